#pragma once
// Weight matrices kept in ggml's block formats on the CPU, and the products the forward pass
// takes with them: y[n, out] (+)= x[n, in] * W[out, in]^T and the embedding gather.
//
// Why: decoding streams every weight once per step and is bound by those bytes. SmolLM2's Q4_1
// layers take 0.625 bytes per weight against bf16's 2. The activations are quantized per block of
// 32 to 8 bits (as llama.cpp does), so a block's dot product is an exact integer sum times two
// scales (math/quant_blocks.hpp) and the CPU's byte dot products do the work (cpu/quant_dot.hpp).
// The error against the fp32 product of the dequantized weights is the activations' rounding
// alone, at most half a step (max|x| / 254 per block) per element.
//
// Every output element is one row's sum over blocks in block order, written by one thread, so it
// does not depend on the thread count, on the kernel (portable, AVX2, VNNI give the same
// integers) or on the other rows of x: a batched decoding row equals the same row alone.
#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "../core/backend.hpp"
#include "../core/buffer.hpp"
#include "../core/config.hpp"
#include "../core/error.hpp"
#include "../core/finite.hpp"
#include "../core/tensor.hpp"
#include "../math/quant_blocks.hpp"
#include "quant_dot.hpp"

namespace dc {

// A [rows, cols] matrix stored as rows of cols / 32 blocks of one format.
class QuantizedMatrix {
 public:
  QuantizedMatrix() = default;
  QuantizedMatrix(QuantFormat format, std::int64_t rows, std::int64_t cols)
      : format_(format), rows_(rows), cols_(cols), bytes_(checked_bytes(format, rows, cols)) {}

  // Quantizes an fp32 [rows, cols] matrix by ggml's reference rules.
  static QuantizedMatrix quantize(QuantFormat format, const Tensor<float, cpu>& t) {
    DC_CHECK(t.shape().rank == 2, "quantize: expected a matrix, got shape ", t.shape().str());
    check_all_finite(std::span<const float>(t.data(), std::size_t(t.numel())), "quantize: the matrix");
    QuantizedMatrix m(format, t.dim(0), t.dim(1));
    const std::int64_t blocks = m.rows_ * m.blocks_per_row();
    const std::size_t stride = quant_block_bytes(format);
    DC_OMP(parallel for schedule(static))
    for (std::int64_t b = 0; b < blocks; ++b)
      math::quantize_weight_block(format, t.data() + b * kQuantBlock, m.bytes_.data() + std::size_t(b) * stride);
    return m;
  }

  QuantFormat format() const { return format_; }
  std::int64_t rows() const { return rows_; }
  std::int64_t cols() const { return cols_; }
  Shape shape() const { return Shape{rows_, cols_}; }
  int blocks_per_row() const { return static_cast<int>(cols_ / kQuantBlock); }
  std::size_t row_bytes() const { return std::size_t(blocks_per_row()) * quant_block_bytes(format_); }
  std::size_t bytes() const { return bytes_.bytes(); }
  bool empty() const { return bytes_.empty(); }
  static constexpr int device() { return kHostDevice; }

  std::uint8_t* row(std::int64_t r) { return bytes_.data() + std::size_t(r) * row_bytes(); }
  const std::uint8_t* row(std::int64_t r) const { return bytes_.data() + std::size_t(r) * row_bytes(); }

  // Row r decoded to fp32 (cols values).
  void dequantize_row(std::int64_t r, float* out) const {
    const std::uint8_t* block = row(r);
    for (int b = 0; b < blocks_per_row(); ++b, block += quant_block_bytes(format_))
      math::dequantize_weight_block(format_, block, out + std::int64_t(b) * kQuantBlock);
  }

 private:
  static std::size_t checked_bytes(QuantFormat format, std::int64_t rows, std::int64_t cols) {
    DC_CHECK(rows >= 0 && cols >= 0, "quantized matrix: negative shape [", rows, ", ", cols, "]");
    DC_CHECK(cols % kQuantBlock == 0, "quantized matrix (", quant_format_name(format), "): ", cols,
             " columns are not a whole number of blocks of ", kQuantBlock);
    return std::size_t(rows) * std::size_t(cols / kQuantBlock) * quant_block_bytes(format);
  }

  QuantFormat format_ = QuantFormat::q8_0;
  std::int64_t rows_ = 0, cols_ = 0;
  Buffer<std::uint8_t, cpu> bytes_;
};

namespace cpu_detail {

inline constexpr int kQuantRows = 4;  // activation rows per weight-row pass

// out[r] for r < rows (<= kQuantRows): weight row w (blocks of format f) against activation rows
// a + r * a_stride. Each output is its blocks' contributions added in block order, whatever rows
// it is computed with.
inline void quant_rows_dot(QuantKernel k, QuantFormat f, const std::uint8_t* w, const ActivationBlock* a,
                           int a_stride, int rows, int blocks, float* out) {
  constexpr int kChunk = 64;  // integer sums held on the stack per pass
  std::int32_t sums[kQuantRows * kChunk];
  const std::size_t stride = quant_block_bytes(f);
  for (int r = 0; r < rows; ++r) out[r] = 0.0f;
  for (int begin = 0; begin < blocks; begin += kChunk) {
    const int count = std::min(kChunk, blocks - begin);
    const std::uint8_t* chunk = w + std::size_t(begin) * stride;
    quant_block_sums(k, f, chunk, a + begin, a_stride, rows, count, sums);
    // The floats are combined here, outside the SIMD kernels, so every kernel rounds alike.
    for (int r = 0; r < rows; ++r) {
      const ActivationBlock* ar = a + std::int64_t(r) * a_stride + begin;
      float acc = out[r];
      for (int b = 0; b < count; ++b)
        acc += math::combine_block(f, chunk + std::size_t(b) * stride, ar[b], sums[r * count + b]);
      out[r] = acc;
    }
  }
}

}  // namespace cpu_detail

// x[n, in] quantized per block of 32 into out[n * in / 32].
inline void quantize_activations(const float* x, int n, int in, ActivationBlock* out) {
  const int blocks = in / kQuantBlock;
  DC_OMP(parallel for schedule(static) if (n > 1))
  for (int i = 0; i < n; ++i)
    for (int b = 0; b < blocks; ++b)
      out[std::int64_t(i) * blocks + b] = math::quantize_activation_block(x + std::int64_t(i) * in + b * kQuantBlock);
}

// y[n, out] = x[n, in] * w^T, or y += ... when accumulate; w is [out, in].
inline void matmul(const Context<cpu>&, float* y, const float* x, const QuantizedMatrix& w, int n, int in,
                   int out, bool accumulate = false) {
  DC_CHECK(w.rows() == out && w.cols() == in, "quantized matmul: weight ", w.shape().str(), ", expected [",
           out, ", ", in, "]");
  const int blocks = w.blocks_per_row();
  thread_local std::vector<ActivationBlock> activations;  // reused: no allocation per call
  activations.resize(std::size_t(n) * std::size_t(blocks));
  quantize_activations(x, n, in, activations.data());
  const ActivationBlock* a = activations.data();
  const QuantKernel kernel = best_quant_kernel();
  const QuantFormat f = w.format();
  constexpr int kTileOut = 32;  // weight rows per parallel tile; each stays in L1 for all n rows
  const int tiles = (out + kTileOut - 1) / kTileOut;
  DC_OMP(parallel for schedule(static))
  for (int tile = 0; tile < tiles; ++tile) {
    const int o_end = std::min(out, (tile + 1) * kTileOut);
    for (int o = tile * kTileOut; o < o_end; ++o) {
      const std::uint8_t* row = w.row(o);
      for (int i = 0; i < n; i += cpu_detail::kQuantRows) {
        const int rows = std::min(cpu_detail::kQuantRows, n - i);
        float v[cpu_detail::kQuantRows];
        cpu_detail::quant_rows_dot(kernel, f, row, a + std::int64_t(i) * blocks, blocks, rows, blocks, v);
        for (int r = 0; r < rows; ++r) {
          float& dst = y[std::int64_t(i + r) * out + o];
          dst = accumulate ? dst + v[r] : v[r];
        }
      }
    }
  }
}

// out[n, d] = table[tokens[t], :], decoded; tokens are validated by the caller.
inline void embedding(const Context<cpu>&, float* out, const std::int32_t* tokens, int n,
                      const QuantizedMatrix& table, int d) {
  DC_CHECK(table.cols() == d, "quantized embedding: table ", table.shape().str(), ", expected ", d, " columns");
  for (int t = 0; t < n; ++t) table.dequantize_row(tokens[t], out + std::int64_t(t) * d);
}

}  // namespace dc
