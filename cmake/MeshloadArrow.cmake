# Finds Arrow C++ and its Parquet library (libarrow + libparquet, the
# reference implementation), which read Parquet footers and decode row
# groups (formats/parquet.h). Debian 12 does not package them; the pinned
# pyarrow wheel (requirements-build.txt, installed into .venv by
# scripts/install-deps.sh) ships their C++ headers and shared libraries,
# built for manylinux_2_28 with the C++11 ABI g++ uses here.
#
# Looks, in order, in MESHLOAD_ARROW_ROOT (a folder holding include/arrow,
# include/parquet, libarrow.so* and libparquet.so*, e.g. an unpacked pyarrow
# wheel's pyarrow/ folder or an Arrow install's prefix with lib/), an Arrow
# C++ install CMake finds (find_package(Parquet)), and the pyarrow wheel in
# the project's .venv. Sets
#   meshload::arrow, meshload::parquet   imported targets
#   MESHLOAD_ARROW_LIBRARIES             the shared libraries' paths (what
#                                        an image or a bundle carries)
#   MESHLOAD_ARROW_VERSION               e.g. 26.0.1
set(MESHLOAD_ARROW_ROOT "" CACHE PATH "Folder holding Arrow C++'s include/ and libarrow/libparquet (empty: an installed Arrow, else the pyarrow wheel in .venv)")
set(MESHLOAD_ARROW_LIBRARIES "")
set(_meshload_arrow_dir "")
set(_meshload_arrow_from "")

function(_meshload_arrow_lib out dir name)
  # The wheel ships only the versioned name (libarrow.so.2600); an install
  # has the unversioned link too.
  file(GLOB _cands "${dir}/lib${name}.so" "${dir}/lib${name}.so.[0-9]*" "${dir}/lib/lib${name}.so"
       "${dir}/lib/lib${name}.so.[0-9]*" "${dir}/lib64/lib${name}.so" "${dir}/lib64/lib${name}.so.[0-9]*")
  set(_pick "")
  foreach(_c IN LISTS _cands)
    # The shortest name that is a file: the link name, else the soname.
    if(NOT _pick)
      set(_pick "${_c}")
    else()
      string(LENGTH "${_c}" _lc)
      string(LENGTH "${_pick}" _lp)
      if(_lc LESS _lp)
        set(_pick "${_c}")
      endif()
    endif()
  endforeach()
  set(${out} "${_pick}" PARENT_SCOPE)
endfunction()

if(MESHLOAD_ARROW_ROOT)
  if(NOT EXISTS "${MESHLOAD_ARROW_ROOT}/include/parquet/api/reader.h")
    message(FATAL_ERROR "MESHLOAD_ARROW_ROOT=${MESHLOAD_ARROW_ROOT} holds no include/parquet/api/reader.h")
  endif()
  set(_meshload_arrow_dir "${MESHLOAD_ARROW_ROOT}")
  set(_meshload_arrow_from "MESHLOAD_ARROW_ROOT")
else()
  find_package(Parquet CONFIG QUIET)
  if(Parquet_FOUND AND TARGET Parquet::parquet_shared)
    get_target_property(_meshload_parquet_lib Parquet::parquet_shared LOCATION)
    get_filename_component(_libdir "${_meshload_parquet_lib}" DIRECTORY)
    get_filename_component(_meshload_arrow_dir "${_libdir}" DIRECTORY)
    set(_meshload_arrow_from "the Arrow C++ ${Parquet_VERSION} install")
  else()
    file(GLOB _meshload_wheel_reader "${MESHLOAD_SOURCE_ROOT}/.venv/lib/python3*/site-packages/pyarrow/include/parquet/api/reader.h")
    if(_meshload_wheel_reader)
      list(GET _meshload_wheel_reader 0 _meshload_wheel_reader)
      string(REGEX REPLACE "/include/parquet/api/reader.h$" "" _meshload_arrow_dir "${_meshload_wheel_reader}")
      set(_meshload_arrow_from "the pyarrow wheel in .venv")
    endif()
  endif()
endif()

if(NOT _meshload_arrow_dir)
  message(FATAL_ERROR "meshload needs Arrow C++ with Parquet (libarrow, libparquet and their headers) to read Parquet "
                      "and Arrow datasets: run scripts/install-deps.sh --build-only (the pinned pyarrow wheel into "
                      ".venv), or set MESHLOAD_ARROW_ROOT")
endif()
_meshload_arrow_lib(_meshload_libarrow "${_meshload_arrow_dir}" arrow)
_meshload_arrow_lib(_meshload_libparquet "${_meshload_arrow_dir}" parquet)
if(NOT _meshload_libarrow OR NOT _meshload_libparquet)
  message(FATAL_ERROR "Arrow C++ at ${_meshload_arrow_dir} (from ${_meshload_arrow_from}): libarrow or libparquet not found")
endif()
file(STRINGS "${_meshload_arrow_dir}/include/arrow/util/config.h" MESHLOAD_ARROW_VERSION REGEX "^#define ARROW_VERSION_STRING ")
string(REGEX REPLACE ".*\"(.*)\".*" "\\1" MESHLOAD_ARROW_VERSION "${MESHLOAD_ARROW_VERSION}")

add_library(meshload::arrow SHARED IMPORTED GLOBAL)
set_target_properties(meshload::arrow PROPERTIES IMPORTED_LOCATION "${_meshload_libarrow}"
                                                 INTERFACE_INCLUDE_DIRECTORIES "${_meshload_arrow_dir}/include")
# The headers are a third party's: their warnings are not ours (-Werror).
set_target_properties(meshload::arrow PROPERTIES INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${_meshload_arrow_dir}/include")
add_library(meshload::parquet SHARED IMPORTED GLOBAL)
set_target_properties(meshload::parquet PROPERTIES IMPORTED_LOCATION "${_meshload_libparquet}"
                                                   INTERFACE_LINK_LIBRARIES meshload::arrow)
# The pyarrow wheel's libparquet carries its own copy of OpenSSL's libcrypto
# and exports its symbols (EVP_*, X509_*, ...). Loaded ahead of the
# system's libcrypto, it would take the calls the HTTPS and S3 sources make
# through the system's OpenSSL (two OpenSSL builds mixed: a crash). Whatever
# links libparquet therefore names the system's libcrypto first, so that it
# comes first in the process's symbol lookup order (libparquet's own calls
# then go to the system's libcrypto too; meshload refuses encrypted Parquet,
# the only thing libparquet uses OpenSSL for).
if(NOT OPENSSL_CRYPTO_LIBRARY)
  message(FATAL_ERROR "MeshloadArrow.cmake needs find_package(OpenSSL) first")
endif()
set_target_properties(meshload::parquet PROPERTIES
  INTERFACE_LINK_OPTIONS "LINKER:--push-state,--no-as-needed;${OPENSSL_CRYPTO_LIBRARY};LINKER:--pop-state")
set(MESHLOAD_ARROW_LIBRARIES "${_meshload_libarrow};${_meshload_libparquet}")
message(STATUS "meshload: Arrow C++ ${MESHLOAD_ARROW_VERSION} with Parquet from ${_meshload_arrow_from} at ${_meshload_arrow_dir}")
