/* SPDX-License-Identifier: MIT */
/* Widening half-precision values to float: fp16 through F16C's vcvtph2ps where the CPU has it
 * (detected at run time, so a portable build uses it too), through a portable loop otherwise. The
 * conversion is exact either way, so every path gives the same bits. */
#include <pthread.h>

#include "ops/half.h"

static void widen_f16_portable(float *d, const uint16_t *s, int64_t n) {
    for (int64_t i = 0; i < n; i++) d[i] = cgi_from_f16(s[i]);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_X86 1
/* F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports does not know "f16c" */
static bool cpu_has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1u);
}
__attribute__((target("avx,f16c"))) static void widen_f16_f16c(float *d, const uint16_t *s, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    widen_f16_portable(d + i, s + i, n - i);
}
__attribute__((target("avx512f"))) static void widen_f16_avx512(float *d, const uint16_t *s, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + i))));
    if (i < n) { /* the tail in one conversion too: the packs widen many short runs */
        uint16_t t[16] = {0};
        memcpy(t, s + i, (size_t)(n - i) * sizeof *t);
        _mm512_mask_storeu_ps(d + i, (__mmask16)((1u << (n - i)) - 1), _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)t)));
    }
}
#endif

/* path's function, or NULL when the CPU lacks it */
typedef void (*widen_fn)(float *, const uint16_t *, int64_t);
static widen_fn path_fn(int path) {
    if (path == 0) return widen_f16_portable;
#ifdef HAVE_X86
    __builtin_cpu_init();
    if (path == 1 && __builtin_cpu_supports("avx") && cpu_has_f16c()) return widen_f16_f16c;
    if (path == 2 && __builtin_cpu_supports("avx512f")) return widen_f16_avx512;
#endif
    return NULL;
}

static widen_fn best;
static void pick(void) {
    for (int p = 2; p >= 0 && !best; p--) best = path_fn(p);
}
static pthread_once_t pick_once = PTHREAD_ONCE_INIT;

void cgi_widen_f16(float *d, const uint16_t *s, int64_t n) {
    pthread_once(&pick_once, pick);
    best(d, s, n);
}

bool cgi_widen_f16_on(int path, float *d, const uint16_t *s, int64_t n) {
    const widen_fn f = path_fn(path);
    if (f) f(d, s, n);
    return f != NULL;
}

void cgi_widen_half(cg_real *d, const uint16_t *s, int64_t n, int el) {
    enum { PART = 1 << 16 };
#pragma omp parallel for schedule(static) if (n > CGI_PAR_MIN) num_threads(cgi_nthreads())
    for (int64_t at = 0; at < n; at += PART) {
        const int64_t k = n - at < PART ? n - at : PART;
#ifndef CGRAD_DOUBLE
        if (el == CGI_EL_F16) {
            cgi_widen_f16(d + at, s + at, k);
            continue;
        }
#endif
        for (int64_t i = 0; i < k; i++) d[at + i] = (cg_real)cgi_half_at(s, at + i, el);
    }
}

bool cgi_reads_half(const cg_graph *g, const cg_tensor *t, int k) {
    (void)g; /* the same readers in fp32 and bf16 graphs: bf16's products take an fp16 operand too */
    switch (t->op) {
    case CGI_OP_EMBEDDING: return k == 0; /* the gather widens the rows it copies */
    case CGI_OP_LINEAR:
    case CGI_OP_LORA_LINEAR:
    case CGI_OP_LINEAR_ACT:
    case CGI_OP_LINEAR_ADD:
    case CGI_OP_LINEAR_CROSS_ENTROPY: return k == 1 && cgi_half_products();
    default: return false;
    }
}
