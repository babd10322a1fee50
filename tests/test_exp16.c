/* SPDX-License-Identifier: MIT */
/* cgi_exp16 (ops/exp16.h: GELU's 16-lane passes, attention's softmax) bit for bit against its
 * Cephes steps written out in scalar fused multiply-adds (fmaf, floorf, ldexpf: each one correctly
 * rounded operation), over every 61st float of [-87, 88], the range its callers clamp to, and the
 * range's ends: a change to how the kernel computes must not change a bit of GELU or softmax.
 * Skipped (77) where the build or the CPU has no AVX-512. */
#include "graph/internal.h"
#include "check.h"

#if defined(__AVX512F__) && !defined(CGRAD_DOUBLE)
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ops/exp16.h"

/* e^x as cgi_exp16 computes it, one lane */
static float exp_steps(float x) {
    const float fx = floorf(fmaf(x, CGI_EXP_LOG2E, 0.5f));
    const float r = fmaf(fx, CGI_EXP_LN2_LO, fmaf(-fx, CGI_EXP_LN2_HI, x));
    float y = CGI_EXP_P0;
    y = fmaf(y, r, CGI_EXP_P1);
    y = fmaf(y, r, CGI_EXP_P2);
    y = fmaf(y, r, CGI_EXP_P3);
    y = fmaf(y, r, CGI_EXP_P4);
    y = fmaf(y, r, CGI_EXP_P5);
    y = fmaf(y * r, r, r) + 1.0f;
    return ldexpf(y, (int)fx); /* exact: e^x >= e^-87 is a normal float */
}

/* x as float from its bits */
static float from_bits(uint32_t b) {
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}

/* The floats whose bits run from lo to hi (one sign) every `step`, and hi itself: how many of their
 * exponentials differ (the first few printed); *count: how many were compared. */
static int64_t check_run(uint32_t lo, uint32_t hi, uint32_t step, int64_t *count) {
    int64_t bad = 0;
    float xs[16], v[16];
    int n = 0;
    for (uint64_t b = lo;; b += step) {
        const bool last = b >= hi;
        xs[n++] = from_bits(last ? hi : (uint32_t)b);
        if (n == 16 || last) {
            for (int l = n; l < 16; l++) xs[l] = 0;
            _mm512_storeu_ps(v, cgi_exp16(_mm512_loadu_ps(xs)));
            for (int l = 0; l < n; l++) {
                const float s = exp_steps(xs[l]);
                if (!memcmp(&s, &v[l], sizeof s)) continue;
                if (bad++ < 5)
                    fprintf(stderr, "e^%.9g: 16 lanes %.9g, the steps %.9g\n", (double)xs[l], (double)v[l], (double)s);
            }
            *count += n;
            n = 0;
        }
        if (last) break;
    }
    return bad;
}

int main(void) {
    if (!__builtin_cpu_supports("avx512f")) {
        printf("skipped: no AVX-512 on this CPU\n");
        return 77;
    }
    const uint32_t pos = 0x42b00000u, neg = 0xc2ae0000u; /* 88.0f and -87.0f */
    CHECK(from_bits(pos) == 88.0f && from_bits(neg) == -87.0f, "range ends");
    int64_t count = 0;
    const int64_t bad = check_run(0, pos, 61, &count) + check_run(0x80000000u, neg, 61, &count); /* +0 to 88, -0 to -87 */
    CHECK(bad == 0 && count > 30000000, "%lld of %lld exponentials differ", (long long)bad, (long long)count);
    TEST_END();
}
#else
int main(void) {
    printf("skipped: no AVX-512 kernels in this build\n");
    return 77;
}
#endif
