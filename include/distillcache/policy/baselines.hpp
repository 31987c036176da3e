#pragma once
// The heuristics every user compares a learned policy against. Each keeps the top-B of its score.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "policy.hpp"

namespace dc {

// Every baseline scores rows (cache/features.hpp), so each runs at every granularity: one
// keep-set for the whole cache, one per layer or one per (layer, KV head). At head granularity
// each follows the rule of the corresponding kvpress press (kvpress keeps per-(layer, KV head)
// sets): observed = ObservedAttentionPress, snapkv = SnapKVPress (window 64, kernel 5, average
// pooling), tova = TOVAPress (per layer: it averages over all heads of a layer), knorm =
// KnormPress, streaming = StreamingLLMPress, random = RandomPress, expected =
// ExpectedAttentionPress.

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

// random: a uniformly random B-subset of each group (seeded), the floor any policy must beat.
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
// most recent tokens (H2O, Zhang et al. 2023). "h2o:recent=F" keeps the newest fraction F of the
// budget instead (the best F depends on the text and the budget: bench/results/README.md).
class H2OPolicy final : public EvictionPolicy {
 public:
  explicit H2OPolicy(double recent_fraction = 0.5, std::string name = "h2o")
      : recent_fraction_(recent_fraction), name_(std::move(name)) {
    DC_CHECK(std::isfinite(recent_fraction) && recent_fraction >= 0.0 && recent_fraction <= 1.0,
             "policy '", name_, "': the recent fraction must lie in [0, 1]");
  }
  std::string name() const override { return name_; }
  int observation_window() const override { return 0; }  // every prompt query
  std::optional<ScoreRule> score_rule(int budget) const override {
    return ScoreRule{ScoreRule::Kind::accumulated_mass, recent_slots(budget)};
  }
  void score_slots(const TokenFeatures& f, int budget, std::span<float> s) override {
    const int recent = recent_slots(budget);
    for (int i = 0; i < f.size; ++i)
      s[std::size_t(i)] = math::h2o_score(f.position[std::size_t(i)], f.latest_position, recent,
                                          f.accumulated_mass[std::size_t(i)]);
  }

 private:
  int recent_slots(int budget) const { return int(recent_fraction_ * budget); }
  double recent_fraction_;
  std::string name_;
};

// observed: the mean attention a token received from the queries that could see it (every
// prompt query observed), no recent window and no sinks: kvpress's ObservedAttentionPress, its
// one-shot form of H2O. That mean is the alpha feature.
class ObservedAttentionPolicy final : public EvictionPolicy {
 public:
  std::string name() const override { return "observed"; }
  int observation_window() const override { return 0; }
  void score_slots(const TokenFeatures& f, int, std::span<float> s) override {
    for (int i = 0; i < f.size; ++i) s[std::size_t(i)] = f.feature(i, Feature::alpha);
  }
};

// snapkv: attention of an observation window of the last W prompt queries to the keys before
// the window, average-pooled over neighbouring positions of the same group, top-B; the window
// itself is kept (SnapKV, Li et al. 2024; W 64, kernel 5 and average pooling as in kvpress). The
// pooling sees only the keys before the window, zero-padded at both ends, as kvpress pools its
// [L - W] score array: the window's own attention never leaks into its neighbours' scores.
class SnapKVPolicy final : public EvictionPolicy {
 public:
  explicit SnapKVPolicy(int window = 64, int kernel = 5) : window_(window), kernel_(kernel) {}
  std::string name() const override { return "snapkv"; }
  int observation_window() const override { return window_; }
  void score_slots(const TokenFeatures& f, int, std::span<float> s) override {
    // A group's rows are in position order: pool over row neighbours inside the group that lie
    // before the window.
    const int half = kernel_ / 2;
    auto in_window = [&](int row) { return f.position[std::size_t(row)] > f.latest_position - window_; };
    for (const FeatureGroup& g : f.groups)
      for (int i = g.row_begin; i < g.row_end; ++i) {
        if (in_window(i)) {
          s[std::size_t(i)] = INFINITY;
          continue;
        }
        float sum = 0.0f;
        for (int j = std::max(g.row_begin, i - half); j <= std::min(g.row_end - 1, i + half); ++j)
          if (!in_window(j)) sum += f.feature(j, Feature::alpha);
        s[std::size_t(i)] = sum / float(kernel_);  // zero padding at the edges, as avg_pool1d
      }
  }

 private:
  int window_, kernel_;
};

// tova: evict the token the newest query attends to least, mean over the heads of a layer (or of
// every layer for a shared set) (TOVA, Oren et al. 2024); the newest token itself is always kept,
// as in kvpress's TOVAPress. Defined per layer, as there: a head-granular request keeps one set
// per layer.
class TOVAPolicy final : public EvictionPolicy {
 public:
  std::string name() const override { return "tova"; }
  int observation_window() const override { return 1; }
  Granularity finest_granularity() const override { return Granularity::layer; }
  void score_slots(const TokenFeatures& f, int, std::span<float> s) override {
    for (int i = 0; i < f.size; ++i)
      s[std::size_t(i)] = f.position[std::size_t(i)] == f.latest_position
                              ? INFINITY
                              : f.last_query_mass[std::size_t(i)];
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

// expected: the attention future queries are expected to pay each key, from the mean and
// covariance of the prompt's queries rotated to the next 512 positions, times ||v||; the first 4
// tokens (sinks) are kept and left out of the statistics (kvpress's ExpectedAttentionPress, its
// recommended default; cache/expected_attention.hpp).
class ExpectedAttentionPolicy final : public EvictionPolicy {
 public:
  explicit ExpectedAttentionPolicy(int sinks = 4, int future_positions = 512)
      : sinks_(sinks), future_positions_(future_positions) {}
  std::string name() const override { return "expected"; }
  int observation_window() const override { return 1; }  // reads no attention statistics
  QueryStatisticsSpec query_statistics() const override { return {sinks_, future_positions_}; }
  void score_slots(const TokenFeatures& f, int, std::span<float> s) override {
    DC_CHECK(f.has_expected_attention, "policy 'expected': the features carry no expected "
             "attention (the cache did not collect query statistics)");
    for (int i = 0; i < f.size; ++i)
      s[std::size_t(i)] =
          f.position[std::size_t(i)] < sinks_ ? INFINITY : f.expected_attention[std::size_t(i)];
  }

 private:
  int sinks_, future_positions_;
};

inline std::vector<std::string> baseline_policy_names() {
  return {"full", "random", "streaming", "h2o", "observed", "snapkv", "tova", "knorm", "expected"};
}

inline constexpr std::string_view kH2ORecentPrefix = "h2o:recent=";

// Whether make_baseline_policy knows `name` (a baseline's name, or h2o with its recent fraction).
inline bool is_baseline_policy_name(const std::string& name) {
  const auto names = baseline_policy_names();
  return name.rfind(kH2ORecentPrefix, 0) == 0 || std::find(names.begin(), names.end(), name) != names.end();
}

// Makes a baseline by name; dc::Error lists the known names otherwise.
inline std::unique_ptr<EvictionPolicy> make_baseline_policy(const std::string& name,
                                                             std::uint64_t seed = 0) {
  if (name.rfind(kH2ORecentPrefix, 0) == 0) {
    const std::string value = name.substr(kH2ORecentPrefix.size());
    char* end = nullptr;
    const double fraction = std::strtod(value.c_str(), &end);
    DC_CHECK(!value.empty() && end == value.c_str() + value.size(), "policy '", name,
             "': the recent fraction '", value, "' is not a number");
    return std::make_unique<H2OPolicy>(fraction, name);
  }
  if (name == "full") return std::make_unique<FullCachePolicy>();
  if (name == "random") return std::make_unique<RandomPolicy>(seed);
  if (name == "streaming") return std::make_unique<StreamingPolicy>();
  if (name == "h2o") return std::make_unique<H2OPolicy>();
  if (name == "observed") return std::make_unique<ObservedAttentionPolicy>();
  if (name == "snapkv") return std::make_unique<SnapKVPolicy>();
  if (name == "tova") return std::make_unique<TOVAPolicy>();
  if (name == "knorm") return std::make_unique<KNormPolicy>();
  if (name == "expected") return std::make_unique<ExpectedAttentionPolicy>();
  DC_FAIL("unknown policy '", name, "' (known: full, random, streaming, h2o, h2o:recent=F, observed, snapkv, tova, knorm, expected)");
}

}  // namespace dc
