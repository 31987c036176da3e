#pragma once
// dc::PolicyCheckpoint: the file a learned eviction policy is kept in, optionally with the trainer
// state that resumes its training. A versioned binary container, integers little-endian:
//
//   offset     bytes  field
//   0          8      magic "DCPOLICY"
//   8          4      u32 format version (kPolicyCheckpointVersion = 1)
//   12         8      u64 L, the length of the metadata
//   20         L      metadata: one JSON object, UTF-8
//   20 + L     D      data section: the float32 tensors the metadata lists
//   20 + L + D 8      u64 FNV-1a 64 checksum of every byte before it
//
// The metadata object has exactly these members (anything else is rejected; free-form data
// belongs in "extra"):
//   "feature_normalisation"  identifier of the feature normalisation, e.g. "scale_free_v1"
//   "inputs"                 feature names in input order, 1 to 64, no repeats; names the policy
//                            layer does not know are accepted here (it checks them)
//   "hidden"                 hidden layer sizes, at least one, each 1 to 4096
//   "activation"             "silu", "tanh" or "relu"
//   "extra"                  object: training command, corpus, budgets, ...
//   "trainer"                optional object (or null): step, rng counters, best validation, ...
//   "tensors"                [{"name": ..., "shape": [count], "offset": byte offset in the data}]
// Identifiers (feature_normalisation, inputs, tensor names) are 1 to 64 characters of
// [A-Za-z0-9_.:/-]. The tensor "weights" is the MLP; every other tensor is a `state` entry (Adam
// moments "adam_m", "adam_v", ...). Tensors are one-dimensional -- the struct keeps flat vectors,
// so a longer shape would not round-trip -- must not overlap, and together cover the data
// section exactly, so no byte of a file goes unread.
//
// The weights block (math/mlp.hpp's layout): layer after layer (inputs -> hidden... -> 1 score),
// W [out, in] row-major, then b [out]; mlp_parameter_count() is its length.
//
// The checksum is FNV-1a 64: each step (xor one byte, multiply by an odd constant mod 2^64) is a
// bijection of the state, so a file differing from the written one in any single byte always
// fails; no table, a few lines. It catches corruption (torn copies, bad disks), not tampering.
//
// Untrusted input: every length is checked against the bytes present before anything is
// allocated, the metadata is at most kPolicyMaxMetadataBytes and nests at most
// kPolicyMaxJsonDepth levels (nlohmann copies and dumps recursively), and every field is checked.
// The reader goes header, metadata, tensor table, checksum, fields: the tensor table comes before
// the checksum so a cut file is reported as truncated, not merely as corrupt.
//
// Saving is atomic: a temporary file in the target's directory, fsync, rename over the target,
// fsync of the directory. Readers see the old file or the new one, never a mix; a failed save
// leaves the old file as it was and no temporary file behind. POSIX only (open/fsync/rename).
#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "../core/error.hpp"
#include "../core/finite.hpp"
#include "detail/checked_file.hpp"
#include "detail/json_text.hpp"

namespace dc {

// Tensor data is copied straight from the file into floats.
static_assert(std::endian::native == std::endian::little, "policy checkpoints assume little-endian");
static_assert(std::numeric_limits<float>::is_iec559 && sizeof(float) == 4, "float must be IEEE binary32");

inline constexpr std::uint32_t kPolicyCheckpointVersion = 1;
inline constexpr int kPolicyMaxInputs = 64;
inline constexpr int kPolicyMaxHiddenSize = 4096;
// Real metadata is a few KB; the cap bounds what a hostile length can make the JSON parser build.
inline constexpr std::uint64_t kPolicyMaxMetadataBytes = 1ull << 20;
inline constexpr std::size_t kPolicyMaxJsonDepth = 64;

struct PolicyCheckpoint {
  int version = int(kPolicyCheckpointVersion);  // format version: load reports the file's
  std::string feature_normalisation;
  std::vector<std::string> inputs;
  std::vector<int> hidden;
  std::string activation = "silu";
  std::vector<float> weights;                           // the flat MLP parameter block
  nlohmann::json extra = nlohmann::json::object();      // null is saved as {}
  std::map<std::string, std::vector<float>> state;      // e.g. "adam_m", "adam_v"
  nlohmann::json trainer;                               // null: no trainer state

  // Float members compare with ==, so -0 equals +0; tests needing bits compare bytes.
  friend bool operator==(const PolicyCheckpoint&, const PolicyCheckpoint&) = default;
};

// Parameters of an MLP with `inputs` inputs, the given hidden layers and one output: the sum over
// layers of in*out + out. Throws dc::Error on a non-positive size or an int64 overflow.
inline std::int64_t mlp_parameter_count(int inputs, std::span<const int> hidden) {
  DC_CHECK(inputs >= 1, "mlp_parameter_count: ", inputs, " inputs; need at least 1");
  std::int64_t total = 0;
  std::int64_t in = inputs;
  // in, out < 2^31, so (in + 1) * out < 2^62 cannot overflow; only the running sum can.
  auto add_layer = [&](std::int64_t out) {
    const std::int64_t layer = (in + 1) * out;
    DC_CHECK(total <= std::numeric_limits<std::int64_t>::max() - layer,
             "mlp_parameter_count: the parameter count overflows int64");
    total += layer;
    in = out;
  };
  for (std::size_t i = 0; i < hidden.size(); ++i) {
    DC_CHECK(hidden[i] >= 1, "mlp_parameter_count: hidden layer ", i, " has size ", hidden[i],
             "; sizes must be positive");
    add_layer(hidden[i]);
  }
  add_layer(1);
  return total;
}

namespace detail {

inline constexpr std::uint8_t kPolicyMagic[8] = {'D', 'C', 'P', 'O', 'L', 'I', 'C', 'Y'};
inline constexpr std::uint64_t kPolicyHeaderBytes = 20;   // magic, version, metadata length
inline constexpr std::uint64_t kPolicyChecksumBytes = 8;
inline constexpr std::size_t kPolicyMaxIdentifier = 64;
// Caps numel so numel * 4 and offset sums stay far from 2^64.
inline constexpr std::uint64_t kPolicyMaxNumel = std::uint64_t(1) << 56;

inline std::uint64_t fnv1a64(std::span<const std::uint8_t> bytes) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const std::uint8_t b : bytes) {
    h ^= b;
    h *= 0x100000001b3ull;
  }
  return h;
}

inline std::string policy_where(std::string_view name) {
  return "policy checkpoint '" + std::string(name) + "': ";
}

inline std::uint64_t read_le(std::span<const std::uint8_t> b, std::size_t at, int n) {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | b[at + std::size_t(i)];
  return v;
}

inline void store_le(std::uint8_t* out, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out[i] = std::uint8_t(v >> (8 * i));
}

// Identifiers appear in messages and in the policy layer's lookups; the charset keeps both sane.
inline bool is_policy_identifier(std::string_view s) {
  if (s.empty() || s.size() > kPolicyMaxIdentifier) return false;
  return std::all_of(s.begin(), s.end(), [](char ch) {
    const auto c = static_cast<unsigned char>(ch);
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '.' || c == ':' || c == '/' || c == '-';
  });
}

inline void check_identifier(std::string_view s, const std::string& where, std::string_view what) {
  DC_CHECK(is_policy_identifier(s), where, what, " ", json_text(nlohmann::json(std::string(s))),
           " is not an identifier (1 to ", kPolicyMaxIdentifier, " characters of A-Z a-z 0-9 _ . : / -)");
}

// Whether v nests at most `limit` levels; iterative, since deep values are what it guards against.
inline bool json_depth_at_most(const nlohmann::json& v, std::size_t limit) {
  std::vector<std::pair<const nlohmann::json*, std::size_t>> todo{{&v, 1}};
  while (!todo.empty()) {
    const auto [x, depth] = todo.back();
    todo.pop_back();
    if (!x->is_structured()) continue;
    if (depth > limit) return false;
    for (const auto& child : *x) todo.emplace_back(&child, depth + 1);
  }
  return true;
}

// Whether v holds a NaN or an infinity, which JSON cannot say: nlohmann would write null, and the
// checkpoint would not read back as saved. (The parser never produces one.)
inline bool json_has_non_finite(const nlohmann::json& v) {
  std::vector<const nlohmann::json*> todo{&v};
  while (!todo.empty()) {
    const nlohmann::json* x = todo.back();
    todo.pop_back();
    if (x->is_number_float() && !std::isfinite(x->get<double>())) return true;
    if (x->is_structured())
      for (const auto& child : *x) todo.push_back(&child);
  }
  return false;
}

// "[8, 4]"; a hostile list of thousands of layers is cut, so the message stays one line.
inline std::string sizes_text(std::span<const int> sizes) {
  constexpr std::size_t kShown = 8;
  std::string s = "[";
  for (std::size_t i = 0; i < sizes.size() && i < kShown; ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  if (sizes.size() > kShown) s += ", ... (" + std::to_string(sizes.size()) + " layers)";
  return s + "]";
}

// The magic, telling a file cut inside it (a prefix of "DCPOLICY") from a file of another kind.
inline void check_policy_magic(std::span<const std::uint8_t> bytes, const std::string& where) {
  const std::size_t n = std::min<std::size_t>(bytes.size(), 8);
  const bool prefix = std::equal(bytes.begin(), bytes.begin() + std::ptrdiff_t(n), kPolicyMagic);
  if (prefix && n == 8) return;
  DC_CHECK(!prefix, where, "truncated in the header: the file is ", bytes.size(),
           " bytes, the header takes ", kPolicyHeaderBytes);
  std::string shown;
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned char c = bytes[i];
    static const char* hex = "0123456789abcdef";
    if (c >= 0x20 && c < 0x7f) shown += char(c);
    else shown += std::string("\\x") + hex[c >> 4] + hex[c & 15];
  }
  DC_FAIL(where, "not a distillcache policy checkpoint (the file starts with '", shown,
          "', not the magic 'DCPOLICY')");
}

// A tensor as the metadata lists it; byte range [offset, offset + 4 * numel) of the data section.
struct PolicyTensorEntry {
  std::string name;
  std::uint64_t numel = 0;
  std::uint64_t offset = 0;
  std::uint64_t bytes() const { return numel * 4; }
};

inline nlohmann::json parse_policy_metadata(std::span<const std::uint8_t> text, const std::string& where) {
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    DC_FAIL(where, "metadata is not valid JSON: ", e.what());
  }
  DC_CHECK(meta.is_object(), where, "metadata must be a JSON object, got ", meta.type_name());
  DC_CHECK(json_depth_at_most(meta, kPolicyMaxJsonDepth), where, "metadata nests deeper than ",
           kPolicyMaxJsonDepth, " levels");
  static const std::set<std::string> known = {"feature_normalisation", "inputs", "hidden",
                                              "activation", "extra", "trainer", "tensors"};
  for (const auto& item : meta.items())
    DC_CHECK(known.count(item.key()) != 0, where, "unknown metadata field ",
             json_text(nlohmann::json(item.key())),
             " (known: feature_normalisation, inputs, hidden, activation, extra, trainer, tensors)");
  return meta;
}

inline const nlohmann::json& required_field(const nlohmann::json& meta, const char* key,
                                            const std::string& where) {
  DC_CHECK(meta.contains(key), where, "metadata field '", key, "' missing");
  return meta.at(key);
}

// The tensor table, each entry well-typed and inside the data section; "weights" present.
inline std::vector<PolicyTensorEntry> read_tensor_table(const nlohmann::json& meta, std::uint64_t data_size,
                                                        const std::string& where) {
  const nlohmann::json& list = required_field(meta, "tensors", where);
  DC_CHECK(list.is_array(), where, "metadata field 'tensors' must be an array, got ", json_text(list));
  std::vector<PolicyTensorEntry> out;
  std::set<std::string> seen;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const nlohmann::json& e = list[i];
    DC_CHECK(e.is_object() && e.size() == 3 && e.contains("name") && e.contains("shape") &&
                 e.contains("offset"),
             where, "tensor entry ", i, " must be an object of exactly 'name', 'shape' and 'offset', got ",
             json_text(e));
    DC_CHECK(e.at("name").is_string(), where, "tensor entry ", i, ": 'name' must be a string, got ",
             json_text(e.at("name")));
    PolicyTensorEntry t;
    t.name = e.at("name").get<std::string>();
    check_identifier(t.name, where, "tensor name");
    const std::string tw = where + "tensor '" + t.name + "': ";
    DC_CHECK(seen.insert(t.name).second, tw, "listed twice in the metadata");
    const nlohmann::json& shape = e.at("shape");
    DC_CHECK(shape.is_array() && shape.size() == 1 && shape[0].is_number_integer(), tw,
             "'shape' must be [count] (tensors are one-dimensional), got ", json_text(shape));
    DC_CHECK(shape[0].is_number_unsigned(), tw, "negative element count ", json_text(shape[0]));
    t.numel = shape[0].get<std::uint64_t>();
    DC_CHECK(t.numel <= kPolicyMaxNumel, tw, "element count ", t.numel, " is absurdly large");
    const nlohmann::json& offset = e.at("offset");
    DC_CHECK(offset.is_number_unsigned(), tw, "'offset' must be a non-negative integer, got ",
             json_text(offset));
    t.offset = offset.get<std::uint64_t>();
    DC_CHECK(t.offset <= data_size && t.bytes() <= data_size - t.offset, tw, t.bytes(), " bytes at offset ",
             t.offset, " run past the end of the ", data_size,
             "-byte data section: truncated tensor data or a bad offset");
    out.push_back(std::move(t));
  }
  DC_CHECK(seen.count("weights") != 0, where, "no tensor named 'weights' (the MLP parameters)");
  return out;
}

// Tensors inside the section (read_tensor_table) that do not overlap and cover all of it.
inline void check_tensor_layout(std::vector<PolicyTensorEntry> table, std::uint64_t data_size,
                                const std::string& where) {
  std::erase_if(table, [](const PolicyTensorEntry& t) { return t.numel == 0; });  // overlap nothing
  std::sort(table.begin(), table.end(),
            [](const PolicyTensorEntry& a, const PolicyTensorEntry& b) { return a.offset < b.offset; });
  std::uint64_t covered = 0;
  for (std::size_t i = 0; i < table.size(); ++i) {
    if (i > 0) {
      const PolicyTensorEntry& a = table[i - 1];
      const PolicyTensorEntry& b = table[i];
      DC_CHECK(a.offset + a.bytes() <= b.offset, where, "tensors '", a.name, "' (bytes [", a.offset,
               ", ", a.offset + a.bytes(), ")) and '", b.name, "' (bytes [", b.offset, ", ",
               b.offset + b.bytes(), ")) overlap");
    }
    covered += table[i].bytes();  // no overlap, each inside the section: cannot pass data_size
  }
  DC_CHECK(covered == data_size, where, "the data section holds ", data_size,
           " bytes but the tensors cover only ", covered);
}

inline std::string string_field(const nlohmann::json& meta, const char* key, const std::string& where) {
  const nlohmann::json& v = required_field(meta, key, where);
  DC_CHECK(v.is_string(), where, "metadata field '", key, "' must be a string, got ", json_text(v));
  return v.get<std::string>();
}

// The fields besides the tensors, type-checked; the values are checked by validate.
inline PolicyCheckpoint policy_fields(nlohmann::json& meta, const std::string& where) {
  PolicyCheckpoint c;
  c.feature_normalisation = string_field(meta, "feature_normalisation", where);
  c.activation = string_field(meta, "activation", where);

  const nlohmann::json& inputs = required_field(meta, "inputs", where);
  DC_CHECK(inputs.is_array(), where, "metadata field 'inputs' must be an array of strings, got ",
           json_text(inputs));
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    DC_CHECK(inputs[i].is_string(), where, "metadata field 'inputs': entry ", i,
             " must be a string, got ", json_text(inputs[i]));
    c.inputs.push_back(inputs[i].get<std::string>());
  }

  const nlohmann::json& hidden = required_field(meta, "hidden", where);
  DC_CHECK(hidden.is_array(), where, "metadata field 'hidden' must be an array of integers, got ",
           json_text(hidden));
  for (std::size_t i = 0; i < hidden.size(); ++i) {
    const nlohmann::json& h = hidden[i];
    DC_CHECK(h.is_number_integer(), where, "metadata field 'hidden': entry ", i,
             " must be an integer, got ", json_text(h));
    // Range-check before narrowing to int; validate says the same of an in-range bad size.
    const bool in_range = h.is_number_unsigned() ? h.get<std::uint64_t>() <= std::uint64_t(kPolicyMaxHiddenSize)
                                                 : h.get<std::int64_t>() >= 1;
    DC_CHECK(in_range, where, "hidden layer ", i, " has size ", json_text(h), "; sizes must be in [1, ",
             kPolicyMaxHiddenSize, "]");
    c.hidden.push_back(int(h.get<std::int64_t>()));
  }

  // Moved, not copied: no second deep copy of what may be large free-form data.
  nlohmann::json& extra = meta.at("extra");  // present: parse checks every required field first
  DC_CHECK(extra.is_object(), where, "metadata field 'extra' must be an object, got ", json_text(extra));
  c.extra = std::move(extra);
  if (meta.contains("trainer")) {
    nlohmann::json& trainer = meta.at("trainer");
    DC_CHECK(trainer.is_object() || trainer.is_null(), where,
             "metadata field 'trainer' must be an object or null, got ", json_text(trainer));
    c.trainer = std::move(trainer);
  }
  return c;
}

}  // namespace detail

// Every rule a checkpoint obeys; save checks it before writing, load after reading. `name` (a
// path or any label) prefixes the messages.
inline void validate_policy_checkpoint(const PolicyCheckpoint& c, std::string_view name) {
  const std::string where = detail::policy_where(name);
  DC_CHECK(c.version == int(kPolicyCheckpointVersion), where, "format version ", c.version,
           " is not one this code writes or reads (", kPolicyCheckpointVersion, ")");
  detail::check_identifier(c.feature_normalisation, where, "feature_normalisation");

  DC_CHECK(!c.inputs.empty() && c.inputs.size() <= std::size_t(kPolicyMaxInputs), where, "the policy has ",
           c.inputs.size(), " input features; it needs 1 to ", kPolicyMaxInputs);
  std::map<std::string_view, std::size_t> first;
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    detail::check_identifier(c.inputs[i], where, "input feature name");
    const auto [it, fresh] = first.emplace(c.inputs[i], i);
    DC_CHECK(fresh, where, "input feature '", c.inputs[i], "' is listed twice (inputs ", it->second,
             " and ", i, ")");
  }

  DC_CHECK(!c.hidden.empty(), where, "no hidden layer (the policy MLP needs at least one)");
  for (std::size_t i = 0; i < c.hidden.size(); ++i)
    DC_CHECK(c.hidden[i] >= 1 && c.hidden[i] <= kPolicyMaxHiddenSize, where, "hidden layer ", i,
             " has size ", c.hidden[i], "; sizes must be in [1, ", kPolicyMaxHiddenSize, "]");
  DC_CHECK(c.activation == "silu" || c.activation == "tanh" || c.activation == "relu", where,
           "unknown activation ", detail::json_text(nlohmann::json(c.activation)),
           " (known: silu, tanh, relu)");

  // Layers of at most 4097 * 4096 parameters: reaching the int64 overflow mlp_parameter_count
  // reports takes over 5 * 10^11 of them, far more than a file or memory holds.
  const std::int64_t expected = mlp_parameter_count(int(c.inputs.size()), c.hidden);
  DC_CHECK(c.weights.size() == std::uint64_t(expected), where, "'weights' holds ", c.weights.size(),
           " floats, but an MLP with ", c.inputs.size(), " inputs, hidden ", detail::sizes_text(c.hidden),
           " and one output has ", expected, " parameters");
  check_all_finite(c.weights, where + "tensor 'weights'");

  for (const auto& [key, values] : c.state) {
    detail::check_identifier(key, where, "state tensor name");
    DC_CHECK(key != "weights", where, "a state tensor is named 'weights', the name of the MLP parameters");
    DC_CHECK(values.size() <= detail::kPolicyMaxNumel, where, "state tensor '", key, "' is absurdly large");
    check_all_finite(values, where + "tensor '" + key + "'");
  }

  DC_CHECK(c.extra.is_object() || c.extra.is_null(), where, "'extra' must be a JSON object, got ",
           c.extra.type_name());
  DC_CHECK(c.trainer.is_object() || c.trainer.is_null(), where,
           "'trainer' must be a JSON object or null, got ", c.trainer.type_name());
  // The metadata object adds one level around extra and trainer.
  DC_CHECK(detail::json_depth_at_most(c.extra, kPolicyMaxJsonDepth - 1) &&
               detail::json_depth_at_most(c.trainer, kPolicyMaxJsonDepth - 1),
           where, "'extra' or 'trainer' nests deeper than ", kPolicyMaxJsonDepth - 1, " levels");
  DC_CHECK(!detail::json_has_non_finite(c.extra) && !detail::json_has_non_finite(c.trainer), where,
           "'extra' or 'trainer' holds a NaN or infinite number, which JSON cannot represent");
}

// The bytes save_policy_checkpoint writes (validated first). Deterministic: equal checkpoints
// give equal bytes (nlohmann sorts object keys; tensors go "weights", then state in name order).
inline std::vector<std::uint8_t> encode_policy_checkpoint(const PolicyCheckpoint& c,
                                                          std::string_view name = "(in memory)") {
  validate_policy_checkpoint(c, name);
  const std::string where = detail::policy_where(name);
  std::vector<std::pair<std::string_view, std::span<const float>>> tensors{{"weights", c.weights}};
  for (const auto& [key, values] : c.state) tensors.emplace_back(key, values);

  nlohmann::json table = nlohmann::json::array();
  std::uint64_t offset = 0;
  for (const auto& [key, values] : tensors) {
    table.push_back({{"name", key}, {"shape", {values.size()}}, {"offset", offset}});
    offset += values.size() * 4;
  }
  nlohmann::json meta = {{"feature_normalisation", c.feature_normalisation},
                         {"inputs", c.inputs},
                         {"hidden", c.hidden},
                         {"activation", c.activation},
                         {"extra", c.extra.is_null() ? nlohmann::json::object() : c.extra},
                         {"tensors", std::move(table)}};
  if (!c.trainer.is_null()) meta["trainer"] = c.trainer;
  std::string text;
  try {
    text = meta.dump();
  } catch (const nlohmann::json::exception& e) {  // e.g. a string in extra that is not UTF-8
    DC_FAIL(where, "cannot encode the metadata: ", e.what());
  }
  DC_CHECK(text.size() <= kPolicyMaxMetadataBytes, where, "metadata of ", text.size(),
           " bytes exceeds the limit of ", kPolicyMaxMetadataBytes);

  // Sized once and filled with memcpy: GCC 12 misreads insert/push_back chains here
  // (-Wstringop-overflow false positives).
  const std::size_t data_begin = std::size_t(detail::kPolicyHeaderBytes) + text.size();
  std::vector<std::uint8_t> out(data_begin + std::size_t(offset) + std::size_t(detail::kPolicyChecksumBytes));
  std::memcpy(out.data(), detail::kPolicyMagic, 8);
  detail::store_le(out.data() + 8, kPolicyCheckpointVersion, 4);
  detail::store_le(out.data() + 12, text.size(), 8);
  std::memcpy(out.data() + 20, text.data(), text.size());
  std::size_t at = data_begin;
  for (const auto& [key, values] : tensors) {
    if (!values.empty()) std::memcpy(out.data() + at, values.data(), values.size() * 4);
    at += values.size() * 4;
  }
  detail::store_le(out.data() + at, detail::fnv1a64(std::span(out).first(at)), 8);
  return out;
}

// Parses and validates a checkpoint held in memory; `name` (a path or any label) prefixes the
// messages. Anything wrong throws dc::Error saying what.
inline PolicyCheckpoint parse_policy_checkpoint(std::span<const std::uint8_t> bytes, std::string_view name) {
  const std::string where = detail::policy_where(name);
  detail::check_policy_magic(bytes, where);
  const std::uint64_t size = bytes.size();
  DC_CHECK(size >= detail::kPolicyHeaderBytes, where, "truncated in the header: the file is ", size,
           " bytes, the header takes ", detail::kPolicyHeaderBytes);
  const auto version = std::uint32_t(detail::read_le(bytes, 8, 4));
  DC_CHECK(version == kPolicyCheckpointVersion, where, "unknown format version ", version,
           " (this reader knows version ", kPolicyCheckpointVersion, ")");
  const std::uint64_t meta_len = detail::read_le(bytes, 12, 8);
  DC_CHECK(meta_len <= kPolicyMaxMetadataBytes, where, "metadata length ", meta_len,
           " exceeds the limit of ", kPolicyMaxMetadataBytes, " bytes");
  const std::uint64_t min_size = detail::kPolicyHeaderBytes + meta_len + detail::kPolicyChecksumBytes;
  DC_CHECK(size >= min_size, where, "truncated in the metadata: ", meta_len,
           " bytes of metadata, with the header and the checksum, need ", min_size,
           " bytes; the file has ", size);
  const std::uint64_t data_begin = detail::kPolicyHeaderBytes + meta_len;
  const std::uint64_t data_size = size - detail::kPolicyChecksumBytes - data_begin;

  nlohmann::json meta = detail::parse_policy_metadata(bytes.subspan(20, std::size_t(meta_len)), where);
  const std::vector<detail::PolicyTensorEntry> table = detail::read_tensor_table(meta, data_size, where);
  detail::check_tensor_layout(table, data_size, where);

  const std::uint64_t stored = detail::read_le(bytes, std::size_t(size - 8), 8);
  const std::uint64_t actual = detail::fnv1a64(bytes.first(std::size_t(size - 8)));
  if (stored != actual) {
    std::ostringstream os;
    os << std::hex << "stored 0x" << stored << ", computed 0x" << actual;
    DC_FAIL(where, "bad checksum (", os.str(), "): the file is corrupt");
  }

  // Required members, in the order they are reported missing.
  for (const char* key : {"feature_normalisation", "inputs", "hidden", "activation", "extra"})
    (void)detail::required_field(meta, key, where);
  PolicyCheckpoint c = detail::policy_fields(meta, where);
  for (const detail::PolicyTensorEntry& t : table) {
    std::vector<float> values(std::size_t(t.numel));  // inside the buffer: checked above
    if (t.numel) std::memcpy(values.data(), bytes.data() + data_begin + t.offset, std::size_t(t.bytes()));
    if (t.name == "weights") c.weights = std::move(values);
    else c.state.emplace(t.name, std::move(values));
  }
  validate_policy_checkpoint(c, name);
  return c;
}

inline PolicyCheckpoint load_policy_checkpoint(const std::filesystem::path& path) {
  const std::string where = detail::policy_where(path.string());
  std::uint64_t size = 0;
  std::ifstream in = detail::open_checked(path, where, size);
  // The magic first, so a multi-GB model file handed over by mistake is rejected unread.
  std::uint8_t head[8] = {};
  const std::size_t n_head = std::size_t(std::min<std::uint64_t>(size, 8));
  in.read(reinterpret_cast<char*>(head), std::streamsize(n_head));
  DC_CHECK(in.gcount() == std::streamsize(n_head), where, "cannot read the header");
  if (size >= 8) detail::check_policy_magic(std::span<const std::uint8_t>(head, 8), where);
  DC_CHECK(size <= std::numeric_limits<std::size_t>::max() / 2, where, "file of ", size,
           " bytes is too large");
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(size));
  std::copy(head, head + n_head, bytes.begin());
  if (size > n_head) {
    in.read(reinterpret_cast<char*>(bytes.data() + n_head), std::streamsize(size - n_head));
    DC_CHECK(in.gcount() == std::streamsize(size - n_head), where, "read ", n_head + std::uint64_t(in.gcount()),
             " of ", size, " bytes: the file changed while being read");
  }
  return parse_policy_checkpoint(bytes, path.string());
}

namespace detail {

inline std::string errno_text(int err) { return std::generic_category().message(err); }

// The temporary file of an atomic save: closed and removed on scope exit unless committed.
class AtomicSaveTemp {
 public:
  AtomicSaveTemp(std::filesystem::path tmp, const std::string& where) : path_(std::move(tmp)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    DC_CHECK(fd_ >= 0, where, "cannot create a temporary file in '", path_.parent_path().string(), "': ",
             errno_text(errno));
  }
  ~AtomicSaveTemp() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(path_.c_str());
  }
  AtomicSaveTemp(const AtomicSaveTemp&) = delete;
  AtomicSaveTemp& operator=(const AtomicSaveTemp&) = delete;

  int fd() const { return fd_; }
  const std::filesystem::path& path() const { return path_; }
  // close() reports deferred write errors (NFS, quotas), so it is checked, not left to the destructor.
  int close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }
  void commit() { committed_ = true; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  bool committed_ = false;
};

inline void write_file_atomically(const std::filesystem::path& path, std::span<const std::uint8_t> bytes,
                                  const std::string& where) {
  DC_CHECK(path.has_filename(), where, "the path names no file");
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  // Same directory, so the rename stays on one file system and is atomic; pid and counter keep
  // concurrent saves (other processes, other threads) from sharing a temporary file.
  static std::atomic<unsigned> counter{0};
  const std::string tmp_name = "." + path.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
                               std::to_string(counter.fetch_add(1));
  AtomicSaveTemp tmp(dir / tmp_name, where);
  std::size_t done = 0;
  while (done < bytes.size()) {
    const std::size_t chunk = std::min<std::size_t>(bytes.size() - done, std::size_t(1) << 30);
    const ssize_t n = ::write(tmp.fd(), bytes.data() + done, chunk);
    if (n < 0 && errno == EINTR) continue;
    DC_CHECK(n > 0, where, "cannot write the temporary file in '", dir.string(), "' (", done, " of ",
             bytes.size(), " bytes written): ", n < 0 ? errno_text(errno) : "no progress");
    done += std::size_t(n);
  }
  // Data on disk before the rename makes it visible; otherwise a crash could leave an empty target.
  DC_CHECK(::fsync(tmp.fd()) == 0, where, "cannot fsync the temporary file in '", dir.string(),
           "': ", errno_text(errno));
  DC_CHECK(tmp.close() == 0, where, "cannot close the temporary file in '", dir.string(), "': ",
           errno_text(errno));
  DC_CHECK(::rename(tmp.path().c_str(), path.c_str()) == 0, where, "cannot rename the temporary file over '",
           path.string(), "': ", errno_text(errno));
  tmp.commit();
  // The rename itself lives in the directory: fsync it so the new name survives a crash.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DC_CHECK(dfd >= 0, where, "saved, but cannot open the directory '", dir.string(), "' to fsync it: ",
           errno_text(errno));
  const int rc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  DC_CHECK(rc == 0, where, "saved, but cannot fsync the directory '", dir.string(), "': ", errno_text(err));
}

}  // namespace detail

// Validates, encodes and atomically replaces `path` (see the top of this file). The new file gets
// the default permissions (0666 less the umask); a symlink at `path` is replaced, not followed.
inline void save_policy_checkpoint(const std::filesystem::path& path, const PolicyCheckpoint& c) {
  const std::vector<std::uint8_t> bytes = encode_policy_checkpoint(c, path.string());
  detail::write_file_atomically(path, bytes, detail::policy_where(path.string()));
}

}  // namespace dc
