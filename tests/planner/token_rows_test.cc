// Rows of tokens (planner/token_rows.h, spec.tokens): the rows' invariants
// over random documents and specs (coverage, lengths, windows, document
// order), known rows that pin the contract, and the shard planner's batches
// of rows on several meshes and after a resume.

#include "planner/token_rows.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "planner/sampler.h"
#include "planner/shard_planner.h"
#include "tests/testing/job_fixtures.h"
#include "tests/testing/status_matchers.h"

namespace meshload::planner {
namespace {

using ::testing::HasSubstr;
using testing::MakeMegatronPlanner;

constexpr uint64_t kEod = 0xFFFFFFFFFFFFull;  // a token id no document token is

// One token of a row: (document, its token) or the end-of-document token.
struct Token {
  uint64_t doc;
  uint64_t at;  // kEod for the end-of-document token
  bool operator==(const Token&) const = default;
};

std::vector<Token> Expand(const std::vector<RowPiece>& pieces) {
  std::vector<Token> out;
  for (const RowPiece& p : pieces) {
    for (uint32_t k = 0; k < p.tokens; ++k) out.push_back({p.doc, p.offset + uint64_t{k}});
    if (p.eod) out.push_back({p.doc, kEod});
  }
  return out;
}

std::vector<RowPiece> PiecesOf(const TokenRows& rows, uint64_t r) {
  std::vector<RowPiece> out;
  rows.AppendPieces(r, out);
  return out;
}

JobSpec TokensJob(TokensMode mode, int64_t T, int64_t window, bool eod, ShuffleMode shuffle, uint64_t seed) {
  JobSpec spec;
  spec.mesh.processes = 1;
  spec.mesh.devices_per_process = 1;
  spec.mesh.axes = {{"data", 1}};
  spec.batch.global_batch_size = 1;
  spec.strategy = Strategy::kPerProcess;
  spec.shuffle.mode = shuffle;
  spec.shuffle.seed = seed;
  TokensSpec t;
  t.mode = mode;
  t.sequence_length = T;
  t.window = window;
  if (eod) t.end_of_document = EndOfDocument{7, EodAppend::kAlways};
  spec.tokens = t;
  return spec;
}

// The documents in the dataset's document order (token_rows.h).
std::vector<uint64_t> DocumentOrder(const JobSpec& spec, uint64_t docs) {
  std::vector<uint64_t> out(docs);
  if (spec.shuffle.mode == ShuffleMode::kNone) {
    for (uint64_t k = 0; k < docs; ++k) out[k] = k;
    return out;
  }
  ShuffleSpec s;
  s.mode = ShuffleMode::kBlock;
  s.seed = DocumentOrderSeed(spec.shuffle.seed);
  s.block_size = spec.tokens->window;
  s.block_size_set = true;
  EpochPermutation perm(s, docs, 0);
  for (uint64_t k = 0; k < docs; ++k) out[k] = perm.At(k);
  return out;
}

std::vector<int32_t> RandomLengths(std::mt19937_64& rng, size_t n, int32_t T) {
  std::vector<int32_t> out(n);
  for (int32_t& len : out) {
    switch (rng() % 8) {
      case 0: len = 0; break;                                              // Megatron allows empty sequences
      case 1: len = static_cast<int32_t>(T + rng() % (3 * T + 1)); break;  // longer than a row
      default: len = static_cast<int32_t>(1 + rng() % T); break;
    }
  }
  return out;
}

TEST(TokenRowsConcatenate, EveryTokenOnceInDocumentOrderWithRowsOverlappingByOne) {
  std::mt19937_64 rng(37);
  for (int round = 0; round < 60; ++round) {
    const int64_t T = 1 + static_cast<int64_t>(rng() % 40);
    const int64_t W = 1 + static_cast<int64_t>(rng() % 12);
    const bool eod = rng() % 2;
    const ShuffleMode shuffle = static_cast<ShuffleMode>(rng() % 3);
    std::vector<int32_t> lengths = RandomLengths(rng, 20 + rng() % 60, static_cast<int32_t>(T));
    lengths.push_back(static_cast<int32_t>(3 * T));  // at least a few rows
    const JobSpec spec = TokensJob(TokensMode::kConcatenate, T, W, eod, shuffle, rng() % 1000);
    const ShardPlanner planner = MakeMegatronPlanner(spec, lengths);
    const TokenRows& rows = *planner.job().dataset.token_rows();
    SCOPED_TRACE("round " + std::to_string(round) + " T=" + std::to_string(T) + " W=" + std::to_string(W));

    // The stream: the documents in their order, each with its token.
    std::vector<Token> stream;
    for (uint64_t doc : DocumentOrder(spec, lengths.size())) {
      for (int32_t k = 0; k < lengths[doc]; ++k) stream.push_back({doc, static_cast<uint64_t>(k)});
      if (eod) stream.push_back({doc, kEod});
    }
    const uint64_t R = (stream.size() - 1) / static_cast<uint64_t>(T);
    ASSERT_EQ(rows.rows(), R);
    ASSERT_EQ(planner.job().samples, R);
    for (uint64_t r = 0; r < R; ++r) {
      const std::vector<Token> row = Expand(PiecesOf(rows, r));
      ASSERT_EQ(row.size(), static_cast<size_t>(T + 1)) << "row " << r;
      const std::vector<Token> want(stream.begin() + static_cast<ptrdiff_t>(r * T),
                                    stream.begin() + static_cast<ptrdiff_t>(r * T + T + 1));
      ASSERT_EQ(row, want) << "row " << r;
      EXPECT_EQ(rows.TokensOf(r), static_cast<uint64_t>(T + 1));
    }
    const TokenRows::Stats& st = rows.stats(0);
    EXPECT_EQ(st.rows, R);
    EXPECT_EQ(st.tokens, R * T + 1);
    EXPECT_EQ(st.dropped, stream.size() - (R * T + 1));
    EXPECT_LT(st.dropped, static_cast<uint64_t>(T));
    // Documents with a token in some row: those starting at most at R·T.
    std::set<uint64_t> in_rows;
    for (uint64_t p = 0; p <= R * T; ++p) in_rows.insert(stream[p].doc);
    EXPECT_EQ(st.documents, in_rows.size());
  }
}

// Pack: every document once, whole, in order; rows within the length;
// documents longer than a row in full rows first; a row's documents from
// one window.
TEST(TokenRowsPack, EveryDocumentOnceAndNoRowOverTheLength) {
  std::mt19937_64 rng(38);
  for (int round = 0; round < 60; ++round) {
    const int64_t T = 1 + static_cast<int64_t>(rng() % 40);
    const int64_t W = 1 + static_cast<int64_t>(rng() % 12);
    const bool eod = rng() % 2;
    const ShuffleMode shuffle = static_cast<ShuffleMode>(rng() % 3);
    JobSpec spec = TokensJob(TokensMode::kPack, T, W, eod, shuffle, rng() % 1000);
    spec.tokens->packing = rng() % 2 ? PackingAlgorithm::kBestFit : PackingAlgorithm::kFirstFit;
    std::vector<int32_t> lengths = RandomLengths(rng, 20 + rng() % 60, static_cast<int32_t>(T));
    lengths.push_back(static_cast<int32_t>(T));
    const ShardPlanner planner = MakeMegatronPlanner(spec, lengths);
    const TokenRows& rows = *planner.job().dataset.token_rows();
    SCOPED_TRACE("round " + std::to_string(round) + " T=" + std::to_string(T) + " W=" + std::to_string(W) +
                 (spec.tokens->packing == PackingAlgorithm::kBestFit ? " BestFit" : " FirstFit"));
    const std::vector<uint64_t> order = DocumentOrder(spec, lengths.size());
    std::vector<uint64_t> window_of(lengths.size());
    for (uint64_t k = 0; k < order.size(); ++k) window_of[order[k]] = k / static_cast<uint64_t>(W);

    std::map<uint64_t, std::vector<Token>> seen;  // by document, in row order
    std::map<uint64_t, std::vector<uint64_t>> rows_of;
    uint64_t padding = 0, last_window = 0;
    for (uint64_t r = 0; r < rows.rows(); ++r) {
      const std::vector<RowPiece> pieces = PiecesOf(rows, r);
      ASSERT_FALSE(pieces.empty()) << "row " << r;
      uint64_t used = 0;
      for (const RowPiece& p : pieces) {
        used += p.row_tokens();
        EXPECT_EQ(window_of[p.doc], window_of[pieces[0].doc]) << "row " << r << " mixes windows";
        const std::vector<Token> t = Expand({p});
        seen[p.doc].insert(seen[p.doc].end(), t.begin(), t.end());
        rows_of[p.doc].push_back(r);
      }
      ASSERT_LE(used, static_cast<uint64_t>(T)) << "row " << r;
      EXPECT_EQ(rows.TokensOf(r), used);
      padding += static_cast<uint64_t>(T) - used;
      // Windows follow one another.
      EXPECT_GE(window_of[pieces[0].doc], last_window);
      last_window = window_of[pieces[0].doc];
    }
    for (uint64_t doc = 0; doc < lengths.size(); ++doc) {
      std::vector<Token> want;
      for (int32_t k = 0; k < lengths[doc]; ++k) want.push_back({doc, static_cast<uint64_t>(k)});
      if (eod) want.push_back({doc, kEod});
      EXPECT_EQ(seen[doc], want) << "document " << doc;
      // A split document: its full rows are consecutive and first.
      const std::vector<uint64_t>& in = rows_of[doc];
      for (size_t k = 1; k + 1 < in.size(); ++k) EXPECT_EQ(in[k], in[k - 1] + 1) << "document " << doc;
    }
    EXPECT_EQ(rows.stats(0).padding, padding);
  }
}

// What the step loader reads without copying (StoredPieces) and asks the
// cache for (Prefetch) is each row's pieces, for one dataset and for
// several (rows found by a search over the datasets' first rows).
TEST(TokenRows, StoredPiecesAndPrefetchSeeEachRowsPieces) {
  std::mt19937_64 rng(41);
  for (int round = 0; round < 24; ++round) {
    TokensSpec t;
    t.mode = round % 2 ? TokensMode::kPack : TokensMode::kConcatenate;
    t.sequence_length = 1 + static_cast<int64_t>(rng() % 30);
    t.window = 1 + static_cast<int64_t>(rng() % 8);
    t.end_of_document = EndOfDocument{7, EodAppend::kAlways};
    ShuffleSpec shuffle;
    shuffle.mode = ShuffleMode::kGlobal;
    std::vector<uint64_t> doc_tokens;
    std::vector<TokenRows::Dataset> datasets;
    const size_t count = 1 + round % 3;
    for (size_t d = 0; d < count; ++d) {
      const uint64_t first = doc_tokens.size(), n = 10 + rng() % 40;
      for (int32_t len : RandomLengths(rng, n, static_cast<int32_t>(t.sequence_length))) doc_tokens.push_back(len);
      doc_tokens.push_back(static_cast<uint64_t>(t.sequence_length));  // every dataset makes a row
      datasets.push_back({first, n + 1, rng(), "spec.mixture.datasets[" + std::to_string(d) + "]"});
    }
    Diagnostics diags;
    auto built = TokenRows::Build(
        t, shuffle, datasets, doc_tokens, [](uint64_t d) { return std::to_string(d); }, diags);
    ASSERT_OK(built.status());
    ASSERT_TRUE(diags.ok());
    const TokenRows& rows = **built;
    SCOPED_TRACE("round " + std::to_string(round));
    std::vector<uint64_t> ids, want_docs;
    for (uint64_t r = 0; r < rows.rows(); ++r) {
      std::vector<RowPiece> want = PiecesOf(rows, r);
      if (t.mode == TokensMode::kConcatenate) want.pop_back();  // the next chunk's first token
      const std::span<const RowPiece> stored = rows.StoredPieces(r);
      EXPECT_EQ(std::vector<RowPiece>(stored.begin(), stored.end()), want) << "row " << r;
      if (r % 3 == 0) {
        ids.push_back(r);
        for (const RowPiece& p : want) want_docs.push_back(p.doc);
      }
    }
    std::vector<uint64_t> docs;
    rows.Prefetch(ids.data(), ids.size(), [&docs](uint64_t d) { docs.push_back(d); });
    EXPECT_EQ(docs, want_docs);
  }
}

// A packed row's segment_ids and positions as token_rows.h defines them,
// for rows of every length up to past a vector's width, every entry
// written (the buffers start as neither 0 nor a valid id).
TEST(TokenRowsPack, PackedFieldsFollowTheRowsPieces) {
  std::mt19937_64 rng(43);
  for (int round = 0; round < 400; ++round) {
    const uint64_t T = round < 100 ? 1 + round : 1 + rng() % 5000;
    std::vector<RowPiece> pieces;
    uint64_t used = 0;
    while (used < T && rng() % 5 != 0) {
      RowPiece p;
      p.doc = rng() % 100;
      p.tokens = static_cast<uint32_t>(rng() % (T - used + 1));
      p.eod = p.tokens < T - used && rng() % 2;
      if (p.row_tokens() == 0) continue;
      pieces.push_back(p);
      used += p.row_tokens();
    }
    std::vector<int32_t> want_seg(T, 0), want_pos(T, 0);
    uint64_t at = 0;
    for (size_t j = 0; j < pieces.size(); ++j) {
      for (uint32_t k = 0; k < pieces[j].row_tokens(); ++k, ++at) {
        want_seg[at] = static_cast<int32_t>(j + 1);
        want_pos[at] = static_cast<int32_t>(k);
      }
    }
    // One element of slack on each side, which must stay untouched.
    std::vector<int32_t> seg(T + 2, -5), pos(T + 2, -5);
    WritePackedFields(pieces.data(), pieces.size(), T, seg.data() + 1, pos.data() + 1);
    SCOPED_TRACE("round " + std::to_string(round) + ", T=" + std::to_string(T));
    EXPECT_EQ(std::vector<int32_t>(seg.begin() + 1, seg.end() - 1), want_seg);
    EXPECT_EQ(std::vector<int32_t>(pos.begin() + 1, pos.end() - 1), want_pos);
    EXPECT_EQ(seg.front(), -5);
    EXPECT_EQ(seg.back(), -5);
    EXPECT_EQ(pos.front(), -5);
    EXPECT_EQ(pos.back(), -5);
  }
}

// The contract, pinned: known documents give these rows.
TEST(TokenRowsPack, BestFitAndFirstFitPlaceAsDocumented) {
  // Window order = index order (shuffle None), one window, T = 8, no
  // end-of-document token. Lengths 5, 3, 6, 2, 1, 11 (= 8 + 3).
  const std::vector<int32_t> lengths = {5, 3, 6, 2, 1, 11};
  auto rows_of = [&](PackingAlgorithm a) {
    JobSpec spec = TokensJob(TokensMode::kPack, 8, 16, false, ShuffleMode::kNone, 0);
    spec.tokens->packing = a;
    const ShardPlanner planner = MakeMegatronPlanner(spec, lengths);
    const TokenRows& rows = *planner.job().dataset.token_rows();
    std::vector<std::vector<std::pair<uint64_t, uint32_t>>> out;  // (doc, tokens) per row
    for (uint64_t r = 0; r < rows.rows(); ++r) {
      out.emplace_back();
      for (const RowPiece& p : PiecesOf(rows, r)) out.back().emplace_back(p.doc, p.tokens);
    }
    return out;
  };
  using Row = std::vector<std::pair<uint64_t, uint32_t>>;
  // Document 5's first 8 tokens make a full row; its other 3 are an item.
  // BestFit, longest first (ties in window order): doc 2's 6 (new row A,
  // room 2), doc 0's 5 (new row B, room 3), doc 1's 3 (B, exactly), doc 5's
  // 3 (no room: new row C, room 5), doc 3's 2 (A, exactly), doc 4's 1 (C).
  EXPECT_EQ(rows_of(PackingAlgorithm::kBestFit),
            (std::vector<Row>{{{5, 8}}, {{2, 6}, {3, 2}}, {{0, 5}, {1, 3}}, {{5, 3}, {4, 1}}}));
  // FirstFit, window order: 5 (A), 3 (A, full), 6 (B), 2 (B, full), 1 (C),
  // 3 of doc 5 (C).
  EXPECT_EQ(rows_of(PackingAlgorithm::kFirstFit),
            (std::vector<Row>{{{5, 8}}, {{0, 5}, {1, 3}}, {{2, 6}, {3, 2}}, {{4, 1}, {5, 3}}}));
}

TEST(TokenRowsConcatenate, KnownRowsWithEndOfDocumentTokens) {
  // Documents of 3 and 2 tokens and an empty one, each followed by the end
  // token: stream d0 d0 d0 E d1 d1 E E (8 tokens); T = 3: rows [0, 4), [3, 7).
  const ShardPlanner planner =
      MakeMegatronPlanner(TokensJob(TokensMode::kConcatenate, 3, 4, true, ShuffleMode::kNone, 0), {3, 2, 0});
  const TokenRows& rows = *planner.job().dataset.token_rows();
  ASSERT_EQ(rows.rows(), 2u);
  EXPECT_EQ(Expand(PiecesOf(rows, 0)), (std::vector<Token>{{0, 0}, {0, 1}, {0, 2}, {0, kEod}}));
  EXPECT_EQ(Expand(PiecesOf(rows, 1)), (std::vector<Token>{{0, kEod}, {1, 0}, {1, 1}, {1, kEod}}));
  EXPECT_EQ(rows.stats(0).dropped, 1u);  // the empty document's end token
  EXPECT_EQ(rows.stats(0).documents, 2u);
}

// The rows are part of the contract: a resumed job on another release must
// read the same rows. These values were computed once; a change is a new
// contract version, not an edit.
TEST(TokenRows, TheRowsAreAStableContract) {
  std::mt19937_64 rng(41);
  std::vector<int32_t> lengths(500);
  for (int32_t& len : lengths) len = static_cast<int32_t>(rng() % 300);
  JobSpec concat = TokensJob(TokensMode::kConcatenate, 128, 64, true, ShuffleMode::kGlobal, 5);
  JobSpec pack = TokensJob(TokensMode::kPack, 128, 64, true, ShuffleMode::kGlobal, 5);
  const ShardPlanner a = MakeMegatronPlanner(concat, lengths);
  const ShardPlanner b = MakeMegatronPlanner(pack, lengths);
  EXPECT_EQ(a.job().dataset.token_rows()->fingerprint(), 1058877125101610018u) << "Concatenate";
  EXPECT_EQ(b.job().dataset.token_rows()->fingerprint(), 4191073108531450082u) << "Pack";
}

// Batches of rows are batches of samples: the same global batch for any
// process count, and a planner made afresh at a step (a resume) gives it.
// The global batches of rows, for 4, 8 and 16 processes and after a
// resume (a new planner, its rows rebuilt from the index at step 40), are
// the same, over one corpus and over a mixture of three.
TEST(TokenRowsPlanner, TheSameGlobalBatchesOn4And8And16ProcessesAndAfterAResume) {
  std::mt19937_64 rng(39);
  const std::vector<int32_t> lengths = testing::RandomDocumentLengths(rng, 3000, 200);
  std::vector<std::vector<int32_t>> corpora;
  for (int32_t typical : {200, 60, 900}) corpora.push_back(testing::RandomDocumentLengths(rng, 1500, typical));
  auto global_batch = [](const ShardPlanner& planner, int64_t step) {
    // What the devices hold, shard by shard.
    const StepPlan plan = planner.PlanStep(step, planner.DefaultLoading());
    std::vector<uint64_t> global;
    for (const DevicePlan& d : plan.devices) global.insert(global.end(), d.samples.begin(), d.samples.end());
    return global;
  };
  for (const bool mixture : {false, true}) {
    for (TokensMode mode : {TokensMode::kConcatenate, TokensMode::kPack}) {
      SCOPED_TRACE(std::string(mixture ? "a mixture, " : "one corpus, ") +
                   (mode == TokensMode::kPack ? "Pack" : "Concatenate"));
      auto make = [&](int64_t P, int64_t resume) {
        JobSpec spec = TokensJob(mode, 256, 128, true, ShuffleMode::kGlobal, 11);
        spec.mesh.processes = P;
        spec.mesh.devices_per_process = 2;
        spec.mesh.axes = {{"data", P * 2}};
        spec.batch.global_batch_size = 64;
        if (resume > 0) spec.resume.step = resume;
        return mixture ? testing::MakeMegatronMixturePlanner(spec, corpora, {0.5, 0.3, 0.2})
                       : MakeMegatronPlanner(spec, lengths);
      };
      std::map<int64_t, std::vector<std::vector<uint64_t>>> by_step;
      for (int64_t P : {4, 8, 16}) {
        const ShardPlanner planner = make(P, 0);
        if (mixture) {
          ASSERT_EQ(planner.job().dataset.token_rows()->datasets(), 3u);
        }
        for (int64_t step : {0, 1, 17, 40}) by_step[step].push_back(global_batch(planner, step));
      }
      for (const auto& [step, batches] : by_step) {
        for (size_t k = 1; k < batches.size(); ++k) EXPECT_EQ(batches[k], batches[0]) << "step " << step;
      }
      const ShardPlanner resumed = make(4, 40);
      EXPECT_EQ(resumed.GlobalBatch(40), make(4, 40).GlobalBatch(40));
      EXPECT_EQ(global_batch(resumed, 40), by_step[40][0]);
      if (mixture) {
        // Every dataset is in the batches.
        std::set<size_t> parts;
        for (uint64_t id : by_step[17][0]) parts.insert(resumed.job().dataset.PartOf(id));
        EXPECT_EQ(parts.size(), 3u);
      }
    }
  }
}

TEST(TokenRowsPlanner, RowsAreDenseSamplesOfTheirTokens) {
  std::mt19937_64 rng(40);
  const std::vector<int32_t> lengths = testing::RandomDocumentLengths(rng, 400, 100);
  const ShardPlanner concat =
      MakeMegatronPlanner(TokensJob(TokensMode::kConcatenate, 64, 32, true, ShuffleMode::kGlobal, 1), lengths);
  EXPECT_FALSE(concat.job().dataset.variable_size());
  EXPECT_EQ(concat.job().dataset.sample_bytes(), 65u * 2);  // uint16 tokens
  EXPECT_EQ(concat.job().dataset.sample_shape(), (std::vector<uint64_t>{65}));
  const ShardPlanner pack =
      MakeMegatronPlanner(TokensJob(TokensMode::kPack, 64, 32, true, ShuffleMode::kGlobal, 1), lengths);
  EXPECT_EQ(pack.job().dataset.sample_bytes(), 64u * 2);
  // A row's bytes come from its documents: the extents of a row are its
  // pieces' tokens (no end-of-document or pad token is read).
  std::vector<Extent> extents;
  uint64_t tokens = 0;
  for (uint64_t r = 0; r < pack.job().samples; ++r) {
    extents.clear();
    pack.job().dataset.AppendExtents(r, extents);
    for (const Extent& e : extents) tokens += e.length / 2;
  }
  uint64_t all = 0;
  for (int32_t len : lengths) all += static_cast<uint64_t>(len);
  EXPECT_EQ(tokens, all);
}

TEST(TokenRowsErrors, ALongerDocumentThanTheJobAllowsIsNamed) {
  JobSpec spec = TokensJob(TokensMode::kPack, 16, 8, false, ShuffleMode::kNone, 0);
  spec.tokens->max_document_tokens = 40;
  Diagnostics d;
  EXPECT_FALSE(testing::ResolveMegatron(spec, {10, 41, 3, 40, 50}, d).ok());
  EXPECT_THAT(d.ToString(), HasSubstr("spec.dataset: document 1 (sequence 1 of /virtual/corpus.bin) has 41 tokens, "
                                      "more than spec.tokens.maxDocumentTokens (40)"));
  EXPECT_THAT(d.ToString(), HasSubstr("document 4 (sequence 4 of /virtual/corpus.bin) has 50 tokens"));
  EXPECT_THAT(d.ToString(), ::testing::Not(HasSubstr("document 3 ")));
}

TEST(TokenRowsErrors, TokensThatDoNotFitTheDatasetsDtype) {
  JobSpec spec = TokensJob(TokensMode::kPack, 16, 8, true, ShuffleMode::kNone, 0);
  spec.tokens->end_of_document->token = 70000;  // the fixture's tokens are uint16
  spec.tokens->pad_token = 65536;
  spec.tokens->pad_token_set = true;
  Diagnostics d;
  EXPECT_FALSE(testing::ResolveMegatron(spec, {10, 20}, d).ok());
  EXPECT_THAT(d.ToString(), HasSubstr("spec.tokens.endOfDocument.token: 70000 does not fit the dataset's uint16 "
                                      "tokens (0 to 65535)"));
  EXPECT_THAT(d.ToString(), HasSubstr("spec.tokens.padToken: 65536 does not fit"));
}

TEST(TokenRowsErrors, DocumentsThatMakeNoRow) {
  Diagnostics d;
  EXPECT_FALSE(
      testing::ResolveMegatron(TokensJob(TokensMode::kConcatenate, 64, 8, false, ShuffleMode::kNone, 0), {10, 20, 0}, d)
          .ok());
  EXPECT_THAT(d.ToString(), HasSubstr("spec.dataset: its 3 documents make no row of 65 tokens"));
}

TEST(TokenRowsErrors, FewerRowsThanABatch) {
  JobSpec spec = TokensJob(TokensMode::kPack, 8, 8, false, ShuffleMode::kNone, 0);
  spec.batch.global_batch_size = 4;
  Diagnostics d;
  EXPECT_FALSE(testing::ResolveMegatron(spec, {8, 8, 8}, d).ok());
  EXPECT_THAT(d.ToString(), HasSubstr("spec.tokens: the dataset has 3 rows, fewer than one global batch of 4"));
}

TEST(TokenRowsErrors, AVirtualDatasetHasNoRows) {
  JobSpec spec = TokensJob(TokensMode::kPack, 16, 8, true, ShuffleMode::kNone, 0);
  spec.dataset.format = DatasetFormat::kMegatronIndexed;
  spec.dataset.uri = "/virtual/corpus";
  spec.dataset.samples = 10;
  Diagnostics d;
  EXPECT_FALSE(ResolveJob(testing::MustValidate(spec), {}, d).ok());
  EXPECT_THAT(d.ToString(), HasSubstr("spec.tokens: the rows are cut from the documents' lengths"));
}

}  // namespace
}  // namespace meshload::planner
