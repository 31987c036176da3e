#pragma once
// KVCache: per-layer key/value storage that really shrinks, with the original position and the
// attention statistics of every slot of every KV head.
//
// Layout per layer l (all backend-resident, allocated once, never reallocated), with C =
// capacity(l), the slots the layer can hold:
//   keys(l), values(l)  [kv_heads, C, head_dim]   slot s of head h is one contiguous row
//   positions(l)        [kv_heads, C]             original token position of each slot
//   stats(l)            [kv_heads, stat_rows_per_kv_head(group), C]  accumulators
//                                                 (math/features.hpp)
// Every layer has the same capacity unless the cache was made with one per layer, as
// EvictingDecoder makes it after the prompt's compression: under a policy that gives some layers
// more budget than others (the shipped one: three times in layers 18-20) each layer then reserves
// what it keeps, not what the longest layer keeps. C is the stride of every row of layer l: read it
// per layer.
// Keys are stored after RoPE, so a slot's key stays valid wherever the slot moves: eviction
// compacts slots in place and keeps positions and statistics in step, and attention masks each
// head by its own positions, not by slot index. next_position() is the position the next
// appended token gets; it keeps counting after eviction, so positions never repeat.
//
// Keep-sets: compact_heads() gives every KV head of a layer its own ordered keep-set, all of the
// same length (a uniform per-head budget: every head of a layer holds length(l) slots, so bytes
// shrink exactly). compact_layer() (one set for the heads of a layer) and compact() (one set for
// every layer and head) are that same path with the set repeated. Layers may hold different
// lengths (length(l)).
//
// Storage type (kv_type()): K and V are fp32 (the default) or bf16 (half the bytes a decode step
// reads at long context), on every backend. keys(l) and
// values(l) are the fp32 view; keys_as<T>(l) any, and with_kv(l, fn) calls fn with the pointers
// of whichever type the cache holds, which is how the ops (templates on the storage type) are
// reached. Positions and statistics are fp32/int32 whatever K and V are.
//
// Statistics are accumulated only for observed queries: set_observed_from(p) makes queries at
// positions >= p accumulate (e.g. the last W prompt tokens); disable_statistics() stops it.
//
// Windowed layers (Gemma 3's local layers, CacheShape::layer_windows): a query at position p
// sees only keys at positions > p - window there (math::attends), so no future query (at
// next_position() or later) reaches a key the next one does not. trim_to_windows() drops the
// rest: exact, and the only way such a layer shrinks; a trimmed layer holds window - 1 slots,
// to which the next token adds itself. Eviction policies choose keep-sets for
// the evictable layers only (evictable()): the global ones, or every layer when all are
// windowed (Mistral v0.1: the window is the model's own horizon, and eviction works under it;
// those layers are then the policy's alone, not trimmed).
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../core/copy.hpp"
#include "../core/dtype.hpp"
#include "../core/tensor.hpp"
#include "../cpu/kv.hpp"
#include "../math/attention_rules.hpp"
#include "../math/features.hpp"
#include "query_statistics.hpp"

namespace dc {

// The shape a cache needs from a model (model/transformer.hpp makes it from a ModelConfig).
struct CacheShape {
  int num_layers = 0;
  int num_heads = 0;     // query heads (statistics keep one row per query head)
  int num_kv_heads = 0;  // key/value heads
  int head_dim = 0;
  int max_position = 0;  // the model's longest context; 0 = unbounded
  // Per layer: its sliding window in positions (0 = global attention). Empty: every layer global.
  std::vector<int> layer_windows;

  void validate() const {
    DC_CHECK(num_layers > 0 && num_heads > 0 && num_kv_heads > 0 && head_dim > 0,
             "KV cache shape: layers ", num_layers, ", heads ", num_heads, ", kv heads ",
             num_kv_heads, ", head_dim ", head_dim, " must all be positive");
    DC_CHECK(num_heads % num_kv_heads == 0, "KV cache shape: ", num_heads,
             " query heads are not a multiple of ", num_kv_heads, " kv heads");
    DC_CHECK(layer_windows.empty() || int(layer_windows.size()) == num_layers, "KV cache shape: ",
             layer_windows.size(), " layer windows for ", num_layers, " layers");
    for (std::size_t l = 0; l < layer_windows.size(); ++l)
      DC_CHECK(layer_windows[l] >= 0, "KV cache shape: layer ", l, " has window ", layer_windows[l],
               " (0 = global, else positive)");
  }
  bool operator==(const CacheShape&) const = default;
};

template <Backend B>
class KVCache {
 public:
  KVCache() = default;
  // Throws unless this backend can store K/V as kv_type (a transformer checks its setting here).
  static void check_kv_type(DType kv_type) {
    DC_CHECK(kv_type == DType::f32 || kv_type == DType::bf16, "KV cache: storage type ", dtype_name(kv_type),
             " is not supported (f32 or bf16)");
  }
  // Every layer holds up to `capacity` slots.
  KVCache(const CacheShape& shape, int capacity, DType kv_type = DType::f32)
      : KVCache(shape, std::vector<int>(std::size_t(std::max(shape.num_layers, 0)), capacity), kv_type) {}
  // Layer l holds up to capacities[l] slots (one entry per layer).
  KVCache(const CacheShape& shape, std::span<const int> capacities, DType kv_type = DType::f32)
      : layers_(shape.num_layers), heads_(shape.num_heads), kv_heads_(shape.num_kv_heads),
        head_dim_(shape.head_dim), max_position_(shape.max_position),
        capacities_(capacities.begin(), capacities.end()), kv_type_(kv_type), windows_(shape.layer_windows) {
    shape.validate();
    check_kv_type(kv_type);
    DC_CHECK(int(capacities_.size()) == layers_, "KV cache: ", capacities_.size(), " layer capacities for ",
             layers_, " layers");
    for (int l = 0; l < layers_; ++l) {
      const int c = capacities_[std::size_t(l)];
      DC_CHECK(c > 0, "KV cache capacity must be positive, got ", c, layer_named(l));
      DC_CHECK(shape.max_position == 0 || c <= shape.max_position, "KV cache capacity ", c, layer_named(l),
               " exceeds the model's max_position ", shape.max_position);
    }
    if (windows_.empty()) windows_.assign(std::size_t(layers_), 0);
    const bool all_windowed = std::all_of(windows_.begin(), windows_.end(), [](int w) { return w > 0; });
    for (int w : windows_) evictable_.push_back(w == 0 || all_windowed);
    position_offsets_.assign(std::size_t(layers_) + 1, 0);
    for (int l = 0; l < layers_; ++l) {
      const int c = capacities_[std::size_t(l)];
      const Shape kv{kv_heads_, c, head_dim_};
      if (kv_type_ == DType::bf16) {
        keys16_.emplace_back(kv);
        values16_.emplace_back(kv);
      } else {
        keys_.emplace_back(kv);
        values_.emplace_back(kv);
      }
      stats_.emplace_back(Shape{kv_heads_, stat_rows(), c});
      stats_.back().buffer().fill_zero();
      position_offsets_[std::size_t(l) + 1] = position_offsets_[std::size_t(l)] + std::int64_t(kv_heads_) * c;
    }
    // One block for every layer's positions, layer after layer: append() and
    // set_positions_from_backend() copy runs of layers of one capacity as one strided copy.
    positions_ = Tensor<std::int32_t, B>(Shape{position_offsets_.back()});
    host_positions_.assign(std::size_t(layers_) * kv_heads_, {});
    for (int l = 0; l < layers_; ++l)
      for (int h = 0; h < kv_heads_; ++h)
        host_positions_[flat(l, h)].reserve(static_cast<std::size_t>(capacities_[std::size_t(l)]));
    last_append_.assign(static_cast<std::size_t>(layers_), 0);
  }

  CacheShape shape() const {
    const bool any = std::any_of(windows_.begin(), windows_.end(), [](int w) { return w > 0; });
    return {layers_, heads_, kv_heads_, head_dim_, max_position_,
            any ? windows_ : std::vector<int>{}};
  }
  int num_layers() const { return layers_; }
  int num_heads() const { return heads_; }
  int num_kv_heads() const { return kv_heads_; }
  int head_dim() const { return head_dim_; }
  // The slots layer l can hold: the stride of its K, V, positions and statistics rows.
  int capacity(int layer) const { return capacities_[index(layer, 0)]; }
  // Every layer's capacity (e.g. to make another cache like this one).
  const std::vector<int>& capacities() const { return capacities_; }
  // The smallest layer capacity (a cache at least this large everywhere holds what this one can).
  int smallest_capacity() const {
    return capacities_.empty() ? 0 : *std::min_element(capacities_.begin(), capacities_.end());
  }
  // How many tokens append() can still take: the fewest free slots of any layer.
  int free_slots() const {
    if (layers_ == 0) return 0;
    int free = capacities_[0] - length(0);
    for (int l = 1; l < layers_; ++l) free = std::min(free, capacities_[std::size_t(l)] - length(l));
    return free;
  }
  // Throws unless append(ctx, n) has room: names the first layer that does not.
  void check_room(int n) const {
    for (int l = 0; l < layers_; ++l)
      DC_CHECK(length(l) + n <= capacities_[std::size_t(l)], "KV cache full: ", length(l), " + ", n,
               " tokens exceed capacity ", capacities_[std::size_t(l)], layer_named(l, " of layer "));
  }
  // Whether every layer has the same capacity.
  bool uniform_capacity() const {
    return std::all_of(capacities_.begin(), capacities_.end(), [&](int c) { return c == capacities_[0]; });
  }
  // Statistics rows per KV head (math/features.hpp).
  int stat_rows() const { return stat_rows_per_kv_head(heads_ / kv_heads_); }
  // Slots held by each KV head of layer l; length() is the longest layer (all equal unless
  // layers were given keep-sets of different sizes).
  int length(int layer) const { return int(host_positions_[flat(layer, 0)].size()); }
  int length() const {
    int m = 0;
    for (int l = 0; l < layers_; ++l) m = std::max(m, length(l));
    return m;
  }
  int next_position() const { return next_position_; }

  // Layer l's sliding window (0: global attention).
  int window(int layer) const { return windows_[index(layer, 0)]; }
  // Whether eviction policies choose layer l's keep-sets (see the header comment).
  bool evictable(int layer) const { return evictable_[index(layer, 0)]; }
  int evictable_layers() const { return int(std::count(evictable_.begin(), evictable_.end(), true)); }
  // The longest evictable layer: what a budget bounds (windowed layers hold their window).
  int evictable_length() const {
    int m = 0;
    for (int l = 0; l < layers_; ++l)
      if (evictable_[std::size_t(l)]) m = std::max(m, length(l));
    return m;
  }
  // The first evictable layer (the reference layer of shared keep-sets).
  int first_evictable_layer() const {
    return int(std::find(evictable_.begin(), evictable_.end(), true) - evictable_.begin());
  }

  // Drops, in every windowed layer that is not evictable, the slots no future query can attend
  // to: those the next query (at next_position()) does not see. Exact: attention is unchanged.
  // Evictable windowed layers (every layer windowed) are left to the policy: their heads may
  // hold different keep-sets, which one uniform per-head trim could not cut to equal lengths.
  void trim_to_windows(const Context<B>& ctx) {
    for (int l = 0; l < layers_; ++l) {
      const int w = windows_[std::size_t(l)];
      if (w == 0 || evictable_[std::size_t(l)]) continue;
      DC_CHECK(heads_share_slots(l), "KV cache: the kv heads of windowed layer ", l,
               " hold different slots");
      const auto& pos = host_positions(l);
      trim_keep_.clear();
      for (std::size_t s = 0; s < pos.size(); ++s)
        if (math::attends(next_position_, pos[s], w)) trim_keep_.push_back(std::int32_t(s));
      if (trim_keep_.size() < pos.size()) compact_layer(ctx, l, trim_keep_);
    }
  }

  // Where the cache lives (kHostDevice on the CPU backend).
  int device() const { return positions_.device(); }

  // How K and V are stored: DType::f32 or DType::bf16.
  DType kv_type() const { return kv_type_; }
  // Layer l's K or V as T, which must be the storage type.
  template <class T>
  T* keys_as(int layer) {
    return storage<T>(layer, true);
  }
  template <class T>
  T* values_as(int layer) {
    return storage<T>(layer, false);
  }
  template <class T>
  const T* keys_as(int layer) const {
    return storage<T>(layer, true);
  }
  template <class T>
  const T* values_as(int layer) const {
    return storage<T>(layer, false);
  }
  // The fp32 view (fails on a bf16 cache).
  float* keys(int layer) { return keys_as<float>(layer); }
  float* values(int layer) { return values_as<float>(layer); }
  const float* keys(int layer) const { return keys_as<float>(layer); }
  const float* values(int layer) const { return values_as<float>(layer); }
  // fn(keys, values) with layer l's pointers of the storage type (float* or bf16*).
  template <class Fn>
  decltype(auto) with_kv(int layer, Fn&& fn) {
    if (kv_type_ == DType::bf16) return fn(keys_as<bf16>(layer), values_as<bf16>(layer));
    return fn(keys_as<float>(layer), values_as<float>(layer));
  }
  template <class Fn>
  decltype(auto) with_kv(int layer, Fn&& fn) const {
    if (kv_type_ == DType::bf16) return fn(keys_as<bf16>(layer), values_as<bf16>(layer));
    return fn(keys_as<float>(layer), values_as<float>(layer));
  }
  // The layer's whole statistics block; KV head h's rows start at h * stat_rows() * capacity(l).
  float* stats(int layer) { return stats_[index(layer, 0)].data(); }
  const float* stats(int layer) const { return stats_[index(layer, 0)].data(); }
  // Backend-resident positions of layer l: [kv_heads, capacity(l)], head h's slots at
  // positions(l) + h * capacity(l), valid in [0, length(l)).
  const std::int32_t* positions(int layer) const { return positions_.data() + position_offsets_[index(layer, 0)]; }
  // Host mirror of KV head h's positions in layer l.
  const std::vector<std::int32_t>& host_positions(int layer, int head = 0) const {
    return host_positions_[flat(layer, head)];
  }
  // True when every KV head of layer l holds the same positions (a shared or per-layer set).
  bool heads_share_slots(int layer) const {
    for (int h = 1; h < kv_heads_; ++h)
      if (host_positions(layer, h) != host_positions(layer, 0)) return false;
    return true;
  }
  // First slot of the tokens added by the latest append(), per layer (the same in every head).
  int appended_at(int layer) const { return last_append_[index(layer, 0)]; }

  // Statistics are accumulated for queries at positions >= observed_from().
  void set_observed_from(int position) { observed_from_ = position; }
  void disable_statistics() { observed_from_ = kNever; }
  int observed_from() const { return observed_from_; }
  bool observing(int position) const { return observed_from_ != kNever && position >= observed_from_; }

  // Query statistics (cache/query_statistics.hpp), off by default: collect_queries(spec, theta)
  // makes the transformer add every query at positions >= spec.from; clear() zeroes them.
  void collect_queries(QueryStatisticsSpec spec, float rope_theta) {
    if (spec.active()) queries_.start(spec, rope_theta, layers_, heads_, head_dim_);
    else queries_.stop();
  }
  bool collecting_queries() const { return queries_.active(); }
  const QueryStatistics& query_statistics() const { return queries_; }
  // Adds layer l's queries q [n, heads*head_dim] (backend-resident, before RoPE) of the tokens
  // in slots [first, first + n), as the transformer computes them. On CUDA this copies the
  // chunk's queries to the host: a round trip per layer and chunk, paid only while a policy
  // (ExpectedAttention) asks for query statistics, and accumulated in double there.
  void add_queries(const Context<B>& ctx, int layer, const float* q, int first, int n) {
    const float* host = q;
    if constexpr (std::is_same_v<B, cuda>) {
      query_scratch_.resize(std::size_t(n) * heads_ * head_dim_);
      copy_to_host(ctx, query_scratch_.data(), q, query_scratch_.size());
      host = query_scratch_.data();
    }
    queries_.add(layer, host, host_positions(layer, 0).data() + first, n);
  }

  // Claims n slots at the end of every KV head of every layer for tokens at positions
  // next_position()..; the caller (the transformer) writes their K/V and statistics.
  void append(const Context<B>& ctx, int n) {
    DC_CHECK(n > 0, "KV cache append of ", n, " tokens");
    check_room(n);
    for (int l = 0; l < layers_; ++l) {
      last_append_[std::size_t(l)] = length(l);
      for (int h = 0; h < kv_heads_; ++h) {
        auto& pos = host_positions_[flat(l, h)];
        for (int i = 0; i < n; ++i) pos.push_back(next_position_ + i);
      }
    }
    // The backend copy: every (layer, head) gets the same n positions, so one strided copy per
    // run of layers whose new slots start at the same index and whose rows have the same stride
    // (all of them, unless layers hold different lengths or capacities). Copying per
    // (layer, head) waited for the stream 256 times a decode step on Mistral-7B's shape: 25 of
    // 82 ms of a 16-sequence step on an H200.
    staged_positions_.resize(std::size_t(layers_) * kv_heads_ * std::size_t(n));
    for (std::size_t r = 0; r < std::size_t(layers_) * kv_heads_; ++r)
      for (int i = 0; i < n; ++i) staged_positions_[r * std::size_t(n) + std::size_t(i)] = next_position_ + i;
    for (int l = 0; l < layers_;) {
      int end = l + 1;
      while (end < layers_ && last_append_[std::size_t(end)] == last_append_[std::size_t(l)] &&
             capacities_[std::size_t(end)] == capacities_[std::size_t(l)])
        ++end;
      copy_rows_to_backend(ctx, device_positions(l, 0) + last_append_[std::size_t(l)],
                           std::size_t(capacities_[std::size_t(l)]), staged_positions_.data(), std::size_t(n),
                           std::size_t(end - l) * kv_heads_);
      l = end;
    }
    next_position_ += n;
  }

  // Keeps exactly the given slots (strictly ascending, each < length) in every layer and head,
  // moved to the front in that order; everything else is dropped. No reallocation.
  void compact(const Context<B>& ctx, std::span<const std::int32_t> keep) {
    for (int l = 0; l < layers_; ++l) compact_layer(ctx, l, keep);
  }

  // The same for one layer: one keep-set for all its KV heads.
  void compact_layer(const Context<B>& ctx, int layer, std::span<const std::int32_t> keep) {
    index(layer, 0);
    repeated_.resize(keep.size() * std::size_t(kv_heads_));
    for (int h = 0; h < kv_heads_; ++h)
      std::copy(keep.begin(), keep.end(), repeated_.begin() + std::ptrdiff_t(h * keep.size()));
    compact_heads(ctx, layer, repeated_);
  }

  // Per-head keep-sets for layer l: keep is [kv_heads, count], head h keeps the slots
  // keep[h * count .. (h + 1) * count) (strictly ascending, each < length(l)), moved to the front
  // in that order. Every head keeps the same number of slots.
  void compact_heads(const Context<B>& ctx, int layer, std::span<const std::int32_t> keep) {
    check_heads_keep(layer, keep);
    move_heads(ctx, layer, keep);
  }

  // compact_heads' checks alone: throws unless keep is a valid per-head keep-set of layer l.
  void check_heads_keep(int layer, std::span<const std::int32_t> keep) const {
    index(layer, 0);
    DC_CHECK(keep.size() % std::size_t(kv_heads_) == 0, "compact: ", keep.size(),
             " keep entries are not ", kv_heads_, " equal per-head keep-sets");
    const int count = int(keep.size() / std::size_t(kv_heads_));
    const int len = length(layer);
    for (int h = 0; h < kv_heads_; ++h)
      for (int i = 0; i < count; ++i) {
        const std::int32_t slot = keep[std::size_t(h) * count + i];
        DC_CHECK(slot >= 0 && slot < len, "compact: slot ", slot, " of kv head ", h, " outside [0, ",
                 len, ")");
        DC_CHECK(i == 0 || slot > keep[std::size_t(h) * count + i - 1],
                 "compact: keep-set of kv head ", h, " must be strictly ascending");
      }
  }

  // compact_heads' moves alone, for a keep-set check_heads_keep accepted. Touches only layer l
  // (its K/V, statistics and positions), so the layers of one eviction may move in parallel on
  // the CPU, where it throws nothing.
  void move_heads(const Context<B>& ctx, int layer, std::span<const std::int32_t> keep) {
    const int count = int(keep.size() / std::size_t(kv_heads_));
    if (count == length(layer)) return;  // strictly ascending and complete: nothing moves
    with_kv(layer, [&](auto* k, auto* v) {
      kv_compact(ctx, k, v, stats(layer), kv_heads_, head_dim_, stat_rows(), capacity(layer), keep, count);
    });
    for (int h = 0; h < kv_heads_; ++h) {
      auto& pos = host_positions_[flat(layer, h)];
      const std::int32_t* head_keep = keep.data() + std::size_t(h) * count;
      for (int i = slots_in_place(head_keep, count); i < count; ++i)
        pos[std::size_t(i)] = pos[std::size_t(head_keep[i])];
      pos.resize(std::size_t(count));
    }
    upload_layer_positions(ctx, layer, count);
  }

  // Copies the first count positions of every KV head of layer l from the host mirror to the
  // backend: on the CPU straight from the mirror (compact_groups moves a CPU cache's layers in
  // parallel, so nothing shared may be written here), elsewhere staged for one strided copy
  // (see append).
  void upload_layer_positions(const Context<B>& ctx, int layer, int count) {
    if (count == 0) return;
    if constexpr (std::is_same_v<B, cpu>) {
      for (int h = 0; h < kv_heads_; ++h)
        copy_to_backend(ctx, device_positions(layer, h), host_positions_[flat(layer, h)].data(), std::size_t(count));
    } else {
      staged_positions_.resize(std::size_t(kv_heads_) * std::size_t(count));
      for (int h = 0; h < kv_heads_; ++h) {
        const auto& pos = host_positions_[flat(layer, h)];
        std::copy(pos.begin(), pos.begin() + count, staged_positions_.begin() + std::ptrdiff_t(h) * count);
      }
      copy_rows_to_backend(ctx, device_positions(layer, 0), std::size_t(capacity(layer)), staged_positions_.data(),
                           std::size_t(count), std::size_t(kv_heads_));
    }
  }

  // After the backend compacted every layer itself (decode/in_place_eviction.cuh): each KV head of every layer
  // now holds `count` slots, at positions rows[(l * kv_heads + h) * count + i] (backend memory,
  // [layers * kv_heads, count]). Copies them into the backend positions (one strided copy per run
  // of layers of one capacity) and the host mirror (one copy back); the slots' contents are the
  // caller's business.
  void set_positions_from_backend(const Context<B>& ctx, const std::int32_t* rows, int count) {
    DC_CHECK(count >= 0 && count <= smallest_capacity(), "KV cache: ", count, " positions per head (capacity ",
             smallest_capacity(), ")");
    const std::size_t heads = std::size_t(layers_) * kv_heads_;
    staged_positions_.resize(heads * std::size_t(count));
    copy_to_host(ctx, staged_positions_.data(), rows, staged_positions_.size());
    for (std::size_t r = 0; r < heads; ++r)
      host_positions_[r].assign(staged_positions_.begin() + std::ptrdiff_t(r * count),
                                staged_positions_.begin() + std::ptrdiff_t((r + 1) * count));
    for (int l = 0; l < layers_;) {  // one strided copy per run of layers of one capacity
      int end = l + 1;
      while (end < layers_ && capacities_[std::size_t(end)] == capacities_[std::size_t(l)]) ++end;
      copy_rows_to_backend(ctx, device_positions(l, 0), std::size_t(capacities_[std::size_t(l)]),
                           rows + std::int64_t(l) * kv_heads_ * count, std::size_t(count),
                           std::size_t(end - l) * kv_heads_);
      l = end;
    }
  }

  // Makes this cache a copy of other (same shape, each layer's capacity at least other's length
  // there; capacities may differ): slots, positions, statistics, next position and observation
  // setting. Used to prefill a prompt once and evict it several ways, and to move a compressed
  // cache into a smaller reservation.
  void copy_from(const Context<B>& ctx, const KVCache& other) {
    DC_CHECK(layers_ == other.layers_ && heads_ == other.heads_ && kv_heads_ == other.kv_heads_ &&
                 head_dim_ == other.head_dim_,
             "KV cache copy between caches of different model shapes");
    DC_CHECK(kv_type_ == other.kv_type_, "KV cache copy from a ", dtype_name(other.kv_type_), " cache into a ",
             dtype_name(kv_type_), " one");
    for (int l = 0; l < layers_; ++l)
      DC_CHECK(other.length(l) <= capacity(l), "KV cache copy: ", other.length(l), " slots exceed capacity ",
               capacity(l), layer_named(l, " of layer "));
    const int rows = stat_rows();
    for (int l = 0; l < layers_; ++l) {
      const std::size_t len = std::size_t(other.length(l));
      const std::int64_t cap = capacity(l), other_cap = other.capacity(l);
      for (int h = 0; h < kv_heads_; ++h) {
        const std::int64_t dst = std::int64_t(h) * cap * head_dim_;
        const std::int64_t src = std::int64_t(h) * other_cap * head_dim_;
        with_kv(l, [&](auto* k, auto* v) {
          using T = std::remove_pointer_t<decltype(k)>;
          copy_on_backend(ctx, k + dst, other.template keys_as<T>(l) + src, len * head_dim_);
          copy_on_backend(ctx, v + dst, other.template values_as<T>(l) + src, len * head_dim_);
        });
        for (int r = 0; r < rows; ++r)
          copy_on_backend(ctx, stats(l) + (std::int64_t(h) * rows + r) * cap,
                          other.stats(l) + (std::int64_t(h) * rows + r) * other_cap, len);
        host_positions_[flat(l, h)] = other.host_positions_[other.flat(l, h)];
        copy_on_backend(ctx, device_positions(l, h), other.positions(l) + std::int64_t(h) * other_cap, len);
      }
      last_append_[std::size_t(l)] = other.last_append_[std::size_t(l)];
    }
    next_position_ = other.next_position_;
    observed_from_ = other.observed_from_;
    queries_ = other.queries_;
  }

  // Drops slots [length, length(l)) of every layer and head, e.g. to rewind a benchmark step.
  // The next token continues right after the last kept position.
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
    queries_.reset();
  }

  // Bytes held by the slots in use, and by the whole reservation: K, V, positions, statistics.
  std::size_t bytes_used() const {
    std::size_t slots = 0;
    for (int l = 0; l < layers_; ++l) slots += std::size_t(length(l));
    return slots * bytes_per_slot_layer();
  }
  std::size_t bytes_reserved() const {
    std::size_t slots = 0;
    for (int c : capacities_) slots += std::size_t(c);
    return slots * bytes_per_slot_layer();
  }
  // One slot of every KV head of one layer.
  std::size_t bytes_per_slot_layer() const {
    return std::size_t(kv_heads_) * (std::size_t(2) * head_dim_ * dtype_size(kv_type_) + sizeof(std::int32_t) +
                                     std::size_t(stat_rows()) * sizeof(float));
  }

 private:
  static constexpr int kNever = 0x7fffffff;

  std::size_t index(int layer, int head) const {
    DC_CHECK(layer >= 0 && layer < layers_, "KV cache: layer ", layer, " outside [0, ", layers_,
             ")");
    DC_CHECK(head >= 0 && head < kv_heads_, "KV cache: kv head ", head, " outside [0, ", kv_heads_,
             ")");
    return std::size_t(layer);
  }
  // " in layer l" where layers differ in capacity (the error would not say which), else nothing.
  std::string layer_named(int layer, const char* prefix = " in layer ") const {
    return uniform_capacity() ? std::string() : prefix + std::to_string(layer);
  }
  std::size_t flat(int layer, int head) const {
    return index(layer, head) * std::size_t(kv_heads_) + std::size_t(head);
  }
  template <class T>
  T* storage(int layer, bool keys) {
    return const_cast<T*>(std::as_const(*this).template storage<T>(layer, keys));
  }
  template <class T>
  const T* storage(int layer, bool keys) const {
    const std::size_t l = index(layer, 0);
    DC_CHECK(dtype_of<T>::value == kv_type_, "KV cache: K/V read as ", dtype_name(dtype_of<T>::value),
             " but stored as ", dtype_name(kv_type_));
    if constexpr (std::is_same_v<T, bf16>) return (keys ? keys16_ : values16_)[l].data();
    else return (keys ? keys_ : values_)[l].data();
  }
  std::int32_t* device_positions(int layer, int head) {
    return positions_.data() + position_offsets_[index(layer, head)] + std::int64_t(head) * capacity(layer);
  }

  int layers_ = 0, heads_ = 0, kv_heads_ = 0, head_dim_ = 0, max_position_ = 0;
  std::vector<int> capacities_;  // per layer
  int next_position_ = 0;
  int observed_from_ = kNever;
  DType kv_type_ = DType::f32;
  std::vector<Tensor<float, B>> keys_, values_, stats_;  // keys_/values_ of an fp32 cache
  std::vector<Tensor<bf16, B>> keys16_, values16_;      // of a bf16 cache
  Tensor<std::int32_t, B> positions_;  // layer l's [kv_heads, capacity(l)] at position_offsets_[l]
  std::vector<std::int64_t> position_offsets_;             // [layers + 1]
  std::vector<std::vector<std::int32_t>> host_positions_;  // [layers * kv_heads]
  std::vector<int> last_append_;
  std::vector<int> windows_;            // per layer, 0 = global
  std::vector<bool> evictable_;         // per layer
  std::vector<std::int32_t> repeated_;  // compact_layer's keep-set repeated per head
  std::vector<std::int32_t> trim_keep_;  // trim_to_windows' keep-set
  // Positions staged for one strided backend copy, [rows, count] (append; move_heads off the
  // CPU, see upload_layer_positions).
  std::vector<std::int32_t> staged_positions_;
  QueryStatistics queries_;
  std::vector<float> query_scratch_;  // host copy of a chunk's queries (CUDA)
};

}  // namespace dc
