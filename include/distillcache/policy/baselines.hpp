#pragma once
// The heuristics every user compares a learned policy against. Each keeps the top-B of its score.
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "policy.hpp"

namespace dc {

// full: keeps everything; the reference every other policy is measured against.
class FullCachePolicy final : public EvictionPolicy {
 public:
  std::string name() const override { return "full"; }
  bool evicts() const override { return false; }
  int observation_window() const override { return 1; }
  void score_slots(const TokenFeatures& f, int, std::span<float> s) override {
    for (int i = 0; i < f.size; ++i) s[std::size_t(i)] = 0.0f;
  }
};

// random: a uniformly random B-subset (seeded), the floor any policy must beat.
class RandomPolicy final : public EvictionPolicy {
 public:
  explicit RandomPolicy(std::uint64_t seed = 0) : rng_(seed) {}
  std::string name() const override { return "random"; }
  int observation_window() const override { return 1; }
  void score_slots(const TokenFeatures& f, int, std::span<float> s) override {
    for (int i = 0; i < f.size; ++i)
      s[std::size_t(i)] = float(rng_() >> 40) * 0x1p-24f;  // uniform in [0, 1)
  }

 private:
  std::mt19937_64 rng_;
};

// streaming: attention sinks + the most recent tokens (StreamingLLM, Xiao et al. 2023; 4 sinks).
class StreamingPolicy final : public EvictionPolicy {
 public:
  explicit StreamingPolicy(int sinks = 4) : sinks_(sinks) {}
  std::string name() const override { return "streaming"; }
  int observation_window() const override { return 1; }
  void score_slots(const TokenFeatures& f, int, std::span<float> s) override {
    for (int i = 0; i < f.size; ++i) {
      const int p = f.position[std::size_t(i)];
      s[std::size_t(i)] = p < sinks_ ? INFINITY : float(p);
    }
  }

 private:
  int sinks_;
};

// h2o: heavy hitters by attention accumulated over all queries, half the budget kept for the
// most recent tokens (H2O, Zhang et al. 2023).
class H2OPolicy final : public EvictionPolicy {
 public:
  explicit H2OPolicy(double recent_fraction = 0.5) : recent_fraction_(recent_fraction) {}
  std::string name() const override { return "h2o"; }
  int observation_window() const override { return 0; }  // every prompt query
  void score_slots(const TokenFeatures& f, int budget, std::span<float> s) override {
    const int recent = int(recent_fraction_ * budget);
    for (int i = 0; i < f.size; ++i) {
      const bool is_recent = f.position[std::size_t(i)] > f.latest_position - recent;
      s[std::size_t(i)] = is_recent ? INFINITY : f.accumulated_mass[std::size_t(i)];
    }
  }

 private:
  double recent_fraction_;
};

// snapkv: attention of an observation window of the last W prompt queries, average-pooled over
// neighbouring positions, top-B; the window itself is kept (SnapKV, Li et al. 2024; W 64,
// kernel 5 as in kvpress).
class SnapKVPolicy final : public EvictionPolicy {
 public:
  explicit SnapKVPolicy(int window = 64, int kernel = 5) : window_(window), kernel_(kernel) {}
  std::string name() const override { return "snapkv"; }
  int observation_window() const override { return window_; }
  void score_slots(const TokenFeatures& f, int, std::span<float> s) override {
    // Slots are in position order for a shared keep-set; pool over slot neighbours.
    const int half = kernel_ / 2;
    for (int i = 0; i < f.size; ++i) {
      if (f.position[std::size_t(i)] > f.latest_position - window_) {
        s[std::size_t(i)] = INFINITY;
        continue;
      }
      float sum = 0.0f;
      for (int j = i - half; j <= i + half; ++j)
        if (j >= 0 && j < f.size) sum += f.alpha[std::size_t(j)];
      s[std::size_t(i)] = sum / float(kernel_);  // zero padding at the edges, as avg_pool1d
    }
  }

 private:
  int window_, kernel_;
};

// tova: evict the token the newest query attends to least, mean over heads and layers
// (TOVA, Oren et al. 2024).
class TOVAPolicy final : public EvictionPolicy {
 public:
  std::string name() const override { return "tova"; }
  int observation_window() const override { return 1; }
  void score_slots(const TokenFeatures& f, int, std::span<float> s) override {
    for (int i = 0; i < f.size; ++i) s[std::size_t(i)] = f.last_query_mass[std::size_t(i)];
  }
};

// knorm: keep the keys of lowest L2 norm, which draw the most attention (Devoto et al. 2024).
class KNormPolicy final : public EvictionPolicy {
 public:
  std::string name() const override { return "knorm"; }
  int observation_window() const override { return 1; }
  void score_slots(const TokenFeatures& f, int, std::span<float> s) override {
    for (int i = 0; i < f.size; ++i) s[std::size_t(i)] = -f.key_norm[std::size_t(i)];
  }
};

inline std::vector<std::string> baseline_policy_names() {
  return {"full", "random", "streaming", "h2o", "snapkv", "tova", "knorm"};
}

// Makes a baseline by name; dc::Error lists the known names otherwise.
inline std::unique_ptr<EvictionPolicy> make_baseline_policy(const std::string& name,
                                                             std::uint64_t seed = 0) {
  if (name == "full") return std::make_unique<FullCachePolicy>();
  if (name == "random") return std::make_unique<RandomPolicy>(seed);
  if (name == "streaming") return std::make_unique<StreamingPolicy>();
  if (name == "h2o") return std::make_unique<H2OPolicy>();
  if (name == "snapkv") return std::make_unique<SnapKVPolicy>();
  if (name == "tova") return std::make_unique<TOVAPolicy>();
  if (name == "knorm") return std::make_unique<KNormPolicy>();
  DC_FAIL("unknown policy '", name, "' (known: full, random, streaming, h2o, snapkv, tova, knorm)");
}

}  // namespace dc
