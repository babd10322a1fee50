# SPDX-License-Identifier: MIT
# Finds cJSON (Debian libcjson-dev) and defines the target cJSON::cJSON. Debian's own
# cJSONConfig.cmake defines a plain `cjson` target with no include directory, so cgrad and its
# installed CMake package use this module instead.
find_path(CJSON_INCLUDE_DIR cjson/cJSON.h)
find_library(CJSON_LIBRARY NAMES cjson)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(cJSON
  REQUIRED_VARS CJSON_LIBRARY CJSON_INCLUDE_DIR
  FAIL_MESSAGE "cJSON not found: run ./setup.sh (Debian libcjson-dev)")
mark_as_advanced(CJSON_INCLUDE_DIR CJSON_LIBRARY)
if(cJSON_FOUND AND NOT TARGET cJSON::cJSON)
  add_library(cJSON::cJSON UNKNOWN IMPORTED)
  set_target_properties(cJSON::cJSON PROPERTIES IMPORTED_LOCATION "${CJSON_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${CJSON_INCLUDE_DIR}")
endif()
