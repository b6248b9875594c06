// meshload-apigen: everything that follows from the DataLoadJob's one
// declaration (planner/api/dataloadjob.yaml, whose header lists the
// annotations). Run by the build:
//
//   meshload-apigen DECLARATION --header H --source CC --crd YAML --docs MD
//
// writes the C++ types (H), their parser and bound checks (CC), the CRD
// (YAML: the declaration without the x-cpp- and x-meshload- keys) and the
// reference's field tables (MD). A declaration it does not understand (an
// unknown annotation, a type it cannot map) is an error naming the field.

#include <yaml-cpp/yaml.h>

#include <cctype>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

[[noreturn]] void Fail(const std::string& path, const std::string& msg) { throw std::runtime_error(path + ": " + msg); }

const std::set<std::string> kAnnotations = {"x-cpp-struct",
                                            "x-cpp-name",
                                            "x-cpp-enum",
                                            "x-cpp-all",
                                            "x-cpp-type",
                                            "x-cpp-parse",
                                            "x-cpp-default",
                                            "x-cpp-presence",
                                            "x-cpp-invalid-flag",
                                            "x-cpp-skip",
                                            "x-meshload-missing",
                                            "x-meshload-list",
                                            "x-meshload-map",
                                            "x-meshload-bounds",
                                            "x-meshload-bounds-each",
                                            "x-meshload-invalid",
                                            "x-meshload-checked-in-code",
                                            "x-meshload-readers",
                                            "x-meshload-doc",
                                            "x-meshload-default-doc",
                                            "x-meshload-rules",
                                            "x-meshload-intro"};

bool IsAnnotation(const std::string& key) { return key.rfind("x-cpp-", 0) == 0 || key.rfind("x-meshload-", 0) == 0; }

std::string Str(const YAML::Node& n, const char* key, const std::string& def = "") {
  return n[key] ? n[key].as<std::string>() : def;
}
bool Has(const YAML::Node& n, const char* key) { return static_cast<bool>(n[key]); }

std::string SnakeCase(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::isupper(static_cast<unsigned char>(c))) {
      if (!out.empty()) out += '_';
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else {
      out += c;
    }
  }
  return out;
}
std::string UpperFirst(std::string s) {
  if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
  return s;
}
std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

// ---- the model -----------------------------------------------------------------

struct Field;
struct Struct {
  std::string name;
  std::string path;  // the JSON path, e.g. spec.mesh (items: spec.mesh.axes[i])
  YAML::Node schema;
  std::vector<Field> fields;
};

enum class Kind { kInt, kNumber, kBool, kString, kEnum, kCustom, kStruct, kList, kMap };

struct Field {
  std::string json, member, path;
  YAML::Node schema;
  bool required = false;
  Kind kind = Kind::kString;
  std::string cpp_type;       // the value type (without optional)
  std::string presence;       // "", "optional", "flag"
  std::string struct_name;    // kStruct, or kList of structs
  Kind item = Kind::kString;  // kList: the items' kind (kString, kInt or kStruct)
};

struct Enum {
  std::string name, all;
  std::vector<std::string> values;
};

class Model {
 public:
  explicit Model(const YAML::Node& decl) : decl_(decl) {
    CheckAnnotations(decl, "");
    const YAML::Node root = decl["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    if (!root) Fail("spec.versions[0]", "no schema.openAPIV3Schema");
    const YAML::Node spec = root["properties"]["spec"];
    if (!spec || !spec["x-cpp-struct"]) Fail("spec", "the spec must be an x-cpp-struct");
    top_ = Build(spec, "spec");
  }

  const std::vector<Struct>& structs() const { return structs_; }  // children first
  const std::vector<Enum>& enums() const { return enums_; }
  const Struct& Find(const std::string& name) const {
    for (const auto& s : structs_) {
      if (s.name == name) return s;
    }
    Fail(name, "no such struct");
  }
  const std::string& top() const { return top_; }

 private:
  static void CheckAnnotations(const YAML::Node& n, const std::string& path) {
    if (n.IsMap()) {
      for (const auto& kv : n) {
        const std::string k = kv.first.as<std::string>();
        if (IsAnnotation(k) && !kAnnotations.count(k)) Fail(path, "unknown annotation " + k);
        CheckAnnotations(kv.second, path.empty() ? k : path + "." + k);
      }
    } else if (n.IsSequence()) {
      for (size_t i = 0; i < n.size(); ++i) CheckAnnotations(n[i], path + "[" + std::to_string(i) + "]");
    }
  }

  std::string Build(const YAML::Node& schema, const std::string& path) {
    Struct s;
    s.name = schema["x-cpp-struct"].as<std::string>();
    s.path = path;
    s.schema = schema;
    std::set<std::string> required;
    if (schema["required"]) {
      for (const auto& r : schema["required"]) required.insert(r.as<std::string>());
    }
    for (const auto& kv : schema["properties"]) {
      const YAML::Node fs = kv.second;
      if (Has(fs, "x-cpp-skip")) continue;
      Field f;
      f.json = kv.first.as<std::string>();
      f.member = Str(fs, "x-cpp-name", SnakeCase(f.json));
      f.path = path + "." + f.json;
      f.schema = fs;
      f.required = required.count(f.json) > 0;
      f.presence = Str(fs, "x-cpp-presence");
      if (!f.presence.empty() && f.presence != "optional" && f.presence != "flag") {
        Fail(f.path, "x-cpp-presence is optional or flag");
      }
      Classify(f);
      s.fields.push_back(std::move(f));
    }
    for (const auto& other : structs_) {
      if (other.name == s.name) Fail(path, "struct " + s.name + " is declared twice");
    }
    structs_.push_back(std::move(s));
    return structs_.back().name;
  }

  void Classify(Field& f) {
    const YAML::Node& fs = f.schema;
    const std::string type = Str(fs, "type");
    if (Has(fs, "x-cpp-struct")) {
      f.kind = Kind::kStruct;
      f.struct_name = Build(fs, f.path);
      f.cpp_type = f.struct_name;
    } else if (type == "array") {
      f.kind = Kind::kList;
      const YAML::Node items = fs["items"];
      if (items["x-cpp-struct"]) {
        f.item = Kind::kStruct;
        f.struct_name = Build(items, f.path + "[i]");
        f.cpp_type = "std::vector<" + f.struct_name + ">";
      } else if (Str(items, "type") == "string") {
        f.item = Kind::kString;
        f.cpp_type = "std::vector<std::string>";
      } else if (Str(items, "type") == "integer") {
        f.item = Kind::kInt;
        f.cpp_type = "std::vector<int64_t>";
      } else {
        Fail(f.path, "a list of " + Str(items, "type") + " has no C++ type here");
      }
    } else if (type == "object") {
      const YAML::Node ap = fs["additionalProperties"];
      if (!ap || fs["properties"]) Fail(f.path, "an object is an x-cpp-struct or a map (additionalProperties)");
      f.kind = Kind::kMap;
      f.cpp_type = "std::map<std::string, std::string>";
    } else if (type == "integer") {
      f.kind = Kind::kInt;
      f.cpp_type = Str(fs, "x-cpp-type", "int64_t");
      if (f.cpp_type != "int64_t" && f.cpp_type != "uint64_t") Fail(f.path, "an integer is int64_t or uint64_t");
    } else if (type == "number") {
      f.kind = Kind::kNumber;
      f.cpp_type = "double";
    } else if (type == "boolean") {
      f.kind = Kind::kBool;
      f.cpp_type = "bool";
    } else if (type == "string") {
      if (Has(fs, "x-cpp-enum")) {
        f.kind = Kind::kEnum;
        f.cpp_type = Str(fs, "x-cpp-enum");
        Enum e{f.cpp_type, Str(fs, "x-cpp-all"), {}};
        if (!fs["enum"]) Fail(f.path, "x-cpp-enum needs enum");
        for (const auto& v : fs["enum"]) e.values.push_back(v.as<std::string>());
        for (const auto& other : enums_) {
          if (other.name == e.name) Fail(f.path, "enum " + e.name + " is declared twice");
        }
        enums_.push_back(std::move(e));
      } else if (Has(fs, "x-cpp-type")) {
        f.kind = Kind::kCustom;
        f.cpp_type = Str(fs, "x-cpp-type");
        if (!Has(fs, "x-cpp-parse")) Fail(f.path, "x-cpp-type on a string needs x-cpp-parse");
      } else {
        f.kind = Kind::kString;
        f.cpp_type = "std::string";
      }
    } else {
      Fail(f.path, "type '" + type + "' has no C++ type here");
    }
  }

  YAML::Node decl_;
  std::vector<Struct> structs_;
  std::vector<Enum> enums_;
  std::string top_;
};

// A default as C++: the CRD's `default`, or x-cpp-default.
std::string DefaultOf(const Field& f, bool* has) {
  YAML::Node d = f.schema["default"] ? f.schema["default"] : f.schema["x-cpp-default"];
  *has = static_cast<bool>(d);
  if (!d) return "";
  const std::string v = d.as<std::string>();
  switch (f.kind) {
    case Kind::kEnum: return f.cpp_type + "::k" + v;
    case Kind::kString: return Quote(v);
    case Kind::kInt: return v;
    case Kind::kNumber: return v;
    case Kind::kBool: return v;
    default: Fail(f.path, "a default of this type is not supported");
  }
}

std::string ConstantName(const Struct& s, const Field& f, const std::string& what) {
  return "k" + s.name + UpperFirst(f.json) + what;
}

// ---- the header ---------------------------------------------------------------------

std::string Header(const Model& m) {
  std::ostringstream o;
  o << "// Generated by meshload-apigen from planner/api/dataloadjob.yaml; do not edit.\n"
       "/// \\file\n"
       "/// The DataLoadJob's types as declared in planner/api/dataloadjob.yaml: its\n"
       "/// enums, structs with their defaults, and the declared bounds. The bound\n"
       "/// checks (CheckDeclaredBounds) come with them, the parser is in\n"
       "/// planner/spec_reader.h, and planner/spec.h adds the validation that spans\n"
       "/// fields.\n"
       "#pragma once\n\n"
       "#include <cstdint>\n#include <map>\n#include <optional>\n#include <string>\n#include <string_view>\n"
       "#include <utility>\n#include <vector>\n\n"
       "#include \"common/diagnostics.h\"\n#include \"formats/dtype.h\"\n\n"
       "namespace meshload::planner {\n\n";
  for (const auto& e : m.enums()) {
    o << "enum class " << e.name << " {";
    for (size_t i = 0; i < e.values.size(); ++i) o << (i ? ", " : " ") << "k" << e.values[i];
    o << " };\n";
    o << "std::string_view ToString(" << e.name << " v);\n";
    o << "/// Every value, in the declared order, with its name.\n";
    o << "const std::vector<std::pair<std::string_view, " << e.name << ">>& " << e.name << "Names();\n";
    if (!e.all.empty()) {
      o << "inline constexpr " << e.name << " " << e.all << "[] = {";
      for (size_t i = 0; i < e.values.size(); ++i) o << (i ? ", " : "") << e.name << "::k" << e.values[i];
      o << "};\n";
    }
    o << "\n";
  }
  o << "// The declared bounds (minimum, maximum, maxItems, maxLength): the generated\n"
       "// checks use them, and so does the validation written by hand.\n";
  for (const auto& s : m.structs()) {
    for (const auto& f : s.fields) {
      for (const char* key : {"minimum", "maximum", "minItems", "maxItems", "maxLength", "maxProperties"}) {
        if (f.schema[key]) {
          o << "inline constexpr int64_t " << ConstantName(s, f, UpperFirst(key)) << " = "
            << f.schema[key].as<std::string>() << ";\n";
        }
      }
    }
  }
  o << "\n";
  for (const auto& s : m.structs()) {
    const std::string desc = Str(s.schema, "description");
    o << "/// " << s.path << (desc.empty() ? "" : ": " + desc) << "\n";
    o << "struct " << s.name << " {\n";
    for (const auto& f : s.fields) {
      bool has_default = false;
      const std::string def = DefaultOf(f, &has_default);
      std::string type = f.cpp_type;
      if (f.presence == "optional") {
        if (has_default) Fail(f.path, "optional with a default");
        type = "std::optional<" + type + ">";
      }
      o << "  /// " << f.json << ": " << Str(f.schema, "description") << "\n";
      o << "  " << type << " " << f.member;
      if (has_default) {
        o << " = " << def;
      } else if (f.presence != "optional" && (f.kind == Kind::kInt || f.kind == Kind::kNumber)) {
        o << " = 0";
      } else if (f.presence != "optional" && f.kind == Kind::kBool) {
        o << " = false";
      } else if (f.presence != "optional" && f.kind == Kind::kEnum) {
        o << " = " << f.cpp_type << "::k" << f.schema["enum"][0].as<std::string>();
      } else if (f.presence == "optional" || f.kind == Kind::kList || f.kind == Kind::kMap) {
        o << "{}";  // aggregate initialisation may leave it out ({"label", DType::kInt64})
      }
      o << ";\n";
    }
    // Flags last, so that the fields keep their declared order in aggregate
    // initialisation (ShuffleSpec{ShuffleMode::kBlock, 7, 4096}).
    for (const auto& f : s.fields) {
      if (f.presence == "flag")
        o << "  bool " << f.member << "_set = false;  // " << f.json << " written in the manifest\n";
      if (Has(f.schema, "x-cpp-invalid-flag")) {
        o << "  bool " << Str(f.schema, "x-cpp-invalid-flag") << " = false;  // " << f.json
          << " missing, or not one of its values\n";
      }
    }
    o << "};\n\n";
  }
  o << "/// The declared bounds, patterns and lengths of every field whose checks are not\n"
       "/// written by hand (x-meshload-checked-in-code), for a parsed or a built spec.\n"
       "void CheckDeclaredBounds(const "
    << m.top()
    << "& spec, Diagnostics& d);\n\n"
       "}  // namespace meshload::planner\n";
  return o.str();
}

// ---- the source --------------------------------------------------------------------

std::string ListOfStrings(const std::vector<std::string>& v) {
  std::string s = "{";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + Quote(v[i]);
  return s + "}";
}

void EmitParseField(std::ostringstream& o, const Field& f) {
  const std::string node = "n[" + Quote(f.json) + "]";
  const std::string p = "path + " + Quote("." + f.json);
  const std::string target = "out." + f.member;
  o << "  if (" << node << ") {\n";
  o << "    const YAML::Node x = " << node << ";\n";
  o << "    const std::string p = " << p << ";\n";
  if (f.presence == "flag") o << "    out." << f.member << "_set = true;\n";
  if (Has(f.schema, "x-cpp-invalid-flag")) o << "    out." << Str(f.schema, "x-cpp-invalid-flag") << " = true;\n";
  switch (f.kind) {
    case Kind::kInt:
      if (f.cpp_type == "uint64_t") {
        o << "    if (auto v = r.Int(x, p)) {\n"
             "      if (*v < 0) {\n"
             "        r.diags().Add(p, \"must be >= 0, got \" + std::to_string(*v));\n"
             "      } else {\n"
             "        "
          << target
          << " = static_cast<uint64_t>(*v);\n"
             "      }\n"
             "    }\n";
      } else {
        o << "    if (auto v = r.Int(x, p)) " << target << " = *v;\n";
      }
      break;
    case Kind::kNumber: o << "    if (auto v = r.Number(x, p)) " << target << " = *v;\n"; break;
    case Kind::kBool: o << "    if (auto v = r.Bool(x, p)) " << target << " = *v;\n"; break;
    case Kind::kString:
      if (f.schema["enum"]) {
        std::vector<std::string> vals;
        for (const auto& v : f.schema["enum"]) vals.push_back(v.as<std::string>());
        o << "    static const std::vector<std::pair<std::string_view, std::string_view>> kValues = {";
        for (size_t i = 0; i < vals.size(); ++i)
          o << (i ? ", " : "") << "{" << Quote(vals[i]) << ", " << Quote(vals[i]) << "}";
        o << "};\n";
        o << "    if (auto v = r.Enum<std::string_view>(x, p, kValues)) " << target << " = std::string(*v);\n";
      } else {
        o << "    if (auto v = r.Str(x, p)) " << target << " = *v;\n";
      }
      break;
    case Kind::kEnum:
      o << "    if (auto v = r.Enum<" << f.cpp_type << ">(x, p, " << f.cpp_type << "Names())) {\n";
      o << "      " << target << " = *v;\n";
      if (Has(f.schema, "x-cpp-invalid-flag"))
        o << "      out." << Str(f.schema, "x-cpp-invalid-flag") << " = false;\n";
      o << "    }\n";
      break;
    case Kind::kCustom:
      o << "    if (auto s = r.Str(x, p)) {\n"
           "      auto t = "
        << Str(f.schema, "x-cpp-parse")
        << "(*s);\n"
           "      if (t.ok()) {\n"
           "        "
        << target
        << " = *t;\n"
           "      } else {\n"
           "        r.diags().Add(p, t.status().message() + LineOf(x));\n"
           "      }\n"
           "    }\n";
      break;
    case Kind::kStruct:
      if (f.presence == "optional") {
        o << "    " << f.struct_name << " v;\n";
        o << "    if (Parse" << f.struct_name << "(r, x, p, v)) " << target << " = std::move(v);\n";
      } else {
        o << "    Parse" << f.struct_name << "(r, x, p, " << target << ");\n";
      }
      break;
    case Kind::kList:
      if (f.item == Kind::kStruct) {
        o << "    if (r.List(x, p, " << Quote(Str(f.schema, "x-meshload-list", "a list of mappings"))
          << ")) {\n"
             "      for (size_t i = 0; i < x.size(); ++i) {\n"
             "        "
          << f.struct_name
          << " item;\n"
             "        Parse"
          << f.struct_name
          << "(r, x[i], p + \"[\" + std::to_string(i) + \"]\", item);\n"
             "        "
          << target
          << ".push_back(std::move(item));\n"
             "      }\n"
             "    }\n";
      } else {
        o << "    " << target << " = r." << (f.item == Kind::kInt ? "IntList" : "StrList") << "(x, p);\n";
      }
      break;
    case Kind::kMap:
      o << "    " << target << " = r.StrMap(x, p, " << Quote(Str(f.schema, "x-meshload-map", "a mapping of strings"))
        << ");\n";
      break;
  }
  o << "  }";
  if (f.required) {
    o << " else {\n";
    if (Has(f.schema, "x-cpp-invalid-flag")) o << "    out." << Str(f.schema, "x-cpp-invalid-flag") << " = true;\n";
    o << "    r.Missing(path + " << Quote("." + f.json) << ", " << Quote(Str(f.schema, "x-meshload-missing", ""))
      << ");\n";
    o << "  }\n";
  } else {
    o << "\n";
  }
}

// The check of one value `v` (an expression) at path expression `p`.
void EmitValueChecks(std::ostringstream& o, const Struct& s, const Field& f, const YAML::Node& sch,
                     const std::string& v, const std::string& p, const std::string& indent, bool named_bounds) {
  const std::string type = Str(sch, "type");
  if (type == "integer" || type == "number") {
    // A number is printed as the shortest text that reads back as it
    // (FormatNumber), never rounded to six decimals; NaN and the infinities
    // satisfy no bound, so they are refused first.
    const bool real = type == "number";
    const std::string fmt = real ? "FormatNumber(" : "std::to_string(";
    if (real) {
      o << indent << "if (!std::isfinite(" << v << ")) AddOnce(d, " << p << ", \"must be a finite number, got \" + "
        << fmt << v << "));\n";
    }
    const bool lo = static_cast<bool>(sch["minimum"]), hi = static_cast<bool>(sch["maximum"]);
    if (!lo && !hi) return;
    const std::string min = named_bounds && lo ? ConstantName(s, f, "Minimum") : Str(sch, "minimum");
    const std::string max = named_bounds && hi ? ConstantName(s, f, "Maximum") : Str(sch, "maximum");
    const std::string cast = f.cpp_type == "uint64_t" ? "static_cast<int64_t>(" + v + ")" : v;
    const std::string got = " + \", got \" + " + fmt + v + ")";
    if (Has(sch, "x-meshload-bounds")) {
      std::string cond;
      if (lo) cond += cast + " < " + min;
      if (hi) cond += std::string(cond.empty() ? "" : " || ") + cast + " > " + max;
      o << indent << "if (" << cond << ") AddOnce(d, " << p << ", std::string(" << Quote(Str(sch, "x-meshload-bounds"))
        << ")" << got << ");\n";
    } else if (lo && hi && !Has(sch, "x-meshload-bounds-each")) {
      o << indent << "if (" << cast << " < " << min << " || " << cast << " > " << max << ") AddOnce(d, " << p
        << ", \"must be between \" + " << fmt << min << ") + \" and \" + " << fmt << max << ")" << got << ");\n";
    } else {
      if (lo) {
        o << indent << "if (" << cast << " < " << min << ") AddOnce(d, " << p << ", \"must be >= \" + " << fmt << min
          << ")" << got << ");\n";
      }
      if (hi) {
        o << indent << (lo ? "else " : "") << "if (" << cast << " > " << max << ") AddOnce(d, " << p
          << ", \"must be <= \" + " << fmt << max << ")" << got << ");\n";
      }
    }
  } else if (type == "string" || sch["x-kubernetes-int-or-string"]) {
    std::vector<std::string> conds;
    if (sch["pattern"]) {
      static int counter = 0;
      const std::string re = "kPattern" + std::to_string(counter++);
      o << indent << "static const std::regex " << re << "(" << Quote(Str(sch, "pattern")) << ");\n";
      conds.push_back("!std::regex_search(" + v + ", " + re + ")");
    }
    if (sch["maxLength"]) conds.push_back(v + ".size() > " + Str(sch, "maxLength"));
    if (sch["enum"] && !Has(sch, "x-cpp-enum") && type == "string") {
      std::vector<std::string> vals;
      for (const auto& e : sch["enum"]) vals.push_back(e.as<std::string>());
      o << indent << "if (!" << v << ".empty()) {\n";
      o << indent << "  static const std::vector<std::string> kValues = " << ListOfStrings(vals) << ";\n";
      o << indent << "  if (std::find(kValues.begin(), kValues.end(), " << v << ") == kValues.end()) AddOnce(d, " << p
        << ", \"must be one of " <<
          [&] {
            std::string j;
            for (size_t i = 0; i < vals.size(); ++i) j += (i ? ", " : "") + vals[i];
            return j;
          }()
        << ", got '\" + " << v << " + \"'\");\n";
      o << indent << "}\n";
    }
    if (conds.empty()) return;
    std::string cond;
    for (size_t i = 0; i < conds.size(); ++i) cond += (i ? " || " : "") + conds[i];
    std::string msg;
    if (Has(sch, "x-meshload-invalid")) {
      const std::string t = Str(sch, "x-meshload-invalid");
      const size_t at = t.find("{}");
      if (at == std::string::npos) Fail(f.path, "x-meshload-invalid needs {} for the value");
      msg = Quote(t.substr(0, at)) + " + " + v + " + " + Quote(t.substr(at + 2));
    } else {
      std::string rule;
      if (sch["pattern"]) rule += "match " + Str(sch, "pattern");
      if (sch["maxLength"])
        rule += std::string(rule.empty() ? "" : " and ") + "be at most " + Str(sch, "maxLength") + " characters";
      msg = "\"'\" + " + v + " + \"' must " + rule + "\"";
    }
    o << indent << "if (!" << v << ".empty() && (" << cond << ")) AddOnce(d, " << p << ", " << msg << ");\n";
  }
}

void EmitCheckField(std::ostringstream& o, const Struct& s, const Field& f) {
  if (Has(f.schema, "x-meshload-checked-in-code")) return;
  const std::string v = "s." + f.member;
  const std::string p = "path + " + Quote("." + f.json);
  const YAML::Node& sch = f.schema;
  switch (f.kind) {
    case Kind::kInt:
    case Kind::kNumber:
    case Kind::kString:
      if (f.presence == "optional") {
        std::ostringstream inner;
        EmitValueChecks(inner, s, f, sch, "(*" + v + ")", p, "    ", true);
        if (!inner.str().empty()) o << "  if (" << v << ") {\n" << inner.str() << "  }\n";
      } else if (f.presence == "flag") {
        std::ostringstream inner;
        EmitValueChecks(inner, s, f, sch, v, p, "    ", true);
        if (!inner.str().empty()) o << "  if (" << v << "_set || " << v << " != 0) {\n" << inner.str() << "  }\n";
      } else {
        EmitValueChecks(o, s, f, sch, v, p, "  ", true);
      }
      if (f.kind == Kind::kString && f.required && sch["minLength"] && sch["minLength"].as<int>() >= 1) {
        o << "  if (" << v << ".empty()) AddOnce(d, " << p << ", \"must not be empty\");\n";
      }
      break;
    case Kind::kStruct:
      if (f.presence == "optional") {
        o << "  if (" << v << ") Check" << f.struct_name << "(*" << v << ", " << p << ", d);\n";
      } else {
        o << "  Check" << f.struct_name << "(" << v << ", " << p << ", d);\n";
      }
      break;
    case Kind::kList:
      if (sch["maxItems"]) {
        o << "  if (static_cast<int64_t>(" << v << ".size()) > " << ConstantName(s, f, "MaxItems") << ") AddOnce(d, "
          << p << ", \"at most \" + std::to_string(" << ConstantName(s, f, "MaxItems")
          << ") + \" entries, got \" + std::to_string(" << v << ".size()));\n";
      }
      o << "  for (size_t i = 0; i < " << v << ".size(); ++i) {\n";
      o << "    const std::string item = " << p << " + \"[\" + std::to_string(i) + \"]\";\n";
      if (f.item == Kind::kStruct) {
        o << "    Check" << f.struct_name << "(" << v << "[i], item, d);\n";
      } else {
        Field itemf = f;
        itemf.cpp_type = f.item == Kind::kInt ? "int64_t" : "std::string";
        EmitValueChecks(o, s, itemf, sch["items"], v + "[i]", "item", "    ", false);
      }
      o << "  }\n";
      break;
    case Kind::kMap:
      if (sch["maxProperties"]) {
        o << "  if (static_cast<int64_t>(" << v << ".size()) > " << ConstantName(s, f, "MaxProperties")
          << ") AddOnce(d, " << p << ", \"at most \" + std::to_string(" << ConstantName(s, f, "MaxProperties")
          << ") + \" entries, got \" + std::to_string(" << v << ".size()));\n";
      }
      o << "  for (const auto& [key, value] : " << v << ") {\n";
      {
        Field itemf = f;
        itemf.cpp_type = "std::string";
        EmitValueChecks(o, s, itemf, sch["additionalProperties"], "value", p + " + \".\" + key", "    ", false);
      }
      o << "  }\n";
      break;
    default: break;
  }
}

std::string Source(const Model& m) {
  std::ostringstream o;
  o << "// Generated by meshload-apigen from planner/api/dataloadjob.yaml; do not edit.\n"
       "#include \"planner/dataloadjob_api.h\"\n\n"
       "#include <algorithm>\n#include <cmath>\n#include <regex>\n\n"
       "#include \"planner/spec_reader.h\"\n\n"
       "namespace meshload::planner {\n\n";
  for (const auto& e : m.enums()) {
    o << "std::string_view ToString(" << e.name << " v) {\n  switch (v) {\n";
    for (const auto& v : e.values) o << "    case " << e.name << "::k" << v << ": return " << Quote(v) << ";\n";
    o << "  }\n  return \"?\";\n}\n\n";
    o << "const std::vector<std::pair<std::string_view, " << e.name << ">>& " << e.name << "Names() {\n";
    o << "  static const std::vector<std::pair<std::string_view, " << e.name << ">> kNames = {";
    for (size_t i = 0; i < e.values.size(); ++i) {
      o << (i ? ", " : "") << "{" << Quote(e.values[i]) << ", " << e.name << "::k" << e.values[i] << "}";
    }
    o << "};\n  return kNames;\n}\n\n";
  }
  o << "namespace {\n\n";
  for (const auto& s : m.structs()) {
    o << "bool Parse" << s.name << "(SpecReader& r, const YAML::Node& n, const std::string& path, " << s.name
      << "& out);\n";
  }
  o << "\n";
  for (const auto& s : m.structs()) {
    o << "// " << s.path << "\n";
    o << "bool Parse" << s.name << "(SpecReader& r, const YAML::Node& n, const std::string& path, " << s.name
      << "& out) {\n";
    std::vector<std::string> keys;
    for (const auto& kv : s.schema["properties"]) keys.push_back(kv.first.as<std::string>());
    o << "  if (!r.Map(n, path, " << ListOfStrings(keys) << ")) return false;\n";
    for (const auto& f : s.fields) EmitParseField(o, f);
    o << "  return true;\n}\n\n";
  }
  for (const auto& s : m.structs()) {
    o << "[[maybe_unused]] void Check" << s.name << "(const " << s.name
      << "& s, const std::string& path, Diagnostics& d) {\n";
    o << "  (void)s;\n  (void)path;\n  (void)d;\n";
    for (const auto& f : s.fields) EmitCheckField(o, s, f);
    o << "}\n\n";
  }
  o << "}  // namespace\n\n";
  o << "void ParseJobSpecFields(SpecReader& r, const YAML::Node& n, " << m.top() << "& out) {\n"
    << "  Parse" << m.top() << "(r, n, \"spec\", out);\n}\n\n";
  o << "void CheckDeclaredBounds(const " << m.top() << "& spec, Diagnostics& d) { Check" << m.top()
    << "(spec, \"spec\", d); }\n\n";
  o << "}  // namespace meshload::planner\n";
  return o.str();
}

// ---- the CRD -------------------------------------------------------------------------

// Writes `n` without the annotations, keeping what the declaration wrote:
// flow or block style, and quotes on the scalars that had them (a quoted
// "True" stays a string).
void Emit(YAML::Emitter& e, const YAML::Node& n) {
  if (n.IsMap()) {
    if (n.Style() == YAML::EmitterStyle::Flow) e << YAML::Flow;
    e << YAML::BeginMap;
    for (const auto& kv : n) {
      const std::string k = kv.first.as<std::string>();
      if (IsAnnotation(k)) continue;
      e << YAML::Key;
      Emit(e, kv.first);
      e << YAML::Value;
      Emit(e, kv.second);
    }
    e << YAML::EndMap;
  } else if (n.IsSequence()) {
    if (n.Style() == YAML::EmitterStyle::Flow) e << YAML::Flow;
    e << YAML::BeginSeq;
    for (const auto& v : n) Emit(e, v);
    e << YAML::EndSeq;
  } else if (n.IsScalar()) {
    if (n.Tag() == "!") {
      e << YAML::DoubleQuoted << n.Scalar();
    } else {
      e << n.Scalar();
    }
  } else {
    e << YAML::Null;
  }
}

std::string Crd(const YAML::Node& decl) {
  YAML::Emitter e;
  e.SetIndent(2);
  e.SetSeqFormat(YAML::Block);
  Emit(e, decl);
  return "# Generated by meshload-apigen from planner/api/dataloadjob.yaml; do not edit: edit that file and run\n"
         "# `cmake --build build --target update-api` (docs/development.md, \"Adding a field\").\n"
         "#\n"
         "# The DataLoadJob custom resource: what a training job's data loading looks\n"
         "# like (device mesh, strategy, replication, dataset). Field reference:\n"
         "# docs/crd-reference.md. The schema checks shapes, bounds and what CEL can\n"
         "# express; the rest (B divisible by the data shards, replication mode against\n"
         "# batchAxes, the dataset's files) is checked by the controller with the\n"
         "# planner's validation and reported in the Valid condition.\n" +
         std::string(e.c_str()) + "\n";
}

// ---- the reference's field tables ----------------------------------------------

std::string OneLine(std::string s) {
  for (char& c : s) {
    if (c == '\n') c = ' ';
  }
  while (!s.empty() && s.back() == ' ') s.pop_back();
  std::string out;
  for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

std::string TypeDoc(const Model& m, const Field& f) {
  const YAML::Node& sch = f.schema;
  switch (f.kind) {
    case Kind::kInt: return "integer";
    case Kind::kNumber: return "number";
    case Kind::kBool: return "boolean";
    case Kind::kEnum:
    case Kind::kString:
    case Kind::kCustom:
      if (sch["enum"]) {
        std::string s;
        const size_t n = sch["enum"].size();
        for (size_t i = 0; i < n; ++i) {
          s += (i ? (n > 4 ? ", " : " \\| ") : "") + std::string("`") + sch["enum"][i].as<std::string>() + "`";
        }
        return s;
      }
      return "string";
    case Kind::kStruct: {
      std::string s = "`{";
      const Struct& st = m.Find(f.struct_name);
      for (size_t i = 0; i < st.fields.size(); ++i) s += (i ? ", " : "") + st.fields[i].json;
      return s + "}`";
    }
    case Kind::kList: {
      if (f.item == Kind::kString) return "list of strings";
      if (f.item == Kind::kInt) return "list of integers";
      std::string s = "list of `{";
      const Struct& st = m.Find(f.struct_name);
      for (size_t i = 0; i < st.fields.size(); ++i) s += (i ? ", " : "") + st.fields[i].json;
      return s + "}`";
    }
    case Kind::kMap: return "map string → string";
  }
  return "";
}

std::string DefaultDoc(const Field& f) {
  if (Has(f.schema, "x-meshload-default-doc")) return Str(f.schema, "x-meshload-default-doc");
  if (f.required) return "required";
  if (f.schema["default"]) return "default `" + Str(f.schema, "default") + "`";
  if (f.schema["x-cpp-default"]) return "default `" + Str(f.schema, "x-cpp-default") + "`";
  return "optional";
}

std::string RulesDoc(const Field& f) {
  if (Has(f.schema, "x-meshload-rules")) return Str(f.schema, "x-meshload-rules");
  const YAML::Node& sch = f.schema;
  std::vector<std::string> r;
  if (sch["enum"]) r.push_back("enum");
  if (sch["minimum"] && sch["maximum"]) {
    r.push_back("`" + Str(sch, "minimum") + " ..= " + Str(sch, "maximum") + "`");
  } else if (sch["minimum"]) {
    r.push_back("`>= " + Str(sch, "minimum") + "`");
  } else if (sch["maximum"]) {
    r.push_back("`<= " + Str(sch, "maximum") + "`");
  }
  if (sch["minLength"] && sch["minLength"].as<int>() >= 1) r.push_back("non-empty");
  if (sch["pattern"]) r.push_back("matches `" + Str(sch, "pattern") + "`");
  if (sch["maxLength"]) r.push_back("at most " + Str(sch, "maxLength") + " characters");
  if (sch["maxItems"]) r.push_back("at most " + Str(sch, "maxItems") + " entries");
  if (sch["maxProperties"]) r.push_back("at most " + Str(sch, "maxProperties") + " entries");
  const YAML::Node ap = sch["additionalProperties"];
  if (ap && ap.IsMap()) {
    if (ap["pattern"]) r.push_back("each value matches `" + Str(ap, "pattern") + "`");
    if (ap["maxLength"]) r.push_back("each value at most " + Str(ap, "maxLength") + " characters");
  }
  const YAML::Node items = sch["items"];
  if (items && items["maxLength"]) r.push_back("each at most " + Str(items, "maxLength") + " characters");
  std::string s;
  for (size_t i = 0; i < r.size(); ++i) s += (i ? "; " : "") + r[i];
  return s.empty() ? "—" : s;
}

std::string Readers(const YAML::Node& sch) {
  std::string readers;
  if (sch["x-meshload-readers"]) {
    for (const auto& r : sch["x-meshload-readers"]) readers += (readers.empty() ? "" : ", ") + r.as<std::string>();
  }
  return readers;
}

void DocRow(const Model& m, const Field& f, const std::string& name, std::ostringstream& o) {
  std::string meaning = OneLine(Str(f.schema, "x-meshload-doc", Str(f.schema, "description")));
  const std::string readers = Readers(f.schema);
  if (!readers.empty()) meaning += " (read by: " + readers + ")";
  o << "| `" << name << "` | " << TypeDoc(m, f) << " | " << OneLine(DefaultDoc(f)) << " | " << meaning << " | "
    << OneLine(RulesDoc(f)) << " |\n";
}

void DocRows(const Model& m, const Struct& s, const std::string& prefix, std::ostringstream& o) {
  for (const auto& f : s.fields) {
    const std::string name = prefix + f.json;
    DocRow(m, f, name, o);
    if (f.kind == Kind::kStruct) DocRows(m, m.Find(f.struct_name), name + ".", o);
    if (f.kind == Kind::kList && f.item == Kind::kStruct) DocRows(m, m.Find(f.struct_name), name + "[i].", o);
  }
}

std::string Docs(const Model& m) {
  std::ostringstream o;
  o << "<!-- generated by meshload-apigen from planner/api/dataloadjob.yaml: begin -->\n";
  const Struct& top = m.Find(m.top());
  for (const auto& f : top.fields) {
    const std::string readers = Readers(f.schema);
    o << "\n## spec." << f.json << "\n\n";
    if (Has(f.schema, "x-meshload-intro")) o << OneLine(Str(f.schema, "x-meshload-intro")) << "\n\n";
    if (!readers.empty()) o << "Read by: " << readers << ".\n\n";
    o << "| field | type | required / default | meaning | validation |\n|---|---|---|---|---|\n";
    if (f.kind == Kind::kStruct) {
      DocRows(m, m.Find(f.struct_name), "", o);
    } else {
      Field own = f;
      own.schema = YAML::Clone(f.schema);
      own.schema.remove("x-meshload-readers");
      DocRow(m, own, f.json, o);
    }
  }
  o << "\n<!-- generated by meshload-apigen: end -->\n";
  return o.str();
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out) throw std::runtime_error(path + ": cannot write");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: meshload-apigen DECLARATION [--header H] [--source CC] [--crd YAML] [--docs MD]\n";
    return 2;
  }
  try {
    const YAML::Node decl = YAML::LoadFile(argv[1]);
    Model m(decl);
    for (int i = 2; i + 1 < argc; i += 2) {
      const std::string flag = argv[i], out = argv[i + 1];
      if (flag == "--header") {
        Write(out, Header(m));
      } else if (flag == "--source") {
        Write(out, Source(m));
      } else if (flag == "--crd") {
        Write(out, Crd(decl));
      } else if (flag == "--docs") {
        Write(out, Docs(m));
      } else {
        std::cerr << "meshload-apigen: unknown flag " << flag << "\n";
        return 2;
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "meshload-apigen: " << argv[1] << ": " << e.what() << "\n";
    return 1;
  }
  return 0;
}
