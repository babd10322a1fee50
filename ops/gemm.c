/* SPDX-License-Identifier: MIT */
/* The product engine under matmul, linear and attention: strided products on BLIS's micro-kernel
 * (a transposed or sliced operand is passed as it lies in memory, never copied), cut into pieces
 * for the threads or a generation team; the register-transposing packs; cgrad's blocked driver,
 * which also runs bf16 operands widened as they are packed (cgi_gemm_bf16). BLIS itself always
 * runs single-threaded. The ops that use it are in ops/matmul.c. */
#include <blis.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "graph/internal.h"
#include "ops/bf16_internal.h"
#include "ops/half.h"

static void blis_ready(void);
/* How a job's C is stored (flags beside every job of a call; a and b have their types in the job,
 * cgi_gemm_job.ta and .tb): F_CBF16, C is bfloat16, rounded once from the float sum plus the bias
 * (beta 0). */
enum { F_CBF16 = 2 };
static bool gemm_blocked(const cgi_gemm_job *j, unsigned fl);
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

static void gemm1(const cgi_gemm_job *j, unsigned fl) {
    if (j->m == 0 || j->n == 0) return;
    if (half_job(j) || (fl & F_CBF16)) {
        gemm_half_1(j, fl);
        return;
    }
    if (gemm_blocked(j, 0)) return;
    gemm_blis(j);
    add_res(j);
    if (j->relu) /* after BLIS's product: a pass over this piece of C */
        for (int64_t i = 0; i < j->m; i++)
            for (int64_t q = 0; q < j->n; q++) {
                cg_real *v = j->c + i * j->rsc + q * j->csc;
                *v = *v > 0 ? *v : 0;
            }
}

/* Threads over products. BLIS always runs on one thread; a product is cut into pieces along the
 * longer side of C, which the threads take in turn. BLIS's own threads wait for each other in
 * spinning barriers several times per product: with another busy process on the machine (or on
 * SMT siblings) a waiting thread burns the time its partner needs, and 2-thread steps took 3-10x
 * as long as 1-thread ones. Pieces share no barrier, only the join at the region's end, and a
 * thread held up elsewhere simply takes fewer of them. The cost is packing the uncut operand
 * once per piece, under 3% of a piece's work at the sizes allowed below. */
enum { MAX_PIECES = 256 };
typedef struct {
    int job;
    int64_t lo, hi; /* the rows (cut_rows) or columns of C the piece computes */
} piece;

static bool cut_rows(const cgi_gemm_job *j) { return j->m >= j->n; }

/* How many pieces job j can be cut into: at most want, each with at least 2^23 multiply-adds (a
 * matrix-vector product: 2^16) and 32 rows or columns (vector: 256 elements). A [64, 256] x
 * [256, 768] product (12.6M) took as long on two threads as on one here, a [128, 256] one 1.28x
 * less: below some 8M a piece, packing and waking the other thread eat the gain. A team's helpers
 * (graph/team.c) are awake already: there a vector piece of 64 outputs (2^15 multiply-adds, 128 kB
 * of gpt-tiny's weights, ~5 us) pays, and a matrix piece of 2^20 (~10 us): a small model's whole
 * training step runs in a team (cgi_run_in_team), and nanoGPT's [768, 128] x [128, 128] projections
 * (12.6M) stayed whole at 2^23. Uncached gpt-tiny generation (steps of 16-216 rows, 89% in products)
 * ran 171-173 tokens/s on two threads with matrix products whole, as on one, and 229-236 with them cut. */
static int pieces_of(const cgi_gemm_job *j, int want, bool team) {
    const int64_t len = cut_rows(j) ? j->m : j->n;
    const bool vec = j->m == 1 || j->n == 1;
    const double work = (double)j->m * (double)j->n * (double)j->k;
    const double min_work = vec ? (team ? 1 << 15 : 1 << 16) : team ? 1 << 20 : 1 << 23;
    const int64_t min_len = vec ? (team ? 64 : 256) : 32;
    int p = want;
    while (p > 1 && (work / p < min_work || len / p < min_len)) p--;
    return p;
}

/* p advanced by `by` elements of a job's operand: floats (CGI_EL_F32, or a float C), or half
 * precision (CGI_EL_BF16 / CGI_EL_F16, or a bf16 C) */
static const void *ahead(const void *p, int64_t by, bool half) {
    return (const char *)p + by * (half ? (int64_t)sizeof(uint16_t) : (int64_t)sizeof(cg_real));
}

static void run_piece(const cgi_gemm_job *jobs, const piece *pc, unsigned fl) {
    cgi_gemm_job j = jobs[pc->job];
    if (cut_rows(&j)) {
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
    gemm1(&j, fl);
}

/* Extra pieces after the products' (cgi_gemm_many_then): task(ctx, i) for i < n. */
typedef struct {
    void (*task)(void *ctx, int i);
    void *ctx;
    int n;
} extra_tasks;

typedef struct {
    const cgi_gemm_job *jobs;
    const piece *pcs;
    unsigned fl;
    int np;               /* product pieces; pieces from np are the extra tasks */
    const extra_tasks *ex;
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
    if (q < t->np) run_piece(t->jobs, &t->pcs[q], t->fl);
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

static void trace_print(const cgi_gemm_job *jobs, int njobs, const piece *pcs, int np, int n, double (*tr)[4], double wall) {
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

/* A job's pieces inside a team, at most: tapered, half for thread 0 and two quarters, the second
 * to whichever thread is free first. Each piece is one stream through a slab of the weight, and
 * short streams lose to the hardware prefetcher's ramp and the claims' cache-line traffic: cached
 * gpt-tiny generation on two threads read 2122-2169 tokens/s with up to 16 pieces against
 * 2487-2510 with 3 (2459-2503 with 2: nothing left for the faster thread to balance with).
 * Matrix products (uncached generation) read the same at 3, 4, 6 and 8 pieces: 3 serves both. */
enum { TEAM_PIECES = 3 };

/* Inside a team a matrix-vector product's pieces taper: the first half weigh 2, the rest 1. Pieces
 * are claimed in order, so the last ones are the small ones, and the thread that finishes first
 * waits for at most a small piece of the other's (the tail wait, ~100 us of a two-thread token with
 * even pieces). The same holds outside a team. A team's matrix products are cut finer to the end
 * (guided_pieces below). Either way the cuts fall on multiples of 32 rows: the same bits.
 * CGRAD_TEAM_SPLIT=taper cuts a team's matrix products as its vectors, =even cuts every product
 * into even pieces, for comparisons. */
enum { SPLIT_EVEN, SPLIT_TAPER, SPLIT_GUIDED };
static _Atomic int split = -1; /* any thread that cuts a product reads it */
static int team_split(void) {
    int t = atomic_load_explicit(&split, memory_order_relaxed);
    if (t < 0) {
        const char *e = getenv("CGRAD_TEAM_SPLIT");
        t = e && !strcmp(e, "even") ? SPLIT_EVEN : e && !strcmp(e, "taper") ? SPLIT_TAPER : SPLIT_GUIDED;
        atomic_store_explicit(&split, t, memory_order_relaxed);
    }
    return t;
}

void cgi_gemm_set_split(const char *mode) {
    atomic_store(&split, !mode ? -1 : !strcmp(mode, "even") ? SPLIT_EVEN : !strcmp(mode, "taper") ? SPLIT_TAPER : SPLIT_GUIDED);
}

/* The weight of pieces [0, q) of p tapered pieces (of p + p / 2 in all). */
static int64_t cut_weight(int q, int p) { return q + (q < p / 2 ? q : p / 2); }

/* Guided pieces for a team's matrix products: each piece takes half the work left over all the
 * jobs (thread 0 claims the first, half of everything), down to a floor, so the pieces shrink to
 * the end and the thread that runs out first waits at most for one floor-sized piece. A piece
 * repacks the operand it does not cut (~12-16 multiply-adds per element on one thread here), so a
 * piece of L rows costs ~14/L more than its share: the floor is 256 rows (or columns; 1/8 of a
 * shorter job) and 2^20 multiply-adds, but at most the tapered cut's smallest piece (a quarter of 3
 * pieces: an uncached generation step's products of 16 rows stay at 3 pieces), at least 32. The jobs with the shortest cut side go first,
 * whole or in large pieces: a linear's dW (k the batch's rows) repacks 1M elements per piece in a
 * gpt-tiny step, its dX only the weight. Cuts fall on multiples of 32 from each job's start, as the
 * tapered ones: the same bits. Returns the pieces written to pcs (at most max), or -1: not all
 * matrix products, or too many pieces. */
enum { GUIDED_FLOOR = 256 };
static int guided_pieces(const cgi_gemm_job *jobs, int njobs, int threads, piece *pcs, int max) {
    int order[MAX_PIECES], n = 0;
    double left = 0;
    for (int i = 0; i < njobs; i++) {
        const cgi_gemm_job *j = &jobs[i];
        if (j->m == 0 || j->n == 0) continue;
        if (j->m == 1 || j->n == 1 || n == MAX_PIECES) return -1;
        const int64_t len = cut_rows(j) ? j->m : j->n;
        int at = n++; /* insertion by cut length, stable */
        while (at > 0) {
            const cgi_gemm_job *o = &jobs[order[at - 1]];
            if ((cut_rows(o) ? o->m : o->n) <= len) break;
            order[at] = order[at - 1], at--;
        }
        order[at] = i;
        left += (double)j->m * (double)j->n * (double)j->k;
    }
    int np = 0;
    for (int o = 0; o < n; o++) {
        const int i = order[o];
        const cgi_gemm_job *j = &jobs[i];
        const int64_t len = cut_rows(j) ? j->m : j->n;
        const double per = (double)(cut_rows(j) ? j->n : j->m) * (double)j->k; /* multiply-adds per row or column */
        int64_t least = len / 8 < GUIDED_FLOOR ? len / 8 : GUIDED_FLOOR;
        const double min_rows = per > 0 ? (double)(1 << 20) / per : 0;
        if ((double)least < min_rows) least = (int64_t)min_rows + 1;
        /* never coarser than the tapered cut, whose smallest piece is a quarter (3 pieces) or a half */
        const int tapered = pieces_of(j, TEAM_PIECES, true);
        const int64_t smallest = tapered < 2 ? len : (tapered < 3 ? len / 2 : len / 4) / 32 * 32;
        if (least > smallest) least = smallest;
        least = least < 32 ? 32 : (least + 31) / 32 * 32;
        for (int64_t lo = 0; lo < len;) {
            int64_t take = per > 0 ? (int64_t)(left / threads / per) : len;
            take = (take + 31) / 32 * 32;
            if (take < least) take = least;
            if (len - lo - take < least) take = len - lo; /* no remnant below the floor */
            if (np == max) return -1;
            pcs[np++] = (piece){i, lo, lo + take};
            left -= per * (double)take;
            lo += take;
        }
    }
    return np;
}

/* Pieces for `threads` threads (0: a sharing team's, TEAM_PIECES a job), two a thread over all jobs
 * by work, each job's tapered 2:1 (the first half of its pieces twice the size of the rest). */
static int tapered_pieces(const cgi_gemm_job *jobs, int njobs, int threads, bool team, piece *pcs) {
    double total = 0;
    for (int i = 0; i < njobs; i++) total += (double)jobs[i].m * (double)jobs[i].n * (double)jobs[i].k;
    int np = 0;
    for (int i = 0; i < njobs; i++) {
        const cgi_gemm_job *j = &jobs[i];
        if (j->m == 0 || j->n == 0) continue;
        /* two pieces per thread over all jobs, shared by work */
        const double part = total > 0 ? (double)j->m * (double)j->n * (double)j->k / total : 1;
        int want = threads == 0 ? TEAM_PIECES : threads > 1 ? (int)(2 * threads * part + 0.5) : 1;
        if (want < 1) want = 1;
        if (want > MAX_PIECES - np - (njobs - 1 - i)) want = MAX_PIECES - np - (njobs - 1 - i);
        const int p = pieces_of(j, want, team);
        const int64_t len = cut_rows(j) ? j->m : j->n;
        /* on threads outside a team too: with 4 even pieces on 2 threads the thread that finishes
         * first waits up to a quarter of the product at the region's join (more when the other was
         * woken late); tapered 2:2:1:1, at most a sixth */
        const bool taper = threads != 1 && p > 2 && team_split() != SPLIT_EVEN;
        for (int q = 0; q < p; q++) {
            /* cut on multiples of 32 so each piece keeps whole micro-tiles */
            const int64_t c0 = taper ? cut_weight(q, p) : q, c1 = taper ? cut_weight(q + 1, p) : q + 1,
                          ct = taper ? cut_weight(p, p) : p;
            int64_t lo = q == 0 ? 0 : len * c0 / ct / 32 * 32, hi = q == p - 1 ? len : len * c1 / ct / 32 * 32;
            if (p > 1 && len < 32 * p) lo = len * q / p, hi = len * (q + 1) / p;
            if (hi > lo) pcs[np++] = (piece){i, lo, hi};
        }
    }
    return np;
}

/* The pieces of jobs for `threads` threads: a sharing team's (share) guided where they can be,
 * else tapered (a sharing team's TEAM_PIECES a job whatever threads says). */
static int cut_pieces(const cgi_gemm_job *jobs, int njobs, int threads, bool share, bool team, piece *pcs) {
    const int np = share && team_split() == SPLIT_GUIDED ? guided_pieces(jobs, njobs, threads, pcs, MAX_PIECES) : -1;
    return np >= 0 ? np : tapered_pieces(jobs, njobs, share ? 0 : threads, team, pcs);
}

static void gemm_many(const cgi_gemm_job *jobs, int njobs, int threads, unsigned fl, const extra_tasks *ex) {
    blis_ready();
    /* Inside a team, products are cut into pieces of whole 32-row blocks while the helpers are
     * awake, and not at all while they rest or at one thread: a cut cost ~4% of a cached token on
     * one thread (1730-1747 -> 1616-1686 tokens/s). BLIS's sgemv runs its fused 8-row dot kernel
     * on row groups from the first row, and a matrix product's cut never splits the depth, so a
     * cut on multiples of 32 gives the same bits as the whole (test_threads checks the tokens at
     * 1 and 2 threads). */
    const bool team = cgi_team_on(), share = team && cgi_team_sharing();
    if (team || (threads > 1 && omp_in_parallel())) threads = 1; /* never nest a team inside a team */
    piece pcs[MAX_PIECES];
    const int np = cut_pieces(jobs, njobs, share ? cgi_team_threads() : threads, share, team, pcs);
    const int nx = ex ? ex->n : 0;
    if (share) { /* the extra tasks (a linear's bias sums) too: they ran on thread 0 alone after the products */
        double(*tr)[4] = team_trace() ? malloc((size_t)(np + nx) * sizeof *tr) : NULL; /* a diagnostic: off by default */
        const team_task task = {jobs, pcs, fl, np, ex, tr, tr ? omp_get_wtime() : 0};
        cgi_team_pieces(run_team_piece, (void *)&task, np + nx);
        if (tr) trace_print(jobs, njobs, pcs, np, np + nx, tr, omp_get_wtime() - task.t0);
        free(tr);
        return;
    }
    if (np <= 1 || threads <= 1) {
        for (int q = 0; q < np + nx; q++)
            if (q < np) run_piece(jobs, &pcs[q], fl);
            else ex->task(ex->ctx, q - np);
        return;
    }
    /* the extra tasks go last, to whichever thread runs out of product pieces first */
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads < np + nx ? threads : np + nx)
    for (int q = 0; q < np + nx; q++)
        if (q < np) run_piece(jobs, &pcs[q], fl);
        else ex->task(ex->ctx, q - np);
}

int cgi_gemm_team_cuts(const cgi_gemm_job *jobs, int njobs, int threads, int64_t (*cuts)[3], int max) {
    piece pcs[MAX_PIECES];
    const int np = cut_pieces(jobs, njobs, threads, true, true, pcs);
    if (np > max) return -1;
    for (int q = 0; q < np; q++) cuts[q][0] = pcs[q].job, cuts[q][1] = pcs[q].lo, cuts[q][2] = pcs[q].hi;
    return np;
}

void cgi_gemm_many(const cgi_gemm_job *jobs, int njobs, int threads) { gemm_many(jobs, njobs, threads, 0, NULL); }

void cgi_gemm_many_then(const cgi_gemm_job *jobs, int njobs, int threads, void (*task)(void *ctx, int i), void *ctx,
                        int ntasks) {
    const extra_tasks ex = {task, ctx, ntasks};
    gemm_many(jobs, njobs, threads, 0, &ex);
}

void cgi_gemm(int64_t m, int64_t n, int64_t k, const cg_real *a, int64_t rsa, int64_t csa, const cg_real *b,
              int64_t rsb, int64_t csb, cg_real alpha, cg_real beta, cg_real *c, int64_t rsc, int64_t csc, int threads) {
    const cgi_gemm_job j = {m, n, k, a, rsa, csa, b, rsb, csb, alpha, beta, c, rsc, csc, NULL, 0, false, CGI_EL_F32, CGI_EL_F32, NULL, 0};
    cgi_gemm_many(&j, 1, threads);
}

/* ---- a transposing pack for BLIS's 12-wide panels ---- */

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

/* p[c * ldp + i] = kappa * a[i * inca + c] for rows i < rows (a multiple of 4) and depths c below
 * n rounded down to 8, in 4 x 8 register transposes; returns the depth where it stopped. */
__attribute__((target("avx2"))) static dim_t transpose_rows(const float *a, inc_t inca, dim_t n, dim_t rows,
                                                            float kappa, float *p, inc_t ldp) {
    const bool scaled = kappa != 1;
    const __m256 kv = _mm256_set1_ps(kappa);
    dim_t c = 0;
    for (; c + 8 <= n; c += 8)
        for (dim_t g = 0; g < rows / 4; g++) { /* rows 4g..4g+3, depths c..c+7 */
            const float *r = a + 4 * g * inca + c;
            __m256 r0 = _mm256_loadu_ps(r), r1 = _mm256_loadu_ps(r + inca), r2 = _mm256_loadu_ps(r + 2 * inca),
                   r3 = _mm256_loadu_ps(r + 3 * inca);
            if (scaled) {
                r0 = _mm256_mul_ps(r0, kv), r1 = _mm256_mul_ps(r1, kv);
                r2 = _mm256_mul_ps(r2, kv), r3 = _mm256_mul_ps(r3, kv);
            }
            const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1),
                         t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
            const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
                         u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
            float *d = p + c * ldp + 4 * g;
            _mm_storeu_ps(d, _mm256_castps256_ps128(u0));
            _mm_storeu_ps(d + ldp, _mm256_castps256_ps128(u1));
            _mm_storeu_ps(d + 2 * ldp, _mm256_castps256_ps128(u2));
            _mm_storeu_ps(d + 3 * ldp, _mm256_castps256_ps128(u3));
            _mm_storeu_ps(d + 4 * ldp, _mm256_extractf128_ps(u0, 1));
            _mm_storeu_ps(d + 5 * ldp, _mm256_extractf128_ps(u1, 1));
            _mm_storeu_ps(d + 6 * ldp, _mm256_extractf128_ps(u2, 1));
            _mm_storeu_ps(d + 7 * ldp, _mm256_extractf128_ps(u3, 1));
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
static void blis_ready(void) {
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
    blis_ready();
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

size_t cgi_ukr_packed_a(const cgi_ukr *u, int64_t m, int64_t k) { return (size_t)((m + u->mr - 1) / u->mr * u->pmr * k); }
size_t cgi_ukr_packed_b(const cgi_ukr *u, int64_t k, int64_t n) { return (size_t)((n + u->nr - 1) / u->nr * u->pnr * k); }

/* One panel: dst[p * w + i] = src[i * si + p * sp] for i < rows, zero for rows <= i < w. The loop
 * runs along whichever source stride is 1, so the reads are contiguous. */
static void pack_panel(int64_t rows, int64_t w, int64_t k, const cg_real *src, int64_t si, int64_t sp, cg_real *dst) {
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
 * may be partial: its missing rows are zero. */
enum { DB = 16 };
static void pack_across(int64_t w, int64_t count, int64_t k, const cg_real *src, int64_t sp, cg_real *dst) {
    for (int64_t p0 = 0; p0 < k; p0 += DB) {
        const int64_t p1 = k - p0 < DB ? k : p0 + DB;
        for (int64_t i = 0; i < count; i += w) {
            const int64_t rows = count - i < w ? count - i : w;
            cg_real *d = dst + i * k;
            const cg_real *sr = src + i;
            if (rows == 32 && w == 32) /* the tile widths here, as constants: the copies inline */
                for (int64_t p = p0; p < p1; p++) memcpy(d + p * 32, sr + p * sp, 32 * sizeof(cg_real));
            else if (rows == 12 && w == 12)
                for (int64_t p = p0; p < p1; p++) memcpy(d + p * 12, sr + p * sp, 12 * sizeof(cg_real));
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
        else pack_panel(rows, w, k, src + i * si, si, sp, dst);
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
} pack_bufs;
/* Each thread's packing buffers: grown once, then reused; freed when the thread ends. */
static pthread_key_t pack_key;
static bool pack_key_ok;

static void pack_bufs_free(void *v) {
    pack_bufs *b = v;
    free(b->a.p), free(b->b.p), free(b->s.p), free(b);
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
static void blk_init(void) {
    cgi_ukr_init(&blk_ukr);
    pack_key_ok = pthread_key_create(&pack_key, pack_bufs_free) == 0;
    const char *off = getenv("CGRAD_GEMM_BLIS"); /* set: BLIS's own driver for every product, for comparisons */
#ifdef CGI_PACK12
    blk_on = blk_ukr.swap && fast_transpose && !(off && *off);
#else
    (void)off;
    blk_on = false;
#endif
}
static pthread_once_t blk_once = PTHREAD_ONCE_INIT;

/* C[m, nb] (rows rsc, columns contiguous) = alpha A B + beta C, or alpha A B + the bias, from
 * packed A (12-row panels) and B (32-column panels) of depth kc: cgi_ukr_gemm strip by strip, one
 * A panel in L1 while the B panels stream past, the bias added (relu: and C clamped at 0; res, rows
 * rsr apart: added, on the last depth pass) while the strip is in cache, row by row. */
static void blk_macro(const cgi_ukr *u, int64_t m, int64_t nb, int64_t kc, cg_real alpha, const cg_real *ap,
                      const cg_real *bp, cg_real beta, const cg_real *bias, int64_t bs, bool relu, const cg_real *res,
                      int64_t rsr, cg_real *c, int64_t rsc) {
    for (int64_t i = 0; i < m; i += u->mr) {
        const int64_t mi = m - i < u->mr ? m - i : u->mr;
        cg_real *cr = c + i * rsc;
        cgi_ukr_gemm(u, mi, nb, kc, alpha, ap + i / u->mr * u->pmr * kc, kc, bp, kc, bias ? 0 : beta, cr, rsc, 1,
                     CGI_UKR_FULL, CGI_UKR_FULL);
        for (int64_t r = 0; (bias || relu || res) && r < mi; r++) {
            cg_real *row = cr + r * rsc;
            if (bias) cgi_add_bias_row(row, bias, bs, nb);
            if (res) cgi_add_bias_row(row, res + (i + r) * rsr, 1, nb);
            if (relu) /* as cg_relu: NaN to 0 */
                for (int64_t jj = 0; jj < nb; jj++) row[jj] = row[jj] > 0 ? row[jj] : 0;
        }
    }
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
            pack_panel(rows, w, dk, tmp, WD, 1, dst + p0 * w);
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

/* Runs j through the driver above where it applies (see blk_init; C row-major, no dimension
 * below 32); false: the caller runs BLIS. A job with a half-precision operand or C (cgi_gemm_half)
 * always applies (any sizes, C row-major); false only without memory for the packs. */
static bool gemm_blocked(const cgi_gemm_job *j, unsigned fl) {
    if (half_job(j) || (fl & F_CBF16)) pthread_once(&blk_once, blk_init);
    else if (!cgi_gemm_blocked_on() || j->csc != 1 || j->m < 32 || j->n < 32 || j->k < 32) return false;
    const cgi_ukr *u = &blk_ukr;
    const int64_t m = j->m, n = j->n, k = j->k;
    /* A bf16 C is rounded once from the whole sum: each block of C is summed over every pass into a
     * float block (at most BLK_MC16 x BLK_NC, per thread) first, so A blocks are smaller */
    const bool c16 = fl & F_CBF16;
    const int64_t mc_max = c16 ? BLK_MC16 : BLK_MC;
    /* pass and block sizes balanced, so no thin remainder pass or block */
    const int64_t passes = (k + BLK_KC - 1) / BLK_KC, kc0 = (k + passes - 1) / passes;
    const int64_t nblk = (n + BLK_NC - 1) / BLK_NC, nc0 = ((n + nblk - 1) / nblk + u->nr - 1) / u->nr * u->nr;
    const int64_t mblk = (m + mc_max - 1) / mc_max, mc0 = ((m + mblk - 1) / mblk + u->mr - 1) / u->mr * u->mr;
    pack_bufs *bufs = pack_bufs_get();
    if (!bufs) return false;
    cg_real *ap = pack_buf_get(&bufs->a, cgi_ukr_packed_a(u, m < mc0 ? m : mc0, kc0));
    cg_real *bp = pack_buf_get(&bufs->b, cgi_ukr_packed_b(u, kc0, n < nc0 ? n : nc0));
    cg_real *acc = c16 ? pack_buf_get(&bufs->s, (size_t)((m < mc0 ? m : mc0) * (n < nc0 ? n : nc0))) : NULL;
    if (!ap || !bp || (c16 && !acc)) return false;
    for (int64_t jc = 0; jc < m; jc += mc0) {
        const int64_t mc = m - jc < mc0 ? m - jc : mc0;
        /* float C: the passes outermost, one packed A per pass; bf16 C: the passes innermost, into acc */
        for (int64_t o = 0; o < (c16 ? n : k); o += c16 ? nc0 : kc0)
            for (int64_t q = 0; q < (c16 ? k : n); q += c16 ? kc0 : nc0) {
                const int64_t pc = c16 ? q : o, ic = c16 ? o : q;
                const int64_t kc = k - pc < kc0 ? k - pc : kc0, nb = n - ic < nc0 ? n - ic : nc0;
                if (c16 || ic == 0) {
#ifndef CGRAD_DOUBLE
                    pack_a_el(u, mc, kc, ahead(j->a, jc * j->rsa + pc * j->csa, j->ta), j->ta, j->rsa, j->csa, ap);
#else
                    cgi_ukr_pack_a(u, mc, kc, j->a + jc * j->rsa + pc * j->csa, j->rsa, j->csa, ap);
#endif
                }
#ifndef CGRAD_DOUBLE
                pack_b_el(u, kc, nb, ahead(j->b, pc * j->rsb + ic * j->csb, j->tb), j->tb, j->rsb, j->csb, bp);
#else
                cgi_ukr_pack_b(u, kc, nb, j->b + pc * j->rsb + ic * j->csb, j->rsb, j->csb, bp);
#endif
                blk_macro(u, mc, nb, kc, j->alpha, ap, bp, pc == 0 ? j->beta : 1,
                          pc == 0 && j->bias ? j->bias + ic * j->bias_stride : NULL, j->bias_stride,
                          j->relu && pc + kc >= k,
                          j->res && !c16 && pc + kc >= k ? j->res + jc * j->res_rs + ic : NULL, j->res_rs,
                          c16 ? acc : j->c + jc * j->rsc + ic, c16 ? nb : j->rsc);
#ifndef CGRAD_DOUBLE
                for (int64_t r = 0; c16 && pc + kc >= k && r < mc; r++) /* the block's last pass: round it */
                    cgi_lp_round((cgi_bf16 *)j->c + (jc + r) * j->rsc + ic, acc + r * nb, nb, 1);
#endif
            }
    }
    return true;
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
    if (j->m == 1 || j->n == 1 || j->k == 0 || j->csc != 1 || !gemm_blocked(j, fl)) {
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
    const cgi_gemm_job j = {m, n, k, a, rsa, csa, b, rsb, csb, alpha, c_bf16 ? 0 : beta, c, rsc, 1, bias, 1, false,
                            (uint8_t)ta, (uint8_t)tb, NULL, 0};
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
