# Decides whether the CUDA backend is built (DC_CUDA = AUTO/ON/OFF) and configures it.
# Compiling needs only nvcc; running the CUDA tests needs a GPU, and they skip themselves without.
include(CheckLanguage)
set(DC_HAVE_CUDA OFF)
if(NOT DC_CUDA STREQUAL "OFF")
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)  # Hopper (H100/H200): the GPU we benchmark on
    endif()
    enable_language(CUDA)
    # CMake 3.25 predates nvcc's C++20 support in its dialect tables, so CMAKE_CUDA_STANDARD 20
    # is rejected; pass the flag directly instead.
    string(APPEND CMAKE_CUDA_FLAGS " -std=c++20")
    find_package(CUDAToolkit REQUIRED)
    set(DC_HAVE_CUDA ON)
  elseif(DC_CUDA STREQUAL "ON")
    message(FATAL_ERROR "DC_CUDA=ON but no working CUDA compiler was found")
  endif()
endif()
message(STATUS "distillcache: CUDA backend ${DC_HAVE_CUDA}")
