/* SPDX-License-Identifier: MIT */
/* What the bf16 tests (test_bf16*.c) share: references in double and the bounds they are held to.
 *
 * The bound: rounding a float to bf16 (8 significant bits, round to nearest even) has relative
 * error at most u = 2^-8, so a product of two rounded operands is off by at most (2u + u^2)|ab|.
 * Accumulating k such products (plus the bias) in float adds at most (k+1) 2^-24 sum|ab| in any
 * order. Per element, |c - c_exact| <= (2u + u^2 + (k+1) 2^-24 (1 + u)^2) sum_p |a_p||b_p| + |bias|
 * terms; against the exact product of the already-rounded operands only the float part remains. */
#ifndef CGRAD_BF16_CHECK_H
#define CGRAD_BF16_CHECK_H
#include <stdint.h>
#include <stdlib.h>

#include "../cgrad.h"
#include "check.h"

static const double U = 1.0 / 256, U32 = 1.0 / 16777216;

static inline float bf(float f) { /* round to nearest even, as the hardware does */
    uint32_t x;
    memcpy(&x, &f, 4);
    x = (x + 0x7fffu + ((x >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &x, 4);
    return f;
}

static inline void fill(float *v, int64_t n, cg_rng *r, double scale) {
    for (int64_t i = 0; i < n; i++) v[i] = (float)(scale * cg_rng_normal(r));
}

/* c[m,n] = a[m,k] b[k,n] (strides given) in double, with sum |a||b| into mag; rounded operands if round. */
static inline void ref_gemm(int64_t m, int64_t n, int64_t k, const float *a, int64_t rsa, int64_t csa, const float *b, int64_t rsb,
                            int64_t csb, bool round, double *c, double *mag) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0, g = 0;
            for (int64_t p = 0; p < k; p++) {
                double x = round ? bf(a[i * rsa + p * csa]) : a[i * rsa + p * csa];
                double y = round ? bf(b[p * rsb + j * csb]) : b[p * rsb + j * csb];
                s += x * y, g += fabs(x * y);
            }
            c[i * n + j] = s, mag[i * n + j] = g;
        }
}

/* got (plus `add`, a float term added exactly in double, may be NULL) against both references:
 * within the float bound of the rounded operands' product, within the full bound of the exact one.
 * Returns how many elements differ from fp32 (the products must really have been rounded). */
static inline int check_product(const char *what, int64_t m, int64_t n, int64_t k, const float *a, int64_t rsa, int64_t csa,
                                const float *b, int64_t rsb, int64_t csb, const float *add, const float *got, const float *fp32) {
    double *c = malloc((size_t)(m * n) * sizeof *c), *mag = malloc((size_t)(m * n) * sizeof *mag);
    double *c0 = malloc((size_t)(m * n) * sizeof *c0), *mag0 = malloc((size_t)(m * n) * sizeof *mag0);
    ref_gemm(m, n, k, a, rsa, csa, b, rsb, csb, true, c, mag);
    ref_gemm(m, n, k, a, rsa, csa, b, rsb, csb, false, c0, mag0);
    double worst_r = 0, worst_x = 0;
    int differ = 0;
    for (int64_t i = 0; i < m * n; i++) {
        const double extra = add ? fabs(add[i]) : 0, z = add ? add[i] : 0;
        const double tol_r = (double)(k + 1) * U32 * (mag[i] + extra) + 1e-30;
        const double tol_x = (2 * U + U * U + (double)(k + 1) * U32 * (1 + U) * (1 + U)) * mag0[i] +
                             (double)(k + 1) * U32 * extra + 1e-30;
        const double er = fabs(got[i] - (c[i] + z)) / tol_r, ex = fabs(got[i] - (c0[i] + z)) / tol_x;
        worst_r = er > worst_r ? er : worst_r;
        worst_x = ex > worst_x ? ex : worst_x;
        differ += got[i] != fp32[i];
    }
    CHECK(worst_r <= 1, "%s: against the rounded operands' exact product, error %.3g of the float bound", what, worst_r);
    CHECK(worst_x <= 1, "%s: against the exact product, error %.3g of the bf16 bound", what, worst_x);
    free(c), free(mag), free(c0), free(mag0);
    return differ;
}


/* |got - want| <= bound elementwise: counts the elements outside into *bad, those that differ at all into *differ. */
static inline void within(const float *got, const float *want, const double *bound, int64_t n, int *bad, int *differ,
                          double *worst) {
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - want[i]);
        *bad += !(d <= bound[i]), *differ += d != 0;
        if (bound[i] > 0 && d / bound[i] > *worst) *worst = d / bound[i];
    }
}

#endif
