#pragma once
// Numbers and lists spelled in option text ("0.25", "8-15,20"), parsed whole: a string that
// only begins with a number ("0.25x") is not one. The policy's rule parsers share these, so every
// option reads a number the same way.
#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace dc {

// The double that all of s spells, or nullopt (empty, trailing text, out of range).
inline std::optional<double> whole_double(std::string_view s) {
  const std::string str(s);
  try {
    std::size_t used = 0;
    const double v = std::stod(str, &used);
    if (used == str.size()) return v;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

// The integer that all of s spells, or nullopt.
inline std::optional<long long> whole_integer(std::string_view s) {
  const std::string str(s);
  try {
    std::size_t used = 0;
    const long long v = std::stoll(str, &used);
    if (used == str.size()) return v;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

// The comma-separated items of text ("" gives one empty item, so a caller names it).
inline std::vector<std::string_view> comma_items(std::string_view text) {
  std::vector<std::string_view> items;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    items.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return items;
}

}  // namespace dc
