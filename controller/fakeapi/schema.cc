#include "controller/fakeapi/schema.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace meshload::fakeapi {

using nlohmann::json;

namespace {

std::string Child(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

std::string Index(const std::string& path, size_t i) {
  return path + "[" + std::to_string(i) + "]";
}

// The JSON type of a value in the schema's terms ("integer" only for JSON
// integers: 1.0 and "1" are not integers).
std::string TypeName(const json& v) {
  if (v.is_object()) return "object";
  if (v.is_array()) return "array";
  if (v.is_string()) return "string";
  if (v.is_number_integer()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_boolean()) return "boolean";
  return "null";
}

bool HasType(const json& v, const std::string& type) {
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "string") return v.is_string();
  if (type == "integer") return v.is_number_integer();
  if (type == "number") return v.is_number();
  if (type == "boolean") return v.is_boolean();
  return true;  // an unknown type name constrains nothing
}

const json* Field(const json& schema, const char* key) {
  if (!schema.is_object()) return nullptr;
  auto it = schema.find(key);
  return it == schema.end() ? nullptr : &*it;
}

bool Flag(const json& schema, const char* key) {
  const json* f = Field(schema, key);
  return f != nullptr && f->is_boolean() && f->get<bool>();
}

size_t CodePoints(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) {
    if ((c & 0xC0) != 0x80) ++n;
  }
  return n;
}

void Add(std::vector<SchemaError>* errors, const char* reason, const std::string& field,
         std::string message) {
  errors->push_back({reason, field, std::move(message)});
}

// `value` is not less than the bound (exclusive: greater than it).
bool AtLeast(const json& value, const json& bound, bool exclusive) {
  if (value.is_number_integer() && bound.is_number_integer()) {
    // Both fit in int64 for any value a CRD or a Kubernetes object carries.
    int64_t v = value.get<int64_t>();
    int64_t b = bound.get<int64_t>();
    return exclusive ? v > b : v >= b;
  }
  double v = value.get<double>();
  double b = bound.get<double>();
  return exclusive ? v > b : v >= b;
}

bool AtMost(const json& value, const json& bound, bool exclusive) {
  if (value.is_number_integer() && bound.is_number_integer()) {
    int64_t v = value.get<int64_t>();
    int64_t b = bound.get<int64_t>();
    return exclusive ? v < b : v <= b;
  }
  double v = value.get<double>();
  double b = bound.get<double>();
  return exclusive ? v < b : v <= b;
}

void ValidateNode(const json& schema, const json& value, const std::string& path,
                  std::vector<SchemaError>* errors);

void ValidateList(const json& schema, const json& value, const std::string& path,
                  std::vector<SchemaError>* errors) {
  if (const json* min = Field(schema, "minItems"); min != nullptr && min->is_number_integer()) {
    if (static_cast<int64_t>(value.size()) < min->get<int64_t>()) {
      Add(errors, "FieldValueInvalid", path,
          "Invalid value: " + std::to_string(value.size()) + ": " + path +
              " in body should have at least " + min->dump() + " items");
    }
  }
  if (const json* max = Field(schema, "maxItems"); max != nullptr && max->is_number_integer()) {
    if (static_cast<int64_t>(value.size()) > max->get<int64_t>()) {
      Add(errors, "FieldValueTooMany", path,
          "Too many: " + std::to_string(value.size()) + ": must have at most " + max->dump() +
              " items");
    }
  }
  const json* list_type = Field(schema, "x-kubernetes-list-type");
  if (list_type != nullptr && list_type->is_string()) {
    std::set<std::string> seen;
    if (*list_type == "set") {
      for (size_t i = 0; i < value.size(); ++i) {
        if (!seen.insert(value[i].dump()).second) {
          Add(errors, "FieldValueDuplicate", Index(path, i), "Duplicate value: " + value[i].dump());
        }
      }
    } else if (*list_type == "map") {
      const json* keys = Field(schema, "x-kubernetes-list-map-keys");
      for (size_t i = 0; i < value.size(); ++i) {
        if (!value[i].is_object()) continue;  // a type error, reported below
        json tuple = json::object();
        if (keys != nullptr && keys->is_array()) {
          for (const json& k : *keys) {
            if (!k.is_string()) continue;
            auto it = value[i].find(k.get<std::string>());
            tuple[k.get<std::string>()] = it == value[i].end() ? json(nullptr) : *it;
          }
        }
        if (!seen.insert(tuple.dump()).second) {
          Add(errors, "FieldValueDuplicate", Index(path, i), "Duplicate value: " + tuple.dump());
        }
      }
    }
  }
  if (const json* items = Field(schema, "items"); items != nullptr && items->is_object()) {
    for (size_t i = 0; i < value.size(); ++i) ValidateNode(*items, value[i], Index(path, i), errors);
  }
}

void ValidateObject(const json& schema, const json& value, const std::string& path,
                    std::vector<SchemaError>* errors) {
  if (const json* required = Field(schema, "required"); required != nullptr) {
    if (required->is_array()) {
      for (const json& r : *required) {
        if (r.is_string() && !value.contains(r.get<std::string>())) {
          Add(errors, "FieldValueRequired", Child(path, r.get<std::string>()), "Required value");
        }
      }
    }
  }
  if (const json* min = Field(schema, "minProperties");
      min != nullptr && min->is_number_integer() &&
      static_cast<int64_t>(value.size()) < min->get<int64_t>()) {
    Add(errors, "FieldValueInvalid", path,
        "Invalid value: " + std::to_string(value.size()) + ": " + path +
            " in body should have at least " + min->dump() + " properties");
  }
  if (const json* max = Field(schema, "maxProperties");
      max != nullptr && max->is_number_integer() &&
      static_cast<int64_t>(value.size()) > max->get<int64_t>()) {
    Add(errors, "FieldValueTooMany", path,
        "Too many: " + std::to_string(value.size()) + ": must have at most " + max->dump() +
            " items");
  }
  const json* properties = Field(schema, "properties");
  const json* additional = Field(schema, "additionalProperties");
  for (auto it = value.begin(); it != value.end(); ++it) {
    std::string child = Child(path, it.key());
    if (properties != nullptr && properties->is_object() && properties->contains(it.key())) {
      ValidateNode((*properties)[it.key()], it.value(), child, errors);
    } else if (additional != nullptr && additional->is_object()) {
      ValidateNode(*additional, it.value(), child, errors);
    }
    // Unknown fields are kept, not pruned (see schema.h).
  }
}

void ValidateNode(const json& schema, const json& value, const std::string& path,
                  std::vector<SchemaError>* errors) {
  if (!schema.is_object()) return;
  // x-kubernetes-validations (CEL rules) are not evaluated: see schema.h.
  if (const json* type = Field(schema, "type"); type != nullptr && type->is_string()) {
    std::string want = type->get<std::string>();
    if (!HasType(value, want)) {
      std::string got = TypeName(value);
      Add(errors, "FieldValueTypeInvalid", path,
          "Invalid value: \"" + got + "\": " + path + " in body must be of type " + want +
              ": \"" + got + "\"");
      return;
    }
  }
  if (const json* values = Field(schema, "enum"); values != nullptr && values->is_array()) {
    bool found = false;
    for (const json& v : *values) found = found || v == value;
    if (!found) {
      std::string supported;
      for (const json& v : *values) supported += (supported.empty() ? "" : ", ") + v.dump();
      Add(errors, "FieldValueNotSupported", path,
          "Unsupported value: " + value.dump() + ": supported values: " + supported);
    }
  }
  if (value.is_number()) {
    const json* min = Field(schema, "minimum");
    if (min != nullptr && min->is_number()) {
      bool exclusive = Flag(schema, "exclusiveMinimum");
      if (!AtLeast(value, *min, exclusive)) {
        Add(errors, "FieldValueInvalid", path,
            "Invalid value: " + value.dump() + ": " + path + " in body should be greater than " +
                (exclusive ? "" : "or equal to ") + min->dump());
      }
    }
    const json* max = Field(schema, "maximum");
    if (max != nullptr && max->is_number()) {
      bool exclusive = Flag(schema, "exclusiveMaximum");
      if (!AtMost(value, *max, exclusive)) {
        Add(errors, "FieldValueInvalid", path,
            "Invalid value: " + value.dump() + ": " + path + " in body should be less than " +
                (exclusive ? "" : "or equal to ") + max->dump());
      }
    }
  } else if (value.is_string()) {
    const std::string& s = value.get_ref<const std::string&>();
    size_t length = CodePoints(s);
    const json* min = Field(schema, "minLength");
    if (min != nullptr && min->is_number_integer() &&
        static_cast<int64_t>(length) < min->get<int64_t>()) {
      Add(errors, "FieldValueInvalid", path,
          "Invalid value: " + value.dump() + ": " + path + " in body should be at least " +
              min->dump() + " chars long");
    }
    const json* max = Field(schema, "maxLength");
    if (max != nullptr && max->is_number_integer() &&
        static_cast<int64_t>(length) > max->get<int64_t>()) {
      Add(errors, "FieldValueTooLong", path, "Too long: may not be longer than " + max->dump());
    }
    const json* pattern = Field(schema, "pattern");
    if (pattern != nullptr && pattern->is_string()) {
      try {
        std::regex re(pattern->get<std::string>(), std::regex::ECMAScript);
        if (!std::regex_search(s, re)) {
          Add(errors, "FieldValueInvalid", path,
              "Invalid value: " + value.dump() + ": " + path + " in body should match '" +
                  pattern->get<std::string>() + "'");
        }
      } catch (const std::regex_error&) {
        // A pattern std::regex cannot compile constrains nothing here.
      }
    }
  } else if (value.is_array()) {
    ValidateList(schema, value, path, errors);
  } else if (value.is_object()) {
    ValidateObject(schema, value, path, errors);
  }
}

}  // namespace

void ApplyDefaults(const json& schema, json& value) {
  if (!schema.is_object()) return;
  if (value.is_object()) {
    const json* properties = Field(schema, "properties");
    if (properties != nullptr && properties->is_object()) {
      for (auto it = properties->begin(); it != properties->end(); ++it) {
        if (!value.contains(it.key()) && it.value().is_object() && it.value().contains("default")) {
          value[it.key()] = it.value()["default"];
        }
        auto v = value.find(it.key());
        if (v != value.end()) ApplyDefaults(it.value(), *v);
      }
    }
    const json* additional = Field(schema, "additionalProperties");
    if (additional != nullptr && additional->is_object()) {
      for (auto it = value.begin(); it != value.end(); ++it) {
        if (properties != nullptr && properties->is_object() && properties->contains(it.key())) {
          continue;
        }
        ApplyDefaults(*additional, it.value());
      }
    }
  } else if (value.is_array()) {
    const json* items = Field(schema, "items");
    if (items != nullptr) {
      for (json& item : value) ApplyDefaults(*items, item);
    }
  }
}

std::vector<SchemaError> Validate(const json& schema, const json& value, const std::string& path) {
  std::vector<SchemaError> errors;
  ValidateNode(schema, value, path, &errors);
  return errors;
}

}  // namespace meshload::fakeapi
