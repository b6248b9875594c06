#include "planner/token_rows.h"

#include <algorithm>
#include <numeric>
#include <set>

#include "planner/sampler.h"

namespace meshload::planner {
namespace {

constexpr uint64_t kMaxPieceTokens = (uint64_t{1} << 31) - 1;  // RowPiece::tokens and ::offset
constexpr size_t kMaxReported = 8;                             // long documents named, then a count

// The document order of one dataset, a window at a time (AtRange is much
// cheaper than a call per position).
class DocumentOrder {
 public:
  DocumentOrder(ShuffleMode mode, uint64_t seed, uint64_t window, uint64_t count)
      : identity_(mode == ShuffleMode::kNone), perm_(BlockShuffle(seed, window), count, 0) {}

  // out = σ(first .. first + n).
  void Range(uint64_t first, size_t n, std::vector<uint64_t>& out) const {
    out.resize(n);
    if (identity_) {
      std::iota(out.begin(), out.end(), first);
    } else {
      perm_.AtRange(first, n, out.data());
    }
  }

 private:
  static ShuffleSpec BlockShuffle(uint64_t seed, uint64_t window) {
    ShuffleSpec s;
    s.mode = ShuffleMode::kBlock;
    s.seed = DocumentOrderSeed(seed);
    s.block_size = static_cast<int64_t>(window);
    s.block_size_set = true;
    return s;
  }
  bool identity_;
  EpochPermutation perm_;
};

// The earliest of a window's open rows with room for an item (FirstFit): a
// max tree over the rows' room.
class EarliestRoom {
 public:
  void Reset(size_t rows) {
    cap_ = 1;
    while (cap_ < rows) cap_ <<= 1;
    tree_.assign(2 * cap_, 0);
  }
  void Set(size_t row, uint64_t room) {
    size_t i = row + cap_;
    tree_[i] = room;
    for (i >>= 1; i >= 1; i >>= 1) tree_[i] = std::max(tree_[2 * i], tree_[2 * i + 1]);
  }
  // The first row with room >= need, or -1.
  int64_t Find(uint64_t need) const {
    if (tree_[1] < need) return -1;
    size_t i = 1;
    while (i < cap_) i = tree_[2 * i] >= need ? 2 * i : 2 * i + 1;
    return static_cast<int64_t>(i - cap_);
  }

 private:
  size_t cap_ = 1;
  std::vector<uint64_t> tree_;
};

uint64_t HashStep(uint64_t h, uint64_t v) { return Mix64(h ^ Mix64(v)); }

// The body of WritePackedFields, compiled once per instruction set below
// (std::fill and the ramp vectorize to the caller's vector width).
[[gnu::always_inline]] inline void PackedFields(const RowPiece* pieces, size_t count, uint64_t row_tokens,
                                                int32_t* segment_ids, int32_t* positions) {
  uint64_t at = 0;
  for (size_t j = 0; j < count; ++j) {
    const uint32_t n = pieces[j].row_tokens();
    std::fill(segment_ids + at, segment_ids + at + n, static_cast<int32_t>(j + 1));
    int32_t* pos = positions + at;
    for (uint32_t k = 0; k < n; ++k) pos[k] = static_cast<int32_t>(k);
    at += n;
  }
  std::fill(segment_ids + at, segment_ids + row_tokens, 0);
  std::fill(positions + at, positions + row_tokens, 0);
}

#if defined(__x86_64__)
[[gnu::target("avx2")]] void PackedFieldsAvx2(const RowPiece* pieces, size_t count, uint64_t row_tokens,
                                              int32_t* segment_ids, int32_t* positions) {
  PackedFields(pieces, count, row_tokens, segment_ids, positions);
}
#endif

}  // namespace

void WritePackedFields(const RowPiece* pieces, size_t count, uint64_t row_tokens, int32_t* segment_ids,
                       int32_t* positions) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return PackedFieldsAvx2(pieces, count, row_tokens, segment_ids, positions);
#endif
  PackedFields(pieces, count, row_tokens, segment_ids, positions);
}

uint64_t DocumentOrderSeed(uint64_t seed) { return DeriveKey(seed, ~uint64_t{0}, 3); }

std::optional<uint64_t> MaxTokenOf(formats::DType dtype) {
  switch (dtype) {
    case formats::DType::kInt8: return 0x7F;
    case formats::DType::kUint8: return 0xFF;
    case formats::DType::kInt16: return 0x7FFF;
    case formats::DType::kUint16: return 0xFFFF;
    case formats::DType::kInt32: return 0x7FFFFFFF;
    case formats::DType::kUint32: return 0xFFFFFFFF;
    case formats::DType::kInt64: return 0x7FFFFFFFFFFFFFFF;
    case formats::DType::kUint64: return ~uint64_t{0};
    default: return std::nullopt;
  }
}

Result<std::shared_ptr<const TokenRows>> TokenRows::Build(const TokensSpec& tokens, const ShuffleSpec& shuffle,
                                                          const std::vector<Dataset>& datasets,
                                                          const std::vector<uint64_t>& doc_tokens,
                                                          const std::function<std::string(uint64_t)>& describe_doc,
                                                          Diagnostics& diags) {
  std::shared_ptr<TokenRows> rows(new TokenRows());
  TokenRows& r = *rows;
  r.mode_ = tokens.mode;
  r.sequence_length_ = static_cast<uint64_t>(tokens.sequence_length);
  r.window_ = static_cast<uint64_t>(std::max<int64_t>(1, tokens.window));
  r.packing_ = tokens.packing;
  r.shuffle_mode_ = shuffle.mode;
  r.has_eod_ = tokens.end_of_document.has_value();
  r.append_eod_ = r.has_eod_ && tokens.end_of_document->append == EodAppend::kAlways;
  r.eod_token_ = r.has_eod_ ? static_cast<uint64_t>(tokens.end_of_document->token) : 0;
  r.pad_token_ = static_cast<uint64_t>(tokens.pad_token);

  // Documents a row cannot hold a piece of, or that the job refuses.
  const uint64_t limit = tokens.max_document_tokens ? static_cast<uint64_t>(*tokens.max_document_tokens) : 0;
  size_t reported = 0, refused = 0;
  for (const Dataset& ds : datasets) {
    for (uint64_t i = ds.first; i < ds.first + ds.count; ++i) {
      const uint64_t n = doc_tokens[i];
      std::string why;
      if (limit > 0 && n > limit) {
        why = "has " + std::to_string(n) + " tokens, more than spec.tokens.maxDocumentTokens (" +
              std::to_string(limit) + ")";
      } else if (n > kMaxPieceTokens - 1) {
        why =
            "has " + std::to_string(n) + " tokens; a document may have at most " + std::to_string(kMaxPieceTokens - 1);
      }
      if (why.empty()) continue;
      if (++refused <= kMaxReported) {
        diags.Add(ds.path, "document " + std::to_string(i - ds.first) + " (" + describe_doc(i) + ") " + why);
        ++reported;
      }
    }
  }
  if (refused > reported) {
    diags.Add("spec.tokens.maxDocumentTokens",
              std::to_string(refused - reported) + " more documents are longer than the job allows");
  }
  if (refused > 0) return InvalidArgument("documents longer than the job allows", "spec.tokens");

  for (const Dataset& ds : datasets) {
    Stats st;
    r.chunk_first_.push_back(r.chunk_begin_.size() - 1);
    if (r.mode_ == TokensMode::kConcatenate) {
      r.BuildConcatenate(ds, doc_tokens, st);
    } else {
      r.BuildPack(ds, doc_tokens, st);
    }
    if (st.rows == 0) {
      diags.Add(ds.path, "its " + std::to_string(ds.count) + " documents make no row of " +
                             std::to_string(r.row_tokens()) + " tokens (spec.tokens.sequenceLength " +
                             std::to_string(r.sequence_length_) + ")");
    }
    r.row_first_.push_back(r.row_first_.back() + st.rows);
    r.stats_.push_back(st);
  }
  if (!diags.ok()) return InvalidArgument("the documents make no rows", "spec.tokens");

  uint64_t h = HashStep(static_cast<uint64_t>(r.mode_), r.sequence_length_);
  h = HashStep(h, r.has_eod_ ? r.eod_token_ + 1 : 0);
  h = HashStep(h, r.append_eod_);
  h = HashStep(h, r.pad_token_);
  for (uint64_t c : r.chunk_begin_) h = HashStep(h, c);
  for (const RowPiece& p : r.pieces_)
    h = HashStep(HashStep(h, p.doc), (uint64_t{p.offset} << 32) | (p.tokens << 1) | p.eod);
  r.fingerprint_ = h;
  return std::shared_ptr<const TokenRows>(std::move(rows));
}

void TokenRows::AddPiece(uint64_t doc, uint64_t len, uint64_t done, uint64_t take) {
  RowPiece p;
  p.doc = doc;
  if (done < len) {
    p.offset = static_cast<uint32_t>(done);
    p.tokens = static_cast<uint32_t>(std::min(take, len - done));
    p.eod = done + take > len ? 1 : 0;
  } else {  // only the appended end-of-document token
    p.offset = static_cast<uint32_t>(len);
    p.tokens = 0;
    p.eod = 1;
  }
  pieces_.push_back(p);
}

void TokenRows::BuildConcatenate(const Dataset& ds, const std::vector<uint64_t>& doc_tokens, Stats& st) {
  const uint64_t T = sequence_length_;
  const uint64_t first_piece = pieces_.size();
  const DocumentOrder order(shuffle_mode_, ds.seed, window_, ds.count);
  std::vector<uint64_t> docs;
  uint64_t fill = 0;    // tokens in the current chunk
  uint64_t stream = 0;  // M so far
  for (uint64_t w = 0; w * window_ < ds.count; ++w) {
    order.Range(w * window_, static_cast<size_t>(std::min(window_, ds.count - w * window_)), docs);
    for (uint64_t local : docs) {
      const uint64_t doc = ds.first + local;
      const uint64_t len = doc_tokens[doc];
      const uint64_t total = len + (append_eod_ ? 1 : 0);
      uint64_t done = 0;
      int pieces = 0;
      while (done < total) {
        const uint64_t take = std::min(total - done, T - fill);
        AddPiece(doc, len, done, take);
        ++pieces;
        done += take;
        fill += take;
        if (fill == T) {
          chunk_begin_.push_back(pieces_.size());
          fill = 0;
        }
      }
      if (pieces > 1) ++st.split;
      stream += total;
    }
  }
  if (fill > 0) chunk_begin_.push_back(pieces_.size());
  st.rows = stream >= 1 ? (stream - 1) / T : 0;
  st.tokens = st.rows > 0 ? st.rows * T + 1 : 0;
  st.dropped = stream - st.tokens;
  st.pieces = pieces_.size() - first_piece;
  // Documents in rows: every one whose first token (its first piece's, at
  // offset 0) is at most stream position R·T; the tail after it is shorter
  // than T, so the walk back from the end is short.
  uint64_t at = stream;
  uint64_t outside = 0, with_tokens = 0;
  for (uint64_t i = pieces_.size(); i-- > first_piece && at > st.tokens;) {
    const RowPiece& p = pieces_[i];
    at -= p.row_tokens();
    if (p.offset == 0 && at >= st.tokens) ++outside;
  }
  for (uint64_t i = first_piece; i < pieces_.size(); ++i) with_tokens += pieces_[i].offset == 0;
  st.documents = with_tokens - outside;
}

void TokenRows::BuildPack(const Dataset& ds, const std::vector<uint64_t>& doc_tokens, Stats& st) {
  const uint64_t T = sequence_length_;
  const uint64_t first_piece = pieces_.size();
  const DocumentOrder order(shuffle_mode_, ds.seed, window_, ds.count);
  struct Item {
    uint64_t doc;
    uint64_t len;   // the document's tokens
    uint64_t done;  // item tokens before this one (the full rows before it)
    uint64_t size;  // tokens to place, 1..T
  };
  std::vector<uint64_t> docs;
  std::vector<Item> items;
  std::vector<size_t> sequence;                  // items in placement order
  std::vector<uint64_t> row_of;                  // per item: its packed row
  std::vector<uint64_t> room;                    // per packed row
  std::vector<size_t> row_count;                 // per packed row: items placed
  std::set<std::pair<uint64_t, uint64_t>> best;  // BestFit: (room, row) of open rows with room
  EarliestRoom earliest;
  for (uint64_t w = 0; w * window_ < ds.count; ++w) {
    order.Range(w * window_, static_cast<size_t>(std::min(window_, ds.count - w * window_)), docs);
    items.clear();
    for (uint64_t local : docs) {
      const uint64_t doc = ds.first + local;
      const uint64_t len = doc_tokens[doc];
      const uint64_t total = len + (append_eod_ ? 1 : 0);
      if (total == 0) continue;
      ++st.documents;
      uint64_t done = 0;
      while (total - done > T) {  // a full row of its own
        AddPiece(doc, len, done, T);
        chunk_begin_.push_back(pieces_.size());
        ++st.rows;
        done += T;
      }
      if (done > 0) ++st.split;
      items.push_back({doc, len, done, total - done});
      st.tokens += total;
    }
    // Placement.
    sequence.resize(items.size());
    std::iota(sequence.begin(), sequence.end(), size_t{0});
    if (packing_ == PackingAlgorithm::kBestFit) {
      std::stable_sort(sequence.begin(), sequence.end(),
                       [&](size_t a, size_t b) { return items[a].size > items[b].size; });
    }
    row_of.assign(items.size(), 0);
    room.clear();
    best.clear();
    if (packing_ == PackingAlgorithm::kFirstFit) earliest.Reset(items.size());
    for (size_t k : sequence) {
      const uint64_t need = items[k].size;
      int64_t row = -1;
      if (packing_ == PackingAlgorithm::kBestFit) {
        auto it = best.lower_bound({need, 0});
        if (it != best.end()) {
          row = static_cast<int64_t>(it->second);
          best.erase(it);
        }
      } else {
        row = earliest.Find(need);
      }
      if (row < 0) {
        row = static_cast<int64_t>(room.size());
        room.push_back(T);
      }
      const size_t ri = static_cast<size_t>(row);
      room[ri] -= need;
      row_of[k] = ri;
      if (packing_ == PackingAlgorithm::kBestFit) {
        if (room[ri] > 0) best.insert({room[ri], ri});
      } else {
        earliest.Set(ri, room[ri]);
      }
    }
    // The packed rows' pieces: rows in opening order, each row's items in
    // placement order (a counting sort of the placement sequence by row).
    row_count.assign(room.size() + 1, 0);
    for (size_t k : sequence) ++row_count[row_of[k] + 1];
    for (size_t i = 1; i < row_count.size(); ++i) row_count[i] += row_count[i - 1];
    std::vector<size_t> placed(items.size());
    for (size_t k : sequence) placed[row_count[row_of[k]]++] = k;
    size_t next = 0;
    for (size_t ri = 0; ri < room.size(); ++ri) {
      for (; next < placed.size() && row_of[placed[next]] == ri; ++next) {
        const Item& it = items[placed[next]];
        AddPiece(it.doc, it.len, it.done, it.size);
      }
      chunk_begin_.push_back(pieces_.size());
      st.padding += room[ri];
      ++st.rows;
    }
  }
  st.pieces = pieces_.size() - first_piece;
}

std::span<const RowPiece> TokenRows::StoredPieces(uint64_t r) const {
  const uint64_t c = ChunkOf(r);
  return {pieces_.data() + chunk_begin_[c], pieces_.data() + chunk_begin_[c + 1]};
}

void TokenRows::AppendPieces(uint64_t r, std::vector<RowPiece>& out) const {
  const uint64_t c = ChunkOf(r);
  out.insert(out.end(), pieces_.begin() + static_cast<std::ptrdiff_t>(chunk_begin_[c]),
             pieces_.begin() + static_cast<std::ptrdiff_t>(chunk_begin_[c + 1]));
  if (mode_ == TokensMode::kConcatenate) {
    // The row's last token: the next chunk's first.
    RowPiece p = pieces_[chunk_begin_[c + 1]];
    if (p.tokens > 0) {
      p.tokens = 1;
      p.eod = 0;
    }
    out.push_back(p);
  }
}

uint64_t TokenRows::TokensOf(uint64_t r) const {
  if (mode_ == TokensMode::kConcatenate) return row_tokens();
  uint64_t n = 0;
  for (const RowPiece& p : StoredPieces(r)) n += p.row_tokens();
  return n;
}

}  // namespace meshload::planner
