#pragma once
// A short, safe rendering of an untrusted JSON value for error messages.
//
// nlohmann's dump() recurses once per nesting level, so dumping `[[[[...]]]]` from a hostile
// config.json or safetensors header overflows the stack (see fuzz/README.md); it also
// throws nlohmann::type_error on strings that are not valid UTF-8. json_text() dumps only values
// with few nodes (so shallow ones), with invalid UTF-8 replaced, and cuts the text at max_chars;
// anything bigger is described by its type and size.
#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dc::detail {

inline std::string json_text(const nlohmann::json& v, std::size_t max_chars = 120) {
  constexpr std::size_t kMaxNodes = 64;
  // Count nodes iteratively, stopping early: at most kMaxNodes nodes means at most that depth.
  std::size_t nodes = 1;  // visited or queued
  std::vector<const nlohmann::json*> todo{&v};
  while (!todo.empty() && nodes <= kMaxNodes) {
    const nlohmann::json* x = todo.back();
    todo.pop_back();
    if (!x->is_structured()) continue;
    nodes += x->size();
    if (nodes > kMaxNodes) break;
    for (const auto& child : *x) todo.push_back(&child);
  }
  if (nodes > kMaxNodes)
    return std::string(v.is_array() ? "an array of " : "an object of ") + std::to_string(v.size()) +
           (v.is_array() ? " elements" : " members");
  std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > max_chars) s = s.substr(0, max_chars) + "...";
  return s;
}

}  // namespace dc::detail
