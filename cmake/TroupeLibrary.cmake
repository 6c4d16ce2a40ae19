# troupe_add_layer(<layer> SOURCES <file>... LINK <target>...)
#
# One library per top-level folder (DESIGN.md's layers): troupe_<layer>, known to users as
# troupe::<layer>, linking LINK publicly. Its headers are included as <troupe/<layer>/x.h>; those
# at the folder's root are public and installed, those in detail/ are the layer's own.
function(troupe_add_layer layer)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "SOURCES;LINK")
  set(target troupe_${layer})
  add_library(${target} ${arg_SOURCES})
  add_library(troupe::${layer} ALIAS ${target})
  set_target_properties(${target} PROPERTIES
    EXPORT_NAME ${layer}
    VERSION ${PROJECT_VERSION}
    SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${TROUPE_INCLUDE_DIR}> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_compile_features(${target} PUBLIC cxx_std_20)
  target_link_libraries(${target} PUBLIC ${arg_LINK} PRIVATE $<BUILD_INTERFACE:troupe_build_flags>)
  if(TROUPE_INSTALL)
    install(DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/
            DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/troupe/${layer}
            FILES_MATCHING PATTERN "*.h" PATTERN "detail" EXCLUDE)
  endif()
endfunction()
