#include "formats/hub_repository.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>

namespace meshload::formats {
namespace {

// A problem at a node of the front matter, located in README.md (the front
// matter starts on the line after the opening `---`).
struct CardError {
  std::string key;
  std::string message;
  int line = -1;  // 0-based within the front matter; -1 unknown
};

int LineOf(const YAML::Node& n) { return n.Mark().line; }

std::string Scalar(const YAML::Node& n, const std::string& key) {
  if (!n.IsScalar()) throw CardError{key, "is not a string", LineOf(n)};
  return n.Scalar();
}

std::vector<std::string> Patterns(const YAML::Node& n, const std::string& key) {
  std::vector<std::string> out;
  if (n.IsScalar()) {
    out.push_back(n.Scalar());
  } else if (n.IsSequence()) {
    for (size_t i = 0; i < n.size(); ++i) out.push_back(Scalar(n[i], key + "[" + std::to_string(i) + "]"));
  } else {
    throw CardError{key, "is neither a path nor a list of paths", LineOf(n)};
  }
  if (out.empty()) throw CardError{key, "names no path", LineOf(n)};
  return out;
}

HubConfig ParseConfig(const YAML::Node& c, const std::string& key) {
  if (!c.IsMap()) throw CardError{key, "is not a mapping", LineOf(c)};
  HubConfig cfg;
  if (!c["config_name"]) throw CardError{key + ".config_name", "is missing", LineOf(c)};
  cfg.name = Scalar(c["config_name"], key + ".config_name");
  if (const YAML::Node d = c["default"]) {
    if (!d.IsScalar() || (d.Scalar() != "true" && d.Scalar() != "false")) {
      throw CardError{key + ".default", "is not true or false", LineOf(d)};
    }
    cfg.marked_default = d.Scalar() == "true";
  }
  if (const YAML::Node dir = c["data_dir"]) cfg.data_dir = Scalar(dir, key + ".data_dir");
  const YAML::Node files = c["data_files"];
  if (!files) {
    if (cfg.data_dir.empty()) throw CardError{key, "gives neither data_files nor data_dir", LineOf(c)};
    return cfg;
  }
  const std::string fkey = key + ".data_files";
  // A path or a list of paths is the train split (as `datasets` reads it);
  // else a list of {split, path}.
  if (files.IsScalar() || (files.IsSequence() && files.size() > 0 && files[0].IsScalar())) {
    cfg.splits.push_back({"train", Patterns(files, fkey)});
    return cfg;
  }
  if (!files.IsSequence() || files.size() == 0) {
    throw CardError{fkey, "is neither a path, a list of paths nor a list of {split, path}", LineOf(files)};
  }
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string ikey = fkey + "[" + std::to_string(i) + "]";
    const YAML::Node e = files[i];
    if (!e.IsMap()) throw CardError{ikey, "is not a {split, path} mapping", LineOf(e)};
    if (!e["split"]) throw CardError{ikey + ".split", "is missing", LineOf(e)};
    if (!e["path"]) throw CardError{ikey + ".path", "is missing", LineOf(e)};
    HubSplit s{Scalar(e["split"], ikey + ".split"), Patterns(e["path"], ikey + ".path")};
    for (const HubSplit& other : cfg.splits) {
      if (other.name == s.name) throw CardError{ikey + ".split", "names split " + s.name + " twice", LineOf(e)};
    }
    cfg.splits.push_back(std::move(s));
  }
  return cfg;
}

// One dataset_info entry: {config_name?, splits: [{name, num_examples}]}.
void ParseInfo(const YAML::Node& info, const std::string& key, std::vector<HubSplitInfo>& out) {
  if (!info.IsMap()) throw CardError{key, "is not a mapping", LineOf(info)};
  const std::string config =
      info["config_name"] ? Scalar(info["config_name"], key + ".config_name") : std::string("default");
  const YAML::Node splits = info["splits"];
  if (!splits) return;
  if (!splits.IsSequence()) throw CardError{key + ".splits", "is not a list", LineOf(splits)};
  for (size_t i = 0; i < splits.size(); ++i) {
    const std::string skey = key + ".splits[" + std::to_string(i) + "]";
    const YAML::Node s = splits[i];
    if (!s.IsMap() || !s["name"]) throw CardError{skey, "is not a {name, num_examples} mapping", LineOf(s)};
    HubSplitInfo hs{config, Scalar(s["name"], skey + ".name"), std::nullopt};
    if (const YAML::Node n = s["num_examples"]) {
      const std::string v = Scalar(n, skey + ".num_examples");
      if (v.empty() || v.size() > 19 ||
          !std::all_of(v.begin(), v.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
        throw CardError{skey + ".num_examples", "'" + v + "' is not a count", LineOf(n)};
      }
      hs.examples = std::stoull(v);
    }
    out.push_back(std::move(hs));
  }
}

std::string Names(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + names[i];
  return s;
}

}  // namespace

Result<HubCard> HubCard::Parse(std::string_view readme) {
  HubCard card;
  if (readme.starts_with("\xEF\xBB\xBF")) readme.remove_prefix(3);  // a byte-order mark
  auto line_end = [&](size_t from) {
    const size_t nl = readme.find('\n', from);
    return nl == std::string_view::npos ? readme.size() : nl;
  };
  auto line_at = [&](size_t from) {
    std::string_view l = readme.substr(from, line_end(from) - from);
    if (l.ends_with('\r')) l.remove_suffix(1);
    while (l.ends_with(' ')) l.remove_suffix(1);
    return l;
  };
  if (line_at(0) != "---") return card;  // no front matter: no configs
  const size_t start = std::min(readme.size(), line_end(0) + 1);
  size_t at = start;
  size_t end = std::string_view::npos;
  while (at < readme.size()) {
    const std::string_view l = line_at(at);
    if (l == "---" || l == "...") {
      end = at;
      break;
    }
    at = line_end(at) + 1;
  }
  if (end == std::string_view::npos) {
    return InvalidArgument("its YAML front matter, opened by --- on line 1, is not closed by a --- line",
                           "README.md:1");
  }
  const std::string yaml(readme.substr(start, end - start));
  try {
    const YAML::Node root = YAML::Load(yaml);
    if (root.IsNull()) return card;
    if (!root.IsMap()) throw CardError{"", "the front matter is not a mapping", LineOf(root)};
    if (const YAML::Node configs = root["configs"]) {
      if (!configs.IsSequence()) throw CardError{"configs", "is not a list", LineOf(configs)};
      for (size_t i = 0; i < configs.size(); ++i) {
        HubConfig c = ParseConfig(configs[i], "configs[" + std::to_string(i) + "]");
        for (const HubConfig& other : card.configs) {
          if (other.name == c.name) {
            throw CardError{"configs[" + std::to_string(i) + "].config_name", "names config " + c.name + " twice",
                            LineOf(configs[i])};
          }
        }
        card.configs.push_back(std::move(c));
      }
    }
    if (const YAML::Node info = root["dataset_info"]) {
      if (info.IsSequence()) {
        for (size_t i = 0; i < info.size(); ++i) {
          ParseInfo(info[i], "dataset_info[" + std::to_string(i) + "]", card.infos);
        }
      } else {
        ParseInfo(info, "dataset_info", card.infos);
      }
    }
  } catch (const CardError& e) {
    const std::string loc = e.line >= 0 ? "README.md:" + std::to_string(e.line + 2) : "README.md";
    return InvalidArgument((e.key.empty() ? "" : e.key + ": ") + e.message, loc);
  } catch (const YAML::Exception& e) {
    const std::string loc = e.mark.line >= 0 ? "README.md:" + std::to_string(e.mark.line + 2) : "README.md";
    return InvalidArgument("its front matter is not valid YAML: " + e.msg, loc);
  }
  return card;
}

Result<const HubConfig*> HubCard::Config(const std::string& name) const {
  std::vector<std::string> names;
  for (const HubConfig& c : configs) names.push_back(c.name);
  if (!name.empty()) {
    for (const HubConfig& c : configs) {
      if (c.name == name) return &c;
    }
    return NotFound("has no config " + name + " (its configs: " + Names(names) + "; spec.dataset.config)", "README.md");
  }
  const HubConfig* marked = nullptr;
  for (const HubConfig& c : configs) {
    if (c.marked_default) {
      if (marked) {
        return InvalidArgument(
            "marks configs " + marked->name + " and " + c.name + " default; name one in spec.dataset.config",
            "README.md");
      }
      marked = &c;
    }
  }
  if (marked) return marked;
  for (const HubConfig& c : configs) {
    if (c.name == "default") return &c;
  }
  if (configs.size() == 1) return &configs[0];
  return InvalidArgument("has configs " + Names(names) + " and none is the default: name one in spec.dataset.config",
                         "README.md");
}

std::optional<uint64_t> HubCard::Examples(const std::string& config, const std::string& split) const {
  for (const HubSplitInfo& i : infos) {
    if (i.config == config && i.split == split) return i.examples;
  }
  return std::nullopt;
}

HubLayouts HubDefaultPatterns(const std::string& split, const std::string& dir) {
  std::string d = dir;
  while (d.ends_with('/')) d.pop_back();
  const std::string p = d.empty() ? "" : d + "/";
  // The shards push_to_hub writes; a folder of the split's name; files
  // named for the split (train.parquet, train_0.parquet).
  const std::string named = split + "[-._ 0-9]*";
  return {
      {p + "data/" + split + "-*"}, {p + split + "/*", p + "data/" + split + "/*"}, {p + named, p + "data/" + named}};
}

Result<HubSplitFiles> HubSplitLayouts(const HubCard& card, const std::string& config, const std::string& split) {
  if (card.configs.empty()) {
    if (!config.empty()) {
      return NotFound("names no configs, so it has no config " + config + " (spec.dataset.config)", "README.md");
    }
    return HubSplitFiles{"default", false, HubDefaultPatterns(split)};
  }
  MESHLOAD_ASSIGN_OR_RETURN(const HubConfig* c, card.Config(config));
  if (c->splits.empty()) return HubSplitFiles{c->name, false, HubDefaultPatterns(split, c->data_dir)};
  std::vector<std::string> names;
  for (const HubSplit& s : c->splits) {
    if (s.name == split) {
      HubSplitFiles one{c->name, true, {s.patterns}};
      if (!c->data_dir.empty()) {
        std::string d = c->data_dir;
        while (d.ends_with('/')) d.pop_back();
        for (std::string& p : one.layouts[0]) p = d + "/" + p;
      }
      return one;
    }
    names.push_back(s.name);
  }
  return NotFound(
      "config " + c->name + " has no split " + split + " (its splits: " + Names(names) + "; spec.dataset.split)",
      "README.md");
}

}  // namespace meshload::formats
