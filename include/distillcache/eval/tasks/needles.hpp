#pragma once
// What needles are made of: 7-digit numbers, word keys and UUIDs (RULER's type_needle_k /
// type_needle_v), and the word list the word keys and the common-words task draw from.
//
// RULER takes its words from the Python package wonderwords (adjective-noun pairs). Here the list
// is any file of one word per line; the default is /usr/share/dict/words from Debian's
// `wamerican` package (scripts/setup.sh installs it), filtered to plain lowercase words. Tests
// pass a small list of their own instead (WordList::from_words).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../../core/error.hpp"
#include "rng.hpp"

namespace dc::tasks {

enum class NeedleType { numbers, words, uuids };

// The plural noun RULER's templates use ("special magic numbers").
inline const char* needle_type_name(NeedleType t) {
  switch (t) {
    case NeedleType::numbers: return "numbers";
    case NeedleType::words: return "words";
    case NeedleType::uuids: return "uuids";
  }
  return "?";
}

class WordList {
 public:
  inline static const char* const kDefaultPath = "/usr/share/dict/words";

  // Lowercase ASCII words of 3 to 12 letters, sorted and without duplicates: proper nouns,
  // possessives ("cat's") and accented entries of the dictionary are left out, so every word
  // tokenizes the same way wherever it appears.
  static WordList from_words(std::vector<std::string> words) {
    std::vector<std::string> kept;
    for (auto& w : words) {
      while (!w.empty() && (w.back() == '\r' || w.back() == ' ')) w.pop_back();
      const bool plain = w.size() >= 3 && w.size() <= 12 &&
                         std::all_of(w.begin(), w.end(), [](char c) { return c >= 'a' && c <= 'z'; });
      if (plain) kept.push_back(std::move(w));
    }
    std::sort(kept.begin(), kept.end());
    kept.erase(std::unique(kept.begin(), kept.end()), kept.end());
    DC_CHECK(kept.size() >= 16, "word list: ", kept.size(),
             " usable words (lowercase a-z, 3 to 12 letters); the tasks need at least 16");
    WordList list;
    list.words_ = std::move(kept);
    return list;
  }

  static WordList from_file(const std::filesystem::path& path) {
    std::ifstream in(path);
    DC_CHECK(in, "word list '", path.string(), "' cannot be read",
             path == kDefaultPath ? " (install Debian's wamerican package, or pass another list)" : "");
    std::vector<std::string> words;
    for (std::string line; std::getline(in, line);) words.push_back(line);
    return from_words(std::move(words));
  }

  const std::vector<std::string>& words() const { return words_; }
  std::size_t size() const { return words_.size(); }

 private:
  std::vector<std::string> words_;
};

// A 7-digit number, uniform in [1000000, 9999999] as RULER's.
inline std::string random_number(TaskRng& rng) { return std::to_string(rng.between(1000000, 9999999)); }

// Two words joined by a hyphen, as RULER's adjective-noun keys ("ancient-harbor").
inline std::string random_word_key(TaskRng& rng, const WordList& words) {
  return rng.choice(words.words()) + "-" + rng.choice(words.words());
}

// A version-4 UUID from 128 random bits (the version and variant bits set as RFC 4122 says),
// written as 8-4-4-4-12 lowercase hex digits.
inline std::string random_uuid(TaskRng& rng) {
  std::uint64_t hi = rng.bits(), lo = rng.bits();
  hi = (hi & ~0xF000ull) | 0x4000ull;                            // version 4
  lo = (lo & ~(0xC000000000000000ull)) | 0x8000000000000000ull;  // variant 10
  char buf[37];
  std::snprintf(buf, sizeof buf, "%08x-%04x-%04x-%04x-%012llx", unsigned(hi >> 32),
                unsigned((hi >> 16) & 0xFFFF), unsigned(hi & 0xFFFF), unsigned(lo >> 48),
                static_cast<unsigned long long>(lo & 0xFFFFFFFFFFFFull));
  return buf;
}

inline std::string random_needle(NeedleType t, TaskRng& rng, const WordList& words) {
  switch (t) {
    case NeedleType::numbers: return random_number(rng);
    case NeedleType::words: return random_word_key(rng, words);
    case NeedleType::uuids: return random_uuid(rng);
  }
  return {};
}

}  // namespace dc::tasks
