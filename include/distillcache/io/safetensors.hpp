#pragma once
// dc::SafetensorsFile: a reader for the Hugging Face .safetensors format.
//
// Layout: u64 little-endian header length N, N bytes of JSON describing each tensor
// ({"dtype", "shape", "data_offsets": [begin, end]}, offsets relative to the data section), then
// the data section. The constructor reads and validates only the header; tensor bytes are read
// on demand with seek+read, so multi-GB checkpoints never sit in memory twice. Every size in the
// header is checked against the real file size before anything is allocated: a lying header
// produces dc::Error, never a crash or a huge allocation.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "../core/dtype.hpp"
#include "../core/error.hpp"
#include "../core/tensor.hpp"
#include "detail/json_text.hpp"
#include "detail/checked_file.hpp"

namespace dc {

// The format is little-endian; reading raw bytes into host integers/floats relies on that.
static_assert(std::endian::native == std::endian::little, "safetensors reader assumes little-endian");

struct SafetensorsTensorInfo {
  std::string dtype;                // as written in the file: "F32", "BF16", "I64", ...
  std::vector<std::int64_t> shape;  // empty for a scalar
  std::int64_t numel = 0;
  std::uint64_t begin = 0;  // byte range inside the data section
  std::uint64_t end = 0;
};

class SafetensorsFile {
 public:
  using TensorInfo = SafetensorsTensorInfo;
  // Real headers are a few KB to a few MB; anything larger is corrupt or hostile.
  static constexpr std::uint64_t kMaxHeaderBytes = 100ull << 20;

  explicit SafetensorsFile(std::filesystem::path path) : path_(std::move(path)) { read_header(); }

  const std::filesystem::path& path() const { return path_; }
  // Tensor names in sorted order (the "__metadata__" entry is not a tensor).
  const std::vector<std::string>& names() const { return names_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) DC_FAIL(where(name), "no such tensor");
    return it->second;
  }
  // The optional "__metadata__" object (empty object when absent).
  const nlohmann::json& metadata() const { return metadata_; }

  // Reads an F32, F16 or BF16 tensor as fp32 (rank <= Shape::kMaxRank).
  Tensor<float, cpu> read_float(const std::string& name) const {
    const TensorInfo& t = info(name);
    DC_CHECK(t.dtype == "F32" || t.dtype == "F16" || t.dtype == "BF16", where(name), "dtype ",
             t.dtype, " cannot be read as float (need F32, F16 or BF16)");
    DC_CHECK(t.shape.size() <= static_cast<std::size_t>(Shape::kMaxRank), where(name), "rank ",
             t.shape.size(), " exceeds the supported ", Shape::kMaxRank);
    Shape shape;
    for (std::int64_t d : t.shape) shape.dims[static_cast<std::size_t>(shape.rank++)] = d;
    Tensor<float, cpu> out(shape);
    const auto n = static_cast<std::size_t>(t.numel);
    if (t.dtype == "F32") {
      read_bytes(name, t, out.data());  // same layout: read straight into the tensor
    } else {
      std::vector<std::uint16_t> half(n);
      read_bytes(name, t, half.data());
      if (t.dtype == "F16")
        for (std::size_t i = 0; i < n; ++i) out.data()[i] = to_float(f16{half[i]});
      else
        for (std::size_t i = 0; i < n; ++i) out.data()[i] = to_float(bf16{half[i]});
    }
    return out;
  }

  // Reads an I32 tensor, or an I64 one whose values all fit in int32 (token ids are often I64).
  std::vector<std::int32_t> read_i32(const std::string& name) const {
    const TensorInfo& t = info(name);
    const auto n = static_cast<std::size_t>(t.numel);
    if (t.dtype == "I32") {
      std::vector<std::int32_t> out(n);
      read_bytes(name, t, out.data());
      return out;
    }
    DC_CHECK(t.dtype == "I64", where(name), "dtype ", t.dtype,
             " cannot be read as int32 (need I32 or I64)");
    std::vector<std::int64_t> wide(n);
    read_bytes(name, t, wide.data());
    std::vector<std::int32_t> out(n);
    for (std::size_t i = 0; i < n; ++i) {
      DC_CHECK(wide[i] >= std::numeric_limits<std::int32_t>::min() &&
                   wide[i] <= std::numeric_limits<std::int32_t>::max(),
               where(name), "I64 value ", wide[i], " at index ", i, " does not fit in int32");
      out[i] = static_cast<std::int32_t>(wide[i]);
    }
    return out;
  }

  // Bytes per element of a safetensors dtype string; 0 when unknown.
  static std::size_t dtype_bytes(std::string_view dtype) {
    static const std::map<std::string_view, std::size_t> sizes = {
        {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
        {"U16", 2},  {"I16", 2}, {"F16", 2}, {"BF16", 2},    {"U32", 4},
        {"I32", 4},  {"F32", 4}, {"U64", 8}, {"I64", 8},     {"F64", 8}};
    auto it = sizes.find(dtype);
    return it == sizes.end() ? 0 : it->second;
  }

 private:
  // Message prefix naming the file and, when given, the tensor.
  std::string where(std::string_view tensor = {}) const {
    std::string s = "safetensors '" + path_.string() + "': ";
    if (!tensor.empty()) s += "tensor '" + std::string(tensor) + "': ";
    return s;
  }

  void read_header() {
    std::ifstream in = detail::open_checked(path_, where(), file_size_);
    DC_CHECK(file_size_ >= 8, where(), "file is ", file_size_,
             " bytes, shorter than the 8-byte header length");

    unsigned char len_bytes[8];
    in.read(reinterpret_cast<char*>(len_bytes), 8);
    DC_CHECK(in.gcount() == 8, where(), "cannot read the header length");
    std::uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
    DC_CHECK(header_len <= kMaxHeaderBytes, where(), "header length ", header_len,
             " exceeds the limit of ", kMaxHeaderBytes, " bytes");
    DC_CHECK(header_len <= file_size_ - 8, where(), "header length ", header_len,
             " runs past the end of the file (", file_size_, " bytes)");

    std::string text(static_cast<std::size_t>(header_len), '\0');
    in.read(text.data(), static_cast<std::streamsize>(header_len));
    DC_CHECK(in.gcount() == static_cast<std::streamsize>(header_len), where(),
             "header truncated while reading");
    data_start_ = 8 + header_len;
    parse_header(text);
  }

  void parse_header(const std::string& text) {
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      DC_FAIL(where(), "header is not valid JSON: ", e.what());
    }
    DC_CHECK(header.is_object(), where(), "header must be a JSON object, got ", header.type_name());

    const std::uint64_t data_size = file_size_ - data_start_;
    metadata_ = nlohmann::json::object();
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") {
        DC_CHECK(entry.is_object(), where(), "__metadata__ must be an object");
        metadata_ = entry;
        continue;
      }
      TensorInfo t = parse_entry(name, entry);
      DC_CHECK(t.end <= data_size, where(name), "data_offsets [", t.begin, ", ", t.end,
               "] run past the end of the data section (", data_size, " bytes)");
      names_.push_back(name);
      tensors_.emplace(name, std::move(t));
    }
  }

  TensorInfo parse_entry(const std::string& name, const nlohmann::json& entry) const {
    DC_CHECK(entry.is_object(), where(name), "entry must be a JSON object");
    for (const char* field : {"dtype", "shape", "data_offsets"})
      DC_CHECK(entry.contains(field), where(name), "field '", field, "' missing");
    const auto& dtype = entry.at("dtype");
    const auto& shape = entry.at("shape");
    const auto& offsets = entry.at("data_offsets");
    DC_CHECK(dtype.is_string(), where(name), "field 'dtype' must be a string");
    DC_CHECK(shape.is_array(), where(name), "field 'shape' must be an array");
    DC_CHECK(offsets.is_array() && offsets.size() == 2, where(name),
             "field 'data_offsets' must be an array of two integers");

    TensorInfo t;
    t.dtype = dtype.get<std::string>();
    const std::size_t elem = dtype_bytes(t.dtype);
    DC_CHECK(elem != 0, where(name), "unknown dtype '", t.dtype, "'");

    // Cap numel so numel * 8 bytes fits every offset type we use (uint64, streamoff, size_t).
    constexpr std::uint64_t kMaxNumel = std::uint64_t(1) << 56;
    std::uint64_t numel = 1;
    for (const auto& d : shape) {
      DC_CHECK(d.is_number_integer(), where(name), "field 'shape' must hold integers, got ",
               detail::json_text(d));
      DC_CHECK(!d.is_number_unsigned() || d.get<std::uint64_t>() <= kMaxNumel, where(name),
               "shape dimension ", detail::json_text(d), " is absurdly large");
      const std::int64_t dim = d.get<std::int64_t>();
      DC_CHECK(dim >= 0, where(name), "negative shape dimension ", dim);
      const auto udim = static_cast<std::uint64_t>(dim);
      DC_CHECK(udim == 0 || numel <= kMaxNumel / udim, where(name), "shape ",
               detail::json_text(shape), " has too many elements");
      numel *= udim;
      t.shape.push_back(dim);
    }
    t.numel = static_cast<std::int64_t>(numel);

    for (const auto& o : offsets)
      DC_CHECK(o.is_number_unsigned(), where(name),
               "field 'data_offsets' must hold non-negative integers, got ",
               detail::json_text(offsets));
    t.begin = offsets[0].get<std::uint64_t>();
    t.end = offsets[1].get<std::uint64_t>();
    DC_CHECK(t.begin <= t.end, where(name), "data_offsets [", t.begin, ", ", t.end, "] are reversed");
    DC_CHECK(t.end - t.begin == numel * elem, where(name), "data_offsets [", t.begin, ", ", t.end,
             "] span ", t.end - t.begin, " bytes, but shape ", detail::json_text(shape), " of ", t.dtype,
             " needs ", numel * elem);
    return t;
  }

  // Reads the tensor's byte range into dst (which holds at least end - begin bytes). The range
  // was validated against the file size at open; a short read means the file changed since.
  void read_bytes(const std::string& name, const TensorInfo& t, void* dst) const {
    const std::uint64_t count = t.end - t.begin;
    if (count == 0) return;
    std::ifstream in(path_, std::ios::binary);
    DC_CHECK(in.is_open(), where(name), "cannot open for reading");
    in.seekg(static_cast<std::streamoff>(data_start_ + t.begin));
    in.read(static_cast<char*>(dst), static_cast<std::streamsize>(count));
    DC_CHECK(in && in.gcount() == static_cast<std::streamsize>(count), where(name),
             "data truncated: expected ", count, " bytes at offset ", data_start_ + t.begin);
  }

  std::filesystem::path path_;
  std::uint64_t file_size_ = 0;
  std::uint64_t data_start_ = 0;  // 8 + header length
  std::vector<std::string> names_;
  std::map<std::string, TensorInfo> tensors_;
  nlohmann::json metadata_;
};

}  // namespace dc
