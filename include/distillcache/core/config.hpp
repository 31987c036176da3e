#pragma once
// Compiler/host-device configuration shared by every header.
//
// DC_HD marks the pure numeric helpers in math/ so one definition serves the CPU loops and the
// CUDA kernels. Under nvcc they become __host__ __device__; under a plain C++ compiler they are
// ordinary inline functions, so host-only builds never need the CUDA toolkit.

#if defined(__CUDACC__)
#define DC_HD __host__ __device__ __forceinline__
#define DC_COMPILING_CUDA 1
#else
#define DC_HD inline
#define DC_COMPILING_CUDA 0
#endif

// DC_HD and always inlined on the host: for the helpers a CPU loop calls per element, which must
// be inlined for the loop to vectorise (GCC kept math::log_poly an out-of-line call in a loop
// with ten call sites, and the policy's inputs ran a call per element).
#if defined(__CUDACC__)
#define DC_HD_INLINE DC_HD
#elif defined(__GNUC__)
#define DC_HD_INLINE inline __attribute__((always_inline))
#else
#define DC_HD_INLINE inline
#endif

// Placed before a DC_HD function template that calls a functor: the functor is host-only when
// the CPU backend instantiates it and device-only in a kernel, and nvcc must accept both.
#if defined(__CUDACC__)
#define DC_EXEC_CHECK_DISABLE _Pragma("nv_exec_check_disable")
#else
#define DC_EXEC_CHECK_DISABLE
#endif

// Restrict-qualified pointers help the CPU loops vectorise; nvcc and g++/clang share the spelling.
#define DC_RESTRICT __restrict__

// OpenMP work-sharing that compiles away (without unknown-pragma warnings) when the translation
// unit is built without OpenMP: DC_OMP(parallel for schedule(static)).
#define DC_PRAGMA(x) _Pragma(#x)
#if defined(_OPENMP)
#define DC_OMP(...) DC_PRAGMA(omp __VA_ARGS__)
#else
#define DC_OMP(...)
#endif

namespace dc {
inline constexpr int kVersionMajor = 0;
inline constexpr int kVersionMinor = 1;
}  // namespace dc
