/// \file
/// Rows of tokens (spec.tokens): the documents of a MegatronIndexed dataset
/// (each of a mixture's datasets on its own) turned into the fixed-size rows
/// a language model trains on. A row is a sample: the sampler orders rows,
/// the global batch is rows, the mesh shards rows, so everything the
/// planner promises about samples (order, shards, invariance under resume
/// and resize) holds for rows unchanged. docs/sampler.md "Rows of tokens" is
/// the contract; none of it may change between releases.
///
/// The rows are a pure function of (the documents' lengths, spec.tokens, the
/// dataset's seed): built once when the job is resolved, in one pass over
/// the documents (O(documents · log window) time, about 16 bytes per piece),
/// and never changed by the step, the epoch, the mesh or a restart.
///
///   Document order. Position k of the dataset's document order holds
///   document σ(k), σ the sampler's Block order (docs/sampler.md, "Modes")
///   of the documents with blockSize = window, seed DocumentOrderSeed(seed)
///   and epoch 0; the identity with spec.shuffle.mode None. A window is
///   positions [w·W, (w+1)·W) of that order.
///
///   Concatenate. The documents in that order, each followed by the
///   end-of-document token when endOfDocument.append is Always, form one
///   stream of M tokens; row r is stream tokens [r·T, r·T + T + 1), so a
///   row's last token is the next row's first, and R = floor((M − 1) / T).
///   The last M − R·T − 1 tokens (fewer than T) are in no row.
///
///   Pack. Window by window, each document's tokens (and its appended
///   end-of-document token) are an item. An item of more than T tokens
///   first gives rows of exactly T tokens, one after another (its pieces
///   continue in the next rows), and the rest of it (fewer than T, if any)
///   is packed like a whole document. The window's items are then placed by
///   `packing` (BestFit: longest first, ties in window order, each into the
///   open row with the least room that holds it, ties the earliest row, else
///   a new row; FirstFit: in window order, each into the earliest open row
///   with room, else a new row). The window's rows are its full rows, then
///   its packed rows in the order they were opened; inside a row, the
///   pieces in the order they were placed. A row's unused end is padding.
///   The rows of window w follow those of window w − 1.
///
/// In a packed row, piece j (from 0) is segment j + 1 over its tokens (its
/// end-of-document token included); padding is segment 0. Positions count
/// from 0 at the start of each piece (a document split over rows restarts
/// at 0 in each), and are 0 on padding.
///
/// Thread safety: immutable after Build(); const methods thread-safe.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/diagnostics.h"
#include "common/status.h"
#include "planner/spec.h"

namespace meshload::planner {

/// A run of one document's tokens inside a row: `tokens` tokens from token
/// `offset` of document `doc`, then, when `eod`, one end-of-document token.
struct RowPiece {
  uint64_t doc = 0;
  uint32_t offset = 0;
  uint32_t tokens : 31 = 0;
  uint32_t eod : 1 = 0;
  /// Tokens the piece takes in its row.
  uint32_t row_tokens() const { return tokens + eod; }
  bool operator==(const RowPiece& o) const {
    return doc == o.doc && offset == o.offset && tokens == o.tokens && eod == o.eod;
  }
};
static_assert(sizeof(RowPiece) == 16);

class TokenRows {
 public:
  /// One dataset's documents: ids [first, first + count) of the documents'
  /// index, in the order `seed` gives them.
  struct Dataset {
    uint64_t first = 0;
    uint64_t count = 0;
    uint64_t seed = 0;  // spec.shuffle.seed, or a mixture's dataset seed
    std::string path;   // for messages: spec.dataset or spec.mixture.datasets[d]
  };
  /// What the rows of one dataset hold.
  struct Stats {
    uint64_t rows = 0;
    uint64_t documents = 0;  // documents with at least one token in a row
    uint64_t tokens = 0;     // document and end-of-document tokens in rows (Concatenate: the overlap counted once)
    uint64_t padding = 0;    // Pack: padding tokens in all rows
    uint64_t dropped = 0;    // Concatenate: stream tokens in no row (fewer than T)
    uint64_t split = 0;      // documents whose pieces are in more than one row
    uint64_t pieces = 0;
  };

  /// Builds the rows of every dataset of `datasets` from the documents'
  /// token counts (`doc_tokens[i]`: document i's tokens, for i below the
  /// last dataset's end). Precondition: `tokens` and `shuffle` passed
  /// ValidateJobSpec. A document longer than maxDocumentTokens (or than
  /// 2^31 − 1 tokens) goes to `diags`, named by `describe_doc(i)`, and no
  /// rows are built.
  static Result<std::shared_ptr<const TokenRows>> Build(const TokensSpec& tokens, const ShuffleSpec& shuffle,
                                                        const std::vector<Dataset>& datasets,
                                                        const std::vector<uint64_t>& doc_tokens,
                                                        const std::function<std::string(uint64_t)>& describe_doc,
                                                        Diagnostics& diags);

  TokensMode mode() const { return mode_; }
  /// T.
  uint64_t sequence_length() const { return sequence_length_; }
  /// Tokens of every row: T + 1 (Concatenate) or T (Pack).
  uint64_t row_tokens() const { return mode_ == TokensMode::kConcatenate ? sequence_length_ + 1 : sequence_length_; }
  uint64_t rows() const { return row_first_.back(); }
  /// Dataset d's rows are [row_first(d), row_first(d + 1)).
  uint64_t row_first(size_t d) const { return row_first_[d]; }
  size_t datasets() const { return stats_.size(); }
  const Stats& stats(size_t d) const { return stats_[d]; }
  bool has_eod() const { return has_eod_; }
  uint64_t eod_token() const { return eod_token_; }
  /// endOfDocument.append is Never: the documents end with the token.
  bool eod_in_data() const { return has_eod_ && !append_eod_; }
  uint64_t pad_token() const { return pad_token_; }

  /// Appends row `r`'s pieces, in row order (their row_tokens() add up to
  /// row_tokens() less the row's padding). Precondition: r < rows().
  void AppendPieces(uint64_t r, std::vector<RowPiece>& out) const;
  /// Row `r`'s pieces as stored, not copied: a Pack row's pieces; a
  /// Concatenate row's without the last token AppendPieces adds (the next
  /// chunk's first). Precondition: r < rows().
  std::span<const RowPiece> StoredPieces(uint64_t r) const;
  /// Asks the CPU to bring rows `ids`' pieces into its cache (nothing
  /// else): a step's rows are in random places of an index of tens of
  /// megabytes, and their lookups, one after another, would each wait for
  /// memory. Calls `doc(d)` for the documents of those pieces it could
  /// already see (in the cache), so that the caller can do the same for its
  /// per-document data.
  template <typename DocumentHint>
  void Prefetch(const uint64_t* ids, size_t n, DocumentHint&& doc) const {
    // Two rounds, so that the misses of each round overlap: the rows'
    // places in chunk_begin_, then their pieces.
    for (size_t i = 0; i < n; ++i) __builtin_prefetch(&chunk_begin_[ChunkOf(ids[i])]);
    for (size_t i = 0; i < n; ++i) __builtin_prefetch(&pieces_[chunk_begin_[ChunkOf(ids[i])]]);
    for (size_t i = 0; i < n; ++i) {
      for (const RowPiece& p : StoredPieces(ids[i])) doc(p.doc);
    }
  }
  /// The tokens of row `r` that are not padding.
  uint64_t TokensOf(uint64_t r) const;
  /// A fingerprint of the rows (every piece), for processes that must agree.
  uint64_t fingerprint() const { return fingerprint_; }

 private:
  TokenRows() = default;
  // Row r's chunk (Concatenate) or its place in the piece arrays (Pack).
  uint64_t ChunkOf(uint64_t r) const {
    if (row_first_.size() == 2) return chunk_first_[0] + r;  // one dataset: no search
    const size_t d =
        static_cast<size_t>(std::upper_bound(row_first_.begin(), row_first_.end(), r) - row_first_.begin()) - 1;
    return chunk_first_[d] + (r - row_first_[d]);
  }
  void BuildConcatenate(const Dataset& ds, const std::vector<uint64_t>& doc_tokens, Stats& st);
  void BuildPack(const Dataset& ds, const std::vector<uint64_t>& doc_tokens, Stats& st);
  // Appends `take` tokens of item (document `doc` of `len` tokens, plus an
  // end-of-document token when appended) from item token `done` as one piece.
  void AddPiece(uint64_t doc, uint64_t len, uint64_t done, uint64_t take);

  TokensMode mode_ = TokensMode::kConcatenate;
  uint64_t sequence_length_ = 0;
  uint64_t window_ = 1;
  PackingAlgorithm packing_ = PackingAlgorithm::kBestFit;
  ShuffleMode shuffle_mode_ = ShuffleMode::kGlobal;
  bool has_eod_ = false;
  bool append_eod_ = false;
  uint64_t eod_token_ = 0;
  uint64_t pad_token_ = 0;
  // Concatenate: chunk c is stream tokens [c·T, (c+1)·T) (the last may be
  // short), its pieces pieces_[chunk_begin_[c], chunk_begin_[c + 1]); row r
  // is chunk r and the first token of chunk r + 1. Pack: the same arrays
  // hold row r's pieces directly. Per dataset, its chunks follow the
  // previous dataset's (dataset d's first is chunk_first_[d]).
  std::vector<RowPiece> pieces_;
  std::vector<uint64_t> chunk_begin_{0};
  std::vector<uint64_t> chunk_first_;
  std::vector<uint64_t> row_first_{0};
  std::vector<Stats> stats_;
  uint64_t fingerprint_ = 0;
};

/// Writes a packed row's `segment_ids` and `positions` (row_tokens entries
/// each) from its pieces, as the class comment defines them: piece j is
/// segment j + 1 over its row_tokens(), positions count from 0 in each
/// piece, and both are 0 on the padding after the last piece. Uses AVX2
/// where the CPU has it: these fields are four times a uint16 row's token
/// bytes, and SSE2's stores write them at half the rate.
void WritePackedFields(const RowPiece* pieces, size_t count, uint64_t row_tokens, int32_t* segment_ids,
                       int32_t* positions);

/// The largest token id a dataset of `dtype` holds (an integer type), or
/// nullopt for a type that holds no token ids (floats, bool).
std::optional<uint64_t> MaxTokenOf(formats::DType dtype);

/// The seed of a dataset's document order (docs/sampler.md).
uint64_t DocumentOrderSeed(uint64_t seed);

}  // namespace meshload::planner
