#pragma once
// KVCache: per-layer key/value storage that really shrinks, with the original position and the
// attention statistics of every slot.
//
// Layout per layer l (all backend-resident, allocated once, never reallocated):
//   keys(l), values(l)  [kv_heads, capacity, head_dim]   slot s of head h is one contiguous row
//   positions(l)        [capacity]                       original token position of each slot
//   stats(l)            [stat_rows(num_heads), capacity] accumulators (math/features.hpp)
// Keys are stored after RoPE, so a slot's key stays valid wherever the slot moves: eviction
// compacts slots in place and keeps positions and statistics in step, and attention masks by
// positions, not by slot index. next_position() is the position the next appended token gets;
// it keeps counting after eviction, so positions never repeat.
//
// Keep-sets: compact() applies one ordered keep-set to every layer (the default); compact_layer()
// gives each layer its own, so layers may hold different lengths (length(l)).
//
// Statistics are accumulated only for observed queries: set_observed_from(p) makes queries at
// positions >= p accumulate (e.g. the last W prompt tokens); disable_statistics() stops it.
#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "../core/copy.hpp"
#include "../core/tensor.hpp"
#include "../math/features.hpp"
#include "../model/config.hpp"

namespace dc {

template <Backend B>
class KVCache {
 public:
  KVCache() = default;
  KVCache(const ModelConfig& cfg, int capacity)
      : layers_(cfg.num_layers), heads_(cfg.num_heads), kv_heads_(cfg.num_kv_heads),
        head_dim_(cfg.head_dim), capacity_(capacity) {
    DC_CHECK(capacity > 0, "KV cache capacity must be positive, got ", capacity);
    DC_CHECK(cfg.max_position == 0 || capacity <= cfg.max_position, "KV cache capacity ", capacity,
             " exceeds the model's max_position ", cfg.max_position);
    const Shape kv{kv_heads_, capacity_, head_dim_};
    for (int l = 0; l < layers_; ++l) {
      keys_.emplace_back(kv);
      values_.emplace_back(kv);
      stats_.emplace_back(Shape{stat_rows(heads_), capacity_});
      stats_.back().buffer().fill_zero();
    }
    positions_ = Tensor<std::int32_t, B>(Shape{layers_, capacity_});
    host_positions_.assign(static_cast<std::size_t>(layers_), {});
    for (auto& p : host_positions_) p.reserve(static_cast<std::size_t>(capacity_));
    last_append_.assign(static_cast<std::size_t>(layers_), 0);
  }

  int num_layers() const { return layers_; }
  int num_heads() const { return heads_; }
  int num_kv_heads() const { return kv_heads_; }
  int head_dim() const { return head_dim_; }
  int capacity() const { return capacity_; }
  // Slots held by layer l; length() is the longest layer (all equal with shared keep-sets).
  int length(int layer) const { return int(host_positions_[index(layer)].size()); }
  int length() const {
    int m = 0;
    for (int l = 0; l < layers_; ++l) m = std::max(m, length(l));
    return m;
  }
  int next_position() const { return next_position_; }

  // Where the cache lives (kHostDevice on the CPU backend).
  int device() const { return positions_.device(); }

  float* keys(int layer) { return keys_[index(layer)].data(); }
  float* values(int layer) { return values_[index(layer)].data(); }
  const float* keys(int layer) const { return keys_[index(layer)].data(); }
  const float* values(int layer) const { return values_[index(layer)].data(); }
  float* stats(int layer) { return stats_[index(layer)].data(); }
  const float* stats(int layer) const { return stats_[index(layer)].data(); }
  // Backend-resident positions of layer l's slots [0, length(l)).
  const std::int32_t* positions(int layer = 0) const {
    return positions_.data() + std::int64_t(index(layer)) * capacity_;
  }
  // Host mirror of the same positions.
  const std::vector<std::int32_t>& host_positions(int layer = 0) const {
    return host_positions_[index(layer)];
  }
  // First slot of the tokens added by the latest append(), per layer.
  int appended_at(int layer) const { return last_append_[index(layer)]; }

  // Statistics are accumulated for queries at positions >= observed_from().
  void set_observed_from(int position) { observed_from_ = position; }
  void disable_statistics() { observed_from_ = kNever; }
  int observed_from() const { return observed_from_; }
  bool observing(int position) const { return observed_from_ != kNever && position >= observed_from_; }

  // Claims n slots at the end of every layer for tokens at positions next_position()..; the
  // caller (the transformer) writes their K/V and statistics.
  void append(const Context<B>& ctx, int n) {
    DC_CHECK(n > 0, "KV cache append of ", n, " tokens");
    DC_CHECK(length() + n <= capacity_, "KV cache full: ", length(), " + ", n,
             " tokens exceed capacity ", capacity_);
    for (int l = 0; l < layers_; ++l) {
      auto& pos = host_positions_[std::size_t(l)];
      const int first = int(pos.size());
      last_append_[std::size_t(l)] = first;
      for (int i = 0; i < n; ++i) pos.push_back(next_position_ + i);
      copy_to_backend(ctx, positions_.data() + std::int64_t(l) * capacity_ + first,
                      pos.data() + first, std::size_t(n));
    }
    next_position_ += n;
  }

  // Keeps exactly the given slots (strictly ascending, each < length) in every layer, moved to
  // the front in that order; everything else is dropped. No reallocation.
  void compact(const Context<B>& ctx, std::span<const std::int32_t> keep) {
    for (int l = 0; l < layers_; ++l) compact_layer(ctx, l, keep);
  }

  // The same for one layer (per-layer keep-sets).
  void compact_layer(const Context<B>& ctx, int layer, std::span<const std::int32_t> keep) {
    DC_CHECK(layer >= 0 && layer < layers_, "compact: layer ", layer, " outside [0, ", layers_, ")");
    auto& pos = host_positions_[std::size_t(layer)];
    const int len = int(pos.size());
    for (std::size_t i = 0; i < keep.size(); ++i) {
      DC_CHECK(keep[i] >= 0 && keep[i] < len, "compact: slot ", keep[i], " outside [0, ", len, ")");
      DC_CHECK(i == 0 || keep[i] > keep[i - 1], "compact: keep-set must be strictly ascending");
    }
    if (int(keep.size()) == len) return;  // strictly ascending and complete: identity
    kv_compact(ctx, keys(layer), values(layer), stats(layer), kv_heads_, head_dim_,
               stat_rows(heads_), capacity_, keep);
    for (std::size_t i = 0; i < keep.size(); ++i) pos[i] = pos[std::size_t(keep[i])];
    pos.resize(keep.size());
    if (!keep.empty())
      copy_to_backend(ctx, positions_.data() + std::int64_t(layer) * capacity_, pos.data(),
                      keep.size());
  }

  // Makes this cache a copy of other (same model shape, capacity at least other's length):
  // slots, positions, statistics, next position and observation setting. Used to prefill a
  // prompt once and evict it several ways.
  void copy_from(const Context<B>& ctx, const KVCache& other) {
    DC_CHECK(layers_ == other.layers_ && heads_ == other.heads_ && kv_heads_ == other.kv_heads_ &&
                 head_dim_ == other.head_dim_,
             "KV cache copy between caches of different model shapes");
    DC_CHECK(other.length() <= capacity_, "KV cache copy: ", other.length(),
             " slots exceed capacity ", capacity_);
    for (int l = 0; l < layers_; ++l) {
      const int len = other.length(l);
      for (int h = 0; h < kv_heads_; ++h) {
        const std::int64_t dst = std::int64_t(h) * capacity_ * head_dim_;
        const std::int64_t src = std::int64_t(h) * other.capacity_ * head_dim_;
        copy_on_backend(ctx, keys(l) + dst, other.keys(l) + src, std::size_t(len) * head_dim_);
        copy_on_backend(ctx, values(l) + dst, other.values(l) + src, std::size_t(len) * head_dim_);
      }
      for (int r = 0; r < stat_rows(heads_); ++r)
        copy_on_backend(ctx, stats(l) + std::int64_t(r) * capacity_,
                        other.stats(l) + std::int64_t(r) * other.capacity_, std::size_t(len));
      host_positions_[std::size_t(l)] = other.host_positions_[std::size_t(l)];
      copy_on_backend(ctx, positions_.data() + std::int64_t(l) * capacity_, other.positions(l),
                      std::size_t(len));
      last_append_[std::size_t(l)] = other.last_append_[std::size_t(l)];
    }
    next_position_ = other.next_position_;
    observed_from_ = other.observed_from_;
  }

  // Drops slots [length, length(l)) of every layer, e.g. to rewind a benchmark step. The next
  // token continues right after the last kept position.
  void truncate(int length) {
    DC_CHECK(length >= 0 && length <= this->length(), "KV cache truncate to ", length,
             " outside [0, ", this->length(), "]");
    int last = -1;
    for (auto& pos : host_positions_) {
      if (int(pos.size()) > length) pos.resize(std::size_t(length));
      if (!pos.empty()) last = std::max(last, pos.back());
    }
    next_position_ = last + 1;
  }

  void clear() {
    for (auto& pos : host_positions_) pos.clear();
    next_position_ = 0;
    for (auto& s : stats_) s.buffer().fill_zero();
  }

  // Bytes held by the slots in use, and by the whole reservation: K, V, positions, statistics.
  std::size_t bytes_used() const {
    std::size_t slots = 0;
    for (int l = 0; l < layers_; ++l) slots += std::size_t(length(l));
    return slots * bytes_per_slot_layer();
  }
  std::size_t bytes_reserved() const {
    return std::size_t(layers_) * std::size_t(capacity_) * bytes_per_slot_layer();
  }
  std::size_t bytes_per_slot_layer() const {
    return std::size_t(2) * kv_heads_ * head_dim_ * sizeof(float) + sizeof(std::int32_t) +
           std::size_t(stat_rows(heads_)) * sizeof(float);
  }

 private:
  static constexpr int kNever = 0x7fffffff;

  std::size_t index(int layer) const {
    DC_CHECK(layer >= 0 && layer < layers_, "KV cache: layer ", layer, " outside [0, ", layers_,
             ")");
    return std::size_t(layer);
  }

  int layers_ = 0, heads_ = 0, kv_heads_ = 0, head_dim_ = 0, capacity_ = 0;
  int next_position_ = 0;
  int observed_from_ = kNever;
  std::vector<Tensor<float, B>> keys_, values_, stats_;
  Tensor<std::int32_t, B> positions_;  // [layers, capacity]
  std::vector<std::vector<std::int32_t>> host_positions_;
  std::vector<int> last_append_;
};

}  // namespace dc
