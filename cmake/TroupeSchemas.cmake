# troupe_add_schemas(<target> FILES <file.capnp>... [IMPORT_DIRS <dir>...])
#
# Compiles Cap'n Proto schemas to C++ at build time (the generated code goes to the build tree,
# never to the sources) and builds it into a library <target>: static, or shared with
# BUILD_SHARED_LIBS. <target> links troupe::schemas, so it brings Cap'n Proto with it.
#
# A schema's generated header is included by its path relative to the directory of the
# CMakeLists.txt that calls this: for FILES calculator.capnp, `#include "calculator.capnp.h"`.
# Schemas may import Cap'n Proto's own ("/capnp/c++.capnp") and troupe's
# ("/troupe/schemas/actor.capnp"); IMPORT_DIRS adds directories to search for other imports.
#
# Works alike in a project that found troupe with find_package(troupe) and in one that pulls it
# in with add_subdirectory(): the schema compiler's location is recorded when troupe is
# configured, so the caller needs no find_package(CapnProto) of its own.

include_guard(GLOBAL)

# Where the schema compiler is; recorded once for the whole configuration.
if(NOT CAPNP_EXECUTABLE AND TARGET CapnProto::capnp_tool)
  get_target_property(CAPNP_EXECUTABLE CapnProto::capnp_tool LOCATION)
endif()
if(NOT CAPNPC_CXX_EXECUTABLE AND TARGET CapnProto::capnpc_cpp)
  get_target_property(CAPNPC_CXX_EXECUTABLE CapnProto::capnpc_cpp LOCATION)
endif()
if(NOT CAPNP_EXECUTABLE OR NOT CAPNPC_CXX_EXECUTABLE OR NOT CAPNP_INCLUDE_DIRECTORY)
  message(FATAL_ERROR "troupe: Cap'n Proto's schema compiler was not found "
                      "(install Debian's capnproto and libcapnp-dev)")
endif()
set_property(GLOBAL PROPERTY TROUPE_CAPNP_EXECUTABLE "${CAPNP_EXECUTABLE}")
set_property(GLOBAL PROPERTY TROUPE_CAPNPC_CXX_EXECUTABLE "${CAPNPC_CXX_EXECUTABLE}")
set_property(GLOBAL PROPERTY TROUPE_CAPNP_INCLUDE_DIRECTORY "${CAPNP_INCLUDE_DIRECTORY}")

# _troupe_compile_schemas(<sources-var> <headers-var> SRC_PREFIX <dir> OUTPUT_DIR <dir>
#                         FILES <file>... [IMPORT_DIRS <dir>...])
#
# One custom command per schema; each output lands in OUTPUT_DIR at the schema's path relative
# to SRC_PREFIX. Imports are searched in SRC_PREFIX, troupe's schema root, Cap'n Proto's and
# IMPORT_DIRS.
function(_troupe_compile_schemas sources_var headers_var)
  cmake_parse_arguments(PARSE_ARGV 2 arg "" "SRC_PREFIX;OUTPUT_DIR" "FILES;IMPORT_DIRS")
  get_property(capnp GLOBAL PROPERTY TROUPE_CAPNP_EXECUTABLE)
  get_property(capnpc_cxx GLOBAL PROPERTY TROUPE_CAPNPC_CXX_EXECUTABLE)
  get_property(capnp_include GLOBAL PROPERTY TROUPE_CAPNP_INCLUDE_DIRECTORY)
  get_property(troupe_include GLOBAL PROPERTY TROUPE_SCHEMA_IMPORT_DIRECTORY)
  get_filename_component(prefix "${arg_SRC_PREFIX}" ABSOLUTE)

  set(search -I "${prefix}")
  foreach(dir IN LISTS troupe_include capnp_include arg_IMPORT_DIRS)
    get_filename_component(dir "${dir}" ABSOLUTE)
    list(APPEND search -I "${dir}")
  endforeach()

  set(schemas)
  foreach(file IN LISTS arg_FILES)
    get_filename_component(path "${file}" ABSOLUTE)
    if(NOT EXISTS "${path}")
      message(FATAL_ERROR "troupe_add_schemas: schema '${file}' does not exist")
    endif()
    list(APPEND schemas "${path}")
  endforeach()

  set(sources)
  set(headers)
  file(MAKE_DIRECTORY "${arg_OUTPUT_DIR}")
  foreach(path IN LISTS schemas)
    file(RELATIVE_PATH relative "${prefix}" "${path}")
    if(relative MATCHES "^\\.\\./")
      message(FATAL_ERROR "troupe_add_schemas: '${path}' lies outside '${prefix}'")
    endif()
    set(base "${arg_OUTPUT_DIR}/${relative}")
    # Every schema of the call is a dependency: one may import another.
    add_custom_command(
      OUTPUT "${base}.c++" "${base}.h"
      COMMAND "${capnp}" compile "--output=${capnpc_cxx}:${arg_OUTPUT_DIR}"
              "--src-prefix=${prefix}" ${search} "${path}"
      DEPENDS ${schemas}
      COMMENT "Compiling Cap'n Proto schema ${relative}"
      VERBATIM)
    list(APPEND sources "${base}.c++")
    list(APPEND headers "${base}.h")
  endforeach()
  set(${sources_var} ${sources} PARENT_SCOPE)
  set(${headers_var} ${headers} PARENT_SCOPE)
endfunction()

function(troupe_add_schemas target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "FILES;IMPORT_DIRS")
  if(NOT arg_FILES)
    message(FATAL_ERROR "troupe_add_schemas(${target} FILES <file.capnp>...): no FILES given")
  endif()
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "troupe_add_schemas: unexpected arguments ${arg_UNPARSED_ARGUMENTS}")
  endif()
  set(out "${CMAKE_CURRENT_BINARY_DIR}/${target}.capnp")
  _troupe_compile_schemas(sources headers
    SRC_PREFIX "${CMAKE_CURRENT_SOURCE_DIR}" OUTPUT_DIR "${out}"
    FILES ${arg_FILES} IMPORT_DIRS ${arg_IMPORT_DIRS})
  add_library(${target} ${sources} ${headers})
  target_include_directories(${target} PUBLIC "$<BUILD_INTERFACE:${out}>")
  target_link_libraries(${target} PUBLIC troupe::schemas)
endfunction()
