/* SPDX-License-Identifier: MIT */
/* Half-precision elements (ops/half.c): IEEE binary16 read as float, and the widening loops the
 * products' packs and the parameter store use for bf16 and fp16 values read in place from a file.
 * Not installed. */
#ifndef CGRAD_HALF_H
#define CGRAD_HALF_H

#include <stdint.h>
#include <string.h>

#include "graph/internal.h"

/* fp16 (IEEE binary16) to float, exact: subnormals, infinities and zeros keep their value, a NaN
 * stays a NaN (made quiet, as vcvtph2ps does). The portable path; cgi_widen_f16 uses F16C. */
static inline float cgi_from_f16(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    uint32_t u;
    if (e == 0x1f) u = sign | 0x7f800000u | (m ? 0x400000u | (m << 13) : 0);
    else if (e) u = sign | ((e + 112u) << 23) | (m << 13);
    else {
        const float f = (float)m * 0x1p-24f; /* zero or a subnormal: m 2^-24, exact in float */
        memcpy(&u, &f, sizeof u);
        u |= sign;
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* d[i] = s[i] as float for fp16 s, on the widest conversion this CPU has (AVX-512F's
 * vcvtph2ps on 16 values, F16C's on 8, else cgi_from_f16), chosen once at run time. */
void cgi_widen_f16(float *d, const uint16_t *s, int64_t n);
/* cgi_widen_f16 on one path: 0 the portable loop, 1 F16C, 2 AVX-512F; false (nothing written)
 * when this CPU lacks it (tests hold the paths equal on every fp16 value). */
bool cgi_widen_f16_on(int path, float *d, const uint16_t *s, int64_t n);
/* d[i] = s[i] as cg_real for n elements of type el (CGI_EL_BF16 or CGI_EL_F16): the float value of
 * a half-precision parameter (threads over large n). */
void cgi_widen_half(cg_real *d, const uint16_t *s, int64_t n, int el);
/* Element i of half-precision s of type el, as float. */
static inline float cgi_half_at(const uint16_t *s, int64_t i, int el) {
    if (el == CGI_EL_F16) return cgi_from_f16(s[i]);
    const uint32_t u = (uint32_t)s[i] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#endif
