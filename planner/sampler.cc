#include "planner/sampler.h"

#include <bit>
#include <utility>

namespace meshload {
namespace {

inline uint64_t Mask(int bits) { return bits >= 64 ? ~0ull : (1ull << bits) - 1; }

}  // namespace

uint64_t DeriveKey(uint64_t seed, uint64_t epoch, uint64_t tag) {
  return Mix64(Mix64(Mix64(seed) ^ epoch) ^ (tag * 0xD1B54A32D192ED03ull));
}

FeistelPermutation::FeistelPermutation(uint64_t n, uint64_t key) : n_(n) {
  if (n_ <= 1) return;
  // Smallest k with 2^k >= n, at least 2 so both halves are non-empty.
  int k = 64 - std::countl_zero(n_ - 1);
  if (k < 2) k = 2;
  hi_bits_ = (k + 1) / 2;
  lo_bits_ = k / 2;
  for (int i = 0; i < kRounds; ++i) keys_[i] = Mix64(key + static_cast<uint64_t>(i) * 0x632BE59BD9B4E019ull);
}

// One round maps (L, R) with L of h bits and R of w bits to (R, L ^ F(R)),
// i.e. the old low half becomes the high half: widths swap every round.
uint64_t FeistelPermutation::Encrypt(uint64_t x) const {
  int h = hi_bits_, w = lo_bits_;
  for (int i = 0; i < kRounds; ++i) {
    uint64_t l = x >> w;
    uint64_t r = x & Mask(w);
    uint64_t nl = (l ^ Round(r, keys_[i])) & Mask(h);
    x = (r << h) | nl;
    std::swap(h, w);
  }
  return x;
}

uint64_t FeistelPermutation::Decrypt(uint64_t y) const {
  for (int i = kRounds - 1; i >= 0; --i) {
    // Undo round i: before it the layout was (w', h') where the round's
    // output has high = r (width w_in) and low = nl (width h_in).
    int h_in = (i % 2 == 0) ? hi_bits_ : lo_bits_;
    int w_in = (i % 2 == 0) ? lo_bits_ : hi_bits_;
    uint64_t r = y >> h_in;
    uint64_t nl = y & Mask(h_in);
    uint64_t l = (nl ^ Round(r, keys_[i])) & Mask(h_in);
    y = (l << w_in) | r;
  }
  return y;
}

EpochPermutation::EpochPermutation(const ShuffleSpec& shuffle, uint64_t n, uint64_t epoch)
    : mode_(shuffle.mode), n_(n), perm_(0, 0) {
  switch (mode_) {
    case ShuffleMode::kNone:
      break;
    case ShuffleMode::kGlobal:
      perm_ = FeistelPermutation(n, DeriveKey(shuffle.seed, epoch, 0));
      break;
    case ShuffleMode::kBlock: {
      block_size_ = shuffle.block_size < 1 ? 1 : static_cast<uint64_t>(shuffle.block_size);
      num_blocks_ = n == 0 ? 1 : (n + block_size_ - 1) / block_size_;
      last_block_size_ = n - (num_blocks_ - 1) * block_size_;
      perm_ = FeistelPermutation(num_blocks_, DeriveKey(shuffle.seed, epoch, 0));
      block_key_base_ = DeriveKey(shuffle.seed, epoch, 1);
      // The short block takes fewer positions; find where it lands once so
      // every position maps in O(1).
      short_block_slot_ = perm_.Inverse(num_blocks_ - 1);
      break;
    }
  }
}

uint64_t EpochPermutation::At(uint64_t position) const {
  switch (mode_) {
    case ShuffleMode::kNone: return position;
    case ShuffleMode::kGlobal: return perm_.Forward(position);
    case ShuffleMode::kBlock: return BlockSampleAt(position);
  }
  return position;
}

uint64_t EpochPermutation::BlockSampleAt(uint64_t position) const {
  // Slots (positions in the block order) before the short block are full;
  // the short block occupies last_block_size_ positions; slots after it are
  // full again but shifted by the short block's shortfall.
  const uint64_t bs = block_size_;
  const uint64_t short_start = short_block_slot_ * bs;
  uint64_t slot, offset;
  if (position < short_start) {
    slot = position / bs;
    offset = position % bs;
  } else if (position < short_start + last_block_size_) {
    slot = short_block_slot_;
    offset = position - short_start;
  } else {
    uint64_t rest = position - short_start - last_block_size_;
    slot = short_block_slot_ + 1 + rest / bs;
    offset = rest % bs;
  }
  const uint64_t block = perm_.Forward(slot);
  const uint64_t size = block == num_blocks_ - 1 ? last_block_size_ : bs;
  FeistelPermutation inner(size, Mix64(block_key_base_ + block));
  return block * bs + inner.Forward(offset);
}

}  // namespace meshload
