#include "controller/fakeapi/selectors.h"

#include <cctype>

namespace meshload::fakeapi {
namespace {

std::string Trim(const std::string& s) {
  size_t b = 0;
  size_t e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

// Splits on commas that are not inside parentheses: `a in (x,y),b` is two requirements.
std::vector<std::string> SplitTopLevel(const std::string& text) {
  std::vector<std::string> parts;
  std::string cur;
  int depth = 0;
  for (char c : text) {
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (c == ',' && depth == 0) {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(cur);
  return parts;
}

bool ValidKey(const std::string& key) {
  if (key.empty()) return false;
  for (char c : key) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.' &&
        c != '/') {
      return false;
    }
  }
  return true;
}

const nlohmann::json* Labels(const nlohmann::json& object) {
  auto md = object.find("metadata");
  if (md == object.end() || !md->is_object()) return nullptr;
  auto labels = md->find("labels");
  if (labels == md->end() || !labels->is_object()) return nullptr;
  return &*labels;
}

}  // namespace

std::optional<LabelSelector> LabelSelector::Parse(const std::string& text, std::string* error) {
  LabelSelector sel;
  if (Trim(text).empty()) return sel;
  for (const std::string& raw : SplitTopLevel(text)) {
    std::string part = Trim(raw);
    Requirement req;
    size_t pos;
    if (part.empty()) {
      *error = "unable to parse requirement: empty requirement in \"" + text + "\"";
      return std::nullopt;
    }
    if (part[0] == '!') {
      req.key = Trim(part.substr(1));
      req.op = Op::kDoesNotExist;
    } else if ((pos = part.find("!=")) != std::string::npos) {
      req.key = Trim(part.substr(0, pos));
      req.op = Op::kNotEquals;
      req.values.insert(Trim(part.substr(pos + 2)));
    } else if ((pos = part.find("==")) != std::string::npos) {
      req.key = Trim(part.substr(0, pos));
      req.op = Op::kEquals;
      req.values.insert(Trim(part.substr(pos + 2)));
    } else if ((pos = part.find('=')) != std::string::npos) {
      req.key = Trim(part.substr(0, pos));
      req.op = Op::kEquals;
      req.values.insert(Trim(part.substr(pos + 1)));
    } else if (size_t open = part.find('('); open != std::string::npos) {
      if (part.back() != ')') {
        *error = "unable to parse requirement: missing ')' in \"" + part + "\"";
        return std::nullopt;
      }
      std::string head = Trim(part.substr(0, open));
      size_t space = head.find_last_of(" \t");
      if (space == std::string::npos) {
        *error = "unable to parse requirement: expected 'in' or 'notin' in \"" + part + "\"";
        return std::nullopt;
      }
      std::string op = head.substr(space + 1);
      req.key = Trim(head.substr(0, space));
      if (op == "in") {
        req.op = Op::kIn;
      } else if (op == "notin") {
        req.op = Op::kNotIn;
      } else {
        *error = "unable to parse requirement: unknown operator '" + op + "'";
        return std::nullopt;
      }
      std::string list = part.substr(open + 1, part.size() - open - 2);
      size_t start = 0;
      while (true) {
        size_t comma = list.find(',', start);
        std::string v = Trim(
            list.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
        if (!v.empty()) req.values.insert(v);
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
      if (req.values.empty()) {
        *error =
            "unable to parse requirement: for 'in', 'notin' operators, values set can't be empty";
        return std::nullopt;
      }
    } else {
      req.key = part;
      req.op = Op::kExists;
    }
    if (!ValidKey(req.key)) {
      *error = "unable to parse requirement: invalid label key \"" + req.key + "\"";
      return std::nullopt;
    }
    sel.requirements_.push_back(std::move(req));
  }
  return sel;
}

bool LabelSelector::Matches(const nlohmann::json& object) const {
  const nlohmann::json* labels = Labels(object);
  for (const Requirement& req : requirements_) {
    std::optional<std::string> value;
    if (labels != nullptr) {
      auto it = labels->find(req.key);
      if (it != labels->end() && it->is_string()) value = it->get<std::string>();
    }
    bool ok = false;
    switch (req.op) {
      case Op::kEquals:
      case Op::kIn:
        ok = value.has_value() && req.values.count(*value) > 0;
        break;
      case Op::kNotEquals:
      case Op::kNotIn:
        ok = !value.has_value() || req.values.count(*value) == 0;
        break;
      case Op::kExists:
        ok = value.has_value();
        break;
      case Op::kDoesNotExist:
        ok = !value.has_value();
        break;
    }
    if (!ok) return false;
  }
  return true;
}

std::optional<FieldSelector> FieldSelector::Parse(const std::string& text, std::string* error) {
  FieldSelector sel;
  if (Trim(text).empty()) return sel;
  for (const std::string& raw : SplitTopLevel(text)) {
    std::string part = Trim(raw);
    Requirement req;
    size_t pos;
    if ((pos = part.find("!=")) != std::string::npos) {
      req.equals = false;
      req.field = Trim(part.substr(0, pos));
      req.value = Trim(part.substr(pos + 2));
    } else if ((pos = part.find("==")) != std::string::npos) {
      req.equals = true;
      req.field = Trim(part.substr(0, pos));
      req.value = Trim(part.substr(pos + 2));
    } else if ((pos = part.find('=')) != std::string::npos) {
      req.equals = true;
      req.field = Trim(part.substr(0, pos));
      req.value = Trim(part.substr(pos + 1));
    } else {
      *error = "invalid selector: '" + text + "'; can't understand '" + part + "'";
      return std::nullopt;
    }
    if (req.field != "metadata.name" && req.field != "metadata.namespace") {
      *error = "field label not supported: " + req.field;
      return std::nullopt;
    }
    sel.requirements_.push_back(std::move(req));
  }
  return sel;
}

bool FieldSelector::Matches(const nlohmann::json& object) const {
  for (const Requirement& req : requirements_) {
    std::string actual;
    auto md = object.find("metadata");
    if (md != object.end() && md->is_object()) {
      auto it = md->find(req.field == "metadata.name" ? "name" : "namespace");
      if (it != md->end() && it->is_string()) actual = it->get<std::string>();
    }
    if ((actual == req.value) != req.equals) return false;
  }
  return true;
}

}  // namespace meshload::fakeapi
