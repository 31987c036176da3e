#pragma once
// Layers named in option text: lists of layers and FIRST-LAST ranges ("8-15,20"; MlpPolicy's
// newest_query_layers and newest_query_reserve_layers) and budget weights per layer
// ("18-20=1.5": MlpPolicy's layer_budget_weights, math/layer_budgets.hpp), and both carried to a
// model of another depth (math/layer_depth.hpp).
#include <algorithm>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../core/parse_text.hpp"
#include "../math/layer_budgets.hpp"
#include "../math/layer_depth.hpp"

namespace dc {

// The [first, last] ranges of "8-15,20" in order; `what` names the option in errors. Throws
// naming the first item that is not a layer or a FIRST-LAST range.
inline std::vector<std::pair<int, int>> parse_layer_ranges(std::string_view text, std::string_view what) {
  auto index = [&](std::string_view s) {
    const auto v = whole_integer(s);
    DC_CHECK(v.has_value() && *v >= 0 && *v < (1LL << 20), what, " '", std::string(text), "': '", std::string(s),
             "' is not a layer index");
    return int(*v);
  };
  std::vector<std::pair<int, int>> ranges;
  for (const std::string_view item : comma_items(text)) {
    const std::size_t dash = item.find('-');
    const int first = index(item.substr(0, dash));
    const int last = dash == std::string_view::npos ? first : index(item.substr(dash + 1));
    DC_CHECK(first <= last, what, " '", std::string(text), "': range '", std::string(item), "' ends before it begins");
    ranges.emplace_back(first, last);
  }
  return ranges;
}

// "8-15,20": model layers (MlpPolicy's newest_query_layers and newest_query_reserve_layers),
// sorted, each once; "" or "none": an empty list. Throws naming the first item that is not a
// layer or a FIRST-LAST range.
inline std::vector<int> parse_layer_list(std::string_view text) {
  std::vector<int> layers;
  if (text.empty() || text == "none") return layers;
  for (const auto& [first, last] : parse_layer_ranges(text, "layer list")) {
    for (int l = first; l <= last; ++l) layers.push_back(l);
  }
  std::sort(layers.begin(), layers.end());
  layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
  return layers;
}

// The list as parse_layer_list reads it ("none" when empty; ranges joined).
inline std::string describe_layer_list(std::span<const int> layers) {
  if (layers.empty()) return "none";
  std::ostringstream out;  // appends only: GCC 12 warns (-Wrestrict) on "-" + std::string
  for (std::size_t i = 0; i < layers.size();) {
    std::size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1) ++j;
    if (i > 0) out << ',';
    out << layers[i];
    if (j > i) out << '-' << layers[j];
    i = j + 1;
  }
  return out.str();
}

// Budget weights per layer (math/layer_budgets.hpp) as an option spells them:
//   "" or "none"        no weights (every layer keeps the budget);
//   "1,1,...,1.5"       one weight per model layer;
//   "18-20=1.5,25=0.8"  the named layers or ranges get that weight, every other layer 1.
// num_layers: the model's layer count, which the LAYERS=WEIGHT form needs and a full list must
// match; 0 when the caller does not know it (then only a full list is read). Throws naming the
// first problem; every weight must be positive and finite.
inline std::vector<double> parse_layer_budget_weights(std::string_view text, int num_layers) {
  std::vector<double> weights;
  if (text.empty() || text == "none") return weights;
  const std::string quoted = "layer budget weights '" + std::string(text) + "'";
  auto number = [&](std::string_view s) {
    const auto v = whole_double(s);
    DC_CHECK(v.has_value(), quoted, ": '", std::string(s), "' is not a number");
    return *v;
  };
  if (text.find('=') == std::string_view::npos) {
    for (const std::string_view item : comma_items(text)) weights.push_back(number(item));
    DC_CHECK(num_layers == 0 || int(weights.size()) == num_layers, quoted, ": ", weights.size(),
             " weights; the model has ", num_layers, " layers (give one per layer, or LAYERS=WEIGHT items)");
  } else {
    DC_CHECK(num_layers > 0, quoted, ": the LAYERS=WEIGHT form needs the model's layer count");
    weights.assign(std::size_t(num_layers), 1.0);
    std::vector<char> named(std::size_t(num_layers), 0);
    for (const std::string_view item : comma_items(text)) {
      const std::size_t eq = item.find('=');
      DC_CHECK(eq != std::string_view::npos, quoted, ": '", std::string(item), "' is not LAYERS=WEIGHT");
      const double w = number(item.substr(eq + 1));
      for (const auto& [first, last] : parse_layer_ranges(item.substr(0, eq), "layer budget weights")) {
        DC_CHECK(last < num_layers, quoted, ": layer ", last, " named; the model has ", num_layers, " layers");
        for (int l = first; l <= last; ++l) {
          DC_CHECK(!named[std::size_t(l)], quoted, ": layer ", l, " is named twice");
          named[std::size_t(l)] = 1;
          weights[std::size_t(l)] = w;
        }
      }
    }
  }
  check_layer_budget_weights(weights, quoted.c_str());
  return weights;
}

// The weights as parse_layer_budget_weights reads them: "none", the LAYERS=WEIGHT form when
// some layers weigh 1 and some do not (ranges joined), else the full list.
inline std::string describe_layer_budget_weights(std::span<const double> weights) {
  if (weights.empty()) return "none";
  std::ostringstream out;  // appends only (see describe_layer_list)
  const auto ones = std::count(weights.begin(), weights.end(), 1.0);
  if (ones == 0 || std::size_t(ones) == weights.size()) {
    for (std::size_t l = 0; l < weights.size(); ++l) out << (l ? "," : "") << weights[l];
    return out.str();
  }
  bool any = false;
  for (std::size_t l = 0; l < weights.size();) {
    std::size_t j = l;
    while (j + 1 < weights.size() && weights[j + 1] == weights[l]) ++j;
    if (weights[l] != 1.0) {
      out << (any ? "," : "") << l;
      if (j > l) out << '-' << j;
      out << '=' << weights[l];
      any = true;
    }
    l = j + 1;
  }
  return out.str();
}

// Budget weights written for a model of weights.size() layers, for a model of `layers` layers:
// each layer takes the weight of the layer at the same relative depth (math/layer_depth.hpp).
// Unchanged when the depths agree; empty stays empty (no weights: every layer keeps the budget).
inline std::vector<double> layer_budget_weights_at_depth(std::span<const double> weights, int layers) {
  if (weights.empty() || weights.size() == std::size_t(layers)) return {weights.begin(), weights.end()};
  std::vector<double> out(static_cast<std::size_t>(layers));
  for (int l = 0; l < layers; ++l)
    out[std::size_t(l)] = weights[std::size_t(math::layer_at_same_depth(l, layers, int(weights.size())))];
  return out;
}

// A sorted list of layers of a model of `source_layers` layers, for a model of `layers` layers:
// the layers whose same-depth source layer is in the list (math/layer_depth.hpp). May be empty
// when the model is shallower (no layer's centre lands in the listed ones).
inline std::vector<int> layer_list_at_depth(std::span<const int> list, int source_layers, int layers) {
  if (source_layers == layers) return {list.begin(), list.end()};
  std::vector<int> out;
  for (int l = 0; l < layers; ++l)
    if (std::binary_search(list.begin(), list.end(), math::layer_at_same_depth(l, layers, source_layers)))
      out.push_back(l);
  return out;
}

// The layers 0..layers-1 missing from a sorted list (an empty list: every layer).
inline std::vector<int> layers_outside(std::span<const int> list, int layers) {
  std::vector<int> out;
  for (int l = 0; l < layers; ++l)
    if (!std::binary_search(list.begin(), list.end(), l)) out.push_back(l);
  return out;
}

}  // namespace dc
