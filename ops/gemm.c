/* SPDX-License-Identifier: MIT */
/* The product engine under matmul, linear and attention: strided products on BLIS's micro-kernel
 * (a transposed or sliced operand is passed as it lies in memory, never copied), run in pieces by
 * the threads or a thread team (the cuts: ops/gemm_cut.c); cgrad's blocked driver on its own packs
 * (ops/gemm_pack.c), which also runs bf16 operands widened as they are packed (cgi_gemm_bf16).
 * BLIS itself always runs single-threaded. The ops that use it are in ops/matmul.c. */
#include <blis.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "graph/internal.h"
#include "ops/bf16_internal.h"
#include "ops/gemm_internal.h"
#include "ops/half.h"

/* How a job's C is stored (flags beside every job of a call; a and b have their types in the job,
 * cgi_gemm_job.ta and .tb): F_CBF16, C is bfloat16, rounded once from the float sum plus the bias
 * (beta 0). */
enum { F_CBF16 = 2 };
/* A sharing team's pack of the operand a job's pieces do not cut (B when the pieces cut rows, A
 * when they cut columns; see gemm_many): packed by whichever piece first claims each block, then
 * read by the others. */
typedef struct {
    cg_real *buf;       /* the whole operand in panels, one depth pass after the other */
    _Atomic int *state; /* per block of the blocked driver: BLOCK_FREE, BLOCK_PACKING or BLOCK_READY */
    bool a;             /* the shared operand is A */
} shared_pack;
static bool gemm_blocked(const cgi_gemm_job *j, unsigned fl, const shared_pack *sh);
enum { SHARE_JOBS = 8, SHARE_BLOCKS = 256 }; /* at most: a call's jobs and blocks with shared packs */
static bool share_packs(const cgi_gemm_job *jobs, int njobs, unsigned fl, const cgi_gemm_piece *pcs, int np,
                        shared_pack *sh, _Atomic int *states);
static void gemm_half_1(const cgi_gemm_job *j, unsigned fl);
static bool half_job(const cgi_gemm_job *j) { return j->ta != CGI_EL_F32 || j->tb != CGI_EL_F32; }

/* C[m,n] = alpha * A[m,k] @ B[k,n] + beta * C (or + bias) on the calling thread, all
 * general-strided. A single row or column goes to gemv: gemm would pack the whole other operand
 * for one vector (token-by-token generation is all such products). */
static void gemm_blis(const cgi_gemm_job *j) {
    int64_t m = j->m, n = j->n, k = j->k, rsa = j->rsa, csa = j->csa, rsb = j->rsb, csb = j->csb;
    cg_real alpha = j->alpha, beta = j->beta, *c = j->c;
    const int64_t rsc = j->rsc, csc = j->csc;
    if (j->bias) { /* C = bias, then C += A B */
        cgi_fill_bias(c, m, n, rsc, csc, j->bias, j->bias_stride);
        beta = 1;
    }
    if (k == 0) { /* an empty sum: C = beta * C */
        for (int64_t i = 0; i < m; i++)
            for (int64_t jj = 0; jj < n; jj++) c[i * rsc + jj * csc] = beta == 0 ? 0 : beta * c[i * rsc + jj * csc];
        return;
    }
    rntm_t rntm = BLIS_RNTM_INITIALIZER;
    bli_rntm_set_num_threads(1, &rntm);
    /* With A stored by rows and B by columns (A @ W^T, Q @ K^T) BLIS's small-matrix path takes its
     * dot-product kernels, which ran 1.2-1.7x slower than packing here on Zen 3 (e.g. 256x256x64,
     * the attention scores: 37 against 62 GFLOP/s); below 32 rows or columns it stays the faster. */
    if (csa == 1 && rsa != 1 && rsb == 1 && csb != 1 && m >= 32 && n >= 32) bli_rntm_disable_l3_sup(&rntm);
#ifdef CGRAD_DOUBLE
#define GEMV bli_dgemv_ex
#define GEMM bli_dgemm_ex
    typedef double real_t;
#else
#define GEMV bli_sgemv_ex
#define GEMM bli_sgemm_ex
    typedef float real_t;
#endif
    if (m == 1 && n > 1) { /* c[1,n] = a[1,k] B[k,n]  <=>  c^T = B^T a^T: B^T is [n, k] */
        GEMV(BLIS_NO_TRANSPOSE, BLIS_NO_CONJUGATE, n, k, &alpha, (real_t *)j->b, csb, rsb, (real_t *)j->a, csa, &beta,
             c, csc, NULL, &rntm);
        return;
    }
    if (n == 1) { /* c[m,1] = A[m,k] b[k,1] */
        GEMV(BLIS_NO_TRANSPOSE, BLIS_NO_CONJUGATE, m, k, &alpha, (real_t *)j->a, rsa, csa, (real_t *)j->b, rsb, &beta,
             c, rsc, NULL, &rntm);
        return;
    }
    /* BLIS rejects strides it cannot tell apart on size-1 dimensions; give those a plain one. */
#define FIX(rows, cols, rs, cs)                           \
    do {                                                  \
        if ((rows) == 1) (rs) = (cs) == 1 ? (cols) : 1;   \
        if ((cols) == 1) (cs) = (rs) == 1 ? (rows) : 1;   \
        if ((rows) == 1 && (cols) == 1) (rs) = (cs) = 1;  \
    } while (0)
    FIX(m, k, rsa, csa);
    FIX(k, n, rsb, csb);
#undef FIX
    GEMM(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, m, n, k, &alpha, (real_t *)j->a, rsa, csa, (real_t *)j->b, rsb, csb,
         &beta, c, rsc, csc, NULL, &rntm);
#undef GEMV
#undef GEMM
}

/* C += res after a product that ran outside the blocked driver: a pass over this piece of C */
static void add_res(const cgi_gemm_job *j) {
    for (int64_t i = 0; j->res && i < j->m; i++)
        for (int64_t q = 0; q < j->n; q++) j->c[i * j->rsc + q * j->csc] += j->res[i * j->res_rs + q];
}

static void gemm1(const cgi_gemm_job *j, unsigned fl, const shared_pack *sh) {
    if (j->m == 0 || j->n == 0) return;
    if (half_job(j) || (fl & F_CBF16)) {
        gemm_half_1(j, fl);
        return;
    }
    if (gemm_blocked(j, 0, sh)) return;
    gemm_blis(j);
    add_res(j);
    if (j->relu) /* after BLIS's product: a pass over this piece of C */
        for (int64_t i = 0; i < j->m; i++)
            for (int64_t q = 0; q < j->n; q++) {
                cg_real *v = j->c + i * j->rsc + q * j->csc;
                *v = *v > 0 ? *v : 0;
            }
}

/* p advanced by `by` elements of a job's operand: floats (CGI_EL_F32, or a float C), or half
 * precision (CGI_EL_BF16 / CGI_EL_F16, or a bf16 C) */
static const void *ahead(const void *p, int64_t by, bool half) {
    return (const char *)p + by * (half ? (int64_t)sizeof(uint16_t) : (int64_t)sizeof(cg_real));
}

static void run_piece(const cgi_gemm_job *jobs, const cgi_gemm_piece *pc, unsigned fl, const shared_pack *sh) {
    cgi_gemm_job j = jobs[pc->job];
    if (cgi_gemm_cut_rows(&j)) {
        j.a = ahead(j.a, pc->lo * j.rsa, j.ta != CGI_EL_F32);
        j.c = (cg_real *)ahead(j.c, pc->lo * j.rsc, fl & F_CBF16);
        if (j.res) j.res += pc->lo * j.res_rs;
        j.m = pc->hi - pc->lo;
    } else {
        j.b = ahead(j.b, pc->lo * j.csb, j.tb != CGI_EL_F32);
        j.c = (cg_real *)ahead(j.c, pc->lo * j.csc, fl & F_CBF16);
        if (j.bias) j.bias += pc->lo * j.bias_stride;
        if (j.res) j.res += pc->lo;
        j.n = pc->hi - pc->lo;
    }
    gemm1(&j, fl, sh && sh[pc->job].buf ? &sh[pc->job] : NULL);
}

/* Extra pieces after the products' (cgi_gemm_many_then): task(ctx, i) for i < n. */
typedef struct {
    void (*task)(void *ctx, int i);
    void *ctx;
    int n;
} extra_tasks;

typedef struct {
    const cgi_gemm_job *jobs;
    const cgi_gemm_piece *pcs;
    unsigned fl;
    int np;               /* product pieces; pieces from np are the extra tasks */
    const extra_tasks *ex;
    const shared_pack *sh; /* per job: the shared pack of its uncut operand (buf NULL: none) */
    double (*trace)[4];   /* CGRAD_TEAM_TRACE: each piece's thread, start, end and CPU seconds */
    double t0;
} team_task;

static double thread_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void run_team_piece(void *ctx, int q) {
    const team_task *t = ctx;
    const double w0 = t->trace ? omp_get_wtime() : 0, c0 = t->trace ? thread_cpu_s() : 0;
    if (q < t->np) run_piece(t->jobs, &t->pcs[q], t->fl, t->sh);
    else t->ex->task(t->ex->ctx, q - t->np);
    if (t->trace) {
        double *r = t->trace[q];
        r[0] = omp_get_thread_num(), r[1] = w0 - t->t0, r[2] = omp_get_wtime() - t->t0, r[3] = thread_cpu_s() - c0;
    }
}

/* CGRAD_TEAM_TRACE=1: a line on stderr for each shared call of products, "team_trace <wall us>
 * <m>x<n>x<k> ... | <thread>:<start>-<end>:<rows or columns, -1 an extra task>:<CPU us> ...", in
 * claiming order; bench/team_trace.py sums it up. */
static bool team_trace(void) {
    static _Atomic int on = -1;
    int t = atomic_load_explicit(&on, memory_order_relaxed);
    if (t < 0) {
        const char *e = getenv("CGRAD_TEAM_TRACE");
        t = e && atoi(e) > 0;
        atomic_store_explicit(&on, t, memory_order_relaxed);
    }
    return t;
}

static void trace_print(const cgi_gemm_job *jobs, int njobs, const cgi_gemm_piece *pcs, int np, int n, double (*tr)[4], double wall) {
    char line[16384];
    size_t at = (size_t)snprintf(line, sizeof line, "team_trace %.0f", 1e6 * wall);
    for (int i = 0; i < njobs && at < sizeof line; i++)
        at += (size_t)snprintf(line + at, sizeof line - at, " %lldx%lldx%lld", (long long)jobs[i].m, (long long)jobs[i].n,
                               (long long)jobs[i].k);
    if (at < sizeof line) at += (size_t)snprintf(line + at, sizeof line - at, " |");
    for (int q = 0; q < n && at < sizeof line; q++)
        at += (size_t)snprintf(line + at, sizeof line - at, " %d:%.0f-%.0f:%lld:%.0f", (int)tr[q][0], 1e6 * tr[q][1],
                               1e6 * tr[q][2], q < np ? (long long)(pcs[q].hi - pcs[q].lo) : -1LL, 1e6 * tr[q][3]);
    fprintf(stderr, "%s\n", line);
}

static void gemm_many(const cgi_gemm_job *jobs, int njobs, int threads, unsigned fl, const extra_tasks *ex) {
    cgi_gemm_blis_ready();
    /* Inside a team, products are cut into pieces of whole 32-row blocks while the helpers are
     * awake, and not at all while they rest or at one thread: a cut cost ~4% of a cached token on
     * one thread (1730-1747 -> 1616-1686 tokens/s). BLIS's sgemv runs its fused 8-row dot kernel
     * on row groups from the first row, and a matrix product's cut never splits the depth, so a
     * cut on multiples of 32 gives the same bits as the whole (test_threads checks the tokens at
     * 1 and 2 threads). */
    const bool team = cgi_team_on(), share = team && cgi_team_sharing();
    if (team || (threads > 1 && omp_in_parallel())) threads = 1; /* never nest a team inside a team */
    cgi_gemm_piece pcs[CGI_GEMM_MAX_PIECES];
    const int np = cgi_gemm_cut(jobs, njobs, share ? cgi_team_threads() : threads, share, team, pcs);
    const int nx = ex ? ex->n : 0;
    if (share) { /* the extra tasks (a linear's bias sums) too: they ran on thread 0 alone after the products */
        double(*tr)[4] = team_trace() ? malloc((size_t)(np + nx) * sizeof *tr) : NULL; /* a diagnostic: off by default */
        shared_pack sh[SHARE_JOBS];
        _Atomic int states[SHARE_BLOCKS];
        const bool shared = njobs <= SHARE_JOBS && share_packs(jobs, njobs, fl, pcs, np, sh, states);
        const team_task task = {jobs, pcs, fl, np, ex, shared ? sh : NULL, tr, tr ? omp_get_wtime() : 0};
        cgi_team_pieces(run_team_piece, (void *)&task, np + nx);
        if (tr) trace_print(jobs, njobs, pcs, np, np + nx, tr, omp_get_wtime() - task.t0);
        free(tr);
        return;
    }
    if (np <= 1 || threads <= 1) {
        for (int q = 0; q < np + nx; q++)
            if (q < np) run_piece(jobs, &pcs[q], fl, NULL);
            else ex->task(ex->ctx, q - np);
        return;
    }
    /* the extra tasks go last, to whichever thread runs out of product pieces first */
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads < np + nx ? threads : np + nx)
    for (int q = 0; q < np + nx; q++)
        if (q < np) run_piece(jobs, &pcs[q], fl, NULL);
        else ex->task(ex->ctx, q - np);
}

void cgi_gemm_many(const cgi_gemm_job *jobs, int njobs, int threads) { gemm_many(jobs, njobs, threads, 0, NULL); }

void cgi_gemm_many_then(const cgi_gemm_job *jobs, int njobs, int threads, void (*task)(void *ctx, int i), void *ctx,
                        int ntasks) {
    const extra_tasks ex = {task, ctx, ntasks};
    gemm_many(jobs, njobs, threads, 0, &ex);
}

void cgi_gemm(int64_t m, int64_t n, int64_t k, const cg_real *a, int64_t rsa, int64_t csa, const cg_real *b,
              int64_t rsb, int64_t csb, cg_real alpha, cg_real beta, cg_real *c, int64_t rsc, int64_t csc, int threads) {
    const cgi_gemm_job j = {.m = m, .n = n, .k = k, .a = a, .rsa = rsa, .csa = csa, .b = b, .rsb = rsb, .csb = csb,
                            .alpha = alpha, .beta = beta, .c = c, .rsc = rsc, .csc = csc};
    cgi_gemm_many(&j, 1, threads);
}


/* ---- BLIS's blocking, cgrad's packs ---- */

/* A product BLIS would run with a column-preferring micro-kernel on row-major C (skx's 32 x 12,
 * every linear here) packs the operand along C's rows into 32-wide panels. BLIS 0.9 has no
 * packing-kernel id for width 32, so it packs them with its generic scal2m, one strided element
 * at a time: for a linear's forward that is the weight, a transpose, at some 2 ns an element
 * (4% of an encdec-base step). This driver keeps BLIS's loops and its micro-kernel, packs with
 * cgi_ukr's register transposes, and starts a bias-initialised C strip by strip while the strip
 * is in cache instead of filling the whole of C first. */
enum { BLK_KC = 512, BLK_NC = 480, BLK_MC = 3072 }; /* at most: depth per pass, C columns per packed B block, C rows per packed A */
enum { BLK_MC16 = 512 }; /* C rows per packed A for a bf16 C: its float block is BLK_MC16 x BLK_NC (960 kB) */

typedef struct {
    cg_real *p;
    size_t n;
} pack_buf;
typedef struct {
    pack_buf a, b, s; /* s: a block of C in float, for a bf16 C */
    pack_buf team;    /* a sharing team's call: the shared packs (thread 0's) */
} pack_bufs;
/* Each thread's packing buffers: grown once, then reused; freed when the thread ends. */
static pthread_key_t pack_key;
static bool pack_key_ok;

static void pack_bufs_free(void *v) {
    pack_bufs *b = v;
    free(b->a.p), free(b->b.p), free(b->s.p), free(b->team.p), free(b);
}

static pack_bufs *pack_bufs_get(void) {
    if (!pack_key_ok) return NULL;
    pack_bufs *b = pthread_getspecific(pack_key);
    if (!b && (b = calloc(1, sizeof *b)) && pthread_setspecific(pack_key, b)) {
        free(b);
        b = NULL;
    }
    return b;
}

static cg_real *pack_buf_get(pack_buf *b, size_t n) {
    if (b->n >= n) return b->p;
    free(b->p);
    b->p = cgi_alloc_large(n * sizeof(cg_real));
    b->n = b->p ? n : 0;
    return b->p;
}

static cgi_ukr blk_ukr;
static bool blk_on;
static _Atomic bool blk_panels; /* set between products by benches (cgi_gemm_set_panels) */
/* The largest packed B block that A's panels stream past when A is packed a panel at a time: half
 * of this CPU's L2 (its size from the C library, else 1 MB), so the block and C's strips share it */
static int64_t blk_wide_bytes;
static void blk_init(void) {
    cgi_ukr_init(&blk_ukr);
    pack_key_ok = pthread_key_create(&pack_key, pack_bufs_free) == 0;
    const char *off = getenv("CGRAD_GEMM_BLIS"); /* set: BLIS's own driver for every product, for comparisons */
    blk_on = blk_ukr.swap && cgi_pack_fast_transpose() && !(off && *off); /* false without the transposing packs */
    const char *panels = getenv("CGRAD_GEMM_PANELS"); /* 0: A packed a block at a time, for comparisons */
    blk_panels = !(panels && *panels == '0');
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    blk_wide_bytes = (l2 > 0 ? l2 : 1L << 20) / 2;
}
static pthread_once_t blk_once = PTHREAD_ONCE_INIT;

/* Whether the driver packs A a panel at a time into one panel's place, just before that panel's
 * tiles: where A is stored by rows (a linear's input, dY), its pack is a transpose; packed as a
 * whole block ahead, the block's stores go to lines long gone from the cache, and on a Xeon whose
 * L3 is slow to give them the pack ran at 0.8 ns an element. One panel's place stays in L1. This
 * needs A's panels used once, so B is one block (blk_sizes_of) and A is the piece's own. */
static bool a_by_panel(const cgi_gemm_job *j, bool c16) {
    return blk_panels && !c16 && j->ta == CGI_EL_F32 && j->csa == 1 && j->rsa != 1;
}

/* A's rows jc.. and depths pc.. of job j, packed a panel at a time into panel (a_by_panel) */
typedef struct {
    const cgi_gemm_job *j;
    int64_t jc, pc;
    cg_real *panel;
} panel_src;
static void pack_a_block(const cgi_ukr *u, const cgi_gemm_job *j, int64_t jc, int64_t pc, int64_t mc, int64_t kc,
                         cg_real *dst);

/* C[m, nb] (rows rsc, columns contiguous) = alpha A B + beta C, or alpha A B + the bias, from
 * packed A (12-row panels) and B (32-column panels) of depth kc: cgi_ukr_gemm strip by strip, one
 * A panel in L1 while the B panels stream past, the bias added (relu: and C clamped at 0; res, rows
 * rsr apart: added, on the last depth pass) while the strip is in cache, row by row. ps: each A
 * panel is packed from ps just before its strip, into ps->panel (ap unused). */
static void blk_macro(const cgi_ukr *u, int64_t m, int64_t nb, int64_t kc, cg_real alpha, const cg_real *ap,
                      const cg_real *bp, cg_real beta, const cg_real *bias, int64_t bs, bool relu, const cg_real *res,
                      int64_t rsr, cg_real *c, int64_t rsc, const panel_src *ps) {
    for (int64_t i = 0; i < m; i += u->mr) {
        const int64_t mi = m - i < u->mr ? m - i : u->mr;
        cg_real *cr = c + i * rsc;
        if (ps) pack_a_block(u, ps->j, ps->jc + i, ps->pc, mi, kc, ps->panel);
        cgi_ukr_gemm(u, mi, nb, kc, alpha, ps ? ps->panel : ap + i / u->mr * u->pmr * kc, kc, bp, kc, bias ? 0 : beta,
                     cr, rsc, 1, CGI_UKR_FULL, CGI_UKR_FULL);
        for (int64_t r = 0; (bias || relu || res) && r < mi; r++) {
            cg_real *row = cr + r * rsc;
            if (bias) cgi_add_bias_row(row, bias, bs, nb);
            if (res) cgi_add_bias_row(row, res + (i + r) * rsr, 1, nb);
            if (relu) /* as cg_relu: NaN to 0 */
                for (int64_t jj = 0; jj < nb; jj++) row[jj] = row[jj] > 0 ? row[jj] : 0;
        }
    }
}

void cgi_gemm_set_panels(bool on) {
    pthread_once(&blk_once, blk_init);
    blk_panels = on;
}

bool cgi_gemm_blocked_on(void) {
    pthread_once(&blk_once, blk_init);
    return blk_on;
}

#ifndef CGRAD_DOUBLE
/* ---- bf16 operands on the float micro-kernel: widened as they are packed ---- */

/* d[i] = s[i] as float (exact: the bf16 bits are a float's upper half); vectorises to a zero
 * extension and a shift */
static CGI_CLONES void widen(float *restrict d, const cgi_bf16 *restrict s, int64_t n) {
    for (int64_t i = 0; i < n; i++) d[i] = cgi_from_bf16(s[i]);
}

enum { WD = 64, WMAX = 64 }; /* depths widened at a time for a transposing pack; widest panel it takes */

/* d[i] = s[i] as float for n elements of type el (CGI_EL_BF16 or CGI_EL_F16) */
static void widen_el(float *restrict d, const uint16_t *restrict s, int64_t n, int el) {
    if (el == CGI_EL_F16) cgi_widen_f16(d, s, n);
    else widen(d, s, n);
}

/* pack_panel over half-precision source elements of type el, widened. Panel rows along the depth
 * (sp 1, a transpose): WD depths of the rows are widened into an L1 block and packed from there by
 * pack_panel (its register transposes); panel rows across (si 1): each depth's run widened in place. */
static void pack_panel_half(int64_t rows, int64_t w, int64_t k, const uint16_t *src, int64_t si, int64_t sp,
                            float *dst, int el) {
    if (sp == 1 && w <= WMAX) {
        float tmp[WMAX * WD];
        for (int64_t p0 = 0; p0 < k; p0 += WD) {
            const int64_t dk = k - p0 < WD ? k - p0 : WD;
            for (int64_t i = 0; i < rows; i++) widen_el(tmp + i * WD, src + i * si + p0, dk, el);
            cgi_pack_panel(rows, w, dk, tmp, WD, 1, dst + p0 * w);
        }
        return;
    }
    for (int64_t p = 0; p < k; p++) {
        float *d = dst + p * w;
        const uint16_t *s = src + p * sp;
        if (si == 1) widen_el(d, s, rows, el);
        else
            for (int64_t i = 0; i < rows; i++) d[i] = cgi_half_at(s, i * si, el);
        for (int64_t i = rows; i < w; i++) d[i] = 0;
    }
}

/* cgi_ukr_pack_a / cgi_ukr_pack_b over sources of element type el (the same panels, widened) */
static void pack_a_el(const cgi_ukr *u, int64_t m, int64_t k, const void *a, int el, int64_t rs, int64_t cs, float *dst) {
    if (el == CGI_EL_F32) {
        cgi_ukr_pack_a(u, m, k, a, rs, cs, dst);
        return;
    }
    for (int64_t i = 0; i < m; i += u->mr, dst += u->pmr * k)
        pack_panel_half(m - i < u->mr ? m - i : u->mr, u->pmr, k, (const uint16_t *)a + i * rs, rs, cs, dst, el);
}
static void pack_b_el(const cgi_ukr *u, int64_t k, int64_t n, const void *b, int el, int64_t rs, int64_t cs, float *dst) {
    if (el == CGI_EL_F32) {
        cgi_ukr_pack_b(u, k, n, b, rs, cs, dst);
        return;
    }
    for (int64_t j = 0; j < n; j += u->nr, dst += u->pnr * k)
        pack_panel_half(n - j < u->nr ? n - j : u->nr, u->pnr, k, (const uint16_t *)b + j * cs, cs, rs, dst, el);
}

void cgi_ukr_pack_b_half(const cgi_ukr *u, int64_t k, int64_t n, const uint16_t *b, int el, int64_t rs, int64_t cs,
                         float *dst) {
    pack_b_el(u, k, n, b, el, rs, cs, dst);
}
void cgi_ukr_pack_a_half(const cgi_ukr *u, int64_t m, int64_t k, const uint16_t *a, int el, int64_t rs, int64_t cs,
                         float *dst) {
    pack_a_el(u, m, k, a, el, rs, cs, dst);
}
#endif

/* The driver's blocking of a job: depth per pass (kc), C columns per packed B block (nc, whole
 * panels), C rows per packed A block (mc, whole panels), and their counts; pass and block sizes
 * balanced, so no thin remainder pass or block. A bf16 C is rounded once from the whole sum: each
 * block of C is summed over every pass into a float block (at most BLK_MC16 x BLK_NC, per thread)
 * first, so its A blocks are smaller. by_panel: A is packed a panel at a time (a_by_panel), so B is
 * one block over all of n wherever that fits in half of L2: each A panel is then used once. */
typedef struct {
    int64_t kc, nc, mc, passes, nblk, mblk;
} blk_sizes;
static blk_sizes blk_sizes_of(const cgi_ukr *u, int64_t m, int64_t n, int64_t k, bool c16, bool by_panel) {
    blk_sizes z;
    const int64_t mc_max = c16 ? BLK_MC16 : BLK_MC;
    z.passes = (k + BLK_KC - 1) / BLK_KC, z.kc = (k + z.passes - 1) / z.passes;
    const int64_t whole = (n + u->nr - 1) / u->nr * u->pnr * z.kc * (int64_t)sizeof(cg_real);
    z.nblk = by_panel && whole <= blk_wide_bytes ? 1 : (n + BLK_NC - 1) / BLK_NC;
    z.nc = ((n + z.nblk - 1) / z.nblk + u->nr - 1) / u->nr * u->nr;
    z.mblk = (m + mc_max - 1) / mc_max, z.mc = ((m + z.mblk - 1) / z.mblk + u->mr - 1) / u->mr * u->mr;
    return z;
}

/* A's block of rows jc.. (mc of them) and depths pc.. (kc), packed into dst */
static void pack_a_block(const cgi_ukr *u, const cgi_gemm_job *j, int64_t jc, int64_t pc, int64_t mc, int64_t kc,
                         cg_real *dst) {
#ifndef CGRAD_DOUBLE
    pack_a_el(u, mc, kc, ahead(j->a, jc * j->rsa + pc * j->csa, j->ta), j->ta, j->rsa, j->csa, dst);
#else
    cgi_ukr_pack_a(u, mc, kc, j->a + jc * j->rsa + pc * j->csa, j->rsa, j->csa, dst);
#endif
}

/* B's block of depths pc.. (kc) and columns ic.. (nb), packed into dst */
static void pack_b_block(const cgi_ukr *u, const cgi_gemm_job *j, int64_t pc, int64_t ic, int64_t kc, int64_t nb,
                         cg_real *dst) {
#ifndef CGRAD_DOUBLE
    pack_b_el(u, kc, nb, ahead(j->b, pc * j->rsb + ic * j->csb, j->tb), j->tb, j->rsb, j->csb, dst);
#else
    cgi_ukr_pack_b(u, kc, nb, j->b + pc * j->rsb + ic * j->csb, j->rsb, j->csb, dst);
#endif
}

enum { BLOCK_FREE, BLOCK_PACKING, BLOCK_READY };

/* Where a piece reads block idx of a shared pack (at `at` reals into its buffer) from: the shared
 * copy when it is ready, or when this piece claims it (*pack set: it packs the block there, then
 * marks it ready); NULL when another piece is packing it, and the piece packs its own copy: no
 * piece ever waits for another. */
static _Atomic long long shared_reads;
static cg_real *shared_block(const shared_pack *sh, int64_t idx, int64_t at, bool *pack) {
    int st = atomic_load_explicit(&sh->state[idx], memory_order_acquire);
    *pack = st == BLOCK_FREE && atomic_compare_exchange_strong_explicit(&sh->state[idx], &st, BLOCK_PACKING,
                                                                        memory_order_acquire, memory_order_acquire);
    if (st == BLOCK_READY) atomic_fetch_add_explicit(&shared_reads, 1, memory_order_relaxed);
    return *pack || st == BLOCK_READY ? sh->buf + at : NULL;
}

long long cgi_gemm_shared_reads(void) { return atomic_load(&shared_reads); }

/* Where a piece's block of A (a) or B goes: its place in the job's shared pack when the pack holds
 * that operand and the block is ready or claimed (shared_block), else the piece's own buffer. *fill:
 * the piece packs the block there (then block_filled). */
static cg_real *block_at(const shared_pack *sh, bool a, int64_t idx, int64_t at, cg_real *own, bool *fill) {
    cg_real *s = sh && sh->a == a ? shared_block(sh, idx, at, fill) : NULL;
    if (!s) *fill = true;
    return s ? s : own;
}

/* After a piece packed block idx at p: a shared block is ready for the other pieces. */
static void block_filled(const shared_pack *sh, int64_t idx, const cg_real *p, const cg_real *own) {
    if (p != own) atomic_store_explicit(&sh->state[idx], BLOCK_READY, memory_order_release);
}

/* Runs j through the driver above where it applies (see blk_init; C row-major, no dimension
 * below 32); false: the caller runs BLIS. A job with a half-precision operand or C (cgi_gemm_half)
 * always applies (any sizes, C row-major); false only without memory for the packs. sh: a
 * sharing team's pack of the operand the job's pieces do not cut (share_packs), or NULL. */
static bool gemm_blocked(const cgi_gemm_job *j, unsigned fl, const shared_pack *sh) {
    if (half_job(j) || (fl & F_CBF16)) pthread_once(&blk_once, blk_init);
    else if (!cgi_gemm_blocked_on() || j->csc != 1 || j->m < 32 || j->n < 32 || j->k < 32) return false;
    const cgi_ukr *u = &blk_ukr;
    const int64_t m = j->m, n = j->n, k = j->k;
    const bool c16 = fl & F_CBF16;
    const bool by_panel = a_by_panel(j, c16) && !(sh && sh->a);
    const blk_sizes z = blk_sizes_of(u, m, n, k, c16, by_panel);
    const int64_t kc0 = z.kc, nc0 = z.nc, mc0 = z.mc;
    pack_bufs *bufs = pack_bufs_get();
    if (!bufs) return false;
    const bool panels_only = by_panel && z.nblk == 1; /* A's own buffer holds one panel */
    cg_real *a_own = pack_buf_get(&bufs->a, cgi_ukr_packed_a(u, panels_only ? u->mr : m < mc0 ? m : mc0, kc0));
    cg_real *b_own = pack_buf_get(&bufs->b, cgi_ukr_packed_b(u, kc0, n < nc0 ? n : nc0));
    cg_real *acc = c16 ? pack_buf_get(&bufs->s, (size_t)((m < mc0 ? m : mc0) * (n < nc0 ? n : nc0))) : NULL;
    if (!a_own || !b_own || (c16 && !acc)) return false;
    /* a shared pack holds the whole operand: a pass's panels over all of m (A) or n (B) */
    const int64_t a_pass = (m + u->mr - 1) / u->mr * u->pmr, b_pass = (n + u->nr - 1) / u->nr * u->pnr;
    const cg_real *ap = a_own, *bp = b_own;
    for (int64_t jc = 0; jc < m; jc += mc0) {
        const int64_t mc = m - jc < mc0 ? m - jc : mc0;
        /* float C: the passes outermost, one packed A per pass; bf16 C: the passes innermost, into acc */
        for (int64_t o = 0; o < (c16 ? n : k); o += c16 ? nc0 : kc0)
            for (int64_t q = 0; q < (c16 ? k : n); q += c16 ? kc0 : nc0) {
                const int64_t pc = c16 ? q : o, ic = c16 ? o : q;
                const int64_t kc = k - pc < kc0 ? k - pc : kc0, nb = n - ic < nc0 ? n - ic : nc0;
                bool fill;
                panel_src ps = {j, jc, pc, a_own}, *panels = panels_only ? &ps : NULL;
                if (!panels && (c16 || ic == 0)) {
                    const int64_t idx = jc / mc0 * z.passes + pc / kc0;
                    cg_real *at = block_at(sh, true, idx, pc * a_pass + jc / u->mr * u->pmr * kc, a_own, &fill);
                    if (fill) pack_a_block(u, j, jc, pc, mc, kc, at), block_filled(sh, idx, at, a_own);
                    ap = at;
                }
                const int64_t idx = pc / kc0 * z.nblk + ic / nc0;
                cg_real *bt = block_at(sh, false, idx, pc * b_pass + ic / u->nr * u->pnr * kc, b_own, &fill);
                if (fill) pack_b_block(u, j, pc, ic, kc, nb, bt), block_filled(sh, idx, bt, b_own);
                bp = bt;
                blk_macro(u, mc, nb, kc, j->alpha, ap, bp, pc == 0 ? j->beta : 1,
                          pc == 0 && j->bias ? j->bias + ic * j->bias_stride : NULL, j->bias_stride,
                          j->relu && pc + kc >= k,
                          j->res && !c16 && pc + kc >= k ? j->res + jc * j->res_rs + ic : NULL, j->res_rs,
                          c16 ? acc : j->c + jc * j->rsc + ic, c16 ? nb : j->rsc, panels);
#ifndef CGRAD_DOUBLE
                for (int64_t r = 0; c16 && pc + kc >= k && r < mc; r++) /* the block's last pass: round it */
                    cgi_lp_round((cgi_bf16 *)j->c + (jc + r) * j->rsc + ic, acc + r * nb, nb, 1);
#endif
            }
    }
    return true;
}

/* CGRAD_TEAM_PACK=own: every piece packs its own copy of the uncut operand, for comparisons */
static bool team_pack_own(void) {
    static _Atomic int own = -1;
    int t = atomic_load_explicit(&own, memory_order_relaxed);
    if (t < 0) {
        const char *e = getenv("CGRAD_TEAM_PACK");
        t = e && !strcmp(e, "own");
        atomic_store_explicit(&own, t, memory_order_relaxed);
    }
    return t;
}

/* A sharing team's pieces each ran the whole product engine on their rows (or columns), so each
 * packed all of the operand it does not cut: a piece of L rows paid ~14/L more than its share.
 * Here a float job of the blocked driver cut into several pieces gets one shared pack of that
 * operand for the call (thread 0's buffer, grown once; at most SHARE_MAX reals a call), packed
 * block by block by whichever piece needs the block first (shared_block). The packs are copies,
 * so the bits are those of each piece packing its own. Sets sh[i] for each job (buf NULL: none)
 * and returns whether any job shares. */
enum { SHARE_MAX = 1 << 22 };
static bool share_packs(const cgi_gemm_job *jobs, int njobs, unsigned fl, const cgi_gemm_piece *pcs, int np, shared_pack *sh,
                        _Atomic int *states) {
    if (fl || !cgi_gemm_blocked_on() || team_pack_own()) return false;
    const cgi_ukr *u = &blk_ukr;
    int64_t off[SHARE_JOBS], total = 0, nstates = 0;
    for (int i = 0; i < njobs; i++) {
        const cgi_gemm_job *j = &jobs[i];
        sh[i] = (shared_pack){NULL, NULL, false};
        int pieces = 0;
        for (int q = 0; q < np; q++) pieces += pcs[q].job == i;
        if (pieces < 2 || half_job(j) || j->csc != 1 || j->m < 32 || j->n < 32 || j->k < 32) continue;
        const bool a = !cgi_gemm_cut_rows(j);
        const blk_sizes z = blk_sizes_of(u, j->m, j->n, j->k, false, !a && a_by_panel(j, false));
        const int64_t blocks = a ? z.mblk * z.passes : z.passes * z.nblk;
        const int64_t size = (int64_t)(a ? cgi_ukr_packed_a(u, j->m, j->k) : cgi_ukr_packed_b(u, j->k, j->n));
        if (nstates + blocks > SHARE_BLOCKS || total + size > SHARE_MAX) continue;
        for (int64_t b = 0; b < blocks; b++) atomic_init(&states[nstates + b], BLOCK_FREE);
        sh[i] = (shared_pack){NULL, states + nstates, a};
        off[i] = total;
        total += size, nstates += blocks;
    }
    pack_bufs *bufs = total ? pack_bufs_get() : NULL; /* a generation step's vector products: none */
    cg_real *buf = bufs ? pack_buf_get(&bufs->team, (size_t)total) : NULL;
    for (int i = 0; i < njobs; i++)
        if (sh[i].state) sh[i].buf = buf ? buf + off[i] : NULL;
    return buf != NULL;
}

#ifndef CGRAD_DOUBLE
/* sum_p a[p sa] b[p sb] in float: sixteen running sums when both are contiguous (they vectorise),
 * then the tail, then the sums in order; the same bits whatever the thread count */
static CGI_CLONES float dot_bf16(const cgi_bf16 *a, int64_t sa, const cgi_bf16 *b, int64_t sb, int64_t k) {
    float acc[16] = {0}, s = 0;
    int64_t p = 0;
    if (sa == 1 && sb == 1)
        for (; p + 16 <= k; p += 16)
            for (int l = 0; l < 16; l++) acc[l] += cgi_from_bf16(a[p + l]) * cgi_from_bf16(b[p + l]);
    for (; p < k; p++) s += cgi_from_bf16(a[p * sa]) * cgi_from_bf16(b[p * sb]);
    for (int l = 0; l < 16; l++) s += acc[l];
    return s;
}

/* acc[q] += s y[q], y widened: vectorises to a zero extension, a shift and an FMA */
static CGI_CLONES void axpy_bf16(float *restrict acc, float s, const cgi_bf16 *restrict y, int64_t n) {
    for (int64_t q = 0; q < n; q++) acc[q] += s * cgi_from_bf16(y[q]);
}

enum { LINE = 256 }; /* outputs of a line summed at a time, in float on the stack */

/* One line of C, len outputs at stride sc: out[q] = alpha sum_p x[p sx] y[p sy + q] (+ bias[q sbias],
 * else + beta out[q]). The one-token product when the other operand runs along the line (a weight
 * stored [in, out]): dot products down its columns read it one element per cache line, 5x slower in
 * bf16 generation than summing whole rows of it into LINE floats, one depth at a time. */
static void line_bf16(int64_t len, int64_t k, float alpha, const cgi_bf16 *x, int64_t sx, const cgi_bf16 *y, int64_t sy,
                      const float *bias, int64_t sbias, float beta, void *c, int64_t sc, bool c16) {
    float acc[LINE];
    for (int64_t q0 = 0; q0 < len; q0 += LINE) {
        const int64_t nq = len - q0 < LINE ? len - q0 : LINE;
        for (int64_t q = 0; q < nq; q++) acc[q] = 0;
        for (int64_t p = 0; p < k; p++) axpy_bf16(acc, cgi_from_bf16(x[p * sx]), y + p * sy + q0, nq);
        for (int64_t q = 0; q < nq; q++) {
            const float v = alpha * acc[q] + (bias ? bias[(q0 + q) * sbias] : 0);
            if (c16) ((cgi_bf16 *)c)[(q0 + q) * sc] = cgi_to_bf16(v);
            else {
                float *d = (float *)c + (q0 + q) * sc;
                *d = v + (!bias && beta != 0 ? beta * *d : 0);
            }
        }
    }
}

/* A bf16 job without packing: a single row or column of C (one token's products: packing the other
 * operand would cost as much as the product), k = 0, or packs that could not be had. */
static void gemm_bf16_direct(const cgi_gemm_job *j, unsigned fl) {
    const cgi_bf16 *a = (const cgi_bf16 *)j->a, *b = (const cgi_bf16 *)j->b;
    const bool c16 = fl & F_CBF16;
    if (j->k > 0 && j->m == 1 && j->csb == 1 && j->n > 1) { /* a row of C, B's rows along it */
        line_bf16(j->n, j->k, j->alpha, a, j->csa, b, j->rsb, j->bias, j->bias_stride, j->beta, j->c, j->csc, c16);
        return;
    }
    if (j->k > 0 && j->n == 1 && j->rsa == 1 && j->m > 1) { /* a column of C, A's columns along it */
        line_bf16(j->m, j->k, j->alpha, b, j->rsb, a, j->csa, j->bias, 0, j->beta, j->c, j->rsc, c16);
        return;
    }
    for (int64_t i = 0; i < j->m; i++)
        for (int64_t q = 0; q < j->n; q++) {
            float acc = j->k ? dot_bf16(a + i * j->rsa, j->csa, b + q * j->csb, j->rsb, j->k) : 0;
            acc = j->alpha * acc + (j->bias ? j->bias[q * j->bias_stride] : 0);
            if ((fl & F_CBF16)) ((cgi_bf16 *)j->c)[i * j->rsc + q * j->csc] = cgi_to_bf16(acc);
            else {
                float *d = j->c + i * j->rsc + q * j->csc;
                *d = acc + (!j->bias && j->beta != 0 ? j->beta * *d : 0);
            }
        }
}

/* Element i of operand p of type el, as float */
static inline float el_at(const void *p, int64_t i, int el) {
    return el == CGI_EL_F32 ? ((const float *)p)[i] : cgi_half_at(p, i, el);
}

/* acc[q] += s y[q] over floats */
static CGI_CLONES void axpy_f32(float *restrict acc, float s, const float *restrict y, int64_t n) {
    for (int64_t q = 0; q < n; q++) acc[q] += s * y[q];
}

/* line_bf16 for operands of any element types: each depth's run of y as float (widened into a
 * buffer on the stack when half), then the same sums in the same order. */
static void line_mixed(int64_t len, int64_t k, float alpha, const void *x, int tx, int64_t sx, const void *y, int ty,
                       int64_t sy, const float *bias, int64_t sbias, float beta, void *c, int64_t sc, bool c16) {
    float acc[LINE], run[LINE];
    for (int64_t q0 = 0; q0 < len; q0 += LINE) {
        const int64_t nq = len - q0 < LINE ? len - q0 : LINE;
        for (int64_t q = 0; q < nq; q++) acc[q] = 0;
        for (int64_t p = 0; p < k; p++) {
            const void *yr = ahead(y, p * sy + q0, ty != CGI_EL_F32);
            if (ty != CGI_EL_F32) widen_el(run, yr, nq, ty);
            axpy_f32(acc, el_at(x, p * sx, tx), ty != CGI_EL_F32 ? run : yr, nq);
        }
        for (int64_t q = 0; q < nq; q++) {
            const float v = alpha * acc[q] + (bias ? bias[(q0 + q) * sbias] : 0);
            if (c16) ((cgi_bf16 *)c)[(q0 + q) * sc] = cgi_to_bf16(v);
            else {
                float *d = (float *)c + (q0 + q) * sc;
                *d = v + (!bias && beta != 0 ? beta * *d : 0);
            }
        }
    }
}

/* sum_p a[p] b[p] over k contiguous elements of any types: runs of each widened to float on the
 * stack, then sixteen running sums as dot_bf16 keeps (they vectorise); the same bits whatever the
 * thread count. A one-token product whose weight rows run along the depth (x W^T) is all such dots. */
static CGI_CLONES float dot_mixed(const void *a, int ta, const void *b, int tb, int64_t k) {
    float acc[16] = {0}, s = 0, ra[LINE], rb[LINE];
    for (int64_t p0 = 0; p0 < k; p0 += LINE) {
        const int64_t n = k - p0 < LINE ? k - p0 : LINE;
        const float *x = ta == CGI_EL_F32 ? (const float *)a + p0 : ra, *y = tb == CGI_EL_F32 ? (const float *)b + p0 : rb;
        if (ta != CGI_EL_F32) widen_el(ra, (const uint16_t *)a + p0, n, ta);
        if (tb != CGI_EL_F32) widen_el(rb, (const uint16_t *)b + p0, n, tb);
        int64_t p = 0;
        for (; p + 16 <= n; p += 16)
            for (int l = 0; l < 16; l++) acc[l] += x[p + l] * y[p + l];
        for (; p < n; p++) s += x[p] * y[p];
    }
    for (int l = 0; l < 16; l++) s += acc[l];
    return s;
}

/* gemm_bf16_direct for operands of other element types (a float activation and a weight read in
 * place, an fp16 weight): the line products above, else one dot product per element. */
static void gemm_mixed_direct(const cgi_gemm_job *j, unsigned fl) {
    const bool c16 = fl & F_CBF16;
    if (j->k > 0 && j->m == 1 && j->csb == 1 && j->n > 1) {
        line_mixed(j->n, j->k, j->alpha, j->a, j->ta, j->csa, j->b, j->tb, j->rsb, j->bias, j->bias_stride, j->beta, j->c,
                   j->csc, c16);
        return;
    }
    if (j->k > 0 && j->n == 1 && j->rsa == 1 && j->m > 1) {
        line_mixed(j->m, j->k, j->alpha, j->b, j->tb, j->rsb, j->a, j->ta, j->csa, j->bias, 0, j->beta, j->c, j->rsc, c16);
        return;
    }
    for (int64_t i = 0; i < j->m; i++)
        for (int64_t q = 0; q < j->n; q++) {
            float acc = 0;
            if (j->csa == 1 && j->rsb == 1) /* both along the depth: widened runs */
                acc = dot_mixed(ahead(j->a, i * j->rsa, j->ta), j->ta, ahead(j->b, q * j->csb, j->tb), j->tb, j->k);
            else
                for (int64_t p = 0; p < j->k; p++)
                    acc += el_at(j->a, i * j->rsa + p * j->csa, j->ta) * el_at(j->b, p * j->rsb + q * j->csb, j->tb);
            acc = j->alpha * acc + (j->bias ? j->bias[q * j->bias_stride] : 0);
            if (c16) ((cgi_bf16 *)j->c)[i * j->rsc + q * j->csc] = cgi_to_bf16(acc);
            else {
                float *d = j->c + i * j->rsc + q * j->csc;
                *d = acc + (!j->bias && j->beta != 0 ? j->beta * *d : 0);
            }
        }
}

static void gemm_half_1(const cgi_gemm_job *j, unsigned fl) {
    if (j->m == 1 || j->n == 1 || j->k == 0 || j->csc != 1 || !gemm_blocked(j, fl, NULL)) {
        if (j->ta == CGI_EL_BF16 && j->tb == CGI_EL_BF16) gemm_bf16_direct(j, fl);
        else gemm_mixed_direct(j, fl);
        for (int64_t i = 0; j->relu && i < j->m; i++) /* as gemm1 after BLIS's product; float C only */
            for (int64_t q = 0; q < j->n; q++) {
                cg_real *v = j->c + i * j->rsc + q * j->csc;
                *v = *v > 0 ? *v : 0;
            }
        add_res(j);
    }
}

bool cgi_gemm_half(int64_t m, int64_t n, int64_t k, const void *a, int ta, int64_t rsa, int64_t csa, const void *b, int tb,
                   int64_t rsb, int64_t csb, float alpha, float beta, void *c, int64_t rsc, const float *bias, bool c_bf16,
                   int threads) {
    const cgi_gemm_job j = {.m = m, .n = n, .k = k, .a = a, .rsa = rsa, .csa = csa, .b = b, .rsb = rsb, .csb = csb,
                            .alpha = alpha, .beta = c_bf16 ? 0 : beta, .c = c, .rsc = rsc, .csc = 1, .bias = bias,
                            .bias_stride = 1, .ta = (uint8_t)ta, .tb = (uint8_t)tb};
    gemm_many(&j, 1, threads, c_bf16 ? F_CBF16 : 0, NULL);
    return true;
}

bool cgi_gemm_bf16(int64_t m, int64_t n, int64_t k, const uint16_t *a, int64_t rsa, int64_t csa, const uint16_t *b,
                   int64_t rsb, int64_t csb, float alpha, float beta, void *c, int64_t rsc, const float *bias, bool c_bf16,
                   int threads) {
    return cgi_gemm_half(m, n, k, a, CGI_EL_BF16, rsa, csa, b, CGI_EL_BF16, rsb, csb, alpha, beta, c, rsc, bias, c_bf16,
                         threads);
}
#else
static void gemm_half_1(const cgi_gemm_job *j, unsigned fl) { (void)j, (void)fl; }
bool cgi_gemm_half(int64_t m, int64_t n, int64_t k, const void *a, int ta, int64_t rsa, int64_t csa, const void *b, int tb,
                   int64_t rsb, int64_t csb, float alpha, float beta, void *c, int64_t rsc, const float *bias, bool c_bf16,
                   int threads) {
    return false;
}
bool cgi_gemm_bf16(int64_t m, int64_t n, int64_t k, const uint16_t *a, int64_t rsa, int64_t csa, const uint16_t *b,
                   int64_t rsb, int64_t csb, float alpha, float beta, void *c, int64_t rsc, const float *bias, bool c_bf16,
                   int threads) {
    return false;
}
#endif
