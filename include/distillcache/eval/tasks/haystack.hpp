#pragma once
// The text the needles hide in (RULER's type_haystack):
//   noise  - one fixed sentence group repeated ("The grass is green. The sky is blue. ...");
//   essay  - real prose, cut to a number of words and split into sentences. RULER uses Paul
//            Graham's essays; here it is the license texts Debian ships in every installation,
//            /usr/share/common-licenses (package base-files: GPL, LGPL, GFDL, Apache, MPL, ...).
//            Neither Vim's help files (the KL evaluation text) nor the Python documentation (the
//            training corpus) are used, so the task text is new to the policy;
//   needle - distractor needles (built by ruler_tasks.hpp, which knows the needle sentence).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "../../core/error.hpp"

namespace dc::tasks {

inline constexpr std::string_view kNoiseSentences =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
inline constexpr const char* kDefaultEssayPath = "/usr/share/common-licenses";

// Whitespace-separated words of a text, in order (runs of spaces, tabs and line breaks are one
// separator, as RULER's re.sub(r'\s+', ' ', essay).split(' ')).
inline std::vector<std::string> split_words(std::string_view text) {
  std::vector<std::string> out;
  std::size_t i = 0;
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; };
  while (i < text.size()) {
    while (i < text.size() && space(text[i])) ++i;
    const std::size_t start = i;
    while (i < text.size() && !space(text[i])) ++i;
    if (i > start) out.emplace_back(text.substr(start, i - start));
  }
  return out;
}

// Sentences of a run of words: a sentence ends with a word whose last character is '.', '!' or
// '?' (after any closing quotes or brackets). Simpler than NLTK's Punkt, which RULER uses, and
// deterministic: an abbreviation such as "e.g." ends a sentence here.
inline std::vector<std::string> split_sentences(const std::vector<std::string>& words, std::size_t count) {
  std::vector<std::string> out;
  std::string current;
  count = std::min(count, words.size());
  for (std::size_t i = 0; i < count; ++i) {
    if (!current.empty()) current += ' ';
    current += words[i];
    std::string_view w = words[i];
    while (!w.empty() && (w.back() == '"' || w.back() == '\'' || w.back() == ')' || w.back() == ']'))
      w.remove_suffix(1);
    if (!w.empty() && (w.back() == '.' || w.back() == '!' || w.back() == '?')) {
      out.push_back(std::move(current));
      current.clear();
    }
  }
  if (!current.empty()) out.push_back(std::move(current));
  return out;
}

// The essay haystack's words: a file, or every regular file of a folder in byte-wise name order
// (symbolic links skipped: /usr/share/common-licenses/GPL is a link to GPL-3), concatenated.
class EssayText {
 public:
  static EssayText from_words(std::vector<std::string> words) {
    DC_CHECK(!words.empty(), "essay haystack: the text has no words");
    EssayText e;
    e.words_ = std::move(words);
    return e;
  }
  static EssayText from_text(std::string_view text) { return from_words(split_words(text)); }

  static EssayText from_path(const std::filesystem::path& path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    DC_CHECK(fs::exists(path, ec), "essay haystack: '", path.string(), "' does not exist");
    std::vector<fs::path> files;
    if (fs::is_directory(path, ec)) {
      for (const auto& e : fs::directory_iterator(path))
        if (!e.is_symlink() && e.is_regular_file()) files.push_back(e.path());
      std::sort(files.begin(), files.end(),
                [](const fs::path& a, const fs::path& b) { return a.filename().string() < b.filename().string(); });
    } else {
      files.push_back(path);
    }
    DC_CHECK(!files.empty(), "essay haystack: no files in '", path.string(), "'");
    std::vector<std::string> words;
    for (const auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      DC_CHECK(in, "essay haystack: cannot open '", f.string(), "'");
      std::ostringstream os;
      os << in.rdbuf();
      const auto w = split_words(os.str());
      words.insert(words.end(), w.begin(), w.end());
    }
    return from_words(std::move(words));
  }

  const std::vector<std::string>& words() const { return words_; }

 private:
  std::vector<std::string> words_;
};

}  // namespace dc::tasks
