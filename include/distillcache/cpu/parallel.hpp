#pragma once
// OpenMP helpers for the CPU backend. Without OpenMP the pragmas are ignored and these report
// one thread, so the CPU backend builds with any C++20 compiler.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>

#include "../core/error.hpp"

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace dc::cpu_detail {

inline int max_threads() {
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// The calling thread's number in its parallel region, and the region's thread count (0 and 1
// outside one).
inline int thread_num() {
#if defined(_OPENMP)
  return omp_get_thread_num();
#else
  return 0;
#endif
}

inline int num_threads() {
#if defined(_OPENMP)
  return omp_get_num_threads();
#else
  return 1;
#endif
}

// Which of `threads` threads takes an item covering rows [begin, end) of [0, total): the rows are
// cut into `threads` contiguous runs of equal length, and an item goes to the run holding its
// middle row. Passes over the same rows that share them out this way (the gather of an
// eviction's features, their check, the policy's scores) give each thread the rows it wrote in
// the pass before, still in its own core's cache: with the groups handed out in any order, H2O's
// scoring (the features' check) at B = 512 of 2048 took 89-92 us where it takes 52-56
// (bench/results/README.md, "Every pass of an eviction on the rows it wrote").
inline int contiguous_share(std::int64_t begin, std::int64_t end, std::int64_t total, int threads) {
  if (threads <= 1 || total <= 0) return 0;
  const std::int64_t share = (begin + end) * threads / (2 * total);  // (begin + end) / 2 is the middle row
  return int(std::clamp<std::int64_t>(share, 0, threads - 1));
}

// Items handed to threads in contiguous runs, with stealing from the back: item i starts in the
// run of thread owner[i] (owners non-decreasing, e.g. by contiguous_share); each thread takes its
// own run from the front and, once it is empty, the last item of the nearest run not yet empty.
// Why: contiguous_share balances rows, not work, and where some items cost twice as much per row
// (the learned policy's layers with a reserve or the newest query's keep-set) one thread waited
// a third of the pass for the other (SmolLM2, B = 512 of 2048, v10's own cache: 45 against 75
// us); a static weight for those items that balanced one cache unbalanced another, where the
// open rows per layer differ. A thread still takes mostly its own rows, so they stay in its
// core's cache from the pass before, and only the items at the far end of another thread's run
// move. Each run is one atomic word (front and back), taken by compare-and-swap: a few dozen
// items per pass, so no contention worth a lock-free deque.
class ContiguousRuns {
 public:
  // owner[i] in [0, threads) for every item, non-decreasing in i.
  ContiguousRuns(std::span<const int> owner, int threads)
      : threads_(std::max(threads, 1)), runs_(std::make_unique<std::atomic<std::uint64_t>[]>(std::size_t(threads_))) {
    for (std::size_t i = 0; i < owner.size(); ++i)
      DC_CHECK(owner[i] >= (i > 0 ? owner[i - 1] : 0) && owner[i] < threads_, "ContiguousRuns: item ", i,
               " goes to thread ", owner[i], " (owners must be non-decreasing thread numbers below ", threads_, ")");
    std::size_t i = 0;
    for (int t = 0; t < threads_; ++t) {
      const std::size_t begin = i;
      while (i < owner.size() && owner[i] <= t) ++i;
      runs_[std::size_t(t)].store(pack(std::uint32_t(begin), std::uint32_t(i)), std::memory_order_relaxed);
    }
  }

  // The next item for `thread` (any number: one without a run only steals), or -1 once every
  // run is empty.
  int next(int thread) {
    if (thread >= 0 && thread < threads_)
      if (const int item = take(thread, true); item >= 0) return item;
    const int farthest = std::max(thread + 1, threads_);  // no run lies farther on either side
    for (int d = 1; d <= farthest; ++d)
      for (const int t : {thread + d, thread - d})
        if (t >= 0 && t < threads_)
          if (const int item = take(t, false); item >= 0) return item;
    return -1;
  }

 private:
  static std::uint64_t pack(std::uint32_t front, std::uint32_t back) { return (std::uint64_t(front) << 32) | back; }

  int take(int run, bool from_front) {
    std::atomic<std::uint64_t>& r = runs_[std::size_t(run)];
    std::uint64_t v = r.load(std::memory_order_relaxed);
    for (;;) {
      const std::uint32_t front = std::uint32_t(v >> 32), back = std::uint32_t(v);
      if (front >= back) return -1;
      const std::uint64_t taken = from_front ? pack(front + 1, back) : pack(front, back - 1);
      if (r.compare_exchange_weak(v, taken, std::memory_order_relaxed)) return int(from_front ? front : back - 1);
    }
  }

  int threads_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> runs_;
};

}  // namespace dc::cpu_detail
