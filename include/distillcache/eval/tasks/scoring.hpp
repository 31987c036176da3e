#pragma once
// RULER's scoring of one generated answer against the expected strings (its
// scripts/eval/synthetic/constants.py and evaluate.py):
//   - the output is cleaned first: every control character (U+0000..U+001F) becomes a line break
//     and surrounding whitespace is trimmed (postprocess_pred), so a stray control byte can split
//     a value but never join two;
//   - string_match_all: the fraction of expected strings that occur in the output, ignoring
//     ASCII case (every synthetic task, the multi-value and multi-query needles included);
//   - string_match_part: 1 if any expected string occurs, else 0 (RULER's QA tasks).
// A task's score over samples is the mean of these per-sample scores.
#include <string>
#include <string_view>
#include <vector>

namespace dc::tasks {

enum class Scoring { match_all, match_part };

inline const char* scoring_name(Scoring s) { return s == Scoring::match_all ? "string_match_all" : "string_match_part"; }

inline std::string clean_output(std::string_view out) {
  std::string s(out);
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20) c = '\n';
  auto space = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; };
  std::size_t b = 0, e = s.size();
  while (b < e && space(s[b])) ++b;
  while (e > b && space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

inline std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  return out;
}

inline bool contains_ignoring_case(std::string_view haystack, std::string_view needle) {
  return ascii_lower(haystack).find(ascii_lower(needle)) != std::string::npos;
}

inline double score_output(std::string_view output, const std::vector<std::string>& expected, Scoring how) {
  if (expected.empty()) return 0.0;
  const std::string cleaned = clean_output(output);
  int found = 0;
  for (const auto& e : expected) found += contains_ignoring_case(cleaned, e);
  if (how == Scoring::match_part) return found > 0 ? 1.0 : 0.0;
  return double(found) / double(expected.size());
}

}  // namespace dc::tasks
