#pragma once
// dc::GgufFile: a reader for GGUF (llama.cpp's model format), versions 2 and 3.
//
// Layout (all little-endian):
//   u32 magic "GGUF", u32 version, u64 tensor_count, u64 kv_count
//   kv_count x  { string key, u32 value type, value }
//   tensor_count x { string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset }
//   padding to general.alignment (default 32), then the data section; offsets are relative to it
// where a string is u64 length + bytes (no terminator) and an array is u32 element type,
// u64 count, elements (arrays of arrays nest). Version 2 has this same layout; version 1 used
// 32-bit counts and is rejected.
//
// The constructor reads the whole header (metadata and tensor infos) eagerly; tensor bytes are
// read on demand with seek+read. Nothing the file claims is trusted: every count and length is
// checked against the bytes actually left in the file before anything is allocated, so a hostile
// file yields a dc::Error naming the file and the key or tensor, never a crash or a huge
// allocation. Tensor dims are stored fastest-first (ggml's ne): ne = [576, 192] is a row-major
// [192, 576] matrix, which is what shape() and read_tensor() return.
#include <algorithm>
#include <bit>
#include <cmath>
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
#include <utility>
#include <vector>

#include "../core/buffer.hpp"
#include "../core/error.hpp"
#include "../core/tensor.hpp"
#include "detail/checked_file.hpp"
#include "gguf_dequant.hpp"

namespace dc {

static_assert(std::endian::native == std::endian::little, "GGUF reader assumes a little-endian host");

enum class GgufValueType : std::uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};

inline constexpr std::string_view gguf_value_type_name(GgufValueType t) {
  switch (t) {
    case GgufValueType::u8: return "uint8";
    case GgufValueType::i8: return "int8";
    case GgufValueType::u16: return "uint16";
    case GgufValueType::i16: return "int16";
    case GgufValueType::u32: return "uint32";
    case GgufValueType::i32: return "int32";
    case GgufValueType::f32: return "float32";
    case GgufValueType::boolean: return "bool";
    case GgufValueType::string: return "string";
    case GgufValueType::array: return "array";
    case GgufValueType::u64: return "uint64";
    case GgufValueType::i64: return "int64";
    case GgufValueType::f64: return "float64";
  }
  return "?";
}

namespace detail {
inline constexpr bool gguf_known_value_type(std::uint32_t t) { return t <= 12; }
// Bytes of one scalar in the file; 0 for string and array.
inline constexpr std::size_t gguf_scalar_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::u8:
    case GgufValueType::i8:
    case GgufValueType::boolean: return 1;
    case GgufValueType::u16:
    case GgufValueType::i16: return 2;
    case GgufValueType::u32:
    case GgufValueType::i32:
    case GgufValueType::f32: return 4;
    case GgufValueType::u64:
    case GgufValueType::i64:
    case GgufValueType::f64: return 8;
    case GgufValueType::string:
    case GgufValueType::array: return 0;
  }
  return 0;
}
inline constexpr bool gguf_is_integer(GgufValueType t) {
  return t == GgufValueType::u8 || t == GgufValueType::i8 || t == GgufValueType::u16 ||
         t == GgufValueType::i16 || t == GgufValueType::u32 || t == GgufValueType::i32 ||
         t == GgufValueType::u64 || t == GgufValueType::i64;
}
inline constexpr bool gguf_is_float(GgufValueType t) {
  return t == GgufValueType::f32 || t == GgufValueType::f64;
}
inline constexpr bool gguf_is_signed(GgufValueType t) {
  return t == GgufValueType::i8 || t == GgufValueType::i16 || t == GgufValueType::i32 ||
         t == GgufValueType::i64;
}
// Decodes one little-endian integer of type t into its two's-complement 64-bit pattern
// (sign-extended for signed types).
inline std::uint64_t gguf_load_integer(GgufValueType t, const unsigned char* p) {
  switch (t) {
    case GgufValueType::u8: return p[0];
    case GgufValueType::i8: return std::uint64_t(std::int64_t(std::int8_t(p[0])));
    case GgufValueType::u16: { std::uint16_t v; std::memcpy(&v, p, 2); return v; }
    case GgufValueType::i16: { std::int16_t v; std::memcpy(&v, p, 2); return std::uint64_t(std::int64_t(v)); }
    case GgufValueType::u32: { std::uint32_t v; std::memcpy(&v, p, 4); return v; }
    case GgufValueType::i32: { std::int32_t v; std::memcpy(&v, p, 4); return std::uint64_t(std::int64_t(v)); }
    case GgufValueType::u64:
    case GgufValueType::i64: { std::uint64_t v; std::memcpy(&v, p, 8); return v; }
    default: return 0;
  }
}
inline double gguf_load_float(GgufValueType t, const unsigned char* p) {
  if (t == GgufValueType::f32) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
  }
  double v;
  std::memcpy(&v, p, 8);
  return v;
}
}  // namespace detail

// One metadata value: a scalar, a string, or an array (of scalars, strings, or arrays).
// Accessors throw dc::Error describing the mismatch; GgufFile's getters add the key and file.
class GgufValue {
 public:
  GgufValueType type() const { return type_; }
  bool is_array() const { return type_ == GgufValueType::array; }
  // Arrays only: the element type and the element count.
  GgufValueType element_type() const { return elem_; }
  std::size_t size() const { return is_array() ? std::size_t(count_) : 0; }

  // Any integer type; a uint64 above INT64_MAX does not fit.
  std::int64_t as_int() const {
    expect(detail::gguf_is_integer(type_), "an integer");
    return to_int64(type_, bits_);
  }
  // Any integer type whose value is >= 0.
  std::uint64_t as_uint() const {
    expect(detail::gguf_is_integer(type_), "an unsigned integer");
    DC_CHECK(!detail::gguf_is_signed(type_) || std::int64_t(bits_) >= 0, "value ",
             std::int64_t(bits_), " is negative");
    return bits_;
  }
  double as_float() const {  // float32 or float64
    expect(detail::gguf_is_float(type_), "a float");
    return real_;
  }
  bool as_bool() const {
    expect(type_ == GgufValueType::boolean, "a bool");
    return bits_ != 0;
  }
  const std::string& as_string() const {
    expect(type_ == GgufValueType::string, "a string");
    return str_;
  }

  // Arrays of integers (any integer element type).
  std::vector<std::int64_t> as_int_array() const {
    expect_array(detail::gguf_is_integer(elem_), "integers");
    const std::size_t w = detail::gguf_scalar_size(elem_);
    std::vector<std::int64_t> out(size());
    for (std::size_t i = 0; i < out.size(); ++i)
      out[i] = to_int64(elem_, detail::gguf_load_integer(elem_, raw_.data() + i * w), i);
    return out;
  }
  // Arrays of float32 or float64; float64 values outside float's range are rejected.
  std::vector<float> as_float_array() const {
    expect_array(detail::gguf_is_float(elem_), "floats");
    const std::size_t w = detail::gguf_scalar_size(elem_);
    std::vector<float> out(size());
    for (std::size_t i = 0; i < out.size(); ++i) {
      const double v = detail::gguf_load_float(elem_, raw_.data() + i * w);
      DC_CHECK(!std::isfinite(v) || std::fabs(v) <= double(std::numeric_limits<float>::max()),
               "element ", i, " = ", v, " is out of float range");
      out[i] = static_cast<float>(v);
    }
    return out;
  }
  std::vector<double> as_double_array() const {
    expect_array(detail::gguf_is_float(elem_), "floats");
    const std::size_t w = detail::gguf_scalar_size(elem_);
    std::vector<double> out(size());
    for (std::size_t i = 0; i < out.size(); ++i)
      out[i] = detail::gguf_load_float(elem_, raw_.data() + i * w);
    return out;
  }
  std::vector<bool> as_bool_array() const {
    expect_array(elem_ == GgufValueType::boolean, "bools");
    std::vector<bool> out(size());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = raw_[i] != 0;
    return out;
  }
  std::vector<std::string> as_string_array() const {
    expect_array(elem_ == GgufValueType::string, "strings");
    std::vector<std::string> out;
    out.reserve(size());
    for (std::size_t i = 0; i < size(); ++i) out.emplace_back(string_at(i));
    return out;
  }
  // Element i of a string array, without copying.
  std::string_view string_at(std::size_t i) const {
    expect_array(elem_ == GgufValueType::string, "strings");
    DC_CHECK(i < size(), "index ", i, " out of range for an array of ", size());
    const std::size_t begin = i == 0 ? 0 : std::size_t(ends_[i - 1]);
    return std::string_view(blob_).substr(begin, std::size_t(ends_[i]) - begin);
  }
  // The elements of an array of arrays.
  const std::vector<GgufValue>& items() const {
    expect_array(elem_ == GgufValueType::array, "arrays");
    return items_;
  }

  // "uint32", "array of string", "array of array".
  std::string type_description() const {
    std::string s(gguf_value_type_name(type_));
    if (is_array()) s += " of " + std::string(gguf_value_type_name(elem_));
    return s;
  }

 private:
  friend class GgufFile;

  void expect(bool ok, const char* wanted) const {
    DC_CHECK(ok, "is ", type_description(), ", not ", wanted);
  }
  void expect_array(bool elem_ok, const char* wanted) const {
    DC_CHECK(is_array() && elem_ok, "is ", type_description(), ", not an array of ", wanted);
  }
  static std::int64_t to_int64(GgufValueType t, std::uint64_t bits, std::size_t index = SIZE_MAX) {
    if (t == GgufValueType::u64 && bits > std::uint64_t(std::numeric_limits<std::int64_t>::max())) {
      if (index == SIZE_MAX) DC_FAIL("uint64 value ", bits, " does not fit in int64");
      DC_FAIL("element ", index, ": uint64 value ", bits, " does not fit in int64");
    }
    return static_cast<std::int64_t>(bits);
  }

  GgufValueType type_ = GgufValueType::u8;
  GgufValueType elem_ = GgufValueType::u8;  // arrays
  std::uint64_t count_ = 0;                 // arrays
  std::uint64_t bits_ = 0;                  // integers (sign-extended) and bools
  double real_ = 0.0;                       // float32 / float64
  std::string str_;                         // string
  std::vector<unsigned char> raw_;          // array of numbers or bools: the file's bytes
  std::string blob_;                        // array of strings: concatenated ...
  std::vector<std::uint64_t> ends_;         // ... and the end offset of each
  std::vector<GgufValue> items_;            // array of arrays
};

struct GgufTensorInfo {
  std::string name;
  std::vector<std::int64_t> ne;  // dims as stored: fastest-varying first
  std::uint32_t type = 0;        // ggml type id (GgmlType)
  std::uint64_t offset = 0;      // from the start of the data section
  std::int64_t numel = 0;
  std::uint64_t nbytes = 0;

  GgmlType ggml_type() const { return static_cast<GgmlType>(type); }
  std::string type_name() const { return ggml_type_name(type); }
  // Row-major shape (slowest first): ne reversed. ne = [576, 192] -> [192, 576].
  Shape shape() const {
    Shape s;
    for (auto it = ne.rbegin(); it != ne.rend(); ++it) s.dims[std::size_t(s.rank++)] = *it;
    return s;
  }
};

class GgufFile {
 public:
  static constexpr std::uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
  static constexpr std::uint32_t kDefaultAlignment = 32;
  static constexpr int kMaxDims = 4;                               // GGML_MAX_DIMS
  static constexpr std::uint64_t kMaxStringBytes = 1ull << 30;     // 1 GiB
  static constexpr int kMaxArrayDepth = 8;                         // arrays of arrays of ...
  static constexpr std::uint64_t kMaxNestedArrays = 1ull << 16;    // total, over the file
  static constexpr std::uint64_t kMaxAlignment = 1ull << 20;

  explicit GgufFile(std::filesystem::path path) : path_(std::move(path)) { read_header(); }

  const std::filesystem::path& path() const { return path_; }
  std::uint32_t version() const { return version_; }
  std::uint32_t alignment() const { return alignment_; }
  std::uint64_t data_offset() const { return data_start_; }  // absolute file offset
  std::uint64_t file_size() const { return file_size_; }

  // ---- metadata ----
  // Keys in file order.
  const std::vector<std::string>& keys() const { return keys_; }
  bool has(std::string_view key) const { return kv_.find(key) != kv_.end(); }
  const GgufValue* find(std::string_view key) const {
    auto it = kv_.find(key);
    return it == kv_.end() ? nullptr : &values_[it->second];
  }
  const GgufValue& get(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) DC_FAIL(where(), "metadata key '", key, "' missing");
    return *v;
  }
  std::string get_string(std::string_view key) const {
    return convert(key, [](const GgufValue& v) { return v.as_string(); });
  }
  std::int64_t get_int(std::string_view key) const {
    return convert(key, [](const GgufValue& v) { return v.as_int(); });
  }
  std::uint64_t get_uint(std::string_view key) const {
    return convert(key, [](const GgufValue& v) { return v.as_uint(); });
  }
  double get_float(std::string_view key) const {
    return convert(key, [](const GgufValue& v) { return v.as_float(); });
  }
  bool get_bool(std::string_view key) const {
    return convert(key, [](const GgufValue& v) { return v.as_bool(); });
  }
  std::vector<std::string> get_string_array(std::string_view key) const {
    return convert(key, [](const GgufValue& v) { return v.as_string_array(); });
  }
  std::vector<float> get_float_array(std::string_view key) const {
    return convert(key, [](const GgufValue& v) { return v.as_float_array(); });
  }
  std::vector<std::int64_t> get_int_array(std::string_view key) const {
    return convert(key, [](const GgufValue& v) { return v.as_int_array(); });
  }

  // ---- tensors ----
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
  }
  const GgufTensorInfo& tensor(std::string_view name) const {
    const GgufTensorInfo* t = find_tensor(name);
    if (!t) DC_FAIL(where(), "tensor '", name, "' missing");
    return *t;
  }

  // The tensor dequantized to fp32, shaped row-major (ne reversed).
  Tensor<float, cpu> read_tensor(std::string_view name) const { return read_tensor(tensor(name)); }
  Tensor<float, cpu> read_tensor(const GgufTensorInfo& t) const {
    DC_CHECK(ggml_can_dequantize(t.type), where(t.name), "type ", t.type_name(),
             " cannot be dequantized (supported: ", kGgmlDequantizableTypes, ")");
    Tensor<float, cpu> out(t.shape());
    if (t.ggml_type() == GgmlType::f32) {
      read_bytes(t, out.data());  // same layout: read straight into the tensor
    } else {
      Buffer<std::uint8_t, cpu> raw(static_cast<std::size_t>(t.nbytes));
      read_bytes(t, raw.data());
      dequantize(t.type, raw.data(), out.data(), t.numel);
    }
    return out;
  }
  // The tensor's bytes as stored (t.nbytes of them).
  std::vector<std::uint8_t> read_raw(const GgufTensorInfo& t) const {
    std::vector<std::uint8_t> out(static_cast<std::size_t>(t.nbytes));
    read_bytes(t, out.data());
    return out;
  }

  // Message prefix naming the file and, when given, the tensor.
  std::string where(std::string_view tensor_name = {}) const {
    std::string s = "gguf '" + path_.string() + "': ";
    if (!tensor_name.empty()) s += "tensor '" + std::string(tensor_name) + "': ";
    return s;
  }

 private:
  // Sequential reader over the header that refuses to read past the end of the file.
  class Cursor {
   public:
    Cursor(const GgufFile& file, std::ifstream& in) : file_(file), in_(in) {}
    std::uint64_t pos() const { return pos_; }
    std::uint64_t remaining() const { return file_.file_size_ - pos_; }
    void read(void* dst, std::uint64_t n, const std::string& what) {
      DC_CHECK(n <= remaining(), file_.where(), what, ": needs ", n, " bytes at offset ", pos_,
               " but the file ends at ", file_.file_size_, " (truncated?)");
      if (n == 0) return;
      in_.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
      DC_CHECK(in_ && std::uint64_t(in_.gcount()) == n, file_.where(), what,
               ": read failed at offset ", pos_);
      pos_ += n;
    }
    template <class T>
    T get(const std::string& what) {
      T v;
      read(&v, sizeof(T), what);
      return v;
    }
    std::string string(const std::string& what) {
      const auto len = get<std::uint64_t>(what + " (string length)");
      DC_CHECK(len <= kMaxStringBytes, file_.where(), what, ": string length ", len,
               " exceeds the limit of ", kMaxStringBytes, " bytes");
      DC_CHECK(len <= remaining(), file_.where(), what, ": string length ", len,
               " runs past the end of the file (", remaining(), " bytes left)");
      std::string s(static_cast<std::size_t>(len), '\0');
      read(s.data(), len, what);
      return s;
    }

   private:
    const GgufFile& file_;
    std::ifstream& in_;
    std::uint64_t pos_ = 0;
  };

  template <class Fn>
  auto convert(std::string_view key, Fn&& fn) const -> decltype(fn(std::declval<const GgufValue&>())) {
    const GgufValue& v = get(key);
    try {
      return fn(v);
    } catch (const Error& e) {
      DC_FAIL(where(), "metadata key '", key, "' ", e.message());
    }
  }

  void read_header() {
    std::ifstream in = detail::open_checked(path_, where(), file_size_);
    Cursor c(*this, in);

    DC_CHECK(file_size_ >= 8, where(), "file is ", file_size_, " bytes, too short for a GGUF header");
    const auto magic = c.get<std::uint32_t>("magic");
    DC_CHECK(magic == kMagic, where(), "bad magic 0x", to_hex(magic),
             " (expected 'GGUF'): not a GGUF file");
    version_ = c.get<std::uint32_t>("version");
    DC_CHECK(version_ != 1, where(), "GGUF version 1 is not supported (only 2 and 3)");
    DC_CHECK(version_ == 2 || version_ == 3, where(), "unsupported GGUF version ", version_,
             (version_ == 0x03000000u || version_ == 0x02000000u ? " (a big-endian file?)" : ""),
             "; only 2 and 3 are supported");
    const auto tensor_count = c.get<std::uint64_t>("tensor_count");
    const auto kv_count = c.get<std::uint64_t>("kv_count");
    // Smallest possible entries: a kv is an empty key (8) + type (4) + a 1-byte value; a tensor
    // info is an empty name (8) + n_dims (4) + type (4) + offset (8).
    DC_CHECK(kv_count <= c.remaining() / 13, where(), "kv_count ", kv_count,
             " is impossible: the file has only ", c.remaining(), " bytes left");
    DC_CHECK(tensor_count <= c.remaining() / 24, where(), "tensor_count ", tensor_count,
             " is impossible: the file has only ", c.remaining(), " bytes left");

    for (std::uint64_t i = 0; i < kv_count; ++i) read_kv(c, i);
    read_alignment();
    for (std::uint64_t i = 0; i < tensor_count; ++i) read_tensor_info(c, i);

    data_start_ = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
    check_tensor_data();
  }

  void read_kv(Cursor& c, std::uint64_t index) {
    const std::string entry = "metadata entry " + std::to_string(index);
    std::string key = c.string(entry + " key");
    const std::string what = "metadata key '" + display_name(key) + "'";
    DC_CHECK(!has(key), where(), what, " appears twice");
    const auto type = c.get<std::uint32_t>(what + " type");
    GgufValue v = read_value(c, type, 0, what);
    kv_.emplace(key, values_.size());
    keys_.push_back(std::move(key));
    values_.push_back(std::move(v));
  }

  GgufValue read_value(Cursor& c, std::uint32_t type, int depth, const std::string& what) {
    DC_CHECK(detail::gguf_known_value_type(type), where(), what, ": unknown value type ", type);
    GgufValue v;
    v.type_ = static_cast<GgufValueType>(type);
    const std::size_t width = detail::gguf_scalar_size(v.type_);
    unsigned char buf[8];
    if (v.type_ == GgufValueType::string) {
      v.str_ = c.string(what);
    } else if (v.type_ == GgufValueType::array) {
      read_array(c, v, depth, what);
    } else {
      c.read(buf, width, what);
      if (detail::gguf_is_float(v.type_)) {
        v.real_ = detail::gguf_load_float(v.type_, buf);
      } else if (v.type_ == GgufValueType::boolean) {
        DC_CHECK(buf[0] <= 1, where(), what, ": invalid bool byte ", int(buf[0]));
        v.bits_ = buf[0];
      } else {
        v.bits_ = detail::gguf_load_integer(v.type_, buf);
      }
    }
    return v;
  }

  void read_array(Cursor& c, GgufValue& v, int depth, const std::string& what) {
    DC_CHECK(depth < kMaxArrayDepth, where(), what, ": arrays nested deeper than ", kMaxArrayDepth);
    const auto elem = c.get<std::uint32_t>(what + " array element type");
    DC_CHECK(detail::gguf_known_value_type(elem), where(), what, ": unknown array element type ", elem);
    v.elem_ = static_cast<GgufValueType>(elem);
    v.count_ = c.get<std::uint64_t>(what + " array length");
    const std::size_t width = detail::gguf_scalar_size(v.elem_);
    // The smallest element takes `min_bytes` in the file, which bounds the count honestly.
    const std::uint64_t min_bytes = v.elem_ == GgufValueType::string  ? 8
                                    : v.elem_ == GgufValueType::array ? 12
                                                                      : width;
    DC_CHECK(v.count_ <= c.remaining() / min_bytes, where(), what, ": array length ", v.count_,
             " of ", gguf_value_type_name(v.elem_), " cannot fit in the ", c.remaining(),
             " bytes left in the file");
    if (v.elem_ == GgufValueType::string) {
      v.ends_.reserve(static_cast<std::size_t>(v.count_));  // <= remaining / 8 entries
      for (std::uint64_t i = 0; i < v.count_; ++i) {
        // The element count was bounded above, so the length word itself is in the file.
        const auto len = c.get<std::uint64_t>(what);
        DC_CHECK(len <= c.remaining() && len <= kMaxStringBytes, where(), what, "[", i,
                 "]: string length ", len, " runs past the end of the file (", c.remaining(),
                 " bytes left)");
        const std::size_t old = v.blob_.size();
        v.blob_.resize(old + static_cast<std::size_t>(len));
        c.read(v.blob_.data() + old, len, what);
        v.ends_.push_back(v.blob_.size());
      }
    } else if (v.elem_ == GgufValueType::array) {
      nested_arrays_ += v.count_;
      DC_CHECK(nested_arrays_ <= kMaxNestedArrays, where(), what, ": more than ", kMaxNestedArrays,
               " nested arrays in the file");
      v.items_.reserve(static_cast<std::size_t>(v.count_));
      for (std::uint64_t i = 0; i < v.count_; ++i)
        v.items_.push_back(read_value(c, elem, depth + 1, what + "[" + std::to_string(i) + "]"));
    } else {
      v.raw_.resize(static_cast<std::size_t>(v.count_ * width));
      c.read(v.raw_.data(), v.raw_.size(), what);
      if (v.elem_ == GgufValueType::boolean)
        for (std::size_t i = 0; i < v.raw_.size(); ++i)
          DC_CHECK(v.raw_[i] <= 1, where(), what, "[", i, "]: invalid bool byte ", int(v.raw_[i]));
    }
  }

  void read_alignment() {
    const GgufValue* a = find("general.alignment");
    if (!a) return;
    DC_CHECK(a->type() == GgufValueType::u32, where(), "metadata key 'general.alignment' is ",
             a->type_description(), ", not uint32");
    const std::uint64_t value = a->as_uint();
    DC_CHECK(value != 0 && (value & (value - 1)) == 0 && value <= kMaxAlignment, where(),
             "metadata key 'general.alignment' = ", value, " is not a power of two <= ", kMaxAlignment);
    alignment_ = static_cast<std::uint32_t>(value);
  }

  void read_tensor_info(Cursor& c, std::uint64_t index) {
    GgufTensorInfo t;
    t.name = c.string("tensor info " + std::to_string(index) + " name");
    const std::string what = "tensor '" + display_name(t.name) + "'";
    DC_CHECK(tensor_index_.find(t.name) == tensor_index_.end(), where(), what,
             ": duplicate tensor name");
    const auto n_dims = c.get<std::uint32_t>(what + " n_dims");
    DC_CHECK(n_dims <= std::uint32_t(kMaxDims), where(), what, ": ", n_dims,
             " dimensions, more than the maximum of ", kMaxDims);
    // Cap numel so every byte count below fits in uint64, streamoff and size_t.
    constexpr std::uint64_t kMaxNumel = std::uint64_t(1) << 56;
    std::uint64_t numel = 1;
    for (std::uint32_t d = 0; d < n_dims; ++d) {
      const auto dim = c.get<std::uint64_t>(what + " dims");
      DC_CHECK(dim <= kMaxNumel && (dim == 0 || numel <= kMaxNumel / dim), where(), what,
               ": dimensions are absurdly large (dim ", d, " = ", dim, ")");
      numel *= dim;
      t.ne.push_back(static_cast<std::int64_t>(dim));
    }
    t.numel = static_cast<std::int64_t>(numel);
    t.type = c.get<std::uint32_t>(what + " type");
    const GgmlTypeTraits* traits = ggml_type_traits(t.type);
    DC_CHECK(traits != nullptr, where(), what, ": unknown tensor type ", t.type);
    const std::uint64_t row = t.ne.empty() ? 1 : std::uint64_t(t.ne[0]);
    DC_CHECK(row % traits->block_size == 0, where(), what, ": first dimension ", row,
             " is not a multiple of the ", traits->name, " block size ", traits->block_size);
    t.nbytes = numel / traits->block_size * traits->type_size;
    t.offset = c.get<std::uint64_t>(what + " offset");
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // Every tensor is aligned, inside the file, and disjoint from the others.
  void check_tensor_data() const {
    std::vector<const GgufTensorInfo*> by_offset;
    by_offset.reserve(tensors_.size());
    for (const auto& t : tensors_) {
      DC_CHECK(t.offset % alignment_ == 0, where(t.name), "offset ", t.offset,
               " is not a multiple of the alignment ", alignment_);
      DC_CHECK(data_start_ <= file_size_ && t.offset <= file_size_ - data_start_, where(t.name),
               "offset ", t.offset, " points past the end of the file (data section starts at ",
               data_start_, ", file is ", file_size_, " bytes)");
      DC_CHECK(t.nbytes <= file_size_ - data_start_ - t.offset, where(t.name), "data truncated: ",
               t.nbytes, " bytes at file offset ", data_start_ + t.offset, " but the file is only ",
               file_size_, " bytes");
      by_offset.push_back(&t);
    }
    std::sort(by_offset.begin(), by_offset.end(),
              [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
    for (std::size_t i = 1; i < by_offset.size(); ++i) {
      const GgufTensorInfo& prev = *by_offset[i - 1];
      DC_CHECK(prev.nbytes == 0 || by_offset[i]->nbytes == 0 ||
                   prev.offset + prev.nbytes <= by_offset[i]->offset,
               where(by_offset[i]->name), "data at offset ", by_offset[i]->offset,
               " overlaps tensor '", prev.name, "' [", prev.offset, ", ", prev.offset + prev.nbytes, ")");
    }
  }

  // Reads the tensor's bytes (validated against the file size at open; a short read now means
  // the file changed since).
  void read_bytes(const GgufTensorInfo& t, void* dst) const {
    if (t.nbytes == 0) return;
    std::ifstream in(path_, std::ios::binary);
    DC_CHECK(in.is_open(), where(t.name), "cannot open for reading");
    in.seekg(static_cast<std::streamoff>(data_start_ + t.offset));
    in.read(static_cast<char*>(dst), static_cast<std::streamsize>(t.nbytes));
    DC_CHECK(in && std::uint64_t(in.gcount()) == t.nbytes, where(t.name), "data truncated: expected ",
             t.nbytes, " bytes at offset ", data_start_ + t.offset);
  }

  // A key or tensor name as header messages show it: cut short, because the reader builds these
  // message prefixes eagerly, once per array element for arrays of arrays -- with a key of
  // megabytes that copying alone took minutes (see fuzz/README.md).
  static std::string display_name(std::string_view name) {
    constexpr std::size_t kMax = 96;
    if (name.size() <= kMax) return std::string(name);
    return std::string(name.substr(0, kMax)) + "... (" + std::to_string(name.size()) + " bytes)";
  }

  static std::string to_hex(std::uint32_t v) {
    static const char* digits = "0123456789abcdef";
    std::string s(8, '0');
    for (int i = 7; i >= 0; --i, v >>= 4) s[std::size_t(i)] = digits[v & 0xf];
    return s;
  }

  std::filesystem::path path_;
  std::uint64_t file_size_ = 0;
  std::uint32_t version_ = 0;
  std::uint32_t alignment_ = kDefaultAlignment;
  std::uint64_t data_start_ = 0;
  std::uint64_t nested_arrays_ = 0;
  std::vector<std::string> keys_;
  std::vector<GgufValue> values_;
  std::map<std::string, std::size_t, std::less<>> kv_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, std::size_t, std::less<>> tensor_index_;
};

}  // namespace dc
