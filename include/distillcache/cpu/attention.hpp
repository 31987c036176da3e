#pragma once
// CPU grouped-query attention of a chunk of queries over the KV cache, with the per-slot
// statistics eviction policies read (math/features.hpp). The cache's writes and compaction are
// in cpu/kv.hpp.
//
// Keys and values are [kv_heads, capacity, head_dim], positions [kv_heads, capacity]; slots
// [0, len) of every KV head are valid and slot j of head g holds the token at position
// key_pos[g * capacity + j] (each KV head may hold its own keep-set). Query t (position
// query_pos[t]) sees that slot iff math::attends(query_pos[t], key_pos[g * capacity + j], window):
// the mask follows positions, so the same code serves prefill, decode, sliding windows and
// evicted (compacted) caches, shared or per head.
//
// Statistics are fused: the probabilities of observed queries are kept from the softmax (no
// second pass over K or V) and folded into the slot accumulators in a fixed order, so the sums
// do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "../core/backend.hpp"
#include "../core/config.hpp"
#include "../math/attention_rules.hpp"
#include "../math/attention_shape.hpp"
#include "../math/features.hpp"
#include "../math/exp_poly.hpp"
#include "gemm.hpp"

namespace dc {

namespace cpu_detail {

// Folds the probabilities of the observed queries (probs [observed, heads, len], row entropies
// [observed, heads], zero where a query cannot see a slot) into the slot accumulators of every
// KV head. Each slot receives exactly math::fold_slot_statistics's sums, in its order (observed
// query r, then the group's head h), so the result is bitwise the per-slot formula's and the
// CUDA kernel's order; only the loops are turned inside out (slots innermost, in runs of kRun)
// so that the compiler vectorises them: a decode step at 8k context folds 24k slots per layer,
// and the per-slot loop with its strided rows cost several times the attention's own writes.
// Skipping an unseen (r, slot), as the per-slot formula does, and adding its zero probability
// give the same bits: the sums start at +0 and every added term is +0.
inline void fold_statistics_cpu(float* block, const float* probs, const float* entropy,
                                const std::int32_t* key_pos, const std::int32_t* observed_pos,
                                int observed, int len, const AttentionShape& s) {
  constexpr int kRun = 256;
  const int group = s.num_heads / s.num_kv_heads;
  const int rows = stat_rows_per_kv_head(group);
  const std::int64_t cap = s.capacity;
  const int runs_per_head = (len + kRun - 1) / kRun;
  const int tasks = s.num_kv_heads * runs_per_head;
  DC_OMP(parallel for schedule(static) if (std::int64_t(s.num_kv_heads) * len > 4096))
  for (int task = 0; task < tasks; ++task) {
    const int g = task / runs_per_head;
    const int j0 = (task % runs_per_head) * kRun;
    const int m = std::min(kRun, len - j0);
    float* kv_block = block + std::int64_t(g) * rows * cap + j0;
    const std::int32_t* keys = key_pos + std::int64_t(g) * cap + j0;
    float mass[kRun] = {}, entropy_mass[kRun] = {}, queries[kRun] = {}, last[kRun] = {};
    for (int r = 0; r < observed; ++r) {
      const int qp = observed_pos[r];
      for (int j = 0; j < m; ++j) queries[j] += math::attends(qp, keys[j], s.window) ? 1.0f : 0.0f;
      for (int h = 0; h < group; ++h) {
        const std::size_t row = std::size_t(r) * s.num_heads + std::size_t(g) * group + h;
        const float* p = probs + row * len + j0;
        const float row_entropy = entropy[row];
        float* head_mass = kv_block + (kStatHeadMass + h) * cap;
        for (int j = 0; j < m; ++j) {
          mass[j] += p[j];
          entropy_mass[j] += p[j] * row_entropy;
          head_mass[j] += p[j];
        }
        if (r == observed - 1)
          for (int j = 0; j < m; ++j) last[j] += p[j];
      }
    }
    for (int j = 0; j < m; ++j) {
      kv_block[kStatMass * cap + j] += mass[j];
      kv_block[kStatEntropyMass * cap + j] += entropy_mass[j];
      kv_block[kStatQueries * cap + j] += queries[j];
      kv_block[kStatLastMass * cap + j] = last[j];
    }
  }
}

// o_h += p_hj v_j for the m query heads of a group (p: m rows of len, ldp apart; o [m, hd]), j in
// slot order: element i of o_h is one FMA chain over the slots, whatever the spelling. The portable loops
// keep o in memory, so every slot waits on the previous slot's store (a load, an FMA and a store
// per 16 elements per head); where the compiler targets AVX-512 and the head size is a multiple
// of 16 up to 256, the accumulators stay in registers for up to 4 heads at once and each V row
// is widened once for all of them. Same FMAs in the same order: the same bits.
template <class KV>
inline void accumulate_values_portable(float* DC_RESTRICT o, const float* DC_RESTRICT p, int ldp,
                                       int m, const KV* DC_RESTRICT vh, int len, int hd) {
  for (int j = 0; j < len; ++j) {
    const KV* vj = vh + std::int64_t(j) * hd;
    for (int h = 0; h < m; ++h) {
      const float ph = p[std::int64_t(h) * ldp + j];
      float* oh = o + std::int64_t(h) * hd;
      for (int i = 0; i < hd; ++i) oh[i] = multiply_add(ph, element_as_float(vj, i), oh[i]);
    }
  }
}

#if DC_GEMM_AVX512
template <int kVecs, int kHeads, class KV>
inline void accumulate_values_avx512(float* DC_RESTRICT o, const float* DC_RESTRICT p, int ldp,
                                     const KV* DC_RESTRICT vh, int len) {
  constexpr int hd = kVecs * 16;
  __m512 acc[kHeads][kVecs];
  for (int h = 0; h < kHeads; ++h)
    for (int c = 0; c < kVecs; ++c) acc[h][c] = _mm512_loadu_ps(o + h * hd + c * 16);
  for (int j = 0; j < len; ++j) {
    const KV* vj = vh + std::int64_t(j) * hd;
    __m512 ph[kHeads];
    for (int h = 0; h < kHeads; ++h) ph[h] = _mm512_set1_ps(p[std::int64_t(h) * ldp + j]);
    for (int c = 0; c < kVecs; ++c) {
      const __m512 v = load_w16(vj + c * 16);
      for (int h = 0; h < kHeads; ++h) acc[h][c] = _mm512_fmadd_ps(ph[h], v, acc[h][c]);
    }
  }
  for (int h = 0; h < kHeads; ++h)
    for (int c = 0; c < kVecs; ++c) _mm512_storeu_ps(o + h * hd + c * 16, acc[h][c]);
}

// Heads in runs of as many as 24 accumulator registers hold (at most 4).
template <int kVecs, class KV>
inline void accumulate_values_avx512(float* DC_RESTRICT o, const float* DC_RESTRICT p, int ldp, int m,
                                     const KV* DC_RESTRICT vh, int len) {
  constexpr int kMaxHeads = 24 / kVecs < 4 ? 24 / kVecs : 4;
  for (int h0 = 0; h0 < m; h0 += kMaxHeads) {
    float* oh = o + std::int64_t(h0) * kVecs * 16;
    const float* ph = p + std::int64_t(h0) * ldp;
    switch (std::min(kMaxHeads, m - h0)) {
      case 1: accumulate_values_avx512<kVecs, 1>(oh, ph, ldp, vh, len); break;
      case 2: if constexpr (kMaxHeads >= 2) accumulate_values_avx512<kVecs, 2>(oh, ph, ldp, vh, len); break;
      case 3: if constexpr (kMaxHeads >= 3) accumulate_values_avx512<kVecs, 3>(oh, ph, ldp, vh, len); break;
      default: if constexpr (kMaxHeads >= 4) accumulate_values_avx512<kVecs, 4>(oh, ph, ldp, vh, len); break;
    }
  }
}
#endif

template <class KV>
inline void accumulate_values(float* DC_RESTRICT o, const float* DC_RESTRICT p, int ldp, int m,
                              const KV* DC_RESTRICT vh, int len, int hd) {
#if DC_GEMM_AVX512
  switch (hd) {
    case 64: return accumulate_values_avx512<4>(o, p, ldp, m, vh, len);
    case 128: return accumulate_values_avx512<8>(o, p, ldp, m, vh, len);
    case 256: return accumulate_values_avx512<16>(o, p, ldp, m, vh, len);
    default: break;
  }
#endif
  accumulate_values_portable(o, p, ldp, m, vh, len, hd);
}

// Query heads sharing one KV head over its len cached slots: for each head h of the m,
// o_h = softmax(q_h K^T * scale + mask) V. Leaves scores[h * len + j] holding the unnormalised
// probabilities exp(score - max) (0 where masked) and writes each head's sum and
// sum p * (score - max) for the entropy (sum 0: nothing visible, o_h 0).
//
// Written for the decode step, where this runs once per cached token per KV head per step and
// the K and V rows are the bytes that decide its speed: the group's heads read each row once
// (grouped-query attention's point), not once per query head. The scores are the GEMM
// micro-kernel's dot products (up to 4 heads x 6 keys per call; an element's bits do not depend
// on the tile shape), the exponentials math::exp_nonpositive (vectorised; glibc's expf is a
// call per key). Each head's sums and output run in slot order, one chain each, so a masked slot
// adds an exact zero: dropping it from the cache (trimming to a window, evicting what no query
// sees) changes no bit, and results depend on neither threads, batch nor how heads are grouped.
struct HeadSoftmax {
  float sum = 0.0f;
  float weighted_score = 0.0f;
};

template <class KV>
inline void attend_head_group(float* DC_RESTRICT o, float* DC_RESTRICT scores, HeadSoftmax* DC_RESTRICT result,
                              const float* DC_RESTRICT q, int m, const KV* DC_RESTRICT kh,
                              const KV* DC_RESTRICT vh, const std::int32_t* DC_RESTRICT kp, int len,
                              int query_pos, const AttentionShape& s) {
  const int hd = s.head_dim;
  // Only the slots from the first to the last the query sees are scored: in a prefill chunk a
  // query sees the slots up to its own (half the chunk's scores on average), in a windowed
  // layer those of its window. The rest would add exact zeros, so the bits do not change.
  int lo = 0, hi = len;
  while (hi > lo && !math::attends(query_pos, kp[hi - 1], s.window)) --hi;
  while (lo < hi && !math::attends(query_pos, kp[lo], s.window)) ++lo;
  for (int h = 0; h < m; ++h) {  // probabilities of the slots outside: 0
    std::fill(scores + std::int64_t(h) * len, scores + std::int64_t(h) * len + lo, 0.0f);
    std::fill(scores + std::int64_t(h) * len + hi, scores + std::int64_t(h + 1) * len, 0.0f);
  }
  for (int i = 0; i < m * hd; ++i) o[i] = 0.0f;
  for (int h = 0; h < m; ++h) result[h] = {};
  const int n = hi - lo;
  if (n == 0) return;  // nothing visible (cannot happen with the query cached)
  float* const sc = scores + lo;  // row h of the scored slots: sc + h * len, n of them
  kh += std::int64_t(lo) * hd;
  vh += std::int64_t(lo) * hd;
  kp += lo;

  constexpr int kHeadsPerCall = 4, kKeysPerCall = 6;
  for (int j = 0; j < n; j += kKeysPerCall)
    for (int h = 0; h < m; h += kHeadsPerCall)
      gemm_tile<kHeadsPerCall, kKeysPerCall>(sc + std::int64_t(h) * len + j, len,
                                             q + std::int64_t(h) * hd, kh + std::int64_t(j) * hd, hd,
                                             std::min(kHeadsPerCall, m - h),
                                             std::min(kKeysPerCall, n - j), false);
  for (int h = 0; h < m; ++h) {
    float* sh = sc + std::int64_t(h) * len;
    float max_score = -INFINITY;
    for (int j = 0; j < n; ++j) {
      sh[j] = math::attends(query_pos, kp[j], s.window) ? sh[j] * s.scale : -INFINITY;
      max_score = fmaxf(max_score, sh[j]);
    }
    // In blocks: the exponentials vectorise, the sums run in slot order (in registers: these
    // chains are the loop's critical path).
    HeadSoftmax sums;
    constexpr int kBlock = 64;
    for (int j0 = 0; j0 < n; j0 += kBlock) {
      const int b = std::min(kBlock, n - j0);
      float shifted[kBlock], p[kBlock];
      for (int j = 0; j < b; ++j) shifted[j] = sh[j0 + j] - max_score;  // -inf where masked
      for (int j = 0; j < b; ++j) p[j] = math::exp_nonpositive(shifted[j]);
      for (int j = 0; j < b; ++j) {
        sums.sum += p[j];
        sums.weighted_score += p[j] > 0.0f ? p[j] * shifted[j] : 0.0f;
        sh[j0 + j] = p[j];
      }
    }
    result[h] = sums;
  }

  // o_h = sum_j p_hj v_j / sum_h, in slot order; j outer so each V row is read once for all
  // the group's heads.
  accumulate_values(o, sc, len, m, vh, n, hd);
  for (int h = 0; h < m; ++h) {
    const float inv = 1.0f / result[h].sum;
    for (int i = 0; i < hd; ++i) o[std::int64_t(h) * hd + i] *= inv;
  }
}

// How many parts the query heads of a KV head are cut into, given the `units` (queries x KV
// heads, over every job of a call) to share among the threads. One part reads each K/V row once
// for the whole group, the point of grouping, and it pays even when a thread is left idle part
// of the time: a single SmolLM2 decode step (3 KV heads, 2 threads) measured faster with 3 whole
// groups (one thread takes two) than with 9 single heads (5 and 4). Only when there are fewer
// units than threads (Gemma 3 270M: one KV head) are the heads cut, into as many parts as there
// are idle threads.
inline int head_group_parts(std::int64_t units, int group, int threads) {
  if (units >= threads) return 1;
  return int(std::min<std::int64_t>(group, (threads + units - 1) / units));
}

}  // namespace cpu_detail

// One sequence's attention in a batched step: out[n, heads*head_dim] = softmax(q K^T * scale +
// mask) V over its own cache (K and V [kv_heads, capacity, head_dim] as float or bf16, the
// cache's storage type, widened to fp32 as they are read), with the statistics of its observed
// queries accumulated into stats.block when given.
struct AttentionJob {
  float* out = nullptr;
  const float* q = nullptr;
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  bool bf16_kv = false;  // K and V are bf16 (else float)
  const std::int32_t* key_pos = nullptr;
  int len = 0;
  const std::int32_t* query_pos = nullptr;
  int n = 0;
  AttentionShape shape;
  AttentionStats stats;

  template <class KV>
  static AttentionJob make(float* out, const float* q, const KV* k_cache, const KV* v_cache,
                           const std::int32_t* key_pos, int len, const std::int32_t* query_pos,
                           int n, const AttentionShape& s, AttentionStats stats) {
    static_assert(std::is_same_v<KV, float> || std::is_same_v<KV, bf16>);
    return {out, q, k_cache, v_cache, std::is_same_v<KV, bf16>, key_pos, len, query_pos, n, s, stats};
  }
  // Observed queries are t in [first_observed, n), first_observed clamped to [0, n] as the CUDA
  // overload does (a negative one means every query).
  int observed() const { return stats.block ? n - std::clamp(stats.first_observed, 0, n) : 0; }
};

// The attention of every job (each sequence of a batched step, or one) in one parallel region:
// the tasks are (job, query, KV head, part of its query heads), so a step of S sequences keeps
// both threads busy with whole groups (each K/V row read once per step) and forks once per
// layer rather than once per sequence. A job's results do not depend on the others, the thread
// count or the scheduling (each output and probability is one task's, the statistics are
// folded per job afterwards in a fixed order).
inline void attention(const Context<cpu>&, std::span<const AttentionJob> jobs) {
  // Probabilities [observed, heads, len] and row entropies [observed, heads] of each job's
  // observed queries, at the job's offsets. Scratch of the calling thread, shared with the
  // OpenMP workers through plain pointers.
  thread_local std::vector<float> probs_scratch, entropy_scratch;
  thread_local std::vector<std::int64_t> probs_at, entropy_at, task_end;
  std::int64_t probs_size = 0, entropy_size = 0, units = 0;
  probs_at.resize(jobs.size());
  entropy_at.resize(jobs.size());
  int group = 1;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    const AttentionJob& job = jobs[i];
    const int observed = job.observed();
    probs_at[i] = probs_size;
    entropy_at[i] = entropy_size;
    probs_size += std::int64_t(observed) * job.shape.num_heads * job.len;
    entropy_size += std::int64_t(observed) * job.shape.num_heads;
    units += std::int64_t(job.n) * job.shape.num_kv_heads;
    group = std::max(group, job.shape.num_heads / job.shape.num_kv_heads);
  }
  probs_scratch.assign(std::size_t(probs_size), 0.0f);
  entropy_scratch.assign(std::size_t(entropy_size), 0.0f);
  const int parts = cpu_detail::head_group_parts(units, group, cpu_detail::max_threads());
  task_end.resize(jobs.size());
  std::int64_t tasks = 0;
  for (std::size_t i = 0; i < jobs.size(); ++i)
    task_end[i] = tasks += std::int64_t(jobs[i].n) * jobs[i].shape.num_kv_heads * parts;
  float* const probs = probs_scratch.data();
  float* const entropy = entropy_scratch.data();
  const std::int64_t* const ends = task_end.data();
  const std::int64_t* const probs_offset = probs_at.data();
  const std::int64_t* const entropy_offset = entropy_at.data();
  const std::size_t num_jobs = jobs.size();

  // Static, tasks in job order: a thread takes neighbouring tasks (the query heads of a KV head
  // together when a group is cut), which measured faster than dynamic scheduling on a single
  // SmolLM2 decode step; jobs of unequal length (students at different budgets) may leave one
  // thread waiting at the end.
  DC_OMP(parallel for schedule(static))
  for (std::int64_t task = 0; task < tasks; ++task) {
    const std::size_t i = std::size_t(std::upper_bound(ends, ends + num_jobs, task) - ends);
    const AttentionJob& job = jobs[i];
    const AttentionShape& s = job.shape;
    const std::int64_t local = task - (i ? ends[i - 1] : 0);
    const int t = int(local / (std::int64_t(s.num_kv_heads) * parts));
    const int kvh = int(local / parts % s.num_kv_heads);
    const int job_group = s.num_heads / s.num_kv_heads;
    const int heads_per_part = (job_group + parts - 1) / parts;
    const int h0 = kvh * job_group + int(local % parts) * heads_per_part;
    const int m = std::min(heads_per_part, (kvh + 1) * job_group - h0);
    if (m <= 0) continue;
    thread_local std::vector<float> scores;
    thread_local std::vector<cpu_detail::HeadSoftmax> softmax;
    scores.resize(std::size_t(m) * job.len);
    softmax.resize(std::size_t(m));
    const std::int64_t kv_offset = std::int64_t(kvh) * s.capacity * s.head_dim;
    auto attend = [&](const auto* k_cache, const auto* v_cache) {
      cpu_detail::attend_head_group(
          job.out + (std::int64_t(t) * s.num_heads + h0) * s.head_dim, scores.data(), softmax.data(),
          job.q + (std::int64_t(t) * s.num_heads + h0) * s.head_dim, m, k_cache + kv_offset,
          v_cache + kv_offset, job.key_pos + std::int64_t(kvh) * s.capacity, job.len,
          job.query_pos[t], s);
    };
    if (job.bf16_kv)
      attend(static_cast<const bf16*>(job.k_cache), static_cast<const bf16*>(job.v_cache));
    else
      attend(static_cast<const float*>(job.k_cache), static_cast<const float*>(job.v_cache));

    const int r = t - (job.n - job.observed());  // index among observed queries
    if (r < 0) continue;
    for (int k = 0; k < m; ++k) {
      const cpu_detail::HeadSoftmax& sm = softmax[std::size_t(k)];
      if (sm.sum == 0.0f) continue;
      const float inv = 1.0f / sm.sum;
      const int h = h0 + k;
      const float* srow = scores.data() + std::size_t(k) * job.len;
      float* prow = probs + probs_offset[i] + (std::int64_t(r) * s.num_heads + h) * job.len;
      for (int j = 0; j < job.len; ++j) prow[j] = srow[j] * inv;
      entropy[entropy_offset[i] + std::int64_t(r) * s.num_heads + h] =
          math::softmax_entropy(std::log(sm.sum), sm.weighted_score * inv);
    }
  }

  for (std::size_t i = 0; i < jobs.size(); ++i) {
    const AttentionJob& job = jobs[i];
    const int observed = job.observed();
    if (!observed) continue;
    cpu_detail::fold_statistics_cpu(job.stats.block, probs + probs_at[i], entropy + entropy_at[i],
                                    job.key_pos, job.query_pos + (job.n - observed), observed,
                                    job.len, job.shape);
  }
}

// out[n, heads*head_dim] = softmax(q K^T * scale + mask) V, per query head; accumulates the
// statistics of observed queries into stats.block when given. K and V are stored as KV (float
// or bf16: the cache's storage type) and widened to fp32 as they are read.
template <class KV>
void attention(const Context<cpu>& ctx, float* out, const float* q, const KV* k_cache, const KV* v_cache,
               const std::int32_t* key_pos, int len, const std::int32_t* query_pos, int n,
               const AttentionShape& s, AttentionStats stats = {}) {
  const AttentionJob job =
      AttentionJob::make(out, q, k_cache, v_cache, key_pos, len, query_pos, n, s, stats);
  attention(ctx, std::span<const AttentionJob>(&job, 1));
}

}  // namespace dc
