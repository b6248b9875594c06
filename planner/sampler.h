/// \file
/// The epoch permutation π_e of [0, N): which sample sits at each position of
/// epoch e, computable at any position in O(1) time and memory (N may be
/// 10^10; nothing is stored).
///
/// Global mode: a 4-round keyed Feistel network on the smallest power-of-two
/// domain 2^k >= N (unbalanced halves of ceil(k/2) and floor(k/2) bits that
/// alternate each round), restricted to [0, N) by cycle walking: apply the
/// network until the value falls inside [0, N). Each round is a bijection, so
/// the composition is one; cycle walking keeps it one on [0, N) and needs
/// fewer than two passes on average because 2^k < 2N.
///
/// Block mode: [0, N) is cut into blocks of `blockSize` consecutive samples
/// (the last one may be short). Epoch e permutes the blocks and, inside each
/// block, its samples, each with its own keyed Feistel network, so a batch
/// reads a few runs of nearby samples instead of scattered ones.
///
/// The round keys are a fixed function of (seed, epoch) documented in
/// docs/sampler.md: the order is part of meshload's contract and must not
/// change between releases (a resumed job must see the same batches).
///
/// Thread safety: immutable after construction; const methods are thread-safe.
#pragma once

#include <array>
#include <cstdint>

#include "planner/spec.h"

namespace meshload {

/// SplitMix64 finaliser: a fast, well-mixed 64-bit bijection.
inline uint64_t Mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// A keyed bijection of [0, n).
class FeistelPermutation {
 public:
  static constexpr int kRounds = 4;

  /// `n` may be 0 or 1 (then the permutation is trivial).
  FeistelPermutation(uint64_t n, uint64_t key);

  uint64_t size() const { return n_; }

  /// π(x) for x < n.
  uint64_t Forward(uint64_t x) const {
    if (n_ <= 1) return x;
    do {
      x = Encrypt(x);
    } while (x >= n_);
    return x;
  }

  /// π^{-1}(y) for y < n.
  uint64_t Inverse(uint64_t y) const {
    if (n_ <= 1) return y;
    do {
      y = Decrypt(y);
    } while (y >= n_);
    return y;
  }

 private:
  static uint64_t Round(uint64_t r, uint64_t key) {
    uint64_t z = (r ^ key) * 0x9E3779B97F4A7C15ull;
    z ^= z >> 29;
    z *= 0xBF58476D1CE4E5B9ull;
    return z ^ (z >> 32);
  }
  uint64_t Encrypt(uint64_t x) const;
  uint64_t Decrypt(uint64_t y) const;

  uint64_t n_;
  int hi_bits_ = 0;  // width of the high half before round 0
  int lo_bits_ = 0;  // width of the low half before round 0
  std::array<uint64_t, kRounds> keys_{};
};

/// The permutation of one epoch, with its keys derived once.
class EpochPermutation {
 public:
  EpochPermutation(const ShuffleSpec& shuffle, uint64_t n, uint64_t epoch);

  /// π_e(position) for position < n.
  uint64_t At(uint64_t position) const;

  uint64_t size() const { return n_; }

 private:
  uint64_t BlockSampleAt(uint64_t position) const;

  ShuffleMode mode_;
  uint64_t n_;
  uint64_t block_key_base_ = 0;
  uint64_t block_size_ = 1;
  uint64_t num_blocks_ = 1;
  uint64_t last_block_size_ = 1;
  uint64_t short_block_slot_ = 0;  // where the short last block lands in the block order
  FeistelPermutation perm_;  // Global: over samples; Block: over blocks
};

/// Derives the key of one network from the job's seed, the epoch and a
/// purpose tag (0: the epoch's global or block order; b+1: block b's inner
/// order). Exposed for docs/tests.
uint64_t DeriveKey(uint64_t seed, uint64_t epoch, uint64_t tag);

}  // namespace meshload
