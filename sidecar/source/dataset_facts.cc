#include "sidecar/source/dataset_facts.h"

#include "formats/compression.h"
#include "sidecar/source/decoded_source.h"
#include "sidecar/source/parquet_source.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <thread>
#include <unordered_map>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "formats/hub_repository.h"
#include "formats/mds.h"
#include "formats/saved_dataset.h"
#include "formats/tfrecord.h"
#include "formats/webdataset.h"

namespace meshload::sidecar::source {

Result<formats::NpyHeader> ReadNpyHeader(Source& source, const std::string& name, uint64_t size) {
  const std::string where = RedactUri(name);
  std::string head(static_cast<size_t>(std::min<uint64_t>(formats::kNpyPreambleBytes, size)), '\0');
  MESHLOAD_RETURN_IF_ERROR(source.Read(name, 0, head.data(), head.size()));
  Result<uint64_t> data_offset = formats::NpyDataOffset(head);
  if (!data_offset.ok()) return data_offset.status().WithLocationPrefix(where);
  // Bounded: NpyDataOffset caps the header at about 1 MiB.
  const uint64_t want = std::min<uint64_t>(*data_offset, size);
  if (want > head.size()) {
    const size_t got = head.size();
    head.resize(static_cast<size_t>(want));
    MESHLOAD_RETURN_IF_ERROR(source.Read(name, got, head.data() + got, want - got));
  }
  Result<formats::NpyHeader> header = formats::ParseNpyHeader(head);
  if (!header.ok()) return header.status().WithLocationPrefix(where);
  return header;
}

Result<formats::MegatronIndex> ReadMegatronIndex(Source& source, const std::string& name, uint64_t size) {
  const std::string where = RedactUri(name);
  std::string bytes(static_cast<size_t>(size), '\0');
  MESHLOAD_RETURN_IF_ERROR(source.Read(name, 0, bytes.data(), bytes.size()));
  return formats::ParseMegatronIndex(bytes, where);
}

namespace {

// MegatronIndexed: the URI names a prefix (PREFIX.idx and PREFIX.bin beside
// it), one of the two files, or a directory, glob or object prefix whose
// .idx/.bin pairs are the dataset's files (other objects are not part of
// the format and are left out). A .bin without its .idx, or an .idx
// without its .bin, is a problem named in `diags`.
Result<std::vector<planner::DatasetIndex::FileFacts>> MegatronFacts(Source& source, const std::string& name,
                                                                    Diagnostics& diags) {
  std::string prefix;
  if (name.ends_with(".idx") || name.ends_with(".bin")) {
    prefix = name.substr(0, name.size() - 4);
  } else if (source.Stat(name + ".idx").ok()) {
    prefix = name;
  }
  std::vector<Source::Listed> objects;
  if (!prefix.empty()) {
    for (const char* ext : {".idx", ".bin"}) {
      MESHLOAD_ASSIGN_OR_RETURN(ObjectInfo info, source.Stat(prefix + ext));
      objects.push_back({prefix + ext, info.size, info.version});
    }
  } else {
    MESHLOAD_ASSIGN_OR_RETURN(objects, source.List(name));
  }
  // prefix -> (.idx, .bin), in prefix order.
  std::map<std::string, std::pair<const Source::Listed*, const Source::Listed*>> pairs;
  for (const Source::Listed& o : objects) {
    if (o.name.ends_with(".idx")) pairs[o.name.substr(0, o.name.size() - 4)].first = &o;
    if (o.name.ends_with(".bin")) pairs[o.name.substr(0, o.name.size() - 4)].second = &o;
  }
  std::vector<planner::DatasetIndex::FileFacts> files;
  std::vector<std::pair<const Source::Listed*, planner::DatasetIndex::FileFacts*>> to_read;  // (.idx, its facts)
  files.reserve(pairs.size());
  for (const auto& [p, pair] : pairs) {
    const auto [idx, bin] = pair;
    if (idx == nullptr) {
      diags.Add(RedactUri(bin->name), "has no " + RedactUri(p) +
                                          ".idx beside it: a Megatron indexed dataset is PREFIX.bin with its "
                                          "PREFIX.idx (written by Megatron-LM's IndexedDatasetBuilder)");
      continue;
    }
    if (bin == nullptr) {
      diags.Add(RedactUri(idx->name), "has no " + RedactUri(p) + ".bin beside it (the sequences' bytes)");
      continue;
    }
    planner::DatasetIndex::FileFacts& facts = files.emplace_back();
    facts.path = bin->name;
    facts.size = bin->size;
    facts.version = bin->version;
    to_read.emplace_back(idx, &facts);
  }
  ForEachObject(source, to_read.size(), [&](size_t i) {
    to_read[i].second->megatron = ReadMegatronIndex(source, to_read[i].first->name, to_read[i].first->size);
  });
  if (files.empty() && diags.ok()) {
    return InvalidArgument("names no Megatron indexed dataset (no PREFIX.idx with its PREFIX.bin)", RedactUri(name));
  }
  return files;
}

// The last component of an object name (after its last '/').
std::string BaseName(const std::string& name) {
  const size_t slash = name.rfind('/');
  return slash == std::string::npos ? name : name.substr(slash + 1);
}

// The data files `name` names (brace ranges expanded as webdataset does,
// globs and directories listed; `is_data` picks them by their last path
// component) and the index beside each: FILE.idx, else the name up to the
// first dot of its last component + .idx (DALI's naming, as wds2idx.py and
// tfrecord2idx name them), read whole and parsed by `parse` (`dali_named`:
// it was found by the second name). Files with neither go to `missing`.
struct IndexedFiles {
  std::vector<planner::DatasetIndex::FileFacts> files;
  std::vector<std::string> missing;
};
using ParseIndex = std::function<Result<std::vector<uint64_t>>(const std::string& bytes, const std::string& idx,
                                                               uint64_t file_bytes, bool dali_named)>;
Result<IndexedFiles> FilesWithIndexes(Source& source, const std::string& name,
                                      const std::function<bool(const std::string& base)>& is_data,
                                      const ParseIndex& parse) {
  std::vector<Source::Listed> data;
  for (const std::string& pattern : formats::ExpandShardPattern(name)) {
    MESHLOAD_ASSIGN_OR_RETURN(std::vector<Source::Listed> objects, source.List(pattern));
    for (Source::Listed& o : objects) {
      if (is_data(BaseName(o.name))) data.push_back(std::move(o));
    }
  }
  std::vector<planner::DatasetIndex::FileFacts> found(data.size());
  std::vector<char> indexed(data.size(), 1);
  ForEachObject(source, data.size(), [&](size_t i) {
    const Source::Listed& o = data[i];
    planner::DatasetIndex::FileFacts& facts = found[i];
    facts.path = o.name;
    facts.size = o.size;
    facts.version = o.version;
    std::string idx = o.name + ".idx";
    auto info = source.Stat(idx);
    bool dali = false;
    if (!info.ok() && info.status().code() == StatusCode::kNotFound) {
      const size_t slash = o.name.rfind('/');
      const size_t dot = o.name.find('.', slash == std::string::npos ? 0 : slash + 1);
      if (dot != std::string::npos) {
        idx = o.name.substr(0, dot) + ".idx";
        info = source.Stat(idx);
        dali = true;
      }
    }
    if (!info.ok() && info.status().code() == StatusCode::kNotFound) {
      indexed[i] = 0;
      return;
    }
    if (!info.ok()) {
      facts.records = info.status();
      return;
    }
    std::string bytes(static_cast<size_t>(info->size), '\0');
    Status st = source.Read(idx, 0, bytes.data(), bytes.size());
    facts.records = st.ok() ? parse(bytes, RedactUri(idx), o.size, dali) : Result<std::vector<uint64_t>>(st);
  });
  IndexedFiles out;
  for (size_t i = 0; i < data.size(); ++i) {
    if (indexed[i]) {
      out.files.push_back(std::move(found[i]));
    } else {
      out.missing.push_back(data[i].name);
    }
  }
  return out;
}

// "FIRST and N more", redacted.
std::string FirstAndMore(const std::vector<std::string>& names) {
  std::string out = RedactUri(names.front());
  if (names.size() > 1) out += " and " + std::to_string(names.size() - 1) + " more";
  return out;
}

// WebDataset: each SHARD.tar needs its Energon index SHARD.tar.idx beside
// it (8 bytes per sample), or DALI's SHARD.idx.
Result<std::vector<planner::DatasetIndex::FileFacts>> WebDatasetFacts(Source& source, const std::string& uri,
                                                                      const std::string& name, Diagnostics& diags) {
  MESHLOAD_ASSIGN_OR_RETURN(
      IndexedFiles found,
      FilesWithIndexes(
          source, name, [](const std::string& base) { return base.ends_with(".tar"); },  // not its index, nor others
          [](const std::string& bytes, const std::string& idx, uint64_t size, bool dali) {
            return dali ? formats::ParseDaliTarIndex(bytes, idx, size)
                        : formats::ParseEnergonTarIndex(bytes, idx, size);
          }));
  if (!found.missing.empty()) {
    diags.Add(RedactUri(found.missing.front()),
              std::to_string(found.missing.size()) +
                  " shard(s) without an index beside them (Energon's SHARD.tar.idx, or DALI's SHARD.idx): " +
                  FirstAndMore(found.missing) + ". Write them with `meshload index " + RedactUri(uri) +
                  "` (or Megatron-Energon's `energon prepare`), then start the job again");
  }
  if (found.files.empty() && found.missing.empty()) {
    return InvalidArgument("names no WebDataset shard (no .tar object)", RedactUri(uri));
  }
  return std::move(found.files);
}

// A GZIP file's trailer holds the size its last member decompresses to,
// modulo 2^32 (RFC 1952): an index written for another version of the file
// ends elsewhere, found here rather than when a step reads the file. A file
// of several members (not how TensorFlow writes one) has the last member's
// size there: it is decompressed whole and counted before it is refused.
Status CheckGzipIndexEnd(Source& source, const planner::StoredFile& stored, uint64_t index_end,
                         const std::string& uri) {
  if (stored.size < 18) return Status::Ok();  // not a gzip member: its first read says so
  uint8_t tail[4];
  MESHLOAD_RETURN_IF_ERROR(source.Read(stored.path, stored.size - 4, tail, sizeof tail));
  const uint32_t isize = static_cast<uint32_t>(tail[0]) | static_cast<uint32_t>(tail[1]) << 8 |
                         static_cast<uint32_t>(tail[2]) << 16 | static_cast<uint32_t>(tail[3]) << 24;
  if (isize == static_cast<uint32_t>(index_end)) return Status::Ok();
  MESHLOAD_ASSIGN_OR_RETURN(const uint64_t size, DecompressedSize(source, stored.path, stored));
  if (size == index_end) return Status::Ok();
  return DataLoss("says the records end at byte " + std::to_string(index_end) + " of the decompressed bytes, but " +
                      RedactUri(stored.path) + " decompresses to " + std::to_string(size) +
                      " bytes: the index was written for another version of the file. Write it again with "
                      "`meshload index --compression GZIP " +
                      RedactUri(uri) + "`",
                  RedactUri(stored.path) + ".idx");
}

// TFRecord: every object the URI names but the .idx ones is a file; each
// needs its DALI index (tfrecord2idx's "OFFSET LENGTH" lines). A
// compressed file (spec.dataset.compression) is read as the bytes it
// decompresses to (DatasetFile::stored, named FILE.decompressed), whose
// size is where its index's records end; its first record's header is
// decompressed here, so a wrong compression is an error before the job
// starts, not at its first read; so is a GZIP file's stale index.
Result<std::vector<planner::DatasetIndex::FileFacts>> TfRecordFacts(Source& source, const std::string& uri,
                                                                    const std::string& name,
                                                                    planner::FileCompression compression,
                                                                    Diagnostics& diags) {
  const bool compressed = compression != planner::FileCompression::kNone;
  MESHLOAD_ASSIGN_OR_RETURN(IndexedFiles found,
                            FilesWithIndexes(
                                source, name, [](const std::string& base) { return !base.ends_with(".idx"); },
                                [compressed](const std::string& bytes, const std::string& idx, uint64_t size, bool) {
                                  return formats::ParseTfRecordIndex(
                                      bytes, idx, compressed ? std::nullopt : std::optional<uint64_t>(size));
                                }));
  const std::string_view spec_name = compression == planner::FileCompression::kGZIP ? "GZIP" : "ZLIB";
  ForEachObject(source, found.files.size(), [&](size_t i) {
    planner::DatasetIndex::FileFacts& facts = found.files[i];
    if (!compressed) {
      // An index that does not fit an uncompressed file: say so when the
      // file looks compressed.
      if (facts.records.ok() || facts.size < 2) return;
      std::string head(2, '\0');
      if (!source.Read(facts.path, 0, head.data(), head.size()).ok()) return;
      if (std::string_view hint = formats::TfRecordCompressionHint(head); !hint.empty()) {
        facts.records = Status(facts.records.status().code(),
                               facts.records.status().message() + " (" + RedactUri(facts.path) + " starts like a " +
                                   std::string(hint) +
                                   " stream: if TensorFlow wrote it compressed, set "
                                   "spec.dataset.compression: " +
                                   std::string(hint) + ")",
                               facts.records.status().location());
      }
      return;
    }
    planner::StoredFile stored{facts.path, facts.size, compression == planner::FileCompression::kGZIP ? "gz" : "zlib"};
    facts.path += ".decompressed";
    facts.size = facts.records.ok() ? facts.records->back() : 0;
    if (facts.records.ok() && facts.size > 0) {
      auto head = ReadStoredHead(source, stored.path, stored, 12);
      Result<uint64_t> first =
          head.ok() ? formats::TfRecordLength(*head, RedactUri(facts.path), 0) : Result<uint64_t>(head.status());
      if (!first.ok()) {
        facts.records =
            Status(first.status().code(),
                   first.status().message() + " (read with spec.dataset.compression: " + std::string(spec_name) +
                       "; is that how it was written?)",
                   first.status().location().empty() ? RedactUri(stored.path) : first.status().location());
      } else if (compression == planner::FileCompression::kGZIP) {
        if (Status st = CheckGzipIndexEnd(source, stored, facts.size, uri); !st.ok()) facts.records = st;
      }
    }
    facts.stored = std::move(stored);
  });
  if (!found.missing.empty()) {
    diags.Add(RedactUri(found.missing.front()),
              std::to_string(found.missing.size()) +
                  " TFRecord file(s) without an index beside them (FILE.idx, as DALI's tfrecord2idx writes it): " +
                  FirstAndMore(found.missing) + ". Write them with `meshload index " +
                  (compressed ? "--compression " + std::string(spec_name) + " " : std::string()) + RedactUri(uri) +
                  "`, then start the job again; or, if they are not TFRecord files, name only those that are "
                  "(a glob such as DIR/*.tfrecord)");
  }
  if (found.files.empty() && found.missing.empty()) return InvalidArgument("names no TFRecord file", RedactUri(uri));
  return std::move(found.files);
}

// MDS: the URI names a dataset folder (or prefix) holding index.json, or
// index.json itself; every shard it lists is read by its offset table (the
// first 4 × (N + 2) bytes). A compressed shard is read as the raw shard it
// decompresses to (DatasetFile::stored), its head decompressed here.
Result<std::vector<planner::DatasetIndex::FileFacts>> MdsFacts(Source& source, const std::string& uri,
                                                               const std::string& name, Diagnostics& diags) {
  std::string folder = name;
  if (folder.ends_with("index.json")) folder.resize(folder.size() - std::string_view("index.json").size());
  if (!folder.empty() && !folder.ends_with("/")) folder += "/";
  const std::string index_name = folder + "index.json";
  auto info = source.Stat(index_name);
  if (!info.ok()) {
    if (info.status().code() == StatusCode::kNotFound) {
      return InvalidArgument(
          "has no index.json: an MDS dataset is a folder with index.json and its shards "
          "(written by MosaicML Streaming's MDSWriter)",
          RedactUri(uri));
    }
    return info.status();
  }
  std::string json(static_cast<size_t>(info->size), '\0');
  MESHLOAD_RETURN_IF_ERROR(source.Read(index_name, 0, json.data(), json.size()));
  MESHLOAD_ASSIGN_OR_RETURN(std::vector<formats::MdsShard> shards, formats::ParseMdsIndex(json, RedactUri(index_name)));
  // The folder's objects in one listing rather than a request per shard,
  // where the source can list it (not plain http); else each is asked for.
  std::unordered_map<std::string, Source::Listed> listed;
  if (auto all = source.List(folder); all.ok()) {
    for (Source::Listed& o : *all) listed.emplace(o.name, std::move(o));
  }
  auto stat = [&](const std::string& object) -> Result<Source::Listed> {
    if (auto it = listed.find(object); it != listed.end()) return it->second;
    MESHLOAD_ASSIGN_OR_RETURN(ObjectInfo i, source.Stat(object));
    return Source::Listed{object, i.size, i.version};
  };
  std::vector<planner::DatasetIndex::FileFacts> files(shards.size());
  ForEachObject(source, shards.size(), [&](size_t i) {
    formats::MdsShard& shard = shards[i];
    planner::DatasetIndex::FileFacts& facts = files[i];
    facts.path = folder + shard.basename;
    if (!shard.compression.empty()) {
      // Read as the raw shard it decompresses to: the stored object's size
      // checked against index.json, its head decompressed for the offsets
      // (only the compressed bytes those need are read).
      planner::StoredFile stored{folder + shard.zip_basename, shard.zip_bytes, shard.compression};
      facts.size = shard.bytes;
      auto found = stat(stored.path);
      if (auto codec = formats::ParseCompression(shard.compression); !codec.ok()) {
        facts.records = codec.status().WithLocationPrefix(RedactUri(stored.path));
      } else if (!found.ok()) {
        facts.records = found.status();
      } else if (found->size != shard.zip_bytes) {
        facts.records = DataLoss("is " + std::to_string(found->size) + " bytes but index.json says " +
                                     std::to_string(shard.zip_bytes) + " (zip_data.bytes)",
                                 RedactUri(stored.path));
      } else {
        facts.version = found->version;
        auto head = ReadStoredHead(source, stored.path, stored, formats::MdsShardHeadBytes(shard.samples));
        if (!head.ok()) {
          facts.records = head.status();
        } else {
          facts.records = formats::ParseMdsShardHead(*head, shard);
          if (!facts.records.ok()) {
            facts.records = facts.records.status().WithLocationPrefix(RedactUri(facts.path) + " (decompressed from " +
                                                                      RedactUri(stored.path) + ")");
          }
        }
      }
      facts.stored = std::move(stored);
    } else {
      auto found = stat(facts.path);
      if (!found.ok()) {
        facts.records = found.status();
      } else if (found->size != shard.bytes) {
        facts.records =
            DataLoss("is " + std::to_string(found->size) + " bytes but index.json says " + std::to_string(shard.bytes),
                     RedactUri(facts.path));
      } else {
        facts.size = found->size;
        facts.version = found->version;
        std::string head(static_cast<size_t>(std::min(formats::MdsShardHeadBytes(shard.samples), found->size)), '\0');
        Status st = source.Read(facts.path, 0, head.data(), head.size());
        if (!st.ok()) {
          facts.records = st;
        } else {
          facts.records = formats::ParseMdsShardHead(head, shard);
          if (!facts.records.ok()) facts.records = facts.records.status().WithLocationPrefix(RedactUri(facts.path));
        }
      }
    }
    facts.mds = std::move(shard);
  });
  if (files.empty() && diags.ok()) return InvalidArgument("index.json lists no shards", RedactUri(index_name));
  return files;
}

}  // namespace

namespace {

// A Hugging Face Hub repository's split: the objects its README.md's
// config names (formats/hub_repository.h), and the rows its dataset_info
// says the split has.
struct HubSplitObjects {
  std::vector<Source::Listed> objects;
  std::string config;  // the config read ("default" for a card of none)
  std::string card;    // README.md's name, for messages ("" when there is none)
  std::optional<uint64_t> examples;
};

// A README.md larger than this is not a dataset card.
constexpr uint64_t kMaxHubCardBytes = 16ull << 20;

Result<HubSplitObjects> HubRepositoryObjects(const planner::DatasetSpec& spec, Source& source,
                                             const std::string& name) {
  std::string root = name;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  const std::string where = RedactUri(root);
  // "README.md:7" in a card's error is the card in this repository.
  auto in_repo = [&](const Status& st) {
    std::string loc = st.location();
    if (loc.starts_with("README.md")) loc = where + "/" + loc;
    return Status(st.code(), "the repository's dataset card " + st.message(), loc);
  };
  HubSplitObjects out;
  formats::HubCard card;
  const std::string readme = root + "/README.md";
  Result<ObjectInfo> info = source.Stat(readme);
  if (info.ok()) {
    if (info->size > kMaxHubCardBytes) {
      return InvalidArgument("is " + std::to_string(info->size) + " bytes, more than a dataset card's 16 MiB",
                             RedactUri(readme));
    }
    std::string text(static_cast<size_t>(info->size), '\0');
    MESHLOAD_RETURN_IF_ERROR(source.Read(readme, 0, text.data(), text.size()));
    Result<formats::HubCard> parsed = formats::HubCard::Parse(text);
    if (!parsed.ok()) return in_repo(parsed.status());
    card = std::move(*parsed);
    out.card = RedactUri(readme);
  } else if (info.status().code() != StatusCode::kNotFound) {
    return info.status();
  }
  Result<formats::HubSplitFiles> split = formats::HubSplitLayouts(card, spec.config, spec.split);
  if (!split.ok()) return in_repo(split.status());
  out.config = split->config;
  out.examples = card.Examples(out.config, spec.split);
  std::vector<std::string> tried;
  for (const std::vector<std::string>& layout : split->layouts) {
    std::vector<Source::Listed> all;
    for (const std::string& pattern : layout) {
      if (pattern.find("**") != std::string::npos || pattern.find('{') != std::string::npos) {
        return InvalidArgument("config " + out.config + " split " + spec.split + ": data_files path '" + pattern +
                                   "' is a recursive glob or a brace pattern, which meshload does not expand; "
                                   "give the files' folder and a * glob in its last part",
                               out.card.empty() ? where : out.card);
      }
      tried.push_back(pattern);
      Result<std::vector<Source::Listed>> listed = source.List(root + "/" + pattern);
      if (!listed.ok() && listed.status().code() != StatusCode::kNotFound) return listed.status();
      if (!listed.ok() || listed->empty()) {
        if (!split->from_card) continue;
        return NotFound("config " + out.config + " split " + spec.split + ": data_files path '" + pattern +
                            "' matches no file under " + where,
                        out.card);
      }
      for (Source::Listed& o : *listed) all.push_back(std::move(o));
    }
    if (all.empty()) continue;
    std::sort(all.begin(), all.end(), [](const Source::Listed& a, const Source::Listed& b) { return a.name < b.name; });
    all.erase(std::unique(all.begin(), all.end(),
                          [](const Source::Listed& a, const Source::Listed& b) { return a.name == b.name; }),
              all.end());
    out.objects = std::move(all);
    return out;
  }
  std::string list;
  for (size_t i = 0; i < tried.size(); ++i) list += (i ? ", " : "") + tried[i];
  return NotFound("has no split " + spec.split + ": " +
                      (out.card.empty() ? "no README.md names configs, and none of the Hub's default layouts (" + list +
                                              ") matches a file"
                                        : "none of " + list + " matches a file"),
                  where);
}

}  // namespace

// A Dataset or DatasetDict that datasets' save_to_disk wrote
// (formats/saved_dataset.h): the Arrow files state.json lists, in its
// order, of the folder `name` names or of its split's folder
// (spec.dataset.split, one of dataset_dict.json's). nullopt when the folder
// has neither JSON file (the URI names Arrow files themselves).
Result<std::optional<std::vector<Source::Listed>>> SavedDatasetObjects(const planner::DatasetSpec& spec, Source& source,
                                                                       const std::string& name) {
  std::string root = name;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  // A JSON file of the folder: its text, nullopt when there is none.
  auto read_json = [&](const std::string& path) -> Result<std::optional<std::string>> {
    Result<ObjectInfo> info = source.Stat(path);
    if (!info.ok()) {
      if (info.status().code() == StatusCode::kNotFound) return std::optional<std::string>();
      return info.status();
    }
    if (info->size > formats::kSavedDatasetJsonMaxBytes) {
      return InvalidArgument("is " + std::to_string(info->size) + " bytes, more than save_to_disk's JSON files' 16 MiB",
                             RedactUri(path));
    }
    std::string text(static_cast<size_t>(info->size), '\0');
    MESHLOAD_RETURN_IF_ERROR(source.Read(path, 0, text.data(), text.size()));
    return std::optional<std::string>(std::move(text));
  };
  auto in_file = [](const Status& st, const std::string& path) {
    return Status(st.code(), st.message(), RedactUri(path) + (st.location().empty() ? "" : ": " + st.location()));
  };
  MESHLOAD_ASSIGN_OR_RETURN(std::optional<std::string> dict, read_json(root + "/dataset_dict.json"));
  std::string folder = root;
  if (dict) {
    Result<std::vector<std::string>> splits = formats::SavedDatasetSplits(*dict);
    if (!splits.ok()) return in_file(splits.status(), root + "/dataset_dict.json");
    std::string list;
    for (size_t i = 0; i < splits->size(); ++i) list += (i ? ", " : "") + (*splits)[i];
    if (spec.split.empty()) {
      return InvalidArgument(
          "is a DatasetDict of splits " + list + " (dataset_dict.json): name one in spec.dataset.split",
          RedactUri(root));
    }
    if (std::find(splits->begin(), splits->end(), spec.split) == splits->end()) {
      return NotFound("has no split " + spec.split + " (dataset_dict.json lists " + list + ")", RedactUri(root));
    }
    folder = root + "/" + spec.split;
  } else if (!spec.split.empty()) {
    return NotFound(
        "has no dataset_dict.json: spec.dataset.split names a split of a DatasetDict that save_to_disk "
        "wrote; for a Dataset's folder or Arrow files, remove it",
        RedactUri(root));
  }
  const std::string state_path = folder + "/state.json";
  MESHLOAD_ASSIGN_OR_RETURN(std::optional<std::string> state, read_json(state_path));
  if (!state) {
    if (!dict) return std::optional<std::vector<Source::Listed>>();
    return NotFound("has no state.json: the split's folder is not a Dataset that save_to_disk wrote",
                    RedactUri(folder));
  }
  Result<std::vector<std::string>> names = formats::SavedDatasetFiles(*state);
  if (!names.ok()) return in_file(names.status(), state_path);
  std::vector<Source::Listed> objects(names->size());
  std::vector<Status> errors(names->size());
  ForEachObject(source, objects.size(), [&](size_t i) {
    objects[i].name = folder + "/" + (*names)[i];
    Result<ObjectInfo> info = source.Stat(objects[i].name);
    if (!info.ok()) {
      errors[i] = info.status().code() == StatusCode::kNotFound
                      ? NotFound("is listed by state.json's _data_files, and is not there", RedactUri(objects[i].name))
                      : info.status();
      return;
    }
    objects[i].size = info->size;
    objects[i].version = info->version;
  });
  for (const Status& st : errors) MESHLOAD_RETURN_IF_ERROR(st);
  return std::optional<std::vector<Source::Listed>>(std::move(objects));
}

// Parquet and Arrow: every `.parquet` (`.arrow`) object the URI names
// (every object, when none is so named), or those of a Hub repository's
// split (Parquet, spec.dataset.split) or of a saved Dataset or DatasetDict's
// split (Arrow); each read by its footer (one ranged read of its last
// 64 KiB; an Arrow file's record batch headers); a field is the column of
// its name, the same type in every file. A file's size becomes its rows'
// records' (formats/parquet_record.h).
Result<std::vector<planner::DatasetIndex::FileFacts>> ColumnarFacts(const planner::DatasetSpec& spec, Source& source,
                                                                    const std::string& name) {
  const bool arrow = spec.format == planner::DatasetFormat::kArrow;
  std::optional<HubSplitObjects> hub;
  std::vector<Source::Listed> objects;
  bool listed_in_order = false;  // by state.json: its order is the dataset's
  if (arrow) {
    MESHLOAD_ASSIGN_OR_RETURN(auto saved, SavedDatasetObjects(spec, source, name));
    if (saved) {
      objects = std::move(*saved);
      listed_in_order = true;
    } else {
      MESHLOAD_ASSIGN_OR_RETURN(objects, source.List(name));
    }
  } else if (!spec.split.empty()) {
    MESHLOAD_ASSIGN_OR_RETURN(hub, HubRepositoryObjects(spec, source, name));
    objects = std::move(hub->objects);
  } else {
    MESHLOAD_ASSIGN_OR_RETURN(objects, source.List(name));
  }
  std::vector<Source::Listed> parquet;
  const std::string_view extension = arrow ? ".arrow" : ".parquet";
  for (const Source::Listed& o : objects) {
    if (listed_in_order || o.name.ends_with(extension)) parquet.push_back(o);
  }
  if (parquet.empty()) parquet = std::move(objects);
  std::vector<planner::DatasetIndex::FileFacts> files(parquet.size());
  ForEachObject(source, files.size(), [&](size_t i) {
    planner::DatasetIndex::FileFacts& facts = files[i];
    facts.path = parquet[i].name;
    facts.size = parquet[i].size;
    facts.version = parquet[i].version;
    auto read = ReadColumnarFile(spec.format, source, facts.path, facts.size);
    if (!read.ok()) {
      facts.parquet = read.status();
      return;
    }
    const std::shared_ptr<const formats::ColumnarFile>& footer = *read;
    planner::ParquetFile pf;
    pf.stored_size = facts.size;
    pf.rows = footer->rows();
    std::vector<uint64_t> rooms;
    for (size_t k = 0; k < spec.fields.size(); ++k) {
      auto field = footer->Field(spec.fields[k].name);
      if (!field.ok()) {
        facts.parquet = Status(field.status().code(),
                               field.status().message() + " (spec.dataset.fields[" + std::to_string(k) + "])",
                               RedactUri(facts.path));
        return;
      }
      rooms.push_back(field->ragged() ? static_cast<uint64_t>(spec.fields[k].max_bytes.value_or(0))
                                      : field->row_bytes());
      pf.fields.push_back(std::move(*field));
    }
    pf.layout = formats::ParquetRecordLayout::Make(rooms);
    // The chunks the fields need, each once (an Arrow batch's message is
    // every field's).
    std::set<int> leaves;
    for (const formats::ParquetField& field : pf.fields) leaves.insert(field.leaves.begin(), field.leaves.end());
    for (const formats::ParquetRowGroup& g : footer->row_groups()) {
      planner::ParquetFile::RowGroup rg{g.first_row, g.rows, 0, 0};
      for (int leaf : leaves) {
        rg.chunk_bytes += g.columns[static_cast<size_t>(leaf)].bytes;
        rg.decoded_bytes += g.columns[static_cast<size_t>(leaf)].uncompressed_bytes;
      }
      pf.row_groups.push_back(rg);
    }
    pf.footer = footer;
    facts.size = pf.rows * pf.layout.bytes;
    facts.parquet = std::move(pf);
  });
  // Every file's columns as the first file's.
  const planner::DatasetIndex::FileFacts* first = nullptr;
  for (planner::DatasetIndex::FileFacts& f : files) {
    if (!f.parquet.ok()) continue;
    if (!first) {
      first = &f;
      continue;
    }
    for (size_t k = 0; k < f.parquet->fields.size(); ++k) {
      const formats::ParquetField& a = first->parquet->fields[k];
      const formats::ParquetField& b = f.parquet->fields[k];
      if (a.type != b.type) {
        f.parquet = InvalidArgument("column " + b.name + " is " + b.type + " here, " + a.type + " in " +
                                        RedactUri(first->path) + " (every file of a dataset has the same columns)",
                                    RedactUri(f.path));
        break;
      }
    }
  }
  if (files.empty()) {
    return InvalidArgument(std::string("names no ") + (arrow ? "Arrow" : "Parquet") + " file", RedactUri(spec.uri));
  }
  // The card's count of the split's rows, against the files' (a file not
  // copied, or one left from an older push, would change what a step reads).
  if (hub && hub->examples) {
    uint64_t rows = 0;
    for (const planner::DatasetIndex::FileFacts& f : files) {
      if (!f.parquet.ok()) return files;  // the file's own error says more
      rows += f.parquet->rows;
    }
    if (rows != *hub->examples) {
      return InvalidArgument("dataset_info gives config " + hub->config + " split " + spec.split + " " +
                                 std::to_string(*hub->examples) + " examples, but its " + std::to_string(files.size()) +
                                 " files hold " + std::to_string(rows) +
                                 " rows: a file is missing, or one is left from an earlier upload",
                             hub->card);
    }
  }
  return files;
}

namespace {

using FileFactsList = std::vector<planner::DatasetIndex::FileFacts>;

// The objects `name` names as its source lists them, with their sizes.
Result<FileFactsList> ListedFacts(Source& source, const std::string& name) {
  MESHLOAD_ASSIGN_OR_RETURN(std::vector<Source::Listed> objects, source.List(name));
  FileFactsList files(objects.size());
  for (size_t i = 0; i < objects.size(); ++i) {
    files[i].path = objects[i].name;
    files[i].size = objects[i].size;
    files[i].version = objects[i].version;
  }
  return files;
}

// The I/O half of each format's driver (planner/format_driver.h): the facts
// of a dataset's files, gathered through its source. One line per format.
using GatherFacts = Result<FileFactsList> (*)(const planner::DatasetSpec& spec, Source& source, const std::string& name,
                                              Diagnostics& diags);
GatherFacts GathererOf(planner::DatasetFormat format) {
  using F = planner::DatasetFormat;
  static const std::map<F, GatherFacts> gatherers = {
      {F::kFixedRecord, [](const planner::DatasetSpec&, Source& s, const std::string& name,
                           Diagnostics&) { return ListedFacts(s, name); }},
      {F::kTokenStream, [](const planner::DatasetSpec&, Source& s, const std::string& name,
                           Diagnostics&) { return ListedFacts(s, name); }},
      {F::kNpy,
       [](const planner::DatasetSpec&, Source& s, const std::string& name, Diagnostics&) -> Result<FileFactsList> {
         MESHLOAD_ASSIGN_OR_RETURN(FileFactsList files, ListedFacts(s, name));
         ForEachObject(s, files.size(),
                       [&](size_t i) { files[i].npy = ReadNpyHeader(s, files[i].path, files[i].size); });
         return files;
       }},
      {F::kMegatronIndexed, [](const planner::DatasetSpec&, Source& s, const std::string& name,
                               Diagnostics& d) { return MegatronFacts(s, name, d); }},
      {F::kWebDataset, [](const planner::DatasetSpec& spec, Source& s, const std::string& name,
                          Diagnostics& d) { return WebDatasetFacts(s, spec.uri, name, d); }},
      {F::kMDS, [](const planner::DatasetSpec& spec, Source& s, const std::string& name,
                   Diagnostics& d) { return MdsFacts(s, spec.uri, name, d); }},
      {F::kTFRecord, [](const planner::DatasetSpec& spec, Source& s, const std::string& name,
                        Diagnostics& d) { return TfRecordFacts(s, spec.uri, name, spec.compression, d); }},
      {F::kParquet, [](const planner::DatasetSpec& spec, Source& s, const std::string& name,
                       Diagnostics&) { return ColumnarFacts(spec, s, name); }},
      {F::kArrow, [](const planner::DatasetSpec& spec, Source& s, const std::string& name,
                     Diagnostics&) { return ColumnarFacts(spec, s, name); }},
  };
  auto it = gatherers.find(format);
  MESHLOAD_CHECK(it != gatherers.end(), "format " + std::string(planner::ToString(format)) + " gathers no facts");
  return it->second;
}

}  // namespace

Result<planner::DatasetIndex> IndexDataset(const planner::DatasetSpec& spec, SourceRegistry& sources,
                                           Diagnostics& diags) {
  MESHLOAD_ASSIGN_OR_RETURN(auto found, sources.For(spec.uri));
  auto [source, name] = found;
  Diagnostics index_diags;
  MESHLOAD_ASSIGN_OR_RETURN(FileFactsList files, GathererOf(spec.format)(spec, *source, name, index_diags));
  std::vector<std::pair<std::string, std::string>> secret;  // names whose redacted form differs
  for (const auto& f : files) {
    if (std::string r = RedactUri(f.path); r != f.path) secret.emplace_back(f.path, std::move(r));
  }
  auto index = planner::DatasetIndex::FromFiles(spec, std::move(files), index_diags);
  // A signed URL's query must not reach messages and logs.
  auto redact = [&](std::string s) {
    for (const auto& [name, redacted] : secret) {
      for (size_t at; (at = s.find(name)) != std::string::npos;) s.replace(at, name.size(), redacted);
    }
    return s;
  };
  for (const auto& p : index_diags.problems()) diags.Add(redact(p.path), redact(p.message));
  if (!index.ok()) {
    return Status(index.status().code(), redact(index.status().message()), redact(index.status().location()));
  }
  return index;
}

bool ReadsOverNetwork(const planner::JobSpec& spec, const SourceRegistry& sources) {
  for (const planner::DatasetSpec& ds : planner::JobDatasets(spec)) {
    if (sources.Network(ds.uri)) return true;
  }
  return false;
}

Result<planner::ResolvedJob> ResolveWithSources(const planner::ValidJob& job, SourceRegistry& sources,
                                                planner::ResolveOptions options, Unreachable unreachable,
                                                Diagnostics& diags) {
  if (options.index || options.samples) {
    return planner::ResolveJob(job, options, diags);
  }
  const planner::JobSpec& spec = job.spec();
  Diagnostics index_diags;
  Result<planner::DatasetIndex> index = Status(StatusCode::kInternal, "not indexed");
  bool declared = spec.dataset.samples.has_value();
  std::string failed_path = "spec.dataset.uri";
  std::string size_hint = "spec.dataset.samples or --samples";
  if (spec.mixture) {
    // Each dataset of the mixture, read as spec.dataset says; then one index.
    const std::vector<planner::DatasetSpec> datasets = planner::JobDatasets(spec);
    // Over a network, the datasets are indexed at once (each one's file
    // reads are already in flight together): a mixture of remote datasets
    // takes about as long as its slowest one, not their sum. Their results
    // are then taken in order, as one after the other would give them.
    std::vector<Result<planner::DatasetIndex>> indexed(datasets.size(), Status(StatusCode::kInternal, "not indexed"));
    std::vector<Diagnostics> indexed_diags(datasets.size());
    ForEach(datasets.size(), ReadsOverNetwork(spec, sources) ? 8 : 1,
            [&](size_t d) { indexed[d] = IndexDataset(datasets[d], sources, indexed_diags[d]); });
    std::vector<planner::DatasetIndex> parts;
    std::vector<std::string> names, paths;
    declared = true;
    for (size_t d = 0; d < datasets.size() && index_diags.ok(); ++d) {
      declared = declared && datasets[d].samples.has_value();
      for (const auto& p : indexed_diags[d].problems()) index_diags.Add(p.path, p.message);
      Result<planner::DatasetIndex>& part = indexed[d];
      if (!part.ok()) {
        index = part.status();
        failed_path = planner::DatasetPath(spec, d) + ".uri";
        // --samples does not size a mixture: each dataset declares its own.
        size_hint = planner::DatasetPath(spec, d) + ".samples";
        break;
      }
      parts.push_back(std::move(*part));
      names.push_back(spec.mixture->datasets[d].name);
      paths.push_back(planner::DatasetPath(spec, d));
    }
    for (size_t d = parts.size(); d < datasets.size(); ++d) declared = declared && datasets[d].samples.has_value();
    if (parts.size() == datasets.size()) {
      index = planner::DatasetIndex::Combine(std::move(parts), names, paths, index_diags);
      if (!index.ok()) {  // the datasets disagree: index_diags names how
        for (const auto& p : index_diags.problems()) diags.Add(p.path, p.message);
        return diags.ToStatus();
      }
    }
  } else {
    index = IndexDataset(spec.dataset, sources, index_diags);
  }
  // Data that could not be reached (missing here, refused, down) may be
  // planned from its declared size; data that was read and is wrong is an
  // error everywhere, as the sidecar will find it, and no size fixes it.
  const StatusCode failed = index.ok() ? StatusCode::kOk : index.status().code();
  const bool out_of_reach = !index.ok() && index_diags.ok() &&
                            (failed == StatusCode::kNotFound || failed == StatusCode::kUnavailable ||
                             failed == StatusCode::kFailedPrecondition || failed == StatusCode::kDeadlineExceeded ||
                             failed == StatusCode::kIoError);
  if (out_of_reach && unreachable == Unreachable::kUseDeclaredSamples && declared) {
    return planner::ResolveJob(job, options, diags);  // planned from the declared samples
  }
  for (const auto& p : index_diags.problems()) diags.Add(p.path, p.message);
  const auto names_a_dataset = [&](const std::string& where) {
    for (const planner::DatasetSpec& ds : planner::JobDatasets(spec)) {
      if (ds.uri == where) return true;
    }
    return false;
  };
  if (!index.ok() && !out_of_reach && !index.status().location().empty() &&
      !names_a_dataset(index.status().location()) && index_diags.ok()) {
    // What was read is wrong: the file (and byte) it names is where to look.
    diags.Add(index.status().location(), index.status().message());
  } else if (!index.ok()) {
    diags.Add(failed_path, index.status().ToString() +
                               (unreachable == Unreachable::kFail || !out_of_reach
                                    ? std::string()
                                    : "; make the data reachable from here, or give its size with " + size_hint));
    // Storage that refuses or cannot be reached keeps its code: callers
    // tell a dataset they cannot read from a wrong job (a URI that names
    // nothing is the job's: kInvalidArgument, as a dataset that does not
    // match the spec).
    const Status all = diags.ToStatus();
    const StatusCode code = index.status().code();
    if (code == StatusCode::kInvalidArgument || code == StatusCode::kNotFound) return all;
    return Status(code, all.message(), all.location());
  }
  if (!diags.ok()) return diags.ToStatus();
  options.index = std::move(*index);
  return planner::ResolveJob(job, options, diags);
}

Result<planner::ResolvedJob> ResolveReadingDataset(const planner::ValidJob& job, planner::ResolveOptions options,
                                                   Unreachable unreachable, Diagnostics& diags) {
  Result<SourceOptions> sopts = SourceOptionsForJob(job.spec());
  if (!sopts.ok()) {
    diags.Add(sopts.status());
    return diags.ToStatus();
  }
  auto sources = SourceRegistry::WithBuiltins(std::move(*sopts));
  return ResolveWithSources(job, *sources, std::move(options), unreachable, diags);
}

}  // namespace meshload::sidecar::source
