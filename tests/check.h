/* A tiny test harness: CHECK prints the failing expression and values and counts failures;
 * each test file ends with TEST_END, which prints "N passed, N failed". */
#ifndef CGRAD_TEST_CHECK_H
#define CGRAD_TEST_CHECK_H
#include <math.h>
#include <stdio.h>

static int test_passed, test_failed;

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

#define TEST_END()                                                    \
    do {                                                              \
        printf("%d passed, %d failed\n", test_passed, test_failed);   \
        return test_failed ? 1 : 0;                                   \
    } while (0)
#endif
