# Finds cuda.h for the GPU staging and import code. Only the header is used
# at build time (the driver API's types); libcuda is opened at run time
# (common/cuda/driver.h), so the same binaries run without a GPU or driver.
#
# Looks, in order, in MESHLOAD_CUDA_INCLUDE_DIR, the CUDA toolkit, NVIDIA's
# CUDA runtime wheel (nvidia-cuda-runtime) in the Python environment named by
# MESHLOAD_CUDA_WHEEL_PYTHON (the pip package's build environment), and the
# same wheel in the project's .venv (scripts/install-deps.sh). Sets
#   MESHLOAD_HAVE_CUDA_HEADERS  ON when found
#   MESHLOAD_CUDA_INCLUDE_DIRS  the directory holding cuda.h
#   MESHLOAD_CUDA_VERSION       e.g. 13000, from cuda.h's CUDA_VERSION
set(MESHLOAD_CUDA_INCLUDE_DIR "" CACHE PATH "Directory holding cuda.h (empty: toolkit, then NVIDIA's wheel)")
set(MESHLOAD_HAVE_CUDA_HEADERS OFF)
set(MESHLOAD_CUDA_INCLUDE_DIRS "")
set(MESHLOAD_CUDA_VERSION "")
if(MESHLOAD_CUDA_INCLUDE_DIR)
  if(NOT EXISTS "${MESHLOAD_CUDA_INCLUDE_DIR}/cuda.h")
    message(FATAL_ERROR "MESHLOAD_CUDA_INCLUDE_DIR=${MESHLOAD_CUDA_INCLUDE_DIR} holds no cuda.h")
  endif()
  set(MESHLOAD_CUDA_INCLUDE_DIRS "${MESHLOAD_CUDA_INCLUDE_DIR}")
  set(_meshload_cuda_from "MESHLOAD_CUDA_INCLUDE_DIR")
else()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND AND EXISTS "${CUDAToolkit_INCLUDE_DIRS}/cuda.h")
    set(MESHLOAD_CUDA_INCLUDE_DIRS "${CUDAToolkit_INCLUDE_DIRS}")
    set(_meshload_cuda_from "the CUDA ${CUDAToolkit_VERSION} toolkit")
  endif()
  if(NOT MESHLOAD_CUDA_INCLUDE_DIRS AND MESHLOAD_CUDA_WHEEL_PYTHON)
    # The `nvidia` namespace package of that interpreter's environment.
    execute_process(
      COMMAND "${MESHLOAD_CUDA_WHEEL_PYTHON}" -c
              "import nvidia, os; print(';'.join(os.path.join(p, s, 'include') for p in nvidia.__path__ for s in ('cu13', 'cuda_runtime')))"
      OUTPUT_VARIABLE _meshload_wheel_dirs OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _meshload_rc)
    if(_meshload_rc EQUAL 0)
      foreach(_dir IN LISTS _meshload_wheel_dirs)
        if(NOT MESHLOAD_CUDA_INCLUDE_DIRS AND EXISTS "${_dir}/cuda.h")
          set(MESHLOAD_CUDA_INCLUDE_DIRS "${_dir}")
          set(_meshload_cuda_from "NVIDIA's CUDA runtime wheel in the build environment")
        endif()
      endforeach()
    endif()
  endif()
  if(NOT MESHLOAD_CUDA_INCLUDE_DIRS)
    file(GLOB _meshload_wheel_cuda_h
         "${MESHLOAD_SOURCE_ROOT}/.venv/lib/python3*/site-packages/nvidia/cu13/include/cuda.h"
         "${MESHLOAD_SOURCE_ROOT}/.venv/lib/python3*/site-packages/nvidia/cuda_runtime/include/cuda.h")
    if(_meshload_wheel_cuda_h)
      list(GET _meshload_wheel_cuda_h 0 _meshload_wheel_cuda_h)
      get_filename_component(MESHLOAD_CUDA_INCLUDE_DIRS "${_meshload_wheel_cuda_h}" DIRECTORY)
      set(_meshload_cuda_from "NVIDIA's CUDA runtime wheel in .venv")
    endif()
  endif()
endif()
if(MESHLOAD_CUDA_INCLUDE_DIRS)
  set(MESHLOAD_HAVE_CUDA_HEADERS ON)
  file(STRINGS "${MESHLOAD_CUDA_INCLUDE_DIRS}/cuda.h" MESHLOAD_CUDA_VERSION REGEX "^#define CUDA_VERSION [0-9]+")
  string(REGEX REPLACE ".* ([0-9]+)$" "\\1" MESHLOAD_CUDA_VERSION "${MESHLOAD_CUDA_VERSION}")
  message(STATUS "meshload: cuda.h (CUDA_VERSION ${MESHLOAD_CUDA_VERSION}) from ${_meshload_cuda_from} at ${MESHLOAD_CUDA_INCLUDE_DIRS}: GPU staging built in")
else()
  message(STATUS "meshload: no cuda.h (no CUDA toolkit, no CUDA runtime wheel: run scripts/install-deps.sh): GPU staging not built (host staging only)")
endif()
