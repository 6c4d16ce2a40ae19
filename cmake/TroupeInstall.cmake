# What `cmake --install` puts under a prefix, and the Debian package `cpack -G DEB` makes of it:
#   include/troupe/...            headers (<troupe/actor/actor_server.h>), the schemas and their
#                                 generated headers, version.h
#   lib/libtroupe_*.a (or .so)    one library per layer
#   lib/cmake/troupe/             troupeConfig.cmake: find_package(troupe 0.2 CONFIG) gives
#                                 troupe::troupe, troupe::actor, ... and troupe_add_schemas()
#   lib/pkgconfig/troupe.pc
#   bin/troupe, bin/troupe-registry
#   bin/troupe-make-certs         scripts/make_certs.sh: a CA and certificates for TLS (openssl)
include(CMakePackageConfigHelpers)

set(config_dir ${CMAKE_INSTALL_LIBDIR}/cmake/troupe)

install(TARGETS troupe_schemas troupe_base troupe_net troupe_observe troupe_actor troupe_resolver troupe_pool troupe_jobs troupe
        EXPORT troupeTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TROUPE_BUILD_TOOLS)
  install(TARGETS troupe-cli troupe-registry EXPORT troupeTargets
          RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
install(FILES ${TROUPE_INCLUDE_DIR}/troupe/version.h ${TROUPE_INCLUDE_DIR}/troupe/troupe.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/troupe)
install(PROGRAMS scripts/make_certs.sh DESTINATION ${CMAKE_INSTALL_BINDIR} RENAME troupe-make-certs)

install(EXPORT troupeTargets NAMESPACE troupe:: DESTINATION ${config_dir})
configure_package_config_file(cmake/troupeConfig.cmake.in
  ${PROJECT_BINARY_DIR}/troupeConfig.cmake
  INSTALL_DESTINATION ${config_dir}
  PATH_VARS CMAKE_INSTALL_INCLUDEDIR)
# 0.x: a new minor version may change the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/troupeConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/troupeConfig.cmake ${PROJECT_BINARY_DIR}/troupeConfigVersion.cmake
              cmake/TroupeSchemas.cmake
        DESTINATION ${config_dir})

# pkg-config: the prefix is found from the .pc file's own place, so the file stays right in the
# Debian package (whose prefix is /usr whatever this build was configured with).
file(RELATIVE_PATH pc_to_prefix /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
string(REGEX REPLACE "/$" "" pc_to_prefix "${pc_to_prefix}")
configure_file(cmake/troupe.pc.in ${PROJECT_BINARY_DIR}/troupe.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/troupe.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# cpack -G DEB: a package that installs the above under /usr. Depends: the Debian packages
# troupe's headers and libraries need to be used (Cap'n Proto with its schema compiler, libuv,
# OpenSSL, spdlog, pkg-config for libuv), openssl for troupe-make-certs, plus the run-time
# libraries of its programs (dpkg-shlibdeps).
set(CPACK_PACKAGE_NAME troupe)
set(CPACK_PACKAGE_VENDOR troupe)
set(CPACK_PACKAGE_CONTACT "troupe developers <troupe@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "C++ actor runtime and RPC framework on Cap'n Proto and libuv, for ML infrastructure")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS
    "libcapnp-dev (>= 0.9.2), capnproto (>= 0.9.2), libuv1-dev (>= 1.44), libssl-dev (>= 3), openssl, libspdlog-dev (>= 1:1.10), pkg-config")
if(TARGET troupe_python)
  # The Python module is built for one minor version of Debian's python3.
  math(EXPR next_minor "${TROUPE_PYTHON_MINOR} + 1")
  string(APPEND CPACK_DEBIAN_PACKAGE_DEPENDS
         ", python3 (>= 3.${TROUPE_PYTHON_MINOR}), python3 (<< 3.${next_minor})")
endif()
include(CPack)
