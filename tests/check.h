/* SPDX-License-Identifier: MIT */
/* A tiny test harness: CHECK prints the failing expression and values and counts failures;
 * each test file ends with TEST_END, which prints "N passed, N failed". */
#ifndef CGRAD_TEST_CHECK_H
#define CGRAD_TEST_CHECK_H
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int test_passed, test_failed;

/* A whole file, NUL-terminated, its length in *len when len is not NULL; NULL if unreadable. */
static inline char *test_slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    size_t got = s ? fread(s, 1, (size_t)n, f) : 0;
    fclose(f);
    if (s) s[got] = 0;
    if (len) *len = got;
    return s;
}

#define CHECK(cond, ...)                                                           \
    do {                                                                           \
        if (cond) test_passed++;                                                   \
        else {                                                                     \
            test_failed++;                                                         \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                          \
            fprintf(stderr, "\n");                                                 \
        }                                                                          \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                                  \
    CHECK(fabs((double)(a) - (double)(b)) <= (tol), "%s = %.9g, %s = %.9g, |diff| %.3g > %.3g", #a, \
          (double)(a), #b, (double)(b), fabs((double)(a) - (double)(b)), (double)(tol))

/* ctest's SKIP_RETURN_CODE (tests/CMakeLists.txt): a part of a test that cannot run on this machine
 * (no AVX-512, no avx512_bf16, no oneDNN) says why and returns this, so ctest shows it as skipped,
 * never as passed. Such parts are their own ctest entries: the binary run with the part's name. */
#define TEST_SKIPPED 77
static inline int test_skip(const char *test, const char *why) {
    printf("%s: skipped: %s\n", test, why);
    return TEST_SKIPPED;
}

/* The part a test binary was asked for (argv[1]), or "" for its main part. */
static inline const char *test_part(int argc, char **argv) { return argc > 1 ? argv[1] : ""; }

#define TEST_END()                                                    \
    do {                                                              \
        printf("%d passed, %d failed\n", test_passed, test_failed);   \
        return test_failed ? 1 : 0;                                   \
    } while (0)
#endif
