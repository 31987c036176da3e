#pragma once
// A JSON file read whole and parsed, with errors that name the file: the loaders of Hugging Face
// folders read two (config.json, model.safetensors.index.json) the same way.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "../../core/error.hpp"

namespace dc::detail {

inline nlohmann::json read_json_file(const std::filesystem::path& path) {
  const std::string source = path.string();
  std::ifstream in(path);
  DC_CHECK(in.is_open(), source, ": cannot open");
  std::stringstream text;
  text << in.rdbuf();
  try {
    return nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    DC_FAIL(source, ": not valid JSON: ", e.what());
  }
}

}  // namespace dc::detail
