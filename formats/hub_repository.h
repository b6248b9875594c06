// A Hugging Face Hub dataset repository's layout: which files hold a
// config's split. The Hub (and `datasets.load_dataset`, and what
// `push_to_hub` writes) takes them from the YAML front matter of the
// repository's README.md:
//
//   ---
//   configs:
//   - config_name: default
//     data_files:
//     - split: train
//       path: data/train-*
//   dataset_info:
//     splits:
//     - name: train
//       num_examples: 1000
//   ---
//
// and, for a repository whose card names no configs, from the file names
// (data/train-00000-of-00004.parquet). Pure: the README's bytes in, the
// split's file patterns (relative to the repository's root) out; the
// sources list and read (sidecar/source/dataset_facts.cc).

#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace meshload::formats {

struct HubSplit {
  std::string name;
  /// Globs relative to the repository's root, as the card gives them.
  std::vector<std::string> patterns;
};

struct HubConfig {
  std::string name;
  /// The card marks it `default: true`.
  bool marked_default = false;
  /// The config's data_dir, when it gives one (its files are laid out
  /// under it as a repository's are).
  std::string data_dir;
  std::vector<HubSplit> splits;
};

/// What dataset_info says of one config's split.
struct HubSplitInfo {
  std::string config;
  std::string split;
  std::optional<uint64_t> examples;
};

struct HubCard {
  /// The card's configs; empty when it names none (the default layout).
  std::vector<HubConfig> configs;
  std::vector<HubSplitInfo> infos;

  /// The README's YAML front matter (between its first two `---` lines).
  /// A README without front matter is a card of no configs. Errors name
  /// the key and README.md's line ("README.md:7").
  static Result<HubCard> Parse(std::string_view readme);

  /// The config a split is read from: `name` when given, else the one
  /// marked default, else the one named "default", else the only one. An
  /// error lists the card's configs.
  Result<const HubConfig*> Config(const std::string& name) const;

  /// dataset_info's example count of a config's split, when it gives one.
  std::optional<uint64_t> Examples(const std::string& config, const std::string& split) const;
};

/// The ways a split's files may be laid out, in order: the first whose
/// patterns (globs relative to the repository's root) match a file is the
/// split's. A config's data_files is one way, all its patterns together; a
/// card of no configs, or a config that gives only a data_dir, has the
/// Hub's default layouts (HubDefaultPatterns). An error names the config
/// and lists its splits.
using HubLayouts = std::vector<std::vector<std::string>>;
struct HubSplitFiles {
  std::string config;  // the config the split is of ("default" for a card of none)
  /// The card's data_files: every pattern must match a file (as on the
  /// Hub). Else the default layouts, the first that matches.
  bool from_card = false;
  HubLayouts layouts;
};
Result<HubSplitFiles> HubSplitLayouts(const HubCard& card, const std::string& config, const std::string& split);

/// The Hub's default layouts of a split under `dir` ("" for the root), in
/// the order it tries them: the shards push_to_hub writes (data/SPLIT-*),
/// a folder of the split's name (SPLIT/*, data/SPLIT/*), files named for
/// it (SPLIT[-._ 0-9]*, data/SPLIT[-._ 0-9]*). Of a layout of several
/// patterns, what each matches.
HubLayouts HubDefaultPatterns(const std::string& split, const std::string& dir = "");

}  // namespace meshload::formats
