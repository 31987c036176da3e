#pragma once
// Shapes, non-owning tensor views and owning tensors (a Buffer plus a Shape).
//
// Tensors are dense and row-major: the last dimension is contiguous. That is all the transformer
// needs, and it keeps views trivially copyable into CUDA kernels.
#include <array>
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <sstream>
#include <string>

#include "buffer.hpp"

namespace dc {

struct Shape {
  static constexpr int kMaxRank = 4;
  std::array<std::int64_t, kMaxRank> dims{};
  int rank = 0;

  Shape() = default;
  Shape(std::initializer_list<std::int64_t> d) {
    DC_CHECK(d.size() <= kMaxRank, "tensor rank ", d.size(), " exceeds ", kMaxRank);
    for (auto v : d) {
      DC_CHECK(v >= 0, "negative tensor dimension ", v);
      dims[rank++] = v;
    }
  }
  std::int64_t operator[](int i) const { return dims[i]; }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= dims[i];
    return n;
  }
  bool operator==(const Shape& o) const {
    if (rank != o.rank) return false;
    for (int i = 0; i < rank; ++i)
      if (dims[i] != o.dims[i]) return false;
    return true;
  }
  std::string str() const {
    std::ostringstream os;
    os << '[';
    for (int i = 0; i < rank; ++i) os << (i ? ", " : "") << dims[i];
    os << ']';
    return os.str();
  }
};

inline std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.str(); }

// A typed pointer with a shape; does not own memory. Backend says where the pointer lives.
template <class T, Backend B>
struct TensorView {
  T* data = nullptr;
  Shape shape;

  std::int64_t numel() const { return shape.numel(); }
  std::int64_t dim(int i) const { return shape[i]; }
  // Row i of a rank-2 view (host-side pointer arithmetic only; valid for any backend).
  T* row(std::int64_t i) const { return data + i * shape[shape.rank - 1]; }
  operator TensorView<const T, B>() const { return {data, shape}; }
};

template <class T, Backend B>
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(Shape shape) : shape_(shape), buf_(static_cast<std::size_t>(shape.numel())) {}

  T* data() { return buf_.data(); }
  const T* data() const { return buf_.data(); }
  const Shape& shape() const { return shape_; }
  std::int64_t dim(int i) const { return shape_[i]; }
  std::int64_t numel() const { return shape_.numel(); }
  std::size_t bytes() const { return buf_.bytes(); }
  bool empty() const { return buf_.empty(); }
  int device() const { return buf_.device(); }
  Buffer<T, B>& buffer() { return buf_; }
  const Buffer<T, B>& buffer() const { return buf_; }

  TensorView<T, B> view() { return {buf_.data(), shape_}; }
  TensorView<const T, B> view() const { return {buf_.data(), shape_}; }

 private:
  Shape shape_;
  Buffer<T, B> buf_;
};

}  // namespace dc
