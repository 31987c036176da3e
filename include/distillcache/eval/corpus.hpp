#pragma once
// Evaluation and training text: the .txt files of a folder (or one file), tokenized, cut into
// non-overlapping windows of a fixed number of tokens.
//
// The rule, shared with bench/peers/kvpress_eval.py so both measure the same contexts: files in
// byte-wise name order; each file's whole text is tokenized without special tokens; windows of
// `window` tokens are taken from the start of each file, back to back, dropping the remainder;
// at most `max_windows` in total, in that order.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../core/error.hpp"
#include "../io/tokenizer.hpp"

namespace dc {

// A .txt file itself, or the .txt files directly inside a folder, sorted by name.
inline std::vector<std::filesystem::path> list_text_files(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  DC_CHECK(fs::exists(path), "text path ", path.string(), " does not exist");
  if (fs::is_regular_file(path)) return {path};
  DC_CHECK(fs::is_directory(path), "text path ", path.string(), " is neither a file nor a folder");
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(path))
    if (e.is_regular_file() && e.path().extension() == ".txt") files.push_back(e.path());
  std::sort(files.begin(), files.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename().string() < b.filename().string(); });
  DC_CHECK(!files.empty(), "no .txt files in ", path.string());
  return files;
}

inline std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  DC_CHECK(in, "cannot open ", path.string());
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

inline std::vector<std::vector<std::int32_t>> token_windows(const Tokenizer& tokenizer,
                                                            const std::filesystem::path& path,
                                                            int window, int max_windows) {
  DC_CHECK(window > 0, "token window must be positive, got ", window);
  DC_CHECK(max_windows > 0, "max windows must be positive, got ", max_windows);
  std::vector<std::vector<std::int32_t>> out;
  for (const auto& file : list_text_files(path)) {
    const auto ids = tokenizer.encode(read_text_file(file), /*add_special=*/false);
    for (std::size_t begin = 0; begin + std::size_t(window) <= ids.size(); begin += std::size_t(window)) {
      out.emplace_back(ids.begin() + std::ptrdiff_t(begin), ids.begin() + std::ptrdiff_t(begin) + window);
      if (int(out.size()) == max_windows) return out;
    }
  }
  return out;
}

}  // namespace dc
