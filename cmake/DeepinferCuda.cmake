# Decides DEEPINFER_CUDA_ENABLED from DEEPINFER_CUDA (AUTO/ON/OFF) and finds cuBLAS.
#
# The CUDA backend (cuda/) is built for sm_90a (Hopper: runs on the H200) and sm_100a
# (Blackwell: compiled only): every source for every architecture. cuda/README.md has the table
# of which files use which instructions (mma.sync / ldmatrix / cp.async of sm_80+ in the sm80/
# folders and the f32 tile loaders, thread-block clusters of sm_90 in norm/rms_norm.cu).
# cuBLAS comes from the CUDA toolkit when it has it, else from the `nvidia-cublas` PyPI wheel
# (site-packages/nvidia/cu13/{include,lib}), which is how a machine
# with nvcc but without the full toolkit builds it:  python -m pip install nvidia-cublas
# AUTO builds the backend only when nvcc and cuBLAS are both found; ON makes either missing an
# error that says how to get it.
set(DEEPINFER_CUDA_ENABLED OFF)
set(DEEPINFER_CUDA_ARCHITECTURES "90a;100a" CACHE STRING "CUDA architectures of the CUDA backend")
string(TOUPPER "${DEEPINFER_CUDA}" _deepinfer_cuda_mode)

function(_deepinfer_find_cublas out_found)
  set(${out_found} OFF PARENT_SCOPE)
  find_package(CUDAToolkit QUIET)
  if(TARGET CUDA::cublas AND EXISTS "${CUDAToolkit_INCLUDE_DIRS}/cublas_v2.h")
    add_library(deepinfer_cublas INTERFACE IMPORTED GLOBAL)
    target_link_libraries(deepinfer_cublas INTERFACE CUDA::cublas CUDA::cublasLt)
    set(${out_found} ON PARENT_SCOPE)
    message(STATUS "deepinfer: cuBLAS from the CUDA toolkit (${CUDAToolkit_INCLUDE_DIRS})")
    return()
  endif()
  find_package(Python 3.10 COMPONENTS Interpreter QUIET)
  if(NOT Python_EXECUTABLE)
    return()
  endif()
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
            "import nvidia, os; print(';'.join(os.path.join(p, 'cu13') for p in nvidia.__path__))"
    OUTPUT_VARIABLE _roots OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc ERROR_QUIET)
  if(NOT _rc EQUAL 0)
    return()
  endif()
  foreach(_root IN LISTS _roots)
    if(EXISTS "${_root}/include/cublas_v2.h" AND EXISTS "${_root}/lib/libcublas.so.13")
      add_library(deepinfer_cublas INTERFACE IMPORTED GLOBAL)
      target_include_directories(deepinfer_cublas SYSTEM INTERFACE "${_root}/include")
      target_link_libraries(deepinfer_cublas INTERFACE "${_root}/lib/libcublas.so.13"
                                                       "${_root}/lib/libcublasLt.so.13")
      set(DEEPINFER_CUBLAS_LIBDIR "${_root}/lib" CACHE INTERNAL "")
      set(${out_found} ON PARENT_SCOPE)
      message(STATUS "deepinfer: cuBLAS from the nvidia-cublas wheel (${_root})")
      return()
    endif()
  endforeach()
endfunction()

if(_deepinfer_cuda_mode STREQUAL "OFF")
  # nothing to do
elseif(_deepinfer_cuda_mode STREQUAL "ON" OR _deepinfer_cuda_mode STREQUAL "AUTO")
  include(CheckLanguage)
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    if(_deepinfer_cuda_mode STREQUAL "ON")
      message(FATAL_ERROR "DEEPINFER_CUDA=ON, but no CUDA compiler was found. Put nvcc on PATH or set "
                          "CMAKE_CUDA_COMPILER, or configure with -DDEEPINFER_CUDA=OFF.")
    endif()
  else()
    _deepinfer_find_cublas(_have_cublas)
    if(_have_cublas)
      set(DEEPINFER_CUDA_ENABLED ON)
    elseif(_deepinfer_cuda_mode STREQUAL "ON")
      message(FATAL_ERROR "DEEPINFER_CUDA=ON, but cuBLAS was found neither in the CUDA toolkit nor in "
                          "the nvidia-cublas wheel. Install it with:  python -m pip install nvidia-cublas")
    else()
      message(STATUS "deepinfer: nvcc found but no cuBLAS; building without the CUDA backend "
                     "(python -m pip install nvidia-cublas to enable it)")
    endif()
  endif()
else()
  message(FATAL_ERROR "DEEPINFER_CUDA must be AUTO, ON or OFF (got '${DEEPINFER_CUDA}')")
endif()

if(DEEPINFER_CUDA_ENABLED)
  # The kernels use sm_80+ instructions (cp.async, ldmatrix, bf16 mma.sync) and sm_90 thread-block
  # clusters: sm_90 or newer.
  foreach(_arch IN LISTS DEEPINFER_CUDA_ARCHITECTURES)
    string(REGEX MATCH "^[0-9]+" _arch_number "${_arch}")
    if(NOT _arch_number OR _arch_number LESS 90)
      message(FATAL_ERROR "DEEPINFER_CUDA_ARCHITECTURES: '${_arch}' is not supported; the CUDA "
                          "backend needs sm_90 or newer (e.g. 90a;100a)")
    endif()
  endforeach()
  set(CMAKE_CUDA_ARCHITECTURES "${DEEPINFER_CUDA_ARCHITECTURES}")
  # One CUDA runtime: the shared libcudart (CUDA::cudart), the same file PyTorch and other CUDA
  # libraries of the process load. CMake's default would also link the static runtime.
  set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
endif()
