/// \file
/// Synthetic datasets whose bytes encode each sample's index, so a consumer
/// can verify every byte it receives against the plan.
///
/// The pattern (stable: tests and docs rely on it):
///   FixedRecord, Npy  byte j of sample i is byte (j mod 8) of the
///                     little-endian word W(i, j div 8), with W(i, 0) = i and
///                     W(i, k) = Mix64(i · 0x9E3779B97F4A7C15 + k) for k > 0;
///   TokenStream       token g of the stream is Mix64(g) truncated to the
///                     token's width (so sample i, tokens [iT, iT+T+1),
///                     encodes its start).
///   MegatronIndexed   sequence i has SyntheticSequenceLength(i) tokens (0 for
///                     one in 16, else 1 to 2048, from Mix64 of i), token t of it is
///                     Mix64(i · 2^32 + t) truncated to the token's width
///                     (default uint16); each sequence is its own document;
///                     files are part-NNNNN.bin with part-NNNNN.idx, the
///                     index as Megatron-LM's builder writes it.
///   WebDataset        shards part-NNNNN.tar (with Energon's .tar.idx) of
///                     samples `sampleNNNNNNNNN`, a member per field: a
///                     decoded field is the text of a number (Mix64 of
///                     i · 16 + field: mod 100 for integers, mod 1000 / 4
///                     for floats), a field of bytes 256 to 8192 bytes of the
///                     FixedRecord pattern of i · 16 + field;
///   MDS               index.json with raw shards shard.NNNNN.mds, a column
///                     per field (the same values: a scalar column of its
///                     dtype, or bytes).
///
/// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "planner/dataset_index.h"
#include "planner/spec.h"

namespace meshload::tools {

/// Writes a dataset of `samples` samples in the format of `spec` into
/// directory `dir` (created if needed; existing dataset files there are
/// replaced), split over `files` files (a TokenStream sample may straddle
/// two), and returns the URI to put in spec.dataset.uri. Npy needs
/// recordBytes (bytes per sample) and a dtype whose size divides it
/// (default uint8).
Result<std::string> GenerateSyntheticDataset(const planner::DatasetSpec& spec, const std::string& dir, uint64_t samples,
                                             int files);

/// The bytes a sample of `spec` takes in a generated dataset (the mean, for
/// MegatronIndexed); 0 for a format meshload generates no data of.
uint64_t SyntheticSampleBytes(const planner::DatasetSpec& spec);

/// The tokens of sequence `id` of a generated MegatronIndexed dataset.
uint64_t SyntheticSequenceLength(uint64_t id);

/// Checks that `bytes` (index.SampleBytes(id) long) are sample `id` of a generated
/// dataset described by `index` (a mixture's: of its dataset, generated on its own). Returns the byte offset of the
/// first mismatch, or -1 when every byte matches.
int64_t FirstMismatch(const planner::DatasetIndex& index, uint64_t id, const uint8_t* bytes);

}  // namespace meshload::tools
