#pragma once
// dc::Error: the one exception type the library throws. It carries the source location of the
// failed check so a user's bug report points straight at the precondition that fired.
#include <sstream>
#include <stdexcept>
#include <string>

namespace dc {

class Error : public std::runtime_error {
 public:
  Error(const std::string& message, const char* file, int line)
      : std::runtime_error(message + " [" + file + ":" + std::to_string(line) + "]"),
        message_(message) {}
  // The message without the location, for one-line user-facing output.
  const std::string& message() const noexcept { return message_; }

 private:
  std::string message_;
};

namespace detail {
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}
}  // namespace detail

}  // namespace dc

// Throws dc::Error with the streamed message parts and the caller's file:line.
#define DC_FAIL(...) throw ::dc::Error(::dc::detail::concat(__VA_ARGS__), __FILE__, __LINE__)

// Precondition check that stays on in release builds: bad input must never become UB.
#define DC_CHECK(cond, ...)          \
  do {                               \
    if (!(cond)) DC_FAIL(__VA_ARGS__); \
  } while (0)
