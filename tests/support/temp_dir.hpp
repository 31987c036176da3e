#pragma once
// A fresh directory under the system temp dir for tests that write hostile files; removed with
// everything in it when the object goes out of scope.
#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <system_error>

namespace dc_test {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix = "dc_test") {
    static std::atomic<int> counter{0};
    const auto stamp = std::chrono::steady_clock::now().time_since_epoch().count();
    path = std::filesystem::temp_directory_path() /
           (prefix + "_" + std::to_string(stamp) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::filesystem::path operator/(const std::string& name) const { return path / name; }
};

}  // namespace dc_test
