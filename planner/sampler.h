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
/// Window mode: the blocks in Block mode's order, taken `windowBlocks` at a
/// time; inside each window, its positions are permuted as one (a keyed
/// Feistel network per window), so the window's samples are mixed across
/// its blocks while a step reads from the window's blocks only: remote
/// data fetched in blocks is fetched once per epoch with a cache of a
/// window (Streaming's shard-window shuffles).
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

namespace meshload::planner {

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

  /// π(x) for x < n. `tweak` selects one of 2^64 related permutations
  /// (Block mode uses it to give every block its own inner order without
  /// deriving new round keys per block).
  uint64_t Forward(uint64_t x, uint64_t tweak = 0) const {
    if (n_ <= 1) return x;
    do {
      x = Encrypt(x, tweak);
    } while (x >= n_);
    return x;
  }

  /// out[i] = π(first + i) for i < count. Branch-free over the batch: every
  /// value is encrypted once, then only the out-of-range ones walk again, so
  /// independent evaluations overlap in the CPU instead of stalling on the
  /// cycle-walking branch. Precondition: first + count <= n.
  void ForwardRange(uint64_t first, size_t count, uint64_t* out, uint64_t tweak = 0) const;

  /// π^{-1}(y) for y < n.
  uint64_t Inverse(uint64_t y) const {
    if (n_ <= 1) return y;
    do {
      y = Decrypt(y);
    } while (y >= n_);
    return y;
  }

 private:
  // Round i maps (L, R), L of h_i bits above R of w_i bits, to
  // (R, L xor F_i(R)): the old low half becomes the high half, so the widths
  // swap every round. F_i(r) = the top h_i bits of (r xor k_i) * m_i, a
  // multiply-shift hash in which every output bit depends on every input bit.
  struct RoundParams {
    uint64_t key;      // k_i
    uint64_t mult;     // m_i, odd
    uint64_t lo_mask;  // 2^w_i - 1
    int lo_bits;       // w_i
    int hi_bits;       // h_i
    int f_shift;       // 64 - h_i
  };
  static uint64_t F(const RoundParams& p, uint64_t r, uint64_t tweak) {
    return ((r ^ p.key ^ tweak) * p.mult) >> p.f_shift;
  }

  uint64_t Encrypt(uint64_t x, uint64_t tweak) const {
    for (const RoundParams& p : rounds_) {
      const uint64_t l = x >> p.lo_bits;
      const uint64_t r = x & p.lo_mask;
      x = (r << p.hi_bits) | (l ^ F(p, r, tweak));
    }
    return x;
  }
  uint64_t Decrypt(uint64_t y) const {
    for (int i = kRounds - 1; i >= 0; --i) {
      const RoundParams& p = rounds_[static_cast<size_t>(i)];
      const uint64_t r = y >> p.hi_bits;
      const uint64_t nl = y & ((uint64_t{1} << p.hi_bits) - 1);
      y = ((nl ^ F(p, r, 0)) << p.lo_bits) | r;
    }
    return y;
  }

  uint64_t n_;
  std::array<RoundParams, kRounds> rounds_{};
};

/// The permutation of one epoch, with its keys derived once.
class EpochPermutation {
 public:
  EpochPermutation(const ShuffleSpec& shuffle, uint64_t n, uint64_t epoch);

  /// π_e(position) for position < n.
  uint64_t At(uint64_t position) const;

  /// out[i] = π_e(first + i) for i < count; much faster than `count` calls
  /// of At() (see FeistelPermutation::ForwardRange). Precondition:
  /// first + count <= n.
  void AtRange(uint64_t first, size_t count, uint64_t* out) const;

  uint64_t size() const { return n_; }

 private:
  uint64_t BlockSampleAt(uint64_t position) const;
  // Window mode: the sample at `position`, and the window holding it
  // ([begin, end) of positions, and its permutation's size).
  uint64_t WindowSampleAt(uint64_t position) const;
  void WindowOf(uint64_t position, uint64_t* window, uint64_t* begin, uint64_t* end) const;
  // The first position of block slot `slot` (slot <= num_blocks_).
  uint64_t SlotStart(uint64_t slot) const {
    return slot <= short_block_slot_ ? slot * block_size_ : slot * block_size_ - (block_size_ - last_block_size_);
  }
  // The block slot holding `position`, the offset in it, and where the slot starts.
  void Locate(uint64_t position, uint64_t* slot, uint64_t* offset) const;
  uint64_t SlotSize(uint64_t slot) const { return slot == short_block_slot_ ? last_block_size_ : block_size_; }
  uint64_t BlockTweak(uint64_t block) const { return Mix64(block_key_base_ ^ block); }

  ShuffleMode mode_;
  uint64_t n_;
  uint64_t block_key_base_ = 0;
  uint64_t block_size_ = 1;
  uint64_t num_blocks_ = 1;
  uint64_t last_block_size_ = 1;
  uint64_t short_block_slot_ = 0;         // where the short last block lands in the block order
  FeistelPermutation perm_;               // Global: over samples; Block: over blocks
  FeistelPermutation inner_full_{0, 0};   // Block: inside a full block (tweaked per block)
  FeistelPermutation inner_short_{0, 0};  // Block: inside the short last block
  uint64_t window_blocks_ = 1;            // Window: blocks per window
  uint64_t window_key_ = 0;               // Window: the inner networks' key
  uint64_t window_tweak_base_ = 0;        // Window: each window's tweak
  FeistelPermutation window_full_{0, 0};  // Window: a window of window_blocks_ full blocks
};

/// Derives the key of one network from the job's seed, the epoch and a
/// purpose tag (0: the epoch's global or block order; 1 and 2: the blocks'
/// inner orders; 4 and 5: the windows'). Exposed for docs/tests.
uint64_t DeriveKey(uint64_t seed, uint64_t epoch, uint64_t tag);

}  // namespace meshload::planner
