# Finds BLIS as Debian's libblis-dev ships it (no pkg-config file): blis.h and libblis itself,
# never whichever libblas.so.3 the system alternatives point to.
find_path(BLIS_INCLUDE_DIR blis.h PATH_SUFFIXES blis x86_64-linux-gnu)
find_library(BLIS_LIBRARY NAMES blis)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(BLIS DEFAULT_MSG BLIS_LIBRARY BLIS_INCLUDE_DIR)
mark_as_advanced(BLIS_INCLUDE_DIR BLIS_LIBRARY)
