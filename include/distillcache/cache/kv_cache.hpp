#pragma once
// KVCache: contiguous per-layer key/value storage with the original position of every slot.
//
// Layout per layer: K and V are [kv_heads, capacity, head_dim]; slot s of head h is a contiguous
// head_dim vector, so attention over one head streams one contiguous block. Keys are stored
// after RoPE, so a slot's key stays valid wherever the slot moves: eviction (issue 4) compacts
// slots and keeps positions[] in step, and attention masks by positions[], not by slot index.
// next_position() is the position the next appended token gets; it keeps counting after
// eviction, so positions never repeat.
#include <cstdint>
#include <vector>

#include "../core/copy.hpp"
#include "../core/tensor.hpp"
#include "../model/config.hpp"

namespace dc {

template <Backend B>
class KVCache {
 public:
  KVCache() = default;
  KVCache(const ModelConfig& cfg, int capacity)
      : layers_(cfg.num_layers), kv_heads_(cfg.num_kv_heads), head_dim_(cfg.head_dim),
        capacity_(capacity) {
    DC_CHECK(capacity > 0, "KV cache capacity must be positive, got ", capacity);
    DC_CHECK(capacity <= cfg.max_position || cfg.max_position == 0,
             "KV cache capacity ", capacity, " exceeds the model's max_position ",
             cfg.max_position);
    const Shape s{kv_heads_, capacity_, head_dim_};
    keys_.reserve(static_cast<std::size_t>(layers_));
    values_.reserve(static_cast<std::size_t>(layers_));
    for (int l = 0; l < layers_; ++l) {
      keys_.emplace_back(s);
      values_.emplace_back(s);
    }
    positions_ = Tensor<std::int32_t, B>(Shape{capacity_});
    host_positions_.reserve(static_cast<std::size_t>(capacity_));
  }

  int num_layers() const { return layers_; }
  int num_kv_heads() const { return kv_heads_; }
  int head_dim() const { return head_dim_; }
  int capacity() const { return capacity_; }
  int length() const { return static_cast<int>(host_positions_.size()); }
  int next_position() const { return next_position_; }

  float* keys(int layer) { return keys_[static_cast<std::size_t>(layer)].data(); }
  float* values(int layer) { return values_[static_cast<std::size_t>(layer)].data(); }
  const float* keys(int layer) const { return keys_[static_cast<std::size_t>(layer)].data(); }
  const float* values(int layer) const { return values_[static_cast<std::size_t>(layer)].data(); }
  // Backend-resident positions of slots [0, length()).
  const std::int32_t* positions() const { return positions_.data(); }
  // Host mirror of the same positions (for policies and tests).
  const std::vector<std::int32_t>& host_positions() const { return host_positions_; }

  // Claims n slots at the end for tokens at positions next_position().., mirrors their positions
  // to the backend and returns the first slot. The caller writes K/V into those slots.
  int append(const Context<B>& ctx, int n) {
    DC_CHECK(n > 0, "KV cache append of ", n, " tokens");
    DC_CHECK(length() + n <= capacity_, "KV cache full: ", length(), " + ", n,
             " tokens exceed capacity ", capacity_);
    const int first = length();
    for (int i = 0; i < n; ++i) host_positions_.push_back(next_position_ + i);
    next_position_ += n;
    copy_to_backend(ctx, positions_.data() + first, host_positions_.data() + first,
                    static_cast<std::size_t>(n));
    return first;
  }

  // Drops slots [length, this->length()), e.g. to rewind a speculative or benchmark step. The
  // next token continues right after the last kept position.
  void truncate(int length) {
    DC_CHECK(length >= 0 && length <= this->length(), "KV cache truncate to ", length,
             " outside [0, ", this->length(), "]");
    host_positions_.resize(static_cast<std::size_t>(length));
    next_position_ = length ? host_positions_.back() + 1 : 0;
  }

  void clear() {
    host_positions_.clear();
    next_position_ = 0;
  }

  // Bytes of K/V (+ positions) for the tokens held, and for the whole reservation.
  std::size_t bytes_used() const { return bytes_for(length()); }
  std::size_t bytes_reserved() const { return bytes_for(capacity_); }

 private:
  std::size_t bytes_for(int slots) const {
    return std::size_t(slots) *
           (std::size_t(2) * layers_ * kv_heads_ * head_dim_ * sizeof(float) + sizeof(std::int32_t));
  }

  int layers_ = 0, kv_heads_ = 0, head_dim_ = 0, capacity_ = 0;
  int next_position_ = 0;
  std::vector<Tensor<float, B>> keys_, values_;
  Tensor<std::int32_t, B> positions_;
  std::vector<std::int32_t> host_positions_;
};

}  // namespace dc
