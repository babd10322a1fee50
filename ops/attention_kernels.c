/* SPDX-License-Identifier: MIT */
/* Attention's small products on AVX-512 straight from the head's rows (docs/design.md,
 * "Fused attention"). A head of 64 queries x 64 keys x 64 features is a few products of 64 x 64
 * x 64 whose operands sit in L1: packing each for BLIS's micro-kernel took a third of the time, and
 * its 12-row strips wasted 11% of the tiles at 64 rows. Here C = alpha A B + beta C is computed in
 * register tiles of up to 6 rows x 64 columns that broadcast A's elements (any strides: A may be a
 * transposed view) against B's rows (contiguous along C's columns), so only K^T (forward) and V^T
 * (backward) are transposed, once per head. The softmax of a block of kept probabilities between the
 * two forward products runs here too, in whole vectors (cgi_attn_softmax). Float builds on a CPU
 * with AVX-512 only; elsewhere the caller keeps the micro-kernel path and the generic softmax. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ops/attention_internal.h"

#if !defined(CGRAD_DOUBLE) && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#include "ops/exp16.h"
#define ATTN_DIRECT 1

enum { TR = 6, TV = 4 }; /* a tile: up to TR rows x TV vectors of 16 columns (24 accumulators) */

#define AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")))

/* One tile of `rows` x `nv` vectors (compile-time after inlining), the last vector masked by `last`;
 * depth [k0, k1). beta is 0 (C not read) or 1. The accumulators are named, not an array: GCC kept
 * an array of 24 vectors in registers but also stored it to the stack on every depth step. */
static inline __attribute__((always_inline)) AVX512 void store(float *cp, __m512 x, __m512 al, float beta, __mmask16 m) {
    x = _mm512_mul_ps(x, al);
    if (beta != 0) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(m, cp));
    _mm512_mask_storeu_ps(cp, m, x);
}
/* The tile's rows of C asked for before its depth loop: C is a head's output or gradient rows, far
 * apart in memory, and each tile's stores (beta 1: its loads) waited on them after the products.
 * bench_attention_paths 16 4 128 64 (views, probabilities kept), backward 3.66 -> 2.97 ms, forward
 * 1.91 -> 1.78 (a write prefetch gained the same; only with beta 1 it lost 8% in forward). */
#define PREFETCH_C(r) \
    if (rows > r) \
        for (int v_ = 0; v_ < nv; v_++) { \
            __builtin_prefetch(c + r * cs + 16 * v_, 0, 3); \
            if (ds) __builtin_prefetch(pp + r * ps + 16 * v_, 0, 3); /* read by store_ds */ \
        }
#define ACC(r) __m512 c##r##0 = z, c##r##1 = z, c##r##2 = z, c##r##3 = z;
#define FMA(r) \
    if (rows > r) { \
        const __m512 x = _mm512_set1_ps(ap[r * ars]); \
        c##r##0 = _mm512_fmadd_ps(x, b0, c##r##0); \
        if (nv > 1) c##r##1 = _mm512_fmadd_ps(x, b1, c##r##1); \
        if (nv > 2) c##r##2 = _mm512_fmadd_ps(x, b2, c##r##2); \
        if (nv > 3) c##r##3 = _mm512_fmadd_ps(x, b3, c##r##3); \
    }
/* With ds: C = P * (alpha A B - D), P's rows ps apart and D one value a row (beta 0): backward's
 * dS = P * (dP - rowsum(dO * O)) applied to the dP tile in registers, the same two roundings. */
static inline __attribute__((always_inline)) AVX512 void store_ds(float *cp, __m512 x, __m512 al, const float *pp,
                                                                   __m512 dv, __mmask16 m) {
    x = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, pp), _mm512_sub_ps(_mm512_mul_ps(x, al), dv));
    _mm512_mask_storeu_ps(cp, m, x);
}
#define STORE1(r, v, cv, m) \
    if (ds) store_ds(c + r * cs + 16 * v, cv, al, pp + r * ps + 16 * v, _mm512_set1_ps(dd[r]), m); \
    else store(c + r * cs + 16 * v, cv, al, beta, m);
#define STORE(r) \
    if (rows > r) { \
        STORE1(r, 0, c##r##0, nv == 1 ? last : full) \
        if (nv > 1) { STORE1(r, 1, c##r##1, nv == 2 ? last : full) } \
        if (nv > 2) { STORE1(r, 2, c##r##2, nv == 3 ? last : full) } \
        if (nv > 3) { STORE1(r, 3, c##r##3, last) } \
    }
static inline __attribute__((always_inline)) AVX512 void tile(const int rows, const int nv, __mmask16 last, int64_t k0,
                                                               int64_t k1, float alpha, const float *a, int64_t ars,
                                                               int64_t acs, const float *b, int64_t bs, float beta,
                                                               float *c, int64_t cs, const bool ds, const float *pp,
                                                               int64_t ps, const float *dd) {
    const __m512 z = _mm512_setzero_ps();
    const __mmask16 full = 0xFFFF;
    PREFETCH_C(0) PREFETCH_C(1) PREFETCH_C(2) PREFETCH_C(3) PREFETCH_C(4) PREFETCH_C(5)
    ACC(0) ACC(1) ACC(2) ACC(3) ACC(4) ACC(5)
    for (int64_t p = k0; p < k1; p++) {
        const float *bp = b + p * bs, *ap = a + p * acs;
        const __m512 b0 = _mm512_maskz_loadu_ps(nv == 1 ? last : full, bp),
                     b1 = nv > 1 ? _mm512_maskz_loadu_ps(nv == 2 ? last : full, bp + 16) : z,
                     b2 = nv > 2 ? _mm512_maskz_loadu_ps(nv == 3 ? last : full, bp + 32) : z,
                     b3 = nv > 3 ? _mm512_maskz_loadu_ps(last, bp + 48) : z;
        FMA(0) FMA(1) FMA(2) FMA(3) FMA(4) FMA(5)
    }
    const __m512 al = _mm512_set1_ps(alpha);
    STORE(0) STORE(1) STORE(2) STORE(3) STORE(4) STORE(5)
}

#define TILE(R, V) tile(R, V, last, k0, k1, alpha, a, ars, acs, b, bs, beta, c, cs, ds, pp, ps, dd)
#define TILES(R) \
    case R: \
        switch (nv) { \
        case 1: TILE(R, 1); break; \
        case 2: TILE(R, 2); break; \
        case 3: TILE(R, 3); break; \
        default: TILE(R, 4); break; \
        } \
        break;

static inline __attribute__((always_inline)) AVX512 void tile_any(int rows, int nv, __mmask16 last, int64_t k0, int64_t k1,
                                                                   float alpha, const float *a, int64_t ars, int64_t acs,
                                                                   const float *b, int64_t bs, float beta, float *c,
                                                                   int64_t cs, const bool ds, const float *pp, int64_t ps,
                                                                   const float *dd) {
    switch (rows) {
        TILES(1)
        TILES(2)
        TILES(3)
        TILES(4)
        TILES(5)
        default: TILES(6)
    }
}

/* mm and mm_ds (below): the depth loop and tiles of cgi_attn_mm, with ds as store_ds. */
static inline __attribute__((always_inline)) AVX512 void mm_any(int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                                                                int64_t ars, int64_t acs, const float *b, int64_t bs,
                                                                float beta, float *c, int64_t cs, int64_t n_diag,
                                                                int64_t k_diag, int64_t k_first, const bool ds,
                                                                const float *pp, int64_t ps, const float *dd) {
    for (int64_t i = 0; i < m; i += TR) {
        const int rows = (int)(m - i < TR ? m - i : TR);
        int64_t ncols = n; /* columns any row of the strip sees */
        if (n_diag != CGI_UKR_FULL && i + rows + n_diag < ncols) ncols = i + rows + n_diag;
        if (ncols <= 0) continue;
        int64_t k1 = k, k0 = 0;
        if (k_diag != CGI_UKR_FULL && i + rows + k_diag < k1) k1 = i + rows + k_diag;
        if (k_first != CGI_UKR_FULL && i + k_first > 0) k0 = i + k_first;
        if (k1 < k0) k1 = k0; /* rows that see nothing still get their tile written (alpha 0 + beta C) */
        for (int64_t j = 0; j < ncols; j += 16 * TV) {
            const int64_t w = ncols - j < 16 * TV ? ncols - j : 16 * TV;
            const int nv = (int)((w + 15) / 16), tail = (int)(w - 16 * (nv - 1));
            const __mmask16 last = (__mmask16)(tail == 16 ? 0xFFFF : (1u << tail) - 1);
            tile_any(rows, nv, last, k0, k1, alpha, a + i * ars, ars, acs, b + j, bs, beta, c + i * cs + j, cs, ds,
                     ds ? pp + i * ps + j : NULL, ps, ds ? dd + i : NULL);
        }
    }
}
static AVX512 void mm(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t ars, int64_t acs,
                      const float *b, int64_t bs, float beta, float *c, int64_t cs, int64_t n_diag, int64_t k_diag,
                      int64_t k_first) {
    mm_any(m, n, k, alpha, a, ars, acs, b, bs, beta, c, cs, n_diag, k_diag, k_first, false, NULL, 0, NULL);
}
static AVX512 void mm_ds(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t ars, int64_t acs,
                         const float *b, int64_t bs, float *c, int64_t cs, const float *pp, int64_t ps, const float *dd) {
    mm_any(m, n, k, alpha, a, ars, acs, b, bs, 0, c, cs, CGI_UKR_FULL, CGI_UKR_FULL, CGI_UKR_FULL, true, pp, ps, dd);
}

/* dst[c * ds + r] = src[r * ss + c] in 8 x 8 register transposes, the edges one element at a time. */
static AVX512 void transpose(int64_t rows, int64_t cols, const float *src, int64_t ss, float *dst, int64_t ds) {
    int64_t r = 0;
    for (; r + 8 <= rows; r += 8) {
        int64_t c = 0;
        for (; c + 8 <= cols; c += 8) {
            __m256 x[8], y[8];
            for (int i = 0; i < 8; i++) x[i] = _mm256_loadu_ps(src + (r + i) * ss + c);
            for (int i = 0; i < 8; i += 2)
                y[i] = _mm256_unpacklo_ps(x[i], x[i + 1]), y[i + 1] = _mm256_unpackhi_ps(x[i], x[i + 1]);
            x[0] = _mm256_shuffle_ps(y[0], y[2], 0x44), x[1] = _mm256_shuffle_ps(y[0], y[2], 0xEE);
            x[2] = _mm256_shuffle_ps(y[1], y[3], 0x44), x[3] = _mm256_shuffle_ps(y[1], y[3], 0xEE);
            x[4] = _mm256_shuffle_ps(y[4], y[6], 0x44), x[5] = _mm256_shuffle_ps(y[4], y[6], 0xEE);
            x[6] = _mm256_shuffle_ps(y[5], y[7], 0x44), x[7] = _mm256_shuffle_ps(y[5], y[7], 0xEE);
            for (int i = 0; i < 4; i++) { /* x[i] holds rows 0-3 of column ..., x[i + 4] rows 4-7 */
                _mm256_storeu_ps(dst + (c + i) * ds + r, _mm256_permute2f128_ps(x[i], x[i + 4], 0x20));
                _mm256_storeu_ps(dst + (c + i + 4) * ds + r, _mm256_permute2f128_ps(x[i], x[i + 4], 0x31));
            }
        }
        for (; c < cols; c++)
            for (int i = 0; i < 8; i++) dst[c * ds + r + i] = src[(r + i) * ss + c];
    }
    for (; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) dst[c * ds + r] = src[r * ss + c];
}

/* e^x on 16 lanes for any x <= 0 (a score less its row's maximum): cgi_exp16 on x clamped at -87, 0
 * below -103.97 and for -inf as cgi_exp gives, NaN kept */
static inline __attribute__((always_inline)) AVX512 __m512 exp16(__m512 x) {
    const __m512 y = cgi_exp16(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)));
    const __m512 z = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-103.97f), _CMP_NLT_UQ), y);
    return _mm512_mask_mov_ps(z, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

/* Lanes [0, n) of a 16-lane mask (n may be outside [0, 16]). */
static inline __mmask16 lanes_below(int64_t n) { return n <= 0 ? 0 : n >= 16 ? 0xFFFF : (__mmask16)((1u << n) - 1); }

/* cgi_attn_softmax on 16 lanes. A row's keys go in whole vectors through the max, the exponentials
 * and the scaling, hidden ones masked off; the generic path (mask, then the row reductions of
 * graph/internal.h, vectorised 8 wide with a 16-term serial sum) took longer than the head's two
 * products: encdec-base's forward heads (64 x 64 x 64, key padding) took 2.7 ms, now 1.75. */
static AVX512 bool softmax_rows(float *s, int64_t ss, int64_t nq, int64_t kend, bool causal, int64_t vis0,
                                const int32_t *keep, int64_t keep_s, float *lse) {
    __mmask16 kept[256 / 16]; /* the keys not padded, by vector */
    const int64_t nv = (kend + 15) / 16;
    for (int64_t v = 0; v < nv; v++) {
        kept[v] = lanes_below(kend - 16 * v);
        for (int l = 0; keep && l < 16 && 16 * v + l < kend; l++)
            if (keep[(16 * v + l) * keep_s] == 0) kept[v] &= (__mmask16)~(1u << l);
    }
    bool any = false;
    for (int64_t r = 0; r < nq; r++) {
        float *row = s + r * ss;
        const int64_t vis = causal ? vis0 + r : kend;
        /* a causal row's vectors past its own key hold only hidden keys: zeros, without the passes */
        const int64_t nvis = vis >= kend ? nv : vis <= 0 ? 0 : (vis + 15) / 16;
        __m512 mx = _mm512_set1_ps(-INFINITY);
        for (int64_t v = 0; v < nvis; v++) /* NaN scores are passed over, as cgi_row_max does */
            mx = _mm512_mask_max_ps(mx, kept[v] & lanes_below(vis - 16 * v), _mm512_loadu_ps(row + 16 * v), mx);
        const float m = _mm512_reduce_max_ps(mx);
        if (m == -INFINITY) { /* every key hidden: zeros, and no gradient */
            for (int64_t v = 0; v < nv; v++)
                _mm512_mask_storeu_ps(row + 16 * v, lanes_below(kend - 16 * v), _mm512_setzero_ps());
            lse[r] = INFINITY;
            continue;
        }
        any = true;
        const __m512 mv = _mm512_set1_ps(m);
        __m512 acc = _mm512_setzero_ps();
        for (int64_t v = 0; v < nvis; v++) {
            const __mmask16 k = kept[v] & lanes_below(vis - 16 * v);
            const __m512 e = _mm512_maskz_mov_ps(k, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, row + 16 * v), mv)));
            acc = _mm512_add_ps(acc, e);
            _mm512_mask_storeu_ps(row + 16 * v, lanes_below(kend - 16 * v), e);
        }
        const float l = _mm512_reduce_add_ps(acc);
        const __m512 inv = _mm512_set1_ps(1 / l);
        for (int64_t v = nvis; v < nv; v++)
            _mm512_mask_storeu_ps(row + 16 * v, lanes_below(kend - 16 * v), _mm512_setzero_ps());
        const int64_t nscaled = l == l ? nvis : nv; /* a NaN sum (a NaN score) makes every key NaN, hidden too */
        for (int64_t v = 0; v < nscaled; v++) {
            const __mmask16 k = lanes_below(kend - 16 * v);
            _mm512_mask_storeu_ps(row + 16 * v, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, row + 16 * v), inv));
        }
        lse[r] = m + logf(l);
    }
    return any;
}
#endif

static int direct_state; /* 0: not decided, 1: on, -1: off */
static pthread_once_t direct_once = PTHREAD_ONCE_INIT;
static void direct_decide(void) {
#ifdef ATTN_DIRECT
    const char *off = getenv("CGRAD_ATTN_UKR"); /* set: BLIS's micro-kernel path, for comparisons */
    if (!direct_state) direct_state = (cgi_cpu_features() & CGI_CPU_AVX512) && !(off && *off) ? 1 : -1;
#else
    direct_state = -1;
#endif
}

bool cgi_attn_direct(void) {
    pthread_once(&direct_once, direct_decide);
    return direct_state > 0;
}

void cgi_attn_direct_force(bool on) {
    pthread_once(&direct_once, direct_decide);
#ifdef ATTN_DIRECT
    direct_state = on && (cgi_cpu_features() & CGI_CPU_AVX512) ? 1 : -1;
#else
    (void)on;
#endif
}

void cgi_attn_mm(int64_t m, int64_t n, int64_t k, cg_real alpha, const cg_real *a, int64_t ars, int64_t acs,
                 const cg_real *b, int64_t bs, cg_real beta, cg_real *c, int64_t cs, int64_t n_diag, int64_t k_diag,
                 int64_t k_first) {
#ifdef ATTN_DIRECT
    mm(m, n, k, alpha, a, ars, acs, b, bs, beta, c, cs, n_diag, k_diag, k_first);
#else
    (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)ars, (void)acs, (void)b, (void)bs, (void)beta, (void)c,
        (void)cs, (void)n_diag, (void)k_diag, (void)k_first;
#endif
}

bool cgi_attn_softmax(cg_real *s, int64_t ss, int64_t nq, int64_t kend, bool causal, int64_t vis0, const int32_t *keep,
                      int64_t keep_s, cg_real *lse) {
#ifdef ATTN_DIRECT
    return softmax_rows(s, ss, nq, kend, causal, vis0, keep, keep_s, lse);
#else
    (void)s, (void)ss, (void)nq, (void)kend, (void)causal, (void)vis0, (void)keep, (void)keep_s, (void)lse;
    return false;
#endif
}

void cgi_attn_mm_panels(int64_t m, int64_t n, int64_t k, cg_real alpha, const cg_real *a, int64_t ars, int64_t acs,
                        const cg_real *b, cg_real beta, cg_real *c, int64_t cs, int64_t n_diag, int64_t k_diag,
                        int64_t k_first) {
    for (int64_t j = 0; j < n; j += CGI_ATTN_PANEL) /* a panel's columns count from j: its diagonal moves by j */
        cgi_attn_mm(m, n - j < CGI_ATTN_PANEL ? n - j : CGI_ATTN_PANEL, k, alpha, a, ars, acs, b + j * k,
                    CGI_ATTN_PANEL, beta, c + j, cs, n_diag == CGI_UKR_FULL ? CGI_UKR_FULL : n_diag - j, k_diag, k_first);
}

void cgi_attn_ds_panels(int64_t m, int64_t n, int64_t k, const cg_real *a, int64_t ars, const cg_real *b, cg_real *c,
                        int64_t cs, const cg_real *p, int64_t ps, const cg_real *d) {
#ifdef ATTN_DIRECT
    for (int64_t j = 0; j < n; j += CGI_ATTN_PANEL)
        mm_ds(m, n - j < CGI_ATTN_PANEL ? n - j : CGI_ATTN_PANEL, k, 1, a, ars, 1, b + j * k, CGI_ATTN_PANEL, c + j, cs,
              p + j, ps, d);
#else
    (void)m, (void)n, (void)k, (void)a, (void)ars, (void)b, (void)c, (void)cs, (void)p, (void)ps, (void)d;
#endif
}

int64_t cgi_attn_panels_reals(int64_t rows, int64_t cols) {
    return (rows + CGI_ATTN_PANEL - 1) / CGI_ATTN_PANEL * CGI_ATTN_PANEL * cols;
}

void cgi_attn_transpose_panels(int64_t rows, int64_t cols, const cg_real *src, int64_t ss, cg_real *dst) {
    for (int64_t r = 0; r < rows; r += CGI_ATTN_PANEL)
        cgi_attn_transpose(rows - r < CGI_ATTN_PANEL ? rows - r : CGI_ATTN_PANEL, cols, src + r * ss, ss, dst + r * cols,
                           CGI_ATTN_PANEL);
}

void cgi_attn_transpose(int64_t rows, int64_t cols, const cg_real *src, int64_t ss, cg_real *dst, int64_t ds) {
#ifdef ATTN_DIRECT
    transpose(rows, cols, src, ss, dst, ds);
#else
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) dst[c * ds + r] = src[r * ss + c];
#endif
}

/* rows x d of x (rows *rs apart) as a B operand of cgi_attn_mm, copied densely into dst when its rows
 * lie apart (head views of a fused q/k/v tensor): rows 6 kB apart share a few L1 sets. Done for the
 * head's V (forward) and K (backward), which every query block reads: encdec's full head on views
 * 5.5 -> 5.3 ms fwd + bwd. The same for a block's dO and Q (read by one product each) lost more to
 * the copy than it won (backward 3.2 -> 3.3 ms). */
const cg_real *cgi_attn_dense_rows(const cg_real *x, int64_t *rs, int64_t rows, int64_t d, cg_real *dst) {
    if (*rs == d) return x;
    for (int64_t r = 0; r < rows; r++) memcpy(dst + r * d, x + r * *rs, (size_t)d * sizeof *dst);
    *rs = d;
    return dst;
}
