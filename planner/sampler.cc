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
    case ShuffleMode::kBlock:
    case ShuffleMode::kWindow: {
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
      if (mode_ == ShuffleMode::kWindow) {
        window_blocks_ = shuffle.window_blocks < 1 ? 1 : static_cast<uint64_t>(shuffle.window_blocks);
        window_key_ = DeriveKey(shuffle.seed, epoch, 4);
        window_tweak_base_ = DeriveKey(shuffle.seed, epoch, 5);
        window_full_ = FeistelPermutation(window_blocks_ * block_size_, window_key_);
      }
      break;
    }
  }
}

uint64_t EpochPermutation::At(uint64_t position) const {
  switch (mode_) {
    case ShuffleMode::kNone: return position;
    case ShuffleMode::kGlobal: return perm_.Forward(position);
    case ShuffleMode::kBlock: return BlockSampleAt(position);
    case ShuffleMode::kWindow: return WindowSampleAt(position);
  }
  return position;
}

void EpochPermutation::WindowOf(uint64_t position, uint64_t* window, uint64_t* begin, uint64_t* end) const {
  uint64_t slot, offset;
  Locate(position, &slot, &offset);
  *window = slot / window_blocks_;
  *begin = SlotStart(*window * window_blocks_);
  *end = SlotStart(std::min(num_blocks_, (*window + 1) * window_blocks_));
}

uint64_t EpochPermutation::WindowSampleAt(uint64_t position) const {
  uint64_t window, begin, end;
  WindowOf(position, &window, &begin, &end);
  const uint64_t tweak = Mix64(window_tweak_base_ ^ window);
  const uint64_t len = end - begin;
  // A window of full blocks has the precomputed network; the one holding
  // the short block, and the last, have their own sizes.
  const uint64_t within = len == window_full_.size()
                              ? window_full_.Forward(position - begin, tweak)
                              : FeistelPermutation(len, window_key_).Forward(position - begin, tweak);
  uint64_t slot, offset;
  Locate(begin + within, &slot, &offset);
  return perm_.Forward(slot) * block_size_ + offset;
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
    case ShuffleMode::kWindow: {
      // One window's network per run of positions in it, then each
      // window position to its slot's block.
      size_t done = 0;
      while (done < count) {
        uint64_t window, begin, end;
        WindowOf(first + done, &window, &begin, &end);
        const size_t len = static_cast<size_t>(std::min<uint64_t>(end - (first + done), count - done));
        const uint64_t tweak = Mix64(window_tweak_base_ ^ window);
        const FeistelPermutation other(end - begin == window_full_.size() ? 0 : end - begin, window_key_);
        const FeistelPermutation& inner = end - begin == window_full_.size() ? window_full_ : other;
        inner.ForwardRange(first + done - begin, len, out + done, tweak);
        for (size_t i = 0; i < len; ++i) {
          uint64_t slot, offset;
          Locate(begin + out[done + i], &slot, &offset);
          out[done + i] = perm_.Forward(slot) * block_size_ + offset;
        }
        done += len;
      }
      return;
    }
  }
}

}  // namespace meshload::planner
