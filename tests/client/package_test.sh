#!/usr/bin/env bash
# The Python client as users install it: `pip install ./client/python` and
# `pip wheel ./client/python` in fresh virtual environments, offline
# (pip --no-index, from the pinned wheelhouse scripts/install-deps.sh fills),
# then the wheel installed into a third environment and the whole client test
# suite (tests/client/client_test.py) run against a real sidecar with it.
#
#   tests/client/package_test.sh ROOT SIDECAR WORKDIR
set -euo pipefail
ROOT=$(cd "$1" && pwd)
SIDECAR=$2
WORK=$3
WHEELHOUSE=${MESHLOAD_WHEELHOUSE:-$HOME/.cache/meshload/wheelhouse}
fail() { echo "FAIL: $*"; echo "0 passed, 1 failed"; exit 1; }
[ -d "$WHEELHOUSE" ] || fail "no wheelhouse at $WHEELHOUSE: run scripts/install-deps.sh"
# The interpreter the fresh environments are made from: the one .venv was.
BASE_PYTHON=$("$ROOT/.venv/bin/python" -c 'import sys; print(sys._base_executable)')
rm -rf "$WORK"
mkdir -p "$WORK"
PIP=(--disable-pip-version-check --no-index --find-links "$WHEELHOUSE")
passed=0

want_version=$(sed -n 's/^project(meshload VERSION \([0-9.]*\).*/\1/p' "$ROOT/CMakeLists.txt")
[ -n "$want_version" ] || fail "no project version in $ROOT/CMakeLists.txt"

# The source directory is copied: the build must not depend on anything but
# what a checkout has (no build tree, no .venv), and must leave it clean.
SRC=$WORK/src
mkdir -p "$SRC"
git -C "$ROOT" ls-files -z --cached --others --exclude-standard | (cd "$ROOT" && xargs -0 cp --parents -t "$SRC" 2>/dev/null) || true
[ -f "$SRC/client/python/pyproject.toml" ] || fail "copying the checkout"

echo "== pip install ./client/python (fresh environment, offline)"
"$BASE_PYTHON" -m venv "$WORK/install-env"
(cd "$SRC" && "$WORK/install-env/bin/pip" install "${PIP[@]}" ./client/python) >"$WORK/install.log" 2>&1 ||
  { tail -40 "$WORK/install.log"; fail "pip install ./client/python"; }
"$WORK/install-env/bin/python" - "$want_version" <<'PY' || fail "the installed package"
import inspect, os, pydoc, sys
import meshload, meshload.jax, meshload.interop
want = sys.argv[1]
assert meshload.__version__ == want, (meshload.__version__, want)
info = meshload.build_info
assert info["version"] == want and info["protocol_version"] == 4, info
assert info["gpu_import"].startswith("built in (CUDA 13."), info  # cuda.h from the build requirements
pkg = os.path.dirname(meshload.__file__)
assert "site-packages" in pkg, pkg
for f in ("_meshload.pyi", "py.typed", "jax.py", "interop.py", "ragged.py"):
    assert os.path.exists(os.path.join(pkg, f)), f
text = pydoc.render_doc(meshload.Client, renderer=pydoc.plaintext)
for needed in ("next(self", "Blocks (without the GIL)", "close(self", "socket_path", "start_step"):
    assert needed in text, "help(meshload.Client) lacks %r" % needed
assert "jax" not in sys.modules, "import meshload imported jax"
# The stubs describe the extension exactly: every class and public member of
# one is in the other.
import ast
from meshload import _meshload
tree = ast.parse(open(os.path.join(pkg, "_meshload.pyi")).read())
stubbed = {n.name: {m.name for m in n.body if isinstance(m, ast.FunctionDef)}
           for n in tree.body if isinstance(n, ast.ClassDef) and not n.name.startswith("_")}
runtime = {name: obj for name, obj in vars(_meshload).items() if isinstance(obj, type)}
assert set(stubbed) == set(runtime), (sorted(stubbed), sorted(runtime))
for name, members in stubbed.items():
    cls = runtime[name]
    if issubclass(cls, BaseException):
        continue
    public = {m for m in vars(cls) if not m.startswith("_") or m in ("__dlpack__", "__dlpack_device__", "__iter__",
              "__next__", "__enter__", "__exit__", "__eq__", "__hash__", "__len__")}
    missing, extra = public - members, members - public - {"__init__"}
    assert not missing and not extra, "%s: not in the stubs %s, not in the module %s" % (name, missing, extra)
assert "__init__" in stubbed["Client"]
print("installed", meshload.__version__, info)
PY
passed=$((passed + 1))

echo "== pip wheel ./client/python"
(cd "$SRC" && "$WORK/install-env/bin/pip" wheel "${PIP[@]}" -w "$WORK/dist" ./client/python) >"$WORK/wheel.log" 2>&1 ||
  { tail -40 "$WORK/wheel.log"; fail "pip wheel ./client/python"; }
wheel=$(ls "$WORK"/dist/meshload-"$want_version"-*.whl 2>/dev/null | head -1)
[ -n "$wheel" ] || fail "no meshload-$want_version wheel in $WORK/dist: $(ls "$WORK/dist")"
echo "built $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB)"
passed=$((passed + 1))

echo "== the wheel in another environment, against a real sidecar"
"$BASE_PYTHON" -m venv "$WORK/wheel-env"
"$WORK/wheel-env/bin/pip" install "${PIP[@]}" "$wheel" numpy==2.4.6 >"$WORK/wheel-install.log" 2>&1 ||
  { tail -20 "$WORK/wheel-install.log"; fail "installing the wheel"; }
# Nothing of the build tree on the path: the client tests import the wheel's meshload.
env -u PYTHONPATH PYTHONDONTWRITEBYTECODE=1 "$WORK/wheel-env/bin/python" -c \
  'import meshload, sys; assert "wheel-env" in meshload.__file__, meshload.__file__'
if env -u PYTHONPATH PYTHONDONTWRITEBYTECODE=1 "$WORK/wheel-env/bin/python" \
    "$ROOT/tests/client/client_test.py" --sidecar "$SIDECAR" >"$WORK/client-test.log" 2>&1; then
  tail -1 "$WORK/client-test.log"
  passed=$((passed + 1))
else
  # The failures first (unittest's FAIL/ERROR blocks), then the end of the log.
  awk '/^(FAIL|ERROR): /{p=1} p{print} /^Ran [0-9]+ tests?/{p=0}' "$WORK/client-test.log" | head -120
  tail -30 "$WORK/client-test.log"
  fail "tests/client/client_test.py with the installed wheel"
fi
rm -rf "$SRC"
echo "$passed passed, 0 failed"
