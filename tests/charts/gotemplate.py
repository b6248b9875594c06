"""A small renderer for the subset of Go templates (text/template with Helm's
and Sprig's functions) that charts/meshload uses, so that the chart can be
checked where there is no helm binary.

What it does as Helm does:
  - `{{- ` and ` -}}` trim white space; `{{/* */}}` comments;
  - pipelines (`a | f b`), parenthesised sub-pipelines, `$`, `$var`,
    `$x := pipeline`, field chains (`.Values.image.tag`, `$.Release.Name`);
  - if / else if / else / end, with / else / end, range (lists and maps,
    `$v :=` and `$k, $v :=`) / else / end, define / end, include;
  - values are loaded as Helm loads them: every number is a float64, printed
    the way Go prints one (1000000 prints as 1e+06);
  - a missing map key is empty (Helm's missingkey=zero and its "<no value>"
    removal); a field of a missing value is an error ("nil pointer
    evaluating interface {}.x"), as is an unknown field of .Release or .Chart;
  - comparing an int with a float (`gt .Values.replicaCount 1`) is an error,
    as in Go; `and` and `or` stop at the first deciding argument.
Anything else (an unknown function, `template`, `block`, `break`, methods
other than `.Files.Get`,
ranges over integers, printf verbs other than %s %d %v %q) raises
TemplateError: the renderer never ignores what it does not understand.

Functions: include, toYaml, indent, nindent, quote, default, printf, trunc,
trimSuffix, replace, contains, int, eq, ne, lt, le, gt, ge, and, or, not, fail.
"""
import decimal
import math
import re

import yaml


class TemplateError(Exception):
    pass


class TemplateFail(TemplateError):
    """The template called `fail`: what `helm install` reports as an error."""


class Struct(dict):
    """A Go struct (.Release, .Chart): an unknown field is an error, not empty."""

    def __init__(self, type_name, fields):
        super().__init__(fields)
        self.type_name = type_name


class Method:
    """A method of a Go value (`.Files.Get "path"`): called with the command's
    arguments; a method is never printed or compared as a value."""

    def __init__(self, name, fn, nargs):
        self.name, self.fn, self.nargs = name, fn, nargs

    def __call__(self, *args):
        if len(args) != self.nargs:
            raise TemplateError("wrong number of args for %s: want %d got %d" % (self.name, self.nargs, len(args)))
        return self.fn(*args)


def chart_files(chart_dir):
    """Helm's .Files for a chart directory: Get returns a file's text, or ""
    for a file the chart does not have (as Helm does). Paths are relative to
    the chart's root; one that leaves it is an error."""
    import os

    root = os.path.realpath(chart_dir)

    def get(path):
        if not isinstance(path, str):
            raise TemplateError("Files.Get: the path must be a string")
        full = os.path.realpath(os.path.join(root, path))
        if not full.startswith(root + os.sep):
            raise TemplateError("Files.Get: %s is outside the chart" % path)
        if full.startswith(os.path.join(root, "templates") + os.sep) or not os.path.isfile(full):
            return ""
        with open(full, encoding="utf-8") as f:
            return f.read()

    return Struct("chart.Files", {"Get": Method("Files.Get", get, 1)})


WS = " \t\r\n"


# ---- values as Helm has them -------------------------------------------------
def helm_values(tree):
    """Numbers become floats, as sigs.k8s.io/yaml's JSON round trip makes them."""
    if isinstance(tree, bool) or tree is None or isinstance(tree, str):
        return tree
    if isinstance(tree, (int, float)):
        return float(tree)
    if isinstance(tree, dict):
        return {str(k): helm_values(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [helm_values(v) for v in tree]
    raise TemplateError("values: unsupported YAML value %r" % (tree,))


def go_format_float(f):
    """fmt.Sprint of a float64: strconv.FormatFloat(f, 'g', -1, 64), the
    shortest digits that read back as f, in %e form when the exponent is
    < -4 or >= 6 (so 1000000 prints as 1e+06, as Helm renders it)."""
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "+Inf" if f > 0 else "-Inf"
    if f == 0:
        return "-0" if math.copysign(1, f) < 0 else "0"
    _, digit_tuple, e = decimal.Decimal(repr(abs(f))).normalize().as_tuple()
    digits = "".join(map(str, digit_tuple))
    exp = e + len(digits) - 1  # the exponent of the first digit
    sign = "-" if f < 0 else ""
    if exp < -4 or exp >= 6:
        mant = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return "%s%se%s%02d" % (sign, mant, "-" if exp < 0 else "+", abs(exp))
    if exp >= len(digits) - 1:
        return sign + digits + "0" * (exp - len(digits) + 1)
    if exp >= 0:
        return sign + digits[:exp + 1] + "." + digits[exp + 1:]
    return sign + "0." + "0" * (-exp - 1) + digits


def go_str(v):
    """What text/template prints for a value (fmt.Sprint), after Helm turns
    "<no value>" into ""."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return go_format_float(v)
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        return "[" + " ".join(go_str_nested(x) for x in v) + "]"
    if isinstance(v, dict):
        return "map[" + " ".join("%s:%s" % (k, go_str_nested(v[k])) for k in sorted(v)) + "]"
    raise TemplateError("cannot print %r" % (v,))


def go_str_nested(v):
    return "<nil>" if v is None else go_str(v)


def truth(v):
    if v is None or v is False:
        return False
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return v != 0
    if isinstance(v, (str, list, dict)):
        return len(v) > 0
    return True


def go_quote(s):
    out = ['"']
    for ch in s:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append("\\x%02x" % ord(ch))
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def to_json_like(v):
    """sigs.k8s.io/yaml marshals through JSON: integral floats print as ints."""
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e21:
        return int(v)
    if isinstance(v, dict):
        return {k: to_json_like(x) for k, x in v.items()}
    if isinstance(v, list):
        return [to_json_like(x) for x in v]
    return v


def to_yaml(v):
    text = yaml.safe_dump(to_json_like(v), default_flow_style=False, sort_keys=True, width=1 << 30)
    if text.endswith("\n...\n"):  # a plain scalar document
        text = text[: -len("...\n")]
    return text[:-1] if text.endswith("\n") else text


# ---- lexing ------------------------------------------------------------------
def split_actions(src, name):
    """[(kind, text, line)] with kind 'text' or 'action'; trim markers applied."""
    out = []
    pos = 0
    trim_next = False
    while True:
        i = src.find("{{", pos)
        text = src[pos:] if i < 0 else src[pos:i]
        if trim_next:
            text = text.lstrip(WS)
        if i < 0:
            if text:
                out.append(("text", text, None))
            return out
        start = i + 2
        if src.startswith("-", start) and start + 1 < len(src) and src[start + 1] in WS:
            text = text.rstrip(WS)
            start += 2
        if text:
            out.append(("text", text, None))
        line = src.count("\n", 0, i) + 1
        j = start
        quote = None
        while True:
            if j >= len(src):
                raise TemplateError("%s:%d: unclosed action" % (name, line))
            c = src[j]
            if quote:
                if c == "\\" and quote == '"':
                    j += 2
                    continue
                if c == quote:
                    quote = None
            elif c in "\"`":
                quote = c
            elif src.startswith("/*", j):
                k = src.find("*/", j + 2)
                if k < 0:
                    raise TemplateError("%s:%d: unclosed comment" % (name, line))
                j = k + 2
                continue
            elif src.startswith("}}", j):
                break
            j += 1
        end = j
        trim_next = end - 2 >= start and src[end - 1] == "-" and src[end - 2] in WS
        inner = src[start:end - 1] if trim_next else src[start:end]
        pos = end + 2
        stripped = inner.strip()
        if stripped.startswith("/*"):
            if not stripped.endswith("*/"):
                raise TemplateError("%s:%d: text after a comment in one action" % (name, line))
            continue
        out.append(("action", stripped, line))


TOKEN = re.compile(r"""\s*(?:
    (?P<str>"(?:[^"\\]|\\.)*")
  | (?P<raw>`[^`]*`)
  | (?P<punct>\(|\)|\||:=|=|,)
  | (?P<word>[^\s()|,"`=]+)
)""", re.X)


def lex(text, where):
    toks = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise TemplateError("%s: cannot read %r" % (where, text[pos:]))
        pos = m.end()
        kind = m.lastgroup
        if kind == "word" and m.group(kind).startswith(".") and toks and toks[-1] == ("punct", ")") \
                and m.start(kind) == m.start():
            raise TemplateError("%s: a field of a parenthesised pipeline is not supported" % where)
        toks.append((kind, m.group(kind)))
    return toks


# ---- parsing -----------------------------------------------------------------
FUNCTIONS = {}  # name -> (callable, lazy); filled below


class Node:
    pass


class Text(Node):
    def __init__(self, text):
        self.text = text


class Output(Node):
    def __init__(self, pipe):
        self.pipe = pipe


class Assign(Node):
    def __init__(self, var, pipe):
        self.var, self.pipe = var, pipe


class Branch(Node):
    def __init__(self, kind, decl, pipe, body, orelse):
        self.kind, self.decl, self.pipe, self.body, self.orelse = kind, decl, pipe, body, orelse


KEYWORDS_UNSUPPORTED = ("template", "block", "break", "continue")


def parse_pipeline(toks, where):
    """A pipeline: a list of commands; a command: a list of operands."""
    cmds = [[]]
    i = 0
    while i < len(toks):
        kind, val = toks[i]
        if kind == "punct" and val == "|":
            if not cmds[-1]:
                raise TemplateError("%s: empty command in pipeline" % where)
            cmds.append([])
        elif kind == "punct" and val == "(":
            depth, j = 1, i + 1
            while j < len(toks) and depth:
                if toks[j] == ("punct", "("):
                    depth += 1
                elif toks[j] == ("punct", ")"):
                    depth -= 1
                j += 1
            if depth:
                raise TemplateError("%s: unclosed (" % where)
            sub = parse_pipeline(toks[i + 1:j - 1], where)
            cmds[-1].append(("pipe", sub))
            i = j
            continue
        elif kind == "punct":
            raise TemplateError("%s: unexpected %r" % (where, val))
        elif kind == "str":
            cmds[-1].append(("lit", decode_go_string(val, where)))
        elif kind == "raw":
            cmds[-1].append(("lit", val[1:-1]))
        else:
            cmds[-1].append(parse_operand(val, where))
        i += 1
    if not cmds[-1]:
        raise TemplateError("%s: empty pipeline" % where)
    for cmd in cmds:
        head = cmd[0]
        if head[0] == "func":
            if head[1] not in FUNCTIONS:
                raise TemplateError("%s: function %r is not supported by this renderer" % (where, head[1]))
        elif len(cmd) > 1 and not (head[0] == "field" and head[2][-2:] == ["Files", "Get"]):
            raise TemplateError("%s: %r is not a function but has arguments" % (where, head))
    for cmd in cmds[1:]:
        if cmd[0][0] != "func":
            raise TemplateError("%s: cannot pipe into a non-function" % where)
    return cmds


def decode_go_string(lit, where):
    body = lit[1:-1]
    out, i = [], 0
    esc = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}
    while i < len(body):
        c = body[i]
        if c == "\\":
            n = body[i + 1]
            if n in esc:
                out.append(esc[n])
                i += 2
                continue
            raise TemplateError("%s: string escape \\%s is not supported" % (where, n))
        out.append(c)
        i += 1
    return "".join(out)


FIELD = r"[A-Za-z_][A-Za-z0-9_]*"


def parse_operand(word, where):
    if word in ("true", "false"):
        return ("lit", word == "true")
    if word == "nil":
        return ("lit", None)
    if re.fullmatch(r"-?\d+", word):
        return ("lit", int(word))
    if re.fullmatch(r"-?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?", word):
        return ("lit", float(word))
    if word == ".":
        return ("field", None, [])
    if re.fullmatch(r"(\.%s)+" % FIELD, word):
        return ("field", None, word[1:].split("."))
    m = re.fullmatch(r"(\$%s?)((?:\.%s)*)" % ("(?:" + FIELD + ")", FIELD), word)
    if m:
        return ("field", m.group(1), [p for p in m.group(2).split(".") if p])
    if re.fullmatch(FIELD, word):
        if word in KEYWORDS_UNSUPPORTED:
            raise TemplateError("%s: %r is not supported by this renderer" % (where, word))
        return ("func", word)
    raise TemplateError("%s: cannot read operand %r" % (where, word))


def parse(src, name):
    """Returns (top-level nodes, {define name: nodes})."""
    items = split_actions(src, name)
    defines = {}
    pos = 0

    def block(stop_words):
        nonlocal pos
        nodes = []
        while pos < len(items):
            kind, text, line = items[pos]
            where = "%s:%s" % (name, line)
            if kind == "text":
                nodes.append(Text(text))
                pos += 1
                continue
            toks = lex(text, where)
            if not toks:
                raise TemplateError("%s: empty action" % where)
            head = toks[0][1] if toks[0][0] == "word" else None
            if head in ("end", "else"):
                if head not in stop_words:
                    raise TemplateError("%s: unexpected {{%s}}" % (where, text))
                return nodes, text
            pos += 1
            if head in KEYWORDS_UNSUPPORTED:
                raise TemplateError("%s: {{%s}} is not supported by this renderer" % (where, text))
            if head == "define":
                if len(toks) != 2 or toks[1][0] != "str":
                    raise TemplateError("%s: define takes one quoted name" % where)
                body, _ = block(("end",))
                pos += 1
                defines[decode_go_string(toks[1][1], where)] = body
                continue
            if head in ("if", "with", "range"):
                nodes.append(branch(head, toks[1:], where))
                continue
            if len(toks) >= 2 and toks[0][0] == "word" and toks[0][1].startswith("$") and toks[1] == ("punct", ":="):
                nodes.append(Assign(toks[0][1], parse_pipeline(toks[2:], where)))
                continue
            if any(t == ("punct", ":=") or t == ("punct", "=") for t in toks):
                raise TemplateError("%s: this assignment is not supported" % where)
            nodes.append(Output(parse_pipeline(toks, where)))
        if stop_words:
            raise TemplateError("%s: missing {{end}}" % name)
        return nodes, None

    def branch(kind, toks, where):
        nonlocal pos
        decl = []
        if kind == "range" and ("punct", ":=") in toks:
            k = toks.index(("punct", ":="))
            names = [t[1] for t in toks[:k] if t != ("punct", ",")]
            if not names or len(names) > 2 or not all(n.startswith("$") for n in names):
                raise TemplateError("%s: range declares $v or $k, $v" % where)
            decl, toks = names, toks[k + 1:]
        elif ("punct", ":=") in toks:
            raise TemplateError("%s: a declaration in %s is not supported" % (where, kind))
        pipe = parse_pipeline(toks, where)
        body, stop = block(("end", "else"))
        orelse = []
        if stop is not None and stop.split()[0] == "else":
            rest = lex(stop, where)[1:]
            pos += 1
            if rest:
                if rest[0] != ("word", "if") or kind != "if":
                    raise TemplateError("%s: {{%s}} is not supported by this renderer" % (where, stop))
                # `else if` closes with the same {{end}} as the if.
                orelse = [branch("if", rest[1:], where)]
                return Branch(kind, decl, pipe, body, orelse)
            orelse, stop = block(("end",))
        pos += 1  # the {{end}}
        return Branch(kind, decl, pipe, body, orelse)

    nodes, _ = block(())
    return nodes, defines


# ---- evaluation --------------------------------------------------------------
class Renderer:
    def __init__(self):
        self.defines = {}
        self.depth = 0

    def add(self, src, name):
        nodes, defines = parse(src, name)
        for k, v in defines.items():
            self.defines[k] = v
        return nodes

    def render(self, nodes, dot):
        out = []
        self.run(nodes, dot, [{"$": dot}], out)
        return "".join(out)

    def run(self, nodes, dot, scopes, out):
        for node in nodes:
            if isinstance(node, Text):
                out.append(node.text)
            elif isinstance(node, Output):
                out.append(go_str(self.pipe(node.pipe, dot, scopes)))
            elif isinstance(node, Assign):
                scopes[-1][node.var] = self.pipe(node.pipe, dot, scopes)
            elif isinstance(node, Branch):
                self.branch(node, dot, scopes, out)
            else:
                raise TemplateError("unknown node")

    def branch(self, node, dot, scopes, out):
        v = self.pipe(node.pipe, dot, scopes)
        if node.kind == "if":
            self.run(node.body if truth(v) else node.orelse, dot, scopes + [{}], out)
        elif node.kind == "with":
            if truth(v):
                self.run(node.body, v, scopes + [{}], out)
            else:
                self.run(node.orelse, dot, scopes + [{}], out)
        else:  # range
            if isinstance(v, list):
                pairs = list(enumerate(v))
            elif isinstance(v, dict):
                pairs = [(k, v[k]) for k in sorted(v)]
            elif v is None:
                pairs = []
            else:
                raise TemplateError("range over %r is not supported by this renderer" % (v,))
            if not pairs:
                self.run(node.orelse, dot, scopes + [{}], out)
            for k, x in pairs:
                scope = {}
                if len(node.decl) == 1:
                    scope[node.decl[0]] = x
                elif len(node.decl) == 2:
                    scope[node.decl[0]], scope[node.decl[1]] = k, x
                self.run(node.body, x, scopes + [scope], out)

    def lookup_var(self, name, scopes):
        for scope in reversed(scopes):
            if name in scope:
                return scope[name]
        raise TemplateError("undefined variable %s" % name)

    def operand(self, op, dot, scopes):
        kind = op[0]
        if kind == "lit":
            return op[1]
        if kind == "pipe":
            return self.pipe(op[1], dot, scopes)
        if kind == "field":
            v = dot if op[1] is None else self.lookup_var(op[1], scopes)
            path = op[1] or ""
            for f in op[2]:
                v = field(v, f, path)
                path += "." + f
            return v
        if kind == "func":  # a function without arguments, as an operand
            return self.call(op[1], [], dot, scopes)
        raise TemplateError("bad operand %r" % (op,))

    def pipe(self, cmds, dot, scopes):
        prev, have_prev = None, False
        for cmd in cmds:
            head = cmd[0]
            extra = [("lit", prev)] if have_prev else []
            if head[0] == "func":
                prev = self.call(head[1], list(cmd[1:]) + extra, dot, scopes)
            else:
                v = self.operand(head, dot, scopes)
                args = list(cmd[1:]) + extra
                if isinstance(v, Method):
                    v = v(*[self.operand(a, dot, scopes) for a in args])
                elif args:
                    raise TemplateError("can't give argument to non-function %r" % (v,))
                prev = v
            have_prev = True
        return prev

    def call(self, name, args, dot, scopes):
        fn, lazy = FUNCTIONS[name]
        if lazy:
            return fn(self, [lambda a=a: self.operand(a, dot, scopes) for a in args])
        values = [self.operand(a, dot, scopes) for a in args]
        if name == "include":
            return self.include(*values)
        return fn(*values)

    def include(self, name, data=None, *extra):
        if extra or not isinstance(name, str):
            raise TemplateError("include takes a name and one value")
        if name not in self.defines:
            raise TemplateError('include: no template named "%s"' % name)
        self.depth += 1
        if self.depth > 100:
            raise TemplateError("include: nesting deeper than 100 (recursion?)")
        try:
            return self.render(self.defines[name], data)
        finally:
            self.depth -= 1


def field(v, f, path):
    if isinstance(v, Struct):
        if f not in v:
            raise TemplateError("can't evaluate field %s in type %s" % (f, v.type_name))
        return v[f]
    if isinstance(v, dict):
        return v.get(f)
    if v is None:
        raise TemplateError("nil pointer evaluating interface {}.%s (at %s.%s)" % (f, path, f))
    raise TemplateError("can't evaluate field %s in type %s (at %s)" % (f, type(v).__name__, path))


# ---- functions ---------------------------------------------------------------
def fn(name, lazy=False):
    def register(f):
        FUNCTIONS[name] = (f, lazy)
        return f
    return register


FUNCTIONS["include"] = (None, False)  # handled by Renderer.call


def want_args(name, args, n):
    if len(args) != n:
        raise TemplateError("%s: wants %d arguments, got %d" % (name, n, len(args)))


@fn("toYaml")
def _to_yaml(*a):
    want_args("toYaml", a, 1)
    return to_yaml(a[0])


@fn("indent")
def _indent(*a):
    want_args("indent", a, 2)
    n, s = a
    pad = " " * to_int(n)
    return pad + go_str(s).replace("\n", "\n" + pad)


@fn("nindent")
def _nindent(*a):
    return "\n" + _indent(*a)


@fn("quote")
def _quote(*a):
    return " ".join(go_quote(go_str(x)) for x in a if x is not None)


def empty(v):
    return not truth(v)


@fn("default")
def _default(*a):
    if not a or len(a) > 2:
        raise TemplateError("default: wants 1 or 2 arguments, got %d" % len(a))
    if len(a) == 1:
        return a[0]
    return a[0] if empty(a[1]) else a[1]


@fn("printf")
def _printf(*a):
    if not a or not isinstance(a[0], str):
        raise TemplateError("printf: the format must be a string")
    fmt, args = a[0], list(a[1:])
    out, i = [], 0
    while i < len(fmt):
        c = fmt[i]
        if c != "%":
            out.append(c)
            i += 1
            continue
        verb = fmt[i + 1] if i + 1 < len(fmt) else ""
        i += 2
        if verb == "%":
            out.append("%")
            continue
        if verb not in "sdvq" or not verb:
            raise TemplateError("printf: verb %%%s is not supported by this renderer" % verb)
        if not args:
            out.append("%%!%s(MISSING)" % verb)
            continue
        x = args.pop(0)
        if verb == "d":
            if isinstance(x, bool) or not isinstance(x, int):
                out.append("%%!d(%s=%s)" % ("float64" if isinstance(x, float) else type(x).__name__, go_str(x)))
            else:
                out.append(str(x))
        elif verb == "q":
            out.append(go_quote(go_str(x)))
        elif verb == "v" or isinstance(x, str):
            out.append(go_str_nested(x))
        else:  # what Go prints for %s of a non-string
            out.append("%%!s(%s=%s)" % ("float64" if isinstance(x, float) else type(x).__name__, go_str_nested(x)))
    if args:
        out.append("%!(EXTRA " + ", ".join(go_str_nested(x) for x in args) + ")")
    return "".join(out)


@fn("trunc")
def _trunc(*a):
    want_args("trunc", a, 2)
    n, s = to_int(a[0]), go_str(a[1])
    if n >= 0:
        return s[:n]
    return s[len(s) + n:] if len(s) + n > 0 else s


@fn("trimSuffix")
def _trim_suffix(*a):
    want_args("trimSuffix", a, 2)
    suffix, s = go_str(a[0]), go_str(a[1])
    return s[: -len(suffix)] if suffix and s.endswith(suffix) else s


@fn("replace")
def _replace(*a):
    want_args("replace", a, 3)
    return go_str(a[2]).replace(go_str(a[0]), go_str(a[1]))


@fn("contains")
def _contains(*a):
    want_args("contains", a, 2)
    return go_str(a[0]) in go_str(a[1])


def to_int(v):
    """Sprig's int (spf13/cast.ToInt); a string that is not a number is 0."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return int(v)
    if v is None:
        return 0
    if isinstance(v, str):
        s = re.sub(r"\.0*$", "", v)
        try:
            return int(s, 0)
        except ValueError:
            return 0
    raise TemplateError("int: cannot convert %r" % (v,))


@fn("int")
def _int(*a):
    want_args("int", a, 1)
    return to_int(a[0])


def basic_kind(v):
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "string"
    raise TemplateError("invalid type for comparison: %r" % (v,))


def compare(name, a, b):
    ka, kb = basic_kind(a), basic_kind(b)
    if ka != kb:
        raise TemplateError("error calling %s: incompatible types for comparison (%s and %s)" % (name, ka, kb))
    return a, b


@fn("eq")
def _eq(*a):
    if len(a) < 2:
        raise TemplateError("eq: wants at least 2 arguments")
    return any(x == y for x, y in (compare("eq", a[0], b) for b in a[1:]))


@fn("ne")
def _ne(*a):
    want_args("ne", a, 2)
    x, y = compare("ne", *a)
    return x != y


def ordered(name, a):
    want_args(name, a, 2)
    x, y = compare(name, *a)
    if isinstance(x, bool):
        raise TemplateError("error calling %s: invalid type for comparison" % name)
    return x, y


FUNCTIONS["lt"] = (lambda *a: (lambda x, y: x < y)(*ordered("lt", a)), False)
FUNCTIONS["le"] = (lambda *a: (lambda x, y: x <= y)(*ordered("le", a)), False)
FUNCTIONS["gt"] = (lambda *a: (lambda x, y: x > y)(*ordered("gt", a)), False)
FUNCTIONS["ge"] = (lambda *a: (lambda x, y: x >= y)(*ordered("ge", a)), False)


@fn("and", lazy=True)
def _and(_, thunks):
    if not thunks:
        raise TemplateError("and: wants arguments")
    v = None
    for t in thunks:
        v = t()
        if not truth(v):
            return v
    return v


@fn("or", lazy=True)
def _or(_, thunks):
    if not thunks:
        raise TemplateError("or: wants arguments")
    v = None
    for t in thunks:
        v = t()
        if truth(v):
            return v
    return v


@fn("not")
def _not(*a):
    want_args("not", a, 1)
    return not truth(a[0])


@fn("fail")
def _fail(*a):
    want_args("fail", a, 1)
    raise TemplateFail(go_str(a[0]))
