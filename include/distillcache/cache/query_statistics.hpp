#pragma once
// Running mean and covariance of the queries (before RoPE) of every layer and query head, for
// policies that predict future attention (math/expected_attention.hpp). Off unless a policy asks
// for it; accumulated on the host in double.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "../core/error.hpp"

namespace dc {

// What a policy asks of the query statistics: queries at positions >= from are accumulated
// (from < 0: none); the expected attention looks future_positions ahead.
struct QueryStatisticsSpec {
  int from = -1;
  int future_positions = 512;
  bool active() const { return from >= 0; }
  bool operator==(const QueryStatisticsSpec&) const = default;
};

class QueryStatistics {
 public:
  QueryStatistics() = default;
  // Starts collecting for a model of `layers` layers of `heads` query heads of head_dim.
  void start(QueryStatisticsSpec spec, float rope_theta, int layers, int heads, int head_dim) {
    DC_CHECK(spec.future_positions > 0, "query statistics: future_positions must be positive, got ",
             spec.future_positions);
    spec_ = spec;
    rope_theta_ = rope_theta;
    heads_ = heads;
    head_dim_ = head_dim;
    count_.assign(std::size_t(layers), 0.0);
    sum_.assign(std::size_t(layers), std::vector<double>(std::size_t(heads) * head_dim, 0.0));
    outer_.assign(std::size_t(layers),
                  std::vector<double>(std::size_t(heads) * head_dim * head_dim, 0.0));
  }
  void stop() { *this = QueryStatistics(); }
  void reset() {
    for (auto& c : count_) c = 0.0;
    for (auto& s : sum_) std::fill(s.begin(), s.end(), 0.0);
    for (auto& o : outer_) std::fill(o.begin(), o.end(), 0.0);
  }

  bool active() const { return spec_.active(); }
  const QueryStatisticsSpec& spec() const { return spec_; }
  float rope_theta() const { return rope_theta_; }
  int heads() const { return heads_; }
  int head_dim() const { return head_dim_; }
  double count(int layer) const { return count_[std::size_t(layer)]; }

  // Adds the rows of q [n, heads * head_dim] (host) whose positions are >= spec().from.
  void add(int layer, const float* q, const std::int32_t* positions, int n) {
    DC_CHECK(active() && layer >= 0 && layer < int(count_.size()), "query statistics: layer ",
             layer, " (collecting: ", active() ? "yes" : "no", ")");
    auto& sum = sum_[std::size_t(layer)];
    auto& outer = outer_[std::size_t(layer)];
    const int d = head_dim_;
    for (int t = 0; t < n; ++t) {
      if (positions[t] < spec_.from) continue;
      count_[std::size_t(layer)] += 1.0;
      for (int h = 0; h < heads_; ++h) {
        const float* x = q + (std::int64_t(t) * heads_ + h) * d;
        double* s = sum.data() + std::size_t(h) * d;
        double* o = outer.data() + std::size_t(h) * d * d;
        for (int i = 0; i < d; ++i) {
          s[i] += x[i];
          const double xi = x[i];
          for (int j = 0; j < d; ++j) o[std::size_t(i) * d + j] += xi * x[j];
        }
      }
    }
  }

  // Mean [head_dim] and covariance [head_dim, head_dim] (population, as kvpress) of head h's
  // queries in layer l.
  void mean_and_covariance(int layer, int head, double* mean, double* cov) const {
    const double n = count_[std::size_t(layer)];
    DC_CHECK(n > 0, "query statistics: no query of layer ", layer, " was collected (positions >= ",
             spec_.from, ")");
    const int d = head_dim_;
    const double* s = sum_[std::size_t(layer)].data() + std::size_t(head) * d;
    const double* o = outer_[std::size_t(layer)].data() + std::size_t(head) * d * d;
    for (int i = 0; i < d; ++i) mean[i] = s[i] / n;
    for (int i = 0; i < d; ++i)
      for (int j = 0; j < d; ++j)
        cov[std::size_t(i) * d + j] = o[std::size_t(i) * d + j] / n - mean[i] * mean[j];
  }

 private:
  QueryStatisticsSpec spec_;
  float rope_theta_ = 0.0f;
  int heads_ = 0, head_dim_ = 0;
  std::vector<double> count_;                // [layers]
  std::vector<std::vector<double>> sum_;     // [layers][heads * head_dim]
  std::vector<std::vector<double>> outer_;   // [layers][heads * head_dim * head_dim]
};

}  // namespace dc
