/* SPDX-License-Identifier: MIT */
/* e^x on 16 lanes for the AVX-512 kernels (GELU's passes in ops/act_passes.c, attention's softmax in
 * ops/attention_kernels.c): cgi_exp's polynomial and constants (graph/internal.h) in fused
 * multiply-adds. The scalar cgi_exp is compiled without contraction (ISO C11), so it rounds apart
 * from these lanes by an ulp on about 0.1% of inputs (tests/test_exp16.c checks the lanes against
 * the fused steps). Float builds on x86-64 only; callers are AVX-512 code. Not installed. */
#ifndef CGRAD_EXP16_H
#define CGRAD_EXP16_H

#if !defined(CGRAD_DOUBLE) && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#include "graph/internal.h"

/* For x already inside [-87, 88] (the caller clamps): 2^n times the polynomial in r = x - n ln 2. */
static inline __attribute__((always_inline, target("avx512f"))) __m512 cgi_exp16(__m512 x) {
    const __m512 fx = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(CGI_EXP_LOG2E), _mm512_set1_ps(0.5f)),
                                           _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const __m512 r =
        _mm512_fmadd_ps(fx, _mm512_set1_ps(CGI_EXP_LN2_LO), _mm512_fnmadd_ps(fx, _mm512_set1_ps(CGI_EXP_LN2_HI), x));
    __m512 y = _mm512_set1_ps(CGI_EXP_P0);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(CGI_EXP_P1));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(CGI_EXP_P2));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(CGI_EXP_P3));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(CGI_EXP_P4));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(CGI_EXP_P5));
    y = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(y, r), r, r), _mm512_set1_ps(1.0f));
    /* y 2^fx in one instruction, where building 2^n's bits and multiplying took four: both are one
     * rounding of the same product, equal for every float in [-87, 88] (checked exhaustively) */
    return _mm512_scalef_ps(y, fx);
}
#endif

#endif
