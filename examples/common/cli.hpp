#pragma once
// Command-line plumbing shared by the example programs: every failure is one line on stderr,
//   <program>: error: <what went wrong>
// and a non-zero exit status, never a signal or an uncaught exception:
//   0  success (also --help, which prints the usage to stdout)
//   1  the inputs are well-formed but unusable: a missing or corrupt model, a budget the prompt
//      cannot hold, a prompt longer than the model's context, an unwritable output file, ...
//   2  the command line itself is wrong: an unknown flag, a missing or malformed value
// tests/examples/bad_args.sh checks this for every bad input it knows of.
#include <CLI/CLI.hpp>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <new>
#include <optional>
#include <stdexcept>
#include <sstream>
#include <string>
#include <vector>

#include <distillcache/core/error.hpp>
#include <distillcache/core/parse_text.hpp>
#include <distillcache/policy/policy.hpp>

namespace dc_examples {

inline constexpr int exit_failure = 1;
inline constexpr int exit_usage = 2;

// A message folded onto one line (file names and library messages could hold line breaks).
inline std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

inline void print_error(const char* program, const std::string& message) {
  std::fprintf(stderr, "%s: error: %s\n", program, one_line(message).c_str());
}

// Parses the command line. Returns the exit status when the program should stop now (--help, or
// a usage error, reported as one line), nothing when it should go on.
inline std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv,
                                             const char* program) {
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::Success& e) {  // --help: usage on stdout, status 0
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string message = e.what();
    // CLI11 reports a missing required option before an unknown one; the unknown one (often a
    // misspelt flag) is the better explanation, so it goes first.
    if (const auto extra = app.remaining(); !extra.empty()) {
      message = extra.size() == 1 ? "unknown argument '" : "unknown arguments '";
      for (std::size_t i = 0; i < extra.size(); ++i) message += (i ? " " : "") + extra[i];
      message += "'";
    }
    print_error(program, message + " (see --help)");
    return exit_usage;
  }
}

// Runs the body of main, turning any exception into one line and exit status 1.
template <class Body>
int run_reporting_errors(const char* program, Body&& body) {
  try {
    return body();
  } catch (const dc::Error& e) {
    print_error(program, e.message());
  } catch (const std::bad_alloc&) {
    print_error(program, "out of memory");
  } catch (const std::exception& e) {
    print_error(program, e.what());
  } catch (...) {
    print_error(program, "unknown failure");
  }
  return exit_failure;
}

// ---- Validators with one-line messages (CLI11 prefixes them with the flag's name) ----------

// "a,b,,c" -> {"a", "b", "c"}: the comma lists of --budget, --policy, --granularity, ...
inline std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::string item;
  std::stringstream in(s);
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

namespace detail {
// std::stoll / std::stod over the whole string: the value, or why not.
template <class T, class Parse>
std::optional<T> parse_all(const std::string& s, Parse parse, bool* out_of_range = nullptr) {
  try {
    std::size_t used = 0;
    const T v = parse(s, &used);
    if (used == s.size()) return v;
  } catch (const std::out_of_range&) {
    if (out_of_range) *out_of_range = true;
  } catch (const std::invalid_argument&) {
  }
  return std::nullopt;
}
inline std::optional<long long> to_integer(const std::string& s, bool* out_of_range = nullptr) {
  return parse_all<long long>(
      s, [](const std::string& t, std::size_t* used) { return std::stoll(t, used); }, out_of_range);
}
inline std::optional<double> to_number(const std::string& s) { return dc::whole_double(s); }
}  // namespace detail

// An integer in [lo, hi].
inline CLI::Validator integer_in(long long lo, long long hi) {
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return CLI::Validator(
      [lo, hi, range](std::string& s) -> std::string {
        bool huge = false;
        const auto v = detail::to_integer(s, &huge);
        if (!v && !huge) return "'" + s + "' is not an integer";
        if (huge || *v < lo || *v > hi) return "must be in " + range + ", got " + s;
        return {};
      },
      range);
}

// A non-negative integer that fits 64 bits (CLI11 alone would wrap "-1" around).
inline CLI::Validator unsigned_integer() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        const auto v = detail::parse_all<unsigned long long>(
            s, [](const std::string& t, std::size_t* used) { return std::stoull(t, used); });
        if (v && s.find('-') == std::string::npos) return {};
        return "'" + s + "' is not a non-negative 64-bit integer";
      },
      "non-negative");
}

// A finite number in [lo, hi] (NaN would slip through CLI::Range).
inline CLI::Validator finite_number(double lo, double hi) {
  std::ostringstream os;
  os << "[" << lo << ", " << hi << "]";
  const std::string range = os.str();
  return CLI::Validator(
      [lo, hi, range](std::string& s) -> std::string {
        const auto v = detail::to_number(s);
        if (!v) return "'" + s + "' is not a number";
        if (!std::isfinite(*v) || *v < lo || *v > hi)
          return "must be a finite number in " + range + ", got " + s;
        return {};
      },
      range);
}

// A number (its range is the library's to check), or a comma-separated list of them.
inline CLI::Validator number() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        return detail::to_number(s) ? std::string() : "'" + s + "' is not a number";
      },
      "");
}
inline CLI::Validator number_list() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        std::stringstream in(s);
        std::string item;
        while (std::getline(in, item, ','))
          if (!item.empty() && !detail::to_number(item)) return "'" + item + "' is not a number";
        return {};
      },
      "NUMBER,...");
}

// ---- Input paths --------------------------------------------------------------------------

enum class ModelFormat { gguf, hf_folder };

// What --model names: a folder with a config.json (a Hugging Face checkpoint) or a GGUF file (by
// extension or by its magic). Anything else fails here with a message about --model; what is
// wrong inside a model file is for the library's readers to say.
inline ModelFormat model_format(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto status = fs::status(path, ec);
  DC_CHECK(fs::exists(status), "--model: '", path, "' does not exist");
  if (fs::is_directory(status)) {
    DC_CHECK(fs::exists(fs::path(path) / "config.json", ec), "--model: folder '", path,
             "' has no config.json, so it is not a Hugging Face checkpoint");
    return ModelFormat::hf_folder;
  }
  DC_CHECK(fs::is_regular_file(status), "--model: '", path, "' is neither a file nor a folder");
  if (fs::path(path).extension() == ".gguf") return ModelFormat::gguf;  // the reader says what is wrong
  char magic[4] = {};
  std::ifstream in(path, std::ios::binary);
  DC_CHECK(in, "--model: cannot open '", path, "'");
  in.read(magic, 4);
  DC_CHECK(in.gcount() == 4 && std::string(magic, 4) == "GGUF", "--model: '", path,
           "' is neither a GGUF file (no 'GGUF' magic) nor a Hugging Face model folder");
  return ModelFormat::gguf;
}

// Fails unless `path` can be opened for writing. Leaves an existing file as it was (opened for
// appending, nothing written) and removes the file when the probe created it.
inline void check_writable(const std::string& path, const char* flag) {
  namespace fs = std::filesystem;
  std::error_code ec;
  DC_CHECK(!fs::is_directory(path, ec), flag, ": '", path, "' is a folder");
  const bool existed = fs::exists(path, ec);
  errno = 0;
  std::ofstream probe(path, std::ios::app);
  const int err = errno;
  DC_CHECK(probe.is_open(), flag, ": cannot write '", path, "'", err ? ": " : "",
           err ? std::strerror(err) : "");
  probe.close();
  if (!existed) fs::remove(path, ec);
}

// One line on stderr when the policy's rules per layer were written for a model of another depth:
// say so, since they then apply by relative depth (math/layer_depth.hpp), not as written, or not
// at all (EvictionPolicy::maps_layer_rules).
inline void note_layer_rules_depth(const char* program, const dc::EvictionPolicy& policy, int model_layers) {
  const int depth = policy.layer_rules_depth();
  if (depth == 0 || depth == model_layers) return;
  std::fprintf(stderr, "%s: policy '%s' has rules per layer for a model of %d layers; this model has %d: %s\n", program,
               policy.name().c_str(), depth, model_layers,
               policy.maps_layer_rules() ? "each layer takes the rule of the layer at the same relative depth"
                                         : "its file leaves them out on other models (layer_rules_on_other_models drop)");
}

}  // namespace dc_examples
