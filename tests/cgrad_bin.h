/* SPDX-License-Identifier: MIT */
/* Where the tests that drive the cgrad command find it: $CGRAD_BIN, else ../cgrad beside the test
 * program (the build tree's layout). */
#ifndef CGRAD_TEST_CGRAD_BIN_H
#define CGRAD_TEST_CGRAD_BIN_H
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The cgrad binary's path into bin[n]; false (message naming test printed) if it is not executable. */
static inline bool test_find_cgrad(char *bin, size_t n, const char *test) {
    const char *env = getenv("CGRAD_BIN");
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (env) snprintf(bin, n, "%s", env);
    else if (len > 0) {
        self[len] = 0;
        *strrchr(self, '/') = 0;
        snprintf(bin, n, "%s/../cgrad", self);
    }
    if (access(bin, X_OK)) {
        fprintf(stderr, "%s: no cgrad binary at %s (build the cgrad_cli target or set CGRAD_BIN)\n", test, bin);
        return false;
    }
    return true;
}
#endif
