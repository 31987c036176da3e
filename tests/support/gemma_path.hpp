#pragma once
// Where tests find the real Gemma 3 270M GGUF: $DC_GEMMA3_GGUF, else the cache that
// scripts/fetch_gemma.sh fills (${XDG_CACHE_HOME:-$HOME/.cache}/distillcache).
#include <cstdlib>
#include <filesystem>
#include <string>

namespace dc_test {

inline std::filesystem::path gemma3_gguf_path() {
  if (const char* p = std::getenv("DC_GEMMA3_GGUF"); p && *p) return p;
  std::filesystem::path cache;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) cache = x;
  else if (const char* h = std::getenv("HOME"); h && *h) cache = std::filesystem::path(h) / ".cache";
  return cache / "distillcache" / "gemma-3-270m-q4_k_m.gguf";
}

}  // namespace dc_test
