# Decides DEEPINFER_CUDA_ENABLED from DEEPINFER_CUDA (AUTO/ON/OFF).
# The CUDA backend lives in cuda/; it is built for sm_90a (Hopper, runs on the H200) and sm_100a
# (Blackwell, compiled only) once its sources exist.
set(DEEPINFER_CUDA_ENABLED OFF)
string(TOUPPER "${DEEPINFER_CUDA}" _deepinfer_cuda_mode)
set(_deepinfer_cuda_sources_present OFF)
if(EXISTS "${CMAKE_CURRENT_SOURCE_DIR}/cuda/CMakeLists.txt")
  set(_deepinfer_cuda_sources_present ON)
endif()

if(_deepinfer_cuda_mode STREQUAL "OFF")
  # nothing to do
elseif(_deepinfer_cuda_mode STREQUAL "ON" OR _deepinfer_cuda_mode STREQUAL "AUTO")
  include(CheckLanguage)
  check_language(CUDA)
  if(NOT _deepinfer_cuda_sources_present)
    if(_deepinfer_cuda_mode STREQUAL "ON")
      message(FATAL_ERROR "DEEPINFER_CUDA=ON, but cuda/CMakeLists.txt does not exist in this checkout: "
                          "the CUDA backend has not landed yet. Configure with -DDEEPINFER_CUDA=OFF.")
    endif()
  elseif(CMAKE_CUDA_COMPILER)
    set(DEEPINFER_CUDA_ENABLED ON)
  elseif(_deepinfer_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "DEEPINFER_CUDA=ON, but no CUDA compiler was found. Put nvcc on PATH or set "
                        "CMAKE_CUDA_COMPILER, or configure with -DDEEPINFER_CUDA=OFF.")
  endif()
else()
  message(FATAL_ERROR "DEEPINFER_CUDA must be AUTO, ON or OFF (got '${DEEPINFER_CUDA}')")
endif()
