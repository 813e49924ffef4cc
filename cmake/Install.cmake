# What `cmake --install` puts under the prefix, and the .deb CPack makes of it (`make package`):
#   bin/        kvtierd, kvtier, kvtier-fsck
#   lib/        libkvtier.so (C ABI + C++ front door), cmake/kvtier/ (find_package), pkgconfig/
#   include/    kvtier.h (C); kvtier/... (the C++ API headers, listed in the README)
#   lib/python3.X/dist-packages/kvtier   the Python package (Debian's interpreter searches there
#               under /usr and /usr/local)
include(CMakePackageConfigHelpers)

set(_cmake_dir lib/cmake/kvtier)
if(EXISTS /usr/lib/python3/dist-packages)
  set(_py_default lib/python${Python3_VERSION_MAJOR}.${Python3_VERSION_MINOR}/dist-packages)
else()
  set(_py_default lib/python${Python3_VERSION_MAJOR}.${Python3_VERSION_MINOR}/site-packages)
endif()
set(KVTIER_PYTHON_INSTALL_DIR ${_py_default} CACHE STRING "Where the kvtier Python package goes, relative to the prefix")

install(TARGETS kvtierd kvtier kvtier-fsck RUNTIME DESTINATION bin)
install(TARGETS kvtier_library EXPORT kvtierTargets LIBRARY DESTINATION lib)
install(FILES capi/kvtier.h DESTINATION include)
# The C++ API and exactly the headers it includes; everything else stays internal.
set(KVTIER_PUBLIC_HEADERS
  inprocess/embedded_cache.h inprocess/tensor_view.h cache/prefix_match.h
  serialize/kv_layout.h serialize/hybrid_layout.h serialize/dtype.h serialize/block_hash.h
  base/status.h)
foreach(h ${KVTIER_PUBLIC_HEADERS})
  get_filename_component(_dir ${h} DIRECTORY)
  install(FILES ${h} DESTINATION include/kvtier/${_dir})
endforeach()

install(EXPORT kvtierTargets NAMESPACE kvtier:: DESTINATION ${_cmake_dir})
configure_package_config_file(cmake/kvtierConfig.cmake.in ${CMAKE_BINARY_DIR}/kvtierConfig.cmake
  INSTALL_DESTINATION ${_cmake_dir})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/kvtierConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/kvtierConfig.cmake ${CMAKE_BINARY_DIR}/kvtierConfigVersion.cmake
  DESTINATION ${_cmake_dir})
configure_file(cmake/kvtier.pc.in ${CMAKE_BINARY_DIR}/kvtier.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/kvtier.pc DESTINATION lib/pkgconfig)

install(DIRECTORY ${KVTIER_PYTHON_BUILD_DIR}/kvtier DESTINATION ${KVTIER_PYTHON_INSTALL_DIR}
  PATTERN __pycache__ EXCLUDE)

# The systemd unit names the installed kvtierd, so it is written at install time, when the prefix
# (and the package's staging DESTDIR) are known.
install(CODE "configure_file(\"${PROJECT_SOURCE_DIR}/packaging/systemd/kvtierd.service.in\"
  \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/lib/systemd/system/kvtierd.service\" @ONLY)")
install(FILES README.md DESTINATION share/doc/kvtier)

# `make package`: one .deb. Its library dependencies come from dpkg-shlibdeps (the Debian packages
# of every shared library the binaries load); the rest are named here.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME kvtier)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Tiered (GPU, RAM, SSD) KV cache for LLM inference: kvtierd, libkvtier, import kvtier")
set(CPACK_PACKAGE_CONTACT "kvtier maintainers <kvtier@localhost>")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION misc)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS
  "python3 (>= ${Python3_VERSION_MAJOR}.${Python3_VERSION_MINOR}), python3 (<< ${Python3_VERSION_MAJOR}.${Python3_VERSION_MINOR}.999)")
# A Vulkan driver for --gpu-memory; nlohmann's headers for C++ users of the API headers.
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "mesa-vulkan-drivers | vulkan-icd, nlohmann-json3-dev")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "python3-torch, python3-numpy, redis-server")
include(CPack)
# Monitoring: the Grafana dashboard and the Prometheus alerting rules (docs/operations.md).
install(FILES packaging/grafana/kvtier-dashboard.json DESTINATION share/kvtier/grafana)
install(FILES packaging/prometheus/kvtier-rules.yml DESTINATION share/kvtier/prometheus)
