# troupe_add_schemas(<target> <file.capnp>...)
#
# Generates C++ for the given schemas at build time into the build tree (never committed) and
# builds them into a static library <target>. Generated headers are included by their path
# relative to the source root, e.g. "schemas/actor.capnp.h".
function(troupe_add_schemas target)
  set(CAPNPC_SRC_PREFIX ${PROJECT_SOURCE_DIR})
  set(CAPNPC_OUTPUT_DIR ${PROJECT_BINARY_DIR}/generated)
  set(CAPNPC_IMPORT_DIRS ${PROJECT_SOURCE_DIR})
  file(MAKE_DIRECTORY ${CAPNPC_OUTPUT_DIR})
  capnp_generate_cpp(srcs hdrs ${ARGN})
  add_library(${target} STATIC ${srcs} ${hdrs})
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/generated>
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>)
  target_link_libraries(${target} PUBLIC CapnProto::capnp-rpc CapnProto::capnp CapnProto::kj-async CapnProto::kj)
endfunction()
