#include "planner/sampler.h"

#include <algorithm>
#include <bit>
#include <utility>

namespace meshload::planner {
uint64_t DeriveKey(uint64_t seed, uint64_t epoch, uint64_t tag) {
  return Mix64(Mix64(Mix64(seed) ^ epoch) ^ (tag * 0xD1B54A32D192ED03ull));
}

FeistelPermutation::FeistelPermutation(uint64_t n, uint64_t key) : n_(n) {
  if (n_ <= 1) return;
  // Smallest k with 2^k >= n, at least 2 so both halves are non-empty.
  int k = 64 - std::countl_zero(n_ - 1);
  if (k < 2) k = 2;
  int h = (k + 1) / 2, w = k / 2;
  for (int i = 0; i < kRounds; ++i) {
    RoundParams& p = rounds_[static_cast<size_t>(i)];
    p.key = Mix64(key + static_cast<uint64_t>(2 * i) * 0x632BE59BD9B4E019ull);
    p.mult = Mix64(key + static_cast<uint64_t>(2 * i + 1) * 0x632BE59BD9B4E019ull) | 1;
    p.hi_bits = h;
    p.lo_bits = w;
    p.lo_mask = (uint64_t{1} << w) - 1;
    p.f_shift = 64 - h;
    std::swap(h, w);
  }
}

void FeistelPermutation::ForwardRange(uint64_t first, size_t count, uint64_t* out, uint64_t tweak) const {
  if (n_ <= 1) {
    for (size_t i = 0; i < count; ++i) out[i] = first + i;
    return;
  }
  // Pass 1 over everything, then compact the indices still outside [0, n)
  // and walk only those; about 1 - n/2^k of them remain after each pass.
  constexpr size_t kChunk = 1024;
  uint32_t pending[kChunk];
  for (size_t base = 0; base < count; base += kChunk) {
    const size_t len = std::min(kChunk, count - base);
    uint64_t* o = out + base;
    size_t m = 0;
    for (size_t i = 0; i < len; ++i) {
      o[i] = Encrypt(first + base + i, tweak);
      pending[m] = static_cast<uint32_t>(i);
      m += o[i] >= n_;
    }
    while (m > 0) {
      size_t next = 0;
      for (size_t j = 0; j < m; ++j) {
        const uint32_t i = pending[j];
        o[i] = Encrypt(o[i], tweak);
        pending[next] = i;
        next += o[i] >= n_;
      }
      m = next;
    }
  }
}

EpochPermutation::EpochPermutation(const ShuffleSpec& shuffle, uint64_t n, uint64_t epoch)
    : mode_(shuffle.mode), n_(n), perm_(0, 0) {
  switch (mode_) {
    case ShuffleMode::kNone: break;
    case ShuffleMode::kGlobal: perm_ = FeistelPermutation(n, DeriveKey(shuffle.seed, epoch, 0)); break;
    case ShuffleMode::kBlock: {
      block_size_ = shuffle.block_size < 1 ? 1 : static_cast<uint64_t>(shuffle.block_size);
      num_blocks_ = n == 0 ? 1 : (n + block_size_ - 1) / block_size_;
      last_block_size_ = n - (num_blocks_ - 1) * block_size_;
      perm_ = FeistelPermutation(num_blocks_, DeriveKey(shuffle.seed, epoch, 0));
      block_key_base_ = DeriveKey(shuffle.seed, epoch, 1);
      inner_full_ = FeistelPermutation(block_size_, DeriveKey(shuffle.seed, epoch, 2));
      inner_short_ = FeistelPermutation(last_block_size_, DeriveKey(shuffle.seed, epoch, 2));
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

void EpochPermutation::Locate(uint64_t position, uint64_t* slot, uint64_t* offset) const {
  // Slots (positions in the block order) before the short block are full;
  // the short block occupies last_block_size_ positions; slots after it are
  // full again but shifted by the short block's shortfall.
  const uint64_t bs = block_size_;
  const uint64_t short_start = short_block_slot_ * bs;
  if (position < short_start) {
    *slot = position / bs;
    *offset = position % bs;
  } else if (position < short_start + last_block_size_) {
    *slot = short_block_slot_;
    *offset = position - short_start;
  } else {
    const uint64_t rest = position - short_start - last_block_size_;
    *slot = short_block_slot_ + 1 + rest / bs;
    *offset = rest % bs;
  }
}

uint64_t EpochPermutation::BlockSampleAt(uint64_t position) const {
  uint64_t slot, offset;
  Locate(position, &slot, &offset);
  const uint64_t block = perm_.Forward(slot);
  const FeistelPermutation& inner = block == num_blocks_ - 1 ? inner_short_ : inner_full_;
  return block * block_size_ + inner.Forward(offset, BlockTweak(block));
}

void EpochPermutation::AtRange(uint64_t first, size_t count, uint64_t* out) const {
  switch (mode_) {
    case ShuffleMode::kNone:
      for (size_t i = 0; i < count; ++i) out[i] = first + i;
      return;
    case ShuffleMode::kGlobal: perm_.ForwardRange(first, count, out); return;
    case ShuffleMode::kBlock: {
      // Contiguous positions run through whole slots: one outer evaluation
      // per slot, then a batched inner range.
      size_t done = 0;
      while (done < count) {
        uint64_t slot, offset;
        Locate(first + done, &slot, &offset);
        const size_t len = static_cast<size_t>(std::min<uint64_t>(SlotSize(slot) - offset, count - done));
        const uint64_t block = perm_.Forward(slot);
        const FeistelPermutation& inner = block == num_blocks_ - 1 ? inner_short_ : inner_full_;
        inner.ForwardRange(offset, len, out + done, BlockTweak(block));
        for (size_t i = 0; i < len; ++i) out[done + i] += block * block_size_;
        done += len;
      }
      return;
    }
  }
}

}  // namespace meshload::planner
