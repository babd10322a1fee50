/* SPDX-License-Identifier: MIT */
/* BLIS's kernel set as cgrad chooses it, and products cut into pieces over threads. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cgrad/cgrad.h>
#include "check.h"
#include "graph/internal.h"

#ifndef CGRAD_DOUBLE
#include <blis.h>
#endif

/* The choice rule on BLIS's answers for CPUs this machine is not. */
static void test_pick_rule(void) {
    const char *why = NULL, *k;
    const unsigned avx2 = CGI_CPU_AVX2_FMA, avx512 = CGI_CPU_AVX2_FMA | CGI_CPU_AVX512;
    /* Zen 4 / Zen 5: BLIS 0.9 runs generic */
    k = cgi_pick_kernels("generic", "", avx512 | CGI_CPU_AMD, &why);
    CHECK(k && !strcmp(k, "skx"), "AVX-512 AMD that BLIS does not know: %s", k ? k : "(null)");
    k = cgi_pick_kernels("generic", "", avx2 | CGI_CPU_AMD, &why);
    CHECK(k && !strcmp(k, "zen3"), "AVX2 AMD that BLIS does not know: %s", k ? k : "(null)");
    k = cgi_pick_kernels("generic", "", avx2, &why);
    CHECK(k && !strcmp(k, "haswell"), "AVX2 CPU that BLIS does not know: %s", k ? k : "(null)");
    /* a CPU without AVX2: BLIS's choice stands, even generic */
    k = cgi_pick_kernels("generic", "", 0, &why);
    CHECK(k && !strcmp(k, "generic"), "no AVX2: %s", k ? k : "(null)");
    /* BLIS knows the CPU: its choice stands */
    k = cgi_pick_kernels("zen3", "", avx2 | CGI_CPU_AMD, &why);
    CHECK(k && !strcmp(k, "zen3") && strstr(why, "BLIS's choice"), "Zen 3: %s (%s)", k ? k : "(null)", why);
    k = cgi_pick_kernels("skx", "", avx512, &why);
    CHECK(k && !strcmp(k, "skx"), "Skylake-X: %s", k ? k : "(null)");
    k = cgi_pick_kernels("haswell", "libblis: Hardware has 1 FMA unit; using 'haswell' (not 'skx') sub-config.\n",
                         avx512, &why);
    CHECK(k && !strcmp(k, "haswell"), "AVX-512 with one FMA unit keeps haswell: %s", k ? k : "(null)");
    /* BLIS cannot count the FMA units: skx, measured faster */
    k = cgi_pick_kernels("haswell", "libblis: Number of FMA units unknown; using 'haswell' (not 'skx') config.\n",
                         avx512, &why);
    CHECK(k && !strcmp(k, "skx"), "AVX-512, FMA units unknown: %s", k ? k : "(null)");
    /* BLIS's answer unreadable: the feature table */
    k = cgi_pick_kernels(NULL, NULL, avx512, &why);
    CHECK(k && !strcmp(k, "skx"), "no answer from BLIS: %s", k ? k : "(null)");
}

/* On this machine: never generic where AVX2 + FMA exist, and the reason is reported. */
static void test_kernels_in_use(void) {
    const char *k = cg_blas_kernels(), *why = cg_blas_kernels_reason();
    printf("kernels in use: %s (%s)\n%s\n", k, why, cg_runtime_info());
    CHECK(k && *k && why && *why, "kernel set and reason reported");
    if (cgi_cpu_features() & CGI_CPU_AVX2_FMA)
        CHECK(strcmp(k, "generic"), "BLIS runs 'generic' on a CPU with AVX2 + FMA (%s)", why);
    if ((cgi_cpu_features() & CGI_CPU_AVX512) && !getenv("BLIS_ARCH_TYPE"))
        CHECK(!strcmp(k, "skx") || !strcmp(k, "haswell"), "AVX-512 CPU runs '%s'", k);
    CHECK(strstr(cg_runtime_info(), cg_version()) != NULL, "runtime line names the version");
}

/* cgi_gemm_many against a plain triple loop, over thread counts that cut products into pieces,
 * shapes on and off the 32-multiple cuts, vectors, transposed operands, and two jobs at once. */
static void naive(const cgi_gemm_job *j, cg_real *c) {
    for (int64_t i = 0; i < j->m; i++)
        for (int64_t q = 0; q < j->n; q++) {
            double s = 0;
            for (int64_t p = 0; p < j->k; p++) s += (double)j->a[i * j->rsa + p * j->csa] * j->b[p * j->rsb + q * j->csb];
            c[i * j->rsc + q * j->csc] = (cg_real)(j->alpha * s + j->beta * c[i * j->rsc + q * j->csc]);
        }
}

static void test_pieces(void) {
    static const int64_t shapes[][3] = {{1, 3000, 300}, {3000, 1, 300}, {700, 129, 64}, {97, 1100, 40},
                                        {64, 64, 8},    {1, 5, 7},      {513, 515, 33}, {40, 2000, 130}};
    cg_rng r;
    cg_rng_seed(&r, 3);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        cg_real *a = malloc(sizeof(cg_real) * (size_t)(m * k)), *b = malloc(sizeof(cg_real) * (size_t)(k * n)),
                *c0 = malloc(sizeof(cg_real) * (size_t)(m * n)), *c = malloc(sizeof(cg_real) * (size_t)(m * n)),
                *c1 = malloc(sizeof(cg_real) * (size_t)(m * n));
        for (int64_t i = 0; i < m * k; i++) a[i] = (cg_real)(cg_rng_uniform(&r) - 0.5);
        for (int64_t i = 0; i < k * n; i++) b[i] = (cg_real)(cg_rng_uniform(&r) - 0.5);
        for (int64_t i = 0; i < m * n; i++) c0[i] = (cg_real)(cg_rng_uniform(&r) - 0.5);
        for (int tr = 0; tr < 2; tr++) {
            /* tr: B read through a transpose (column strides), C written by columns */
            cgi_gemm_job j = {.m = m, .n = n, .k = k, .a = a, .rsa = k, .csa = 1, .b = b, .rsb = tr ? 1 : n,
                              .csb = tr ? k : 1, .alpha = 0.5, .beta = 1, .c = c, .rsc = tr ? 1 : n,
                              .csc = tr ? m : 1};
            cgi_gemm_job ref = j;
            ref.c = c1;
            memcpy(c1, c0, sizeof(cg_real) * (size_t)(m * n));
            naive(&ref, c1);
            for (int th = 1; th <= 4; th++) {
                memcpy(c, c0, sizeof(cg_real) * (size_t)(m * n));
                cgi_gemm_many(&j, 1, th);
                double worst = 0;
                for (int64_t i = 0; i < m * n; i++) worst = fmax(worst, fabs((double)c[i] - (double)c1[i]));
                CHECK(worst < 1e-4, "[%lld,%lld,%lld] tr %d on %d threads: max error %g", (long long)m, (long long)n,
                      (long long)k, tr, th, worst);
            }
        }
        free(a), free(b), free(c0), free(c), free(c1);
    }
    /* two jobs at once (a linear's dX and dW): each equals its own run */
    const int64_t m = 300, n = 200, k = 150;
    cg_real *x = malloc(sizeof(cg_real) * m * k), *w = malloc(sizeof(cg_real) * n * k),
            *dy = malloc(sizeof(cg_real) * m * n), *dx = calloc((size_t)(m * k), sizeof(cg_real)),
            *dw = calloc((size_t)(n * k), sizeof(cg_real)), *rx = calloc((size_t)(m * k), sizeof(cg_real)),
            *rw = calloc((size_t)(n * k), sizeof(cg_real));
    for (int64_t i = 0; i < m * k; i++) x[i] = (cg_real)(cg_rng_uniform(&r) - 0.5);
    for (int64_t i = 0; i < n * k; i++) w[i] = (cg_real)(cg_rng_uniform(&r) - 0.5);
    for (int64_t i = 0; i < m * n; i++) dy[i] = (cg_real)(cg_rng_uniform(&r) - 0.5);
    cgi_gemm_job jobs[2] = {{m, k, n, dy, n, 1, w, k, 1, 1, 0, dx, k, 1, NULL, 0, false, CGI_EL_F32, CGI_EL_F32, NULL, 0},
                            {n, k, m, dy, 1, n, x, k, 1, 1, 0, dw, k, 1, NULL, 0, false, CGI_EL_F32, CGI_EL_F32, NULL, 0}};
    cgi_gemm_job refs[2] = {jobs[0], jobs[1]};
    refs[0].c = rx, refs[1].c = rw;
    naive(&refs[0], rx);
    naive(&refs[1], rw);
    cgi_gemm_many(jobs, 2, 3);
    double worst = 0;
    for (int64_t i = 0; i < m * k; i++) worst = fmax(worst, fabs((double)dx[i] - (double)rx[i]));
    for (int64_t i = 0; i < n * k; i++) worst = fmax(worst, fabs((double)dw[i] - (double)rw[i]));
    CHECK(worst < 1e-4, "two jobs on 3 threads: max error %g", worst);
    free(x), free(w), free(dy), free(dx), free(dw), free(rx), free(rw);
}

/* cgi_gemm_many_then: a linear's dX and dW with its bias's column sums as extra pieces of the same
 * region (ops/matmul.c) give the bits of the products and cgi_colsum_add run one after the other,
 * on 1 to 3 threads, rows not a multiple of the sums' 32 blocks; with no products the tasks still run. */
static void test_then_tasks(void) {
    const int64_t m = 1000, n = 96, k = 64;
    cg_rng r;
    cg_rng_seed(&r, 11);
    cg_real *x = malloc(sizeof(cg_real) * m * k), *w = malloc(sizeof(cg_real) * n * k),
            *dy = malloc(sizeof(cg_real) * m * n), *dx = malloc(sizeof(cg_real) * m * k),
            *dw = malloc(sizeof(cg_real) * n * k), *rx = malloc(sizeof(cg_real) * m * k),
            *rw = malloc(sizeof(cg_real) * n * k), db[96], rb[96],
            *scratch = malloc(sizeof(cg_real) * cgi_colsum_scratch(m, n));
    for (int64_t i = 0; i < m * k; i++) x[i] = (cg_real)(cg_rng_uniform(&r) - 0.5);
    for (int64_t i = 0; i < n * k; i++) w[i] = (cg_real)(cg_rng_uniform(&r) - 0.5);
    for (int64_t i = 0; i < m * n; i++) dy[i] = (cg_real)(cg_rng_uniform(&r) - 0.5);
    for (int th = 1; th <= 3; th++) {
        cgi_gemm_job jobs[2] = {{m, k, n, dy, n, 1, w, k, 1, 1, 0, rx, k, 1, NULL, 0, false, CGI_EL_F32, CGI_EL_F32, NULL, 0},
                                {n, k, m, dy, 1, n, x, k, 1, 1, 0, rw, k, 1, NULL, 0, false, CGI_EL_F32, CGI_EL_F32, NULL, 0}};
        for (int i = 0; i < n; i++) rb[i] = db[i] = (cg_real)i;
        cgi_gemm_many(jobs, 2, th);
        cgi_colsum_add(rb, dy, m, n, n, scratch);
        jobs[0].c = dx, jobs[1].c = dw;
        const cgi_colsum_ctx cs = {db, scratch, dy, m, n, n};
        cgi_gemm_many_then(jobs, 2, th, cgi_colsum_task, (void *)&cs, cgi_colsum_tasks());
        cgi_colsum_tasks_finish(&cs);
        CHECK(!memcmp(dx, rx, sizeof(cg_real) * m * k) && !memcmp(dw, rw, sizeof(cg_real) * n * k) &&
                  !memcmp(db, rb, sizeof db),
              "products + column sums in one region on %d threads differ from them run apart", th);
        for (int i = 0; i < n; i++) db[i] = (cg_real)i;
        cgi_gemm_many_then(NULL, 0, th, cgi_colsum_task, (void *)&cs, cgi_colsum_tasks());
        cgi_colsum_tasks_finish(&cs);
        CHECK(!memcmp(db, rb, sizeof db), "column sums with no products on %d threads: db[0] %g, want %g", th,
              (double)db[0], (double)rb[0]);
    }
    free(x), free(w), free(dy), free(dx), free(dw), free(rx), free(rw), free(scratch);
}

/* Products through cgrad's blocked driver (ops/gemm.c): several depth passes (k > 512), several
 * packed B blocks (n > 480, ragged), several A blocks (m > 3072), and a bias row (strides 1 and
 * 3) in place of beta, each also clamped at 0 (relu: on the last depth pass only, or the clamp
 * would cut partial sums), on 1 and 2 threads, against the triple loop; A is stored by rows, so
 * where B fits one block (n 600 at depth 128: 311 kB) A is packed a panel at a time, the last
 * panel partial (200 rows); the last shape (m < 32) goes to BLIS, whose relu is a pass after the
 * product. */
static void test_blocked(void) {
    static const int64_t shapes[][3] = {{3100, 70, 1030}, {100, 1000, 600}, {45, 515, 97}, {200, 600, 128}, {20, 300, 700}};
    cg_rng r;
    cg_rng_seed(&r, 5);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        cg_real *a = malloc(sizeof(cg_real) * (size_t)(m * k)), *b = malloc(sizeof(cg_real) * (size_t)(k * n)),
                *bias = malloc(sizeof(cg_real) * (size_t)(3 * n)), *c = malloc(sizeof(cg_real) * (size_t)(m * n)),
                *want = malloc(sizeof(cg_real) * (size_t)(m * n));
        for (int64_t i = 0; i < m * k; i++) a[i] = (cg_real)(cg_rng_uniform(&r) - 0.5);
        for (int64_t i = 0; i < k * n; i++) b[i] = (cg_real)(cg_rng_uniform(&r) - 0.5);
        for (int64_t i = 0; i < 3 * n; i++) bias[i] = (cg_real)(cg_rng_uniform(&r) - 0.5);
        for (int v = 0; v < 4; v++) { /* no bias, then a bias read with stride 3; each without and with relu */
            const int bs = v & 1 ? 3 : 0;
            const bool relu = v >= 2;
            /* B as a linear's weight [n, k] seen transposed */
            cgi_gemm_job j = {.m = m, .n = n, .k = k, .a = a, .rsa = k, .csa = 1, .b = b, .rsb = 1, .csb = k,
                              .alpha = 0.75, .beta = 0, .c = c, .rsc = n, .csc = 1, .bias = bs ? bias : NULL,
                              .bias_stride = bs, .relu = relu};
            cgi_gemm_job ref = j;
            ref.c = want;
            naive(&ref, want);
            int64_t neg = 0;
            for (int64_t i = 0; i < m; i++)
                for (int64_t q = 0; q < n; q++) {
                    cg_real *wv = &want[i * n + q];
                    if (bs) *wv += bias[q * bs];
                    if (relu && *wv < 0) *wv = 0, neg++;
                }
            CHECK(!relu || (neg > m * n / 4 && neg < m * n * 3 / 4), "relu clamps %lld of %lld", (long long)neg,
                  (long long)(m * n));
            for (int th = 1; th <= 2; th++) {
                for (int64_t i = 0; i < m * n; i++) c[i] = NAN; /* beta 0 and the bias never read C */
                cgi_gemm_many(&j, 1, th);
                double worst = 0;
                for (int64_t i = 0; i < m * n; i++) worst = fmax(worst, fabs((double)c[i] - (double)want[i]));
                CHECK(worst < 1e-4, "[%lld,%lld,%lld] bias stride %d relu %d on %d threads: max error %g", (long long)m,
                      (long long)n, (long long)k, bs, relu, th, worst);
            }
        }
        free(a), free(b), free(bias), free(c), free(want);
    }
}

/* A thread that runs a product and ends frees its packing buffers (the sanitizer build's leak
 * check fails otherwise); its result is right. */
static void *product_on_thread(void *arg) {
    cg_real *c = arg, *a = c + 64 * 64, *b = a + 64 * 64;
    cgi_gemm_job j = {.m = 64, .n = 64, .k = 64, .a = a, .rsa = 64, .csa = 1, .b = b, .rsb = 64, .csb = 1, .alpha = 1,
                      .beta = 0, .c = c, .rsc = 64, .csc = 1};
    cgi_gemm_many(&j, 1, 1);
    return NULL;
}

static void test_thread_buffers(void) {
    cg_real *buf = malloc(sizeof(cg_real) * 3 * 64 * 64), *a = buf + 64 * 64, *b = a + 64 * 64;
    for (int i = 0; i < 64 * 64; i++) a[i] = (cg_real)(i % 7) - 3, b[i] = (cg_real)(i % 5) - 2;
    for (int t = 0; t < 3; t++) {
        pthread_t th;
        CHECK(pthread_create(&th, NULL, product_on_thread, buf) == 0, "pthread_create");
        pthread_join(th, NULL);
    }
    double s = 0;
    for (int p = 0; p < 64; p++) s += (double)a[5 * 64 + p] * b[p * 64 + 9];
    CHECK(buf[5 * 64 + 9] == (cg_real)s, "C[5,9] = %g, want %g", (double)buf[5 * 64 + 9], s);
    free(buf);
}

/* BLIS's 12-wide float packing kernel as cgrad installs it (ops/gemm.c, a register transpose
 * where BLIS's reference copies element by element) against plain loops: every stride order,
 * full and partial panels, depth padding, kappa. */
static void test_pack12(void) {
#ifndef CGRAD_DOUBLE
    cgi_ukr u;
    cgi_ukr_init(&u); /* BLIS ready, cgrad's kernels in place */
    spackm_cxk_ker_ft f = (spackm_cxk_ker_ft)bli_cntx_get_packm_ker_dt(BLIS_FLOAT, BLIS_PACKM_12XK_KER, u.cntx);
    if (!f) return; /* this kernel set has none */
    enum { W = 12, K = 45, KMAX = 48, LD = 61 };
    float src[W * LD + K * LD], got[KMAX * 16], want[KMAX * 16];
    for (int i = 0; i < (int)(sizeof src / sizeof src[0]); i++) src[i] = (float)((i * 37) % 101) - 50.25f;
    static const struct { int cdim, n; long inca, lda; float kappa; } cases[] = {
        {12, 45, LD, 1, 1}, {12, 45, 1, LD, 1}, {12, 40, LD, 1, 0.5f}, {12, 7, 1, LD, -2}, {12, 45, 3, 5, 1},
        {5, 45, LD, 1, 1},  {12, 0, LD, 1, 1},  {12, 8, 1, 12, 1}};
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        const int cdim = cases[t].cdim, n = cases[t].n;
        const long inca = cases[t].inca, lda = cases[t].lda;
        float kappa = cases[t].kappa;
        for (int i = 0; i < KMAX * 16; i++) got[i] = want[i] = 99;
        for (int c = 0; c < KMAX; c++)
            for (int i = 0; i < W; i++) want[c * W + i] = c < n && i < cdim ? kappa * src[i * inca + c * lda] : 0;
        f(BLIS_NO_CONJUGATE, BLIS_PACKED_COL_PANELS, cdim, n, KMAX, &kappa, src, inca, lda, got, W, u.cntx);
        int bad = -1;
        for (int i = 0; i < KMAX * 16 && bad < 0; i++)
            if (got[i] != want[i]) bad = i;
        CHECK(bad < 0, "pack12 case %zu (cdim %d, n %d, inca %ld, lda %ld, kappa %g): element %d is %g, want %g", t,
              cdim, n, inca, lda, (double)kappa, bad, bad < 0 ? 0.0 : (double)got[bad], bad < 0 ? 0.0 : (double)want[bad]);
    }
#endif
}

static void test_ukr_pack_n(int64_t N) {
    cgi_ukr u;
    cgi_ukr_init(&u);
    enum { K = 37, NMAX = 45, LD = 53 };
    cg_real src[NMAX * LD];
    for (int i = 0; i < NMAX * LD; i++) src[i] = (cg_real)((i * 31) % 97) - 48;
    const size_t nb = cgi_ukr_packed_b(&u, K, N), na = cgi_ukr_packed_a(&u, N, K);
    cg_real *got = malloc((nb > na ? nb : na) * sizeof(cg_real));
    for (int order = 0; order < 2; order++) { /* element (p, j) of B [K, N]: src[j * LD + p], then src[p * LD + j] */
        const int64_t rs = order ? LD : 1, cs = order ? 1 : LD;
        cgi_ukr_pack_b(&u, K, N, src, rs, cs, got);
        int bad = 0;
        for (int64_t j = 0; j < (N + u.nr - 1) / u.nr * u.nr; j++)
            for (int64_t p = 0; p < K; p++) {
                const cg_real want = j < N ? src[p * rs + j * cs] : 0;
                bad += got[j / u.nr * u.pnr * K + p * u.pnr + j % u.nr] != want;
            }
        CHECK(bad == 0, "B panels (N %lld, order %d, width %lld): %d elements differ", (long long)N, order,
              (long long)u.pnr, bad);
        cgi_ukr_pack_a(&u, N, K, src, cs, rs, got); /* A [N, K] = B^T */
        bad = 0;
        for (int64_t i = 0; i < (N + u.mr - 1) / u.mr * u.mr; i++)
            for (int64_t p = 0; p < K; p++) {
                const cg_real want = i < N ? src[p * rs + i * cs] : 0;
                bad += got[i / u.mr * u.pmr * K + p * u.pmr + i % u.mr] != want;
            }
        CHECK(bad == 0, "A panels (N %lld, order %d, width %lld): %d elements differ", (long long)N, order,
              (long long)u.pmr, bad);
    }
    free(got);
}

/* cgi_ukr's packing, A and B, from every stride order (the transposing one runs 4 x 8 register
 * transposes on full groups of 4 rows; the copying one goes depth blocks across the panels),
 * against plain loops: panels of the tile widths, padding 0. N = 44 leaves a last B panel of 12
 * rows, the A panel's width (the copy must keep the B panel's). */
static void test_ukr_pack(void) {
    for (int64_t N = 44; N <= 45; N++) test_ukr_pack_n(N);
}

/* Room for `reals` ending where an unreadable page begins (64-byte aligned start, so at most 60
 * bytes short of it): a read past the end faults. *map, *len: the mapping to unmap. */
static cg_real *before_guard(size_t reals, void **map, size_t *len) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), bytes = reals * sizeof(cg_real);
    *len = (bytes + page - 1) / page * page + page;
    char *m = mmap(NULL, *len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    *map = m;
    char *guard = m + *len - page;
    if (mprotect(guard, page, PROT_NONE)) return NULL;
    return (cg_real *)((uintptr_t)(guard - bytes) & ~(uintptr_t)63);
}

/* The kernel reads ahead of the depth it multiplies (skx's float kernel: one depth past a panel's
 * end). Packs sized by cgi_ukr_packed_a/b and placed right before an unreadable page must still
 * give the product: without room for the read-ahead this faulted, as a product engine's B block did
 * when glibc's mapping of it ended on the block's last line. */
static void test_ukr_read_ahead(void) {
    cgi_ukr u;
    cgi_ukr_init(&u);
    enum { M = 30, N = 70 };
    const int64_t depths[] = {1, 7, 16, 144};
    for (size_t t = 0; t < sizeof depths / sizeof *depths; t++) {
        const int64_t K = depths[t];
        const size_t na = cgi_ukr_packed_a(&u, M, K), nb = cgi_ukr_packed_b(&u, K, N);
        void *ma = NULL, *mb = NULL;
        size_t la = 0, lb = 0;
        cg_real *pa = before_guard(na, &ma, &la), *pb = before_guard(nb, &mb, &lb);
        cg_real *a = malloc(sizeof(cg_real) * M * K), *b = malloc(sizeof(cg_real) * K * N),
                *c = malloc(sizeof(cg_real) * M * N), *want = calloc(M * N, sizeof(cg_real)); /* naive reads beta C */
        CHECK(pa && pb && a && b && c && want, "depth %lld: no memory", (long long)K);
        if (pa && pb && a && b && c && want) {
            for (int64_t i = 0; i < M * K; i++) a[i] = (cg_real)((i * 7) % 13) - 6;
            for (int64_t i = 0; i < K * N; i++) b[i] = (cg_real)((i * 5) % 11) - 5;
            cgi_ukr_pack_a(&u, M, K, a, K, 1, pa);
            cgi_ukr_pack_b(&u, K, N, b, N, 1, pb);
            cgi_ukr_gemm(&u, M, N, K, 1, pa, K, pb, K, 0, c, N, 1, CGI_UKR_FULL, CGI_UKR_FULL);
            const cgi_gemm_job ref = {.m = M, .n = N, .k = K, .a = a, .rsa = K, .csa = 1, .b = b, .rsb = N, .csb = 1,
                                      .alpha = 1, .beta = 0, .rsc = N, .csc = 1};
            naive(&ref, want);
            int bad = 0; /* small integers: exact in any order */
            for (int64_t i = 0; i < M * N; i++) bad += c[i] != want[i];
            CHECK(bad == 0, "depth %lld, packs before an unreadable page: %d of C's elements differ", (long long)K,
                  bad);
        }
        free(a), free(b), free(c), free(want);
        if (ma) munmap(ma, la);
        if (mb) munmap(mb, lb);
    }
}

/* A sharing team's call packs the operand its pieces do not cut once, each block by whichever
 * piece needs it first (ops/gemm.c, share_packs): B where the pieces cut C's rows, A where they
 * cut its columns, over several depth passes, B blocks and A blocks (m > 3072), with a bias and a
 * beta; the team's C holds one thread's bits, and pieces did read blocks another packed. */
typedef struct {
    cgi_gemm_job jobs[2];
} team_call;

static cg_status team_products(void *ctx) {
    team_call *t = ctx;
    cgi_gemm_many(t->jobs, 2, 2);
    return CG_OK;
}

static void test_team_shared_packs(void) {
#ifndef CGRAD_DOUBLE
    if (!cgi_gemm_blocked_on()) return; /* no blocked driver with this kernel set: nothing is shared */
    enum { M0 = 3200, N0 = 520, K0 = 600, M1 = 100, N1 = 1100, K1 = 530 };
    cg_rng r;
    cg_rng_seed(&r, 11);
    cg_real *a0 = malloc(sizeof(cg_real) * M0 * K0), *b0 = malloc(sizeof(cg_real) * K0 * N0),
            *a1 = malloc(sizeof(cg_real) * M1 * K1), *b1 = malloc(sizeof(cg_real) * K1 * N1),
            *bias = malloc(sizeof(cg_real) * N0), *one = malloc(sizeof(cg_real) * (M0 * N0 + M1 * N1)),
            *team = malloc(sizeof(cg_real) * (M0 * N0 + M1 * N1));
    for (int64_t i = 0; i < M0 * K0; i++) a0[i] = (cg_real)(cg_rng_uniform(&r) - 0.5);
    for (int64_t i = 0; i < K0 * N0; i++) b0[i] = (cg_real)(cg_rng_uniform(&r) - 0.5);
    for (int64_t i = 0; i < M1 * K1; i++) a1[i] = (cg_real)(cg_rng_uniform(&r) - 0.5);
    for (int64_t i = 0; i < K1 * N1; i++) b1[i] = (cg_real)(cg_rng_uniform(&r) - 0.5);
    for (int64_t i = 0; i < N0; i++) bias[i] = (cg_real)(cg_rng_uniform(&r) - 0.5);
    /* job 0: A [M0, K0] by rows, B a weight [N0, K0] read transposed, a bias; job 1: A read
     * transposed from [K1, M1], B [K1, N1] by rows, beta 0.5 on C */
    team_call t = {{{M0, N0, K0, a0, K0, 1, b0, 1, K0, 0.75, 0, NULL, N0, 1, bias, 1, false, CGI_EL_F32, CGI_EL_F32, NULL, 0},
                    {M1, N1, K1, a1, 1, M1, b1, N1, 1, 1, 0.5, NULL, N1, 1, NULL, 0, false, CGI_EL_F32, CGI_EL_F32, NULL, 0}}};
    for (int64_t i = 0; i < M1 * N1; i++) one[M0 * N0 + i] = (cg_real)(i % 13) - 6;
    memcpy(team + M0 * N0, one + M0 * N0, sizeof(cg_real) * M1 * N1);
    t.jobs[0].c = one, t.jobs[1].c = one + M0 * N0;
    cgi_gemm_many(t.jobs, 2, 1);
    cgi_team_set_guard(CGI_TEAM_GUARD_ON);
    cgi_team_wait_for_helpers(true); /* else a loaded machine may keep the helpers switched out */
    cg_set_threads(2);
    t.jobs[0].c = team, t.jobs[1].c = team + M0 * N0;
    cg_real *c1 = malloc(sizeof(cg_real) * M1 * N1);
    memcpy(c1, team + M0 * N0, sizeof(cg_real) * M1 * N1);
    long long reads = 0;
    for (int attempt = 0; attempt < 50 && reads == 0; attempt++) { /* a loaded machine may keep a helper asleep */
        const long long before = cgi_gemm_shared_reads();
        memcpy(team + M0 * N0, c1, sizeof(cg_real) * M1 * N1); /* beta reads C */
        CHECK(cg_run_with_team(team_products, &t) == CG_OK, "%s", cg_last_error());
        reads = cgi_gemm_shared_reads() - before;
        int64_t diff = -1;
        for (int64_t i = 0; i < M0 * N0 + M1 * N1 && diff < 0; i++)
            if (memcmp(&one[i], &team[i], sizeof one[i])) diff = i;
        CHECK(diff < 0, "team C element %lld: %.9g, one thread %.9g", (long long)diff, diff < 0 ? 0 : (double)team[diff],
              diff < 0 ? 0 : (double)one[diff]);
    }
    CHECK(reads > 0, "no piece read a shared pack in 50 team calls");
    cgi_team_set_guard(CGI_TEAM_GUARD_AUTO);
    cgi_team_wait_for_helpers(false);
    cg_set_threads(0);
    free(a0), free(b0), free(a1), free(b1), free(bias), free(one), free(team), free(c1);
#endif
}

int main(void) {
    test_pick_rule();
    test_kernels_in_use();
    test_pieces();
    test_then_tasks();
    test_blocked();
    test_thread_buffers();
    test_pack12();
    test_ukr_pack();
    test_ukr_read_ahead();
    test_team_shared_packs();
    TEST_END();
}
