#pragma once
// Opens a model file for the binary readers (GGUF, safetensors): a regular file, its size known
// before any header value is trusted, errors prefixed with the caller's location text.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include "../../core/error.hpp"

namespace dc::detail {

inline std::ifstream open_checked(const std::filesystem::path& path, const std::string& where,
                                  std::uint64_t& size) {
  std::error_code ec;
  DC_CHECK(std::filesystem::is_regular_file(path, ec), where, "file missing or not a regular file");
  size = std::filesystem::file_size(path, ec);
  DC_CHECK(!ec, where, "cannot get file size: ", ec.message());
  std::ifstream in(path, std::ios::binary);
  DC_CHECK(in.is_open(), where, "cannot open for reading");
  return in;
}

}  // namespace dc::detail
