# SPDX-License-Identifier: MIT
# Finds BLIS as Debian's libblis-dev ships it (no pkg-config file): blis.h and libblis itself,
# never whichever libblas.so.3 the system alternatives point to. Defines the target BLIS::BLIS.
# Installed with cgrad's CMake package, whose static libraries link BLIS.
find_path(BLIS_INCLUDE_DIR blis.h PATH_SUFFIXES blis x86_64-linux-gnu)
find_library(BLIS_LIBRARY NAMES blis)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(BLIS DEFAULT_MSG BLIS_LIBRARY BLIS_INCLUDE_DIR)
mark_as_advanced(BLIS_INCLUDE_DIR BLIS_LIBRARY)
if(BLIS_FOUND AND NOT TARGET BLIS::BLIS)
  add_library(BLIS::BLIS UNKNOWN IMPORTED)
  set_target_properties(BLIS::BLIS PROPERTIES IMPORTED_LOCATION "${BLIS_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${BLIS_INCLUDE_DIR}")
endif()
