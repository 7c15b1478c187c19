# User-facing build options. Defaults suit `pip install .`: the Python module on, tests off.
set(DEEPINFER_CUDA "AUTO" CACHE STRING "Build the CUDA backend: AUTO (when nvcc and the backend sources are present), ON or OFF")
set_property(CACHE DEEPINFER_CUDA PROPERTY STRINGS AUTO ON OFF)
option(DEEPINFER_ASCEND "Build the Ascend backend (needs CANN)" OFF)
option(DEEPINFER_PYTHON "Build the nanobind module deepinfer_core" ON)
option(DEEPINFER_WERROR "Treat compiler warnings as errors" OFF)
option(DEEPINFER_BUILD_TESTS "Build the GoogleTest suite in tests/cpp" OFF)
option(DEEPINFER_DEBUG_INVARIANTS "Check engine invariants at run time (always on in Debug builds)" OFF)
