/* SPDX-License-Identifier: MIT */
/* The product engine's packs and BLIS's micro-kernel on operands cgrad packs itself (cgi_ukr):
 * the register-transposing packs that replace BLIS's element-by-element ones, panels packed across
 * rows, and the loops over a packed block's tiles. ops/gemm.c drives them. */
#include <blis.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "graph/internal.h"
#include "ops/gemm_internal.h"

/* ---- a transposing pack for BLIS's 12-wide panels ---- */

/* Asks for the line at p + by reals in L1 (a hint: it never faults, so it may point past the operand) */
static inline void prefetch_at(const cg_real *p, int64_t by) {
    __builtin_prefetch((const void *)((uintptr_t)p + (uintptr_t)(by * (int64_t)sizeof(cg_real))), 0, 3);
}

/* With skx's column-preferring 32 x 12 micro-kernel and C stored by rows, BLIS packs A (rows of A,
 * each contiguous along k) into 12-wide panels k deep: a transpose, which BLIS's reference kernel
 * does one element at a time. It took 13% of a gpt-tiny training step, 1 thread. This kernel
 * transposes 4 x 8 blocks in registers; any other case (other strides, a partial panel) goes to
 * BLIS's own. It copies (times kappa, as BLIS), so products stay bit-identical. */
#if !defined(CGRAD_DOUBLE) && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CGI_PACK12 1
enum { PW = 12 };
static spackm_cxk_ker_ft blis_pack12;
static bool fast_transpose; /* transpose_rows may run (AVX2) */

/* p[h * ldp + 4g + i] = kappa * a[(4g + i) * inca + h] for i < 4 and depths h..h+7: one 4 x 8
 * register transpose; the line of each of the next panel's rows is asked for as this one's is read
 * (once a line: 16 depths). */
__attribute__((target("avx2"))) static inline void transpose_4x8(const float *a, inc_t inca, dim_t g, dim_t h,
                                                                 int64_t next, bool scaled, __m256 kv, float *p,
                                                                 inc_t ldp) {
    const float *r = a + 4 * g * inca + h;
    if (!(h & 15))
        for (int q = 0; q < 4; q++) prefetch_at(r, next + q * inca);
    __m256 r0 = _mm256_loadu_ps(r), r1 = _mm256_loadu_ps(r + inca), r2 = _mm256_loadu_ps(r + 2 * inca),
           r3 = _mm256_loadu_ps(r + 3 * inca);
    if (scaled) {
        r0 = _mm256_mul_ps(r0, kv), r1 = _mm256_mul_ps(r1, kv);
        r2 = _mm256_mul_ps(r2, kv), r3 = _mm256_mul_ps(r3, kv);
    }
    const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3),
                 t3 = _mm256_unpackhi_ps(r2, r3);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
                 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    float *d = p + h * ldp + 4 * g;
    _mm_storeu_ps(d, _mm256_castps256_ps128(u0));
    _mm_storeu_ps(d + ldp, _mm256_castps256_ps128(u1));
    _mm_storeu_ps(d + 2 * ldp, _mm256_castps256_ps128(u2));
    _mm_storeu_ps(d + 3 * ldp, _mm256_castps256_ps128(u3));
    _mm_storeu_ps(d + 4 * ldp, _mm256_extractf128_ps(u0, 1));
    _mm_storeu_ps(d + 5 * ldp, _mm256_extractf128_ps(u1, 1));
    _mm_storeu_ps(d + 6 * ldp, _mm256_extractf128_ps(u2, 1));
    _mm_storeu_ps(d + 7 * ldp, _mm256_extractf128_ps(u3, 1));
}

/* p[c * ldp + i] = kappa * a[i * inca + c] for rows i < rows (a multiple of 4) and depths c below
 * n rounded down to 8, in 4 x 8 register transposes; returns the depth where it stopped. The rows
 * are each a stream of their own, more than the hardware prefetcher follows well: each line of
 * the next panel's rows (rows further on) is asked for as the same line of this panel's is read.
 * It halved the pack of a gpt-tiny linear's input (4096 x 256 from rows: 455 -> 290 us) and took
 * 4-8% off the products that pack so (bench/bench_pack). Each group of 4 rows takes a whole line
 * (16 depths) before the next group: 8 depths at a time across the groups left half of each line
 * to be read again after 11 other rows' lines, and rows a multiple of 4 kB apart (a depth of 1024)
 * share one L1 set, which loses them in between: on an Emerald Rapids Xeon, 4096 rows of depth
 * 1024 packed at 0.30-0.31 ns an element against 0.32-0.35 (depth 256: the same, 0.20-0.27),
 * panels into one panel's place as the blocked driver packs them. */
__attribute__((target("avx2"))) static dim_t transpose_rows(const float *a, inc_t inca, dim_t n, dim_t rows,
                                                            float kappa, float *p, inc_t ldp) {
    const bool scaled = kappa != 1;
    const __m256 kv = _mm256_set1_ps(kappa);
    const int64_t next = rows * inca;
    dim_t c = 0;
    for (; c + 16 <= n; c += 16)
        for (dim_t g = 0; g < rows / 4; g++) {
            transpose_4x8(a, inca, g, c, next, scaled, kv, p, ldp);
            transpose_4x8(a, inca, g, c + 8, next, scaled, kv, p, ldp);
        }
    if (c + 8 <= n) {
        for (dim_t g = 0; g < rows / 4; g++) transpose_4x8(a, inca, g, c, next, scaled, kv, p, ldp);
        c += 8;
    }
    return c;
}

__attribute__((target("avx2"))) static void pack12_rows(conj_t conja, pack_t schema, dim_t cdim, dim_t n, dim_t n_max,
                                                         float *restrict kappa, float *restrict a, inc_t inca,
                                                         inc_t lda, float *restrict p, inc_t ldp, cntx_t *restrict cntx) {
    if (cdim != PW || (lda != 1 && inca != 1) || ldp < PW) {
        blis_pack12(conja, schema, cdim, n, n_max, kappa, a, inca, lda, p, ldp, cntx);
        return;
    }
    const float k = *kappa;
    const bool scaled = k != 1;
    const __m256 kv = _mm256_set1_ps(k);
    const __m128 kq = _mm_set1_ps(k);
    dim_t c = 0;
    if (inca == 1) /* panel rows contiguous: 12 floats per depth, copied as they are */
        for (; c < n; c++) {
            const float *r = a + c * lda;
            __m256 lo = _mm256_loadu_ps(r);
            __m128 hi = _mm_loadu_ps(r + 8);
            if (scaled) lo = _mm256_mul_ps(lo, kv), hi = _mm_mul_ps(hi, kq);
            _mm256_storeu_ps(p + c * ldp, lo);
            _mm_storeu_ps(p + c * ldp + 8, hi);
        }
    if (c < n) c = transpose_rows(a, inca, n, PW, k, p, ldp);
    for (; c < n; c++)
        for (int i = 0; i < PW; i++) p[c * ldp + i] = scaled ? k * a[i * inca + c] : a[i * inca + c];
    for (c = n; c < n_max; c++) /* depth padding, as BLIS's kernel */
        for (int i = 0; i < PW; i++) p[c * ldp + i] = 0;
}

/* Puts pack12_rows in BLIS's context in place of its 12-wide float kernel, where the CPU has AVX2. */
static void install_pack12(void) {
    cntx_t *cx = bli_gks_query_cntx();
    blis_pack12 = (spackm_cxk_ker_ft)bli_cntx_get_packm_ker_dt(BLIS_FLOAT, (l1mkr_t)PW, cx);
    const char *off = getenv("CGRAD_BLIS_PACK"); /* set: BLIS's kernel and plain loops, for comparisons */
    fast_transpose = (cgi_cpu_features() & CGI_CPU_AVX2_FMA) && !(off && *off);
    if (blis_pack12 && fast_transpose) bli_cntx_set_packm_ker_dt((void_fp)pack12_rows, BLIS_FLOAT, (l1mkr_t)PW, cx);
}
#endif

static pthread_once_t packs_once = PTHREAD_ONCE_INIT;

/* BLIS with cgrad's kernel set and packing kernels in place, before any product. */
void cgi_gemm_blis_ready(void) {
    cgi_blis_init();
#ifdef CGI_PACK12
    pthread_once(&packs_once, install_pack12);
#else
    (void)packs_once;
#endif
}

/* ---- BLIS's micro-kernel on caller-packed operands ---- */

#ifdef CGRAD_DOUBLE
#define UKR_DT BLIS_DOUBLE
typedef dgemm_ukr_ft ukr_fn;
typedef dpackm_cxk_ker_ft pack_fn;
#else
#define UKR_DT BLIS_FLOAT
typedef sgemm_ukr_ft ukr_fn;
typedef spackm_cxk_ker_ft pack_fn;
#endif

/* BLIS's packing kernel for panels w wide: 2-3x faster than the loops below on a transposing
 * pack (6 x 256 from rows: 312 against 681 ns on Zen 3). */
static void *pack_kernel(int64_t w, cntx_t *cx) {
    return w >= 1 && w <= 31 ? (void *)bli_cntx_get_packm_ker_dt(UKR_DT, (l1mkr_t)w, cx) : NULL;
}

/* The kernel takes any C strides but writes its preferred ones about twice as fast: skx's 32 x 12
 * float kernel stores C by columns, and on row-major C (every caller's) it ran at 99 against
 * 206 GFLOP/s (C [128, 256], depth 64, in cache). With such a kernel cgrad computes C^T = B^T A^T:
 * A is packed in panels of the kernel's NR and B in panels of its MR, and the kernel writes
 * C's rows as its columns. */
void cgi_ukr_init(cgi_ukr *u) {
    cgi_gemm_blis_ready();
    cntx_t *cx = bli_gks_query_cntx();
    u->cntx = cx;
    u->kernel = (void *)bli_cntx_get_l3_nat_ukr_dt(UKR_DT, BLIS_GEMM_UKR, cx);
    const int64_t mr = bli_cntx_get_blksz_def_dt(UKR_DT, BLIS_MR, cx), nr = bli_cntx_get_blksz_def_dt(UKR_DT, BLIS_NR, cx),
                  pmr = bli_cntx_get_blksz_max_dt(UKR_DT, BLIS_MR, cx), pnr = bli_cntx_get_blksz_max_dt(UKR_DT, BLIS_NR, cx);
    u->swap = bli_cntx_l3_nat_ukr_prefers_cols_dt(UKR_DT, BLIS_GEMM_UKR, cx);
    u->mr = u->swap ? nr : mr, u->pmr = u->swap ? pnr : pmr;
    u->nr = u->swap ? mr : nr, u->pnr = u->swap ? pmr : pnr;
    u->pack_a = pack_kernel(u->pmr, cx);
    u->pack_b = pack_kernel(u->pnr, cx);
}

/* The kernels load the next depth's operands while they multiply this one's, so they read past a
 * packed operand's last panel: skx's 32 x 12 float kernel reads one depth (128 bytes) beyond it,
 * and a pack whose end met an unmapped page faulted. BLIS's own packs come from pools with room to
 * spare; each of ours gets UKR_SLACK depths of the widest panel after its end. */
enum { UKR_SLACK = 4 };
static size_t slack(const cgi_ukr *u) { return (size_t)(UKR_SLACK * (u->pmr > u->pnr ? u->pmr : u->pnr)); }
size_t cgi_ukr_packed_a(const cgi_ukr *u, int64_t m, int64_t k) {
    return (size_t)((m + u->mr - 1) / u->mr * u->pmr * k) + slack(u);
}
size_t cgi_ukr_packed_b(const cgi_ukr *u, int64_t k, int64_t n) {
    return (size_t)((n + u->nr - 1) / u->nr * u->pnr * k) + slack(u);
}

/* One panel: dst[p * w + i] = src[i * si + p * sp] for i < rows, zero for rows <= i < w. The loop
 * runs along whichever source stride is 1, so the reads are contiguous. */
void cgi_pack_panel(int64_t rows, int64_t w, int64_t k, const cg_real *src, int64_t si, int64_t sp, cg_real *dst) {
    if (sp == 1) {
        int64_t p0 = 0; /* depths done by register transposes */
#ifdef CGI_PACK12
        if (fast_transpose && rows % 4 == 0) p0 = transpose_rows(src, si, k, rows, 1, dst, w);
#endif
        for (int64_t i = 0; i < rows; i++)
            for (int64_t p = p0; p < k; p++) dst[p * w + i] = src[i * si + p];
        for (int64_t p = 0; p < k; p++)
            for (int64_t i = rows; i < w; i++) dst[p * w + i] = 0;
        return;
    }
    for (int64_t p = 0; p < k; p++) {
        cg_real *d = dst + p * w;
        const cg_real *s = src + p * sp;
        for (int64_t i = 0; i < rows; i++) d[i] = s[i * si];
        for (int64_t i = rows; i < w; i++) d[i] = 0;
    }
}

/* Panels of width w = t when the source's panel rows are contiguous (si 1): a copy of w reals per
 * depth. Panel by panel, every depth starts a new source line (rows are a matrix's width apart) and
 * a 12-wide panel reads 48 bytes of each 64; here DB depths go across all the panels before the
 * next DB, so the lines a panel leaves half read are still in L1 for the next one. The last panel
 * may be partial: its missing rows are zero. DB rows are DB streams: where DB rows of the block fit
 * in half of L1, the next DB rows' lines are asked for as these are read (a linear's dW with 256
 * outputs, bench/bench_pack: A 310 -> 185 us, B 738 -> 630 us); a wider block's would be gone
 * again before their turn (1024 wide: no gain, 2% slower). */
enum { DB = 16, PREFETCH_SPAN = 32768 };
static void pack_across(int64_t w, int64_t count, int64_t k, const cg_real *src, int64_t sp, cg_real *dst) {
    const int64_t next = DB * count * (int64_t)sizeof(cg_real) <= PREFETCH_SPAN ? DB * sp : 0;
    for (int64_t p0 = 0; p0 < k; p0 += DB) {
        const int64_t p1 = k - p0 < DB ? k : p0 + DB;
        for (int64_t i = 0; i < count; i += w) {
            const int64_t rows = count - i < w ? count - i : w;
            cg_real *d = dst + i * k;
            const cg_real *sr = src + i;
            if (rows == 32 && w == 32) /* the tile widths here, as constants: the copies inline */
                for (int64_t p = p0; p < p1; p++) {
                    if (next) prefetch_at(sr + p * sp, next), prefetch_at(sr + p * sp, next + 31);
                    memcpy(d + p * 32, sr + p * sp, 32 * sizeof(cg_real));
                }
            else if (rows == 12 && w == 12)
                for (int64_t p = p0; p < p1; p++) {
                    if (next) prefetch_at(sr + p * sp, next), prefetch_at(sr + p * sp, next + 11);
                    memcpy(d + p * 12, sr + p * sp, 12 * sizeof(cg_real));
                }
            else
                for (int64_t p = p0; p < p1; p++) {
                    memcpy(d + p * w, sr + p * sp, (size_t)rows * sizeof(cg_real));
                    memset(d + p * w + rows, 0, (size_t)(w - rows) * sizeof(cg_real));
                }
        }
    }
}

/* Panels of width w (tile t) over `count` rows of src (strides si along them, sp along depth k). */
static void pack_panels(const cgi_ukr *u, void *kernel, pack_t schema, int64_t t, int64_t w, int64_t count, int64_t k,
                        const cg_real *src, int64_t si, int64_t sp, cg_real *dst) {
    cg_real one = 1;
    if (si == 1 && w == t) {
        pack_across(w, count, k, src, sp, dst);
        return;
    }
    for (int64_t i = 0; i < count; i += t, dst += w * k) {
        const int64_t rows = count - i < t ? count - i : t;
        if (kernel)
            ((pack_fn)kernel)(BLIS_NO_CONJUGATE, schema, rows, k, k, &one, (cg_real *)src + i * si, si, sp, dst, w,
                              (cntx_t *)u->cntx);
        else cgi_pack_panel(rows, w, k, src + i * si, si, sp, dst);
    }
}

void cgi_ukr_pack_a(const cgi_ukr *u, int64_t m, int64_t k, const cg_real *a, int64_t rs, int64_t cs, cg_real *dst) {
    pack_panels(u, u->pack_a, BLIS_PACKED_ROW_PANELS, u->mr, u->pmr, m, k, a, rs, cs, dst);
}

void cgi_ukr_pack_b(const cgi_ukr *u, int64_t k, int64_t n, const cg_real *b, int64_t rs, int64_t cs, cg_real *dst) {
    pack_panels(u, u->pack_b, BLIS_PACKED_COL_PANELS, u->nr, u->pnr, n, k, b, cs, rs, dst);
}

void cgi_ukr_gemm(const cgi_ukr *u, int64_t m, int64_t n, int64_t k, cg_real alpha, const cg_real *a, int64_t ka,
                  const cg_real *b, int64_t kb, cg_real beta, cg_real *c, int64_t rsc, int64_t csc, int64_t n_diag,
                  int64_t k_diag) {
    const ukr_fn kernel = (ukr_fn)u->kernel;
    auxinfo_t aux;
    memset(&aux, 0, sizeof aux);
    if (u->swap) { /* tiles of C^T: B's panels are the kernel's A, A's its B, C's rows its columns */
        for (int64_t i = 0; i < m; i += u->mr) {
            int64_t kk = k_diag != CGI_UKR_FULL && i + u->mr + k_diag < k ? i + u->mr + k_diag : k;
            if (kk < 1) kk = 1;
            const cg_real *ap = a + i / u->mr * u->pmr * ka;
            for (int64_t j = 0; j < n; j += u->nr) {
                if (n_diag != CGI_UKR_FULL && j > i + u->mr - 1 + n_diag) break; /* and every tile after it */
                const cg_real *bp = b + j / u->nr * u->pnr * kb;
                bli_auxinfo_set_next_a((void *)(bp + u->pnr * kb), &aux);
                bli_auxinfo_set_next_b((void *)ap, &aux);
                kernel(n - j < u->nr ? n - j : u->nr, m - i < u->mr ? m - i : u->mr, kk, &alpha, (cg_real *)bp,
                       (cg_real *)ap, &beta, c + i * rsc + j * csc, csc, rsc, &aux, (cntx_t *)u->cntx);
            }
        }
        return;
    }
    /* as BLIS's macro-kernel: a B panel stays in L1 while the A panels stream past it */
    for (int64_t j = 0; j < n; j += u->nr) {
        const cg_real *bp = b + j / u->nr * u->pnr * kb;
        for (int64_t i = 0; i < m; i += u->mr) {
            if (n_diag != CGI_UKR_FULL && j > i + u->mr - 1 + n_diag) continue;
            int64_t kk = k_diag != CGI_UKR_FULL && i + u->mr + k_diag < k ? i + u->mr + k_diag : k;
            if (kk < 1) kk = 1; /* rows that see nothing still get their tile written */
            const cg_real *ap = a + i / u->mr * u->pmr * ka;
            bli_auxinfo_set_next_a((void *)(ap + u->pmr * ka), &aux);
            bli_auxinfo_set_next_b((void *)bp, &aux);
            kernel(m - i < u->mr ? m - i : u->mr, n - j < u->nr ? n - j : u->nr, kk, &alpha, (cg_real *)ap,
                   (cg_real *)bp, &beta, c + i * rsc + j * csc, rsc, csc, &aux, (cntx_t *)u->cntx);
        }
    }
}

bool cgi_pack_fast_transpose(void) {
#ifdef CGI_PACK12
    return fast_transpose;
#else
    return false;
#endif
}
