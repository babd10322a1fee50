/* SPDX-License-Identifier: MIT */
/* The per-run thread decision (graph/threads.c): a graph run whose estimated work is below
 * CGI_RUN_PAR_MIN keeps every op on one thread, since waking a second thread for each of its
 * small ops cost more than it saved (a cached generation step ran slower on 2 threads than on 1);
 * a larger run uses every thread; outside a run the count is the user's again. The work estimate
 * is checked against hand-counted multiply-adds. The team (graph/team.c): pieces and ranges,
 * its guard, naps, products, attention, generation and a small training step in a team; the ops
 * that share their work in a team are tested in test_threads_ops.c. */
#include <omp.h>
#include <stdatomic.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <stdint.h>
#include <unistd.h>

#include "../cgrad.h"
#include "check.h"
#include "graph/internal.h"
#include "ops/bf16_internal.h"
#include "team_check.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})

static int seen = -1; /* cgi_nthreads() as a kernel of the run sees it */

static void note_threads(cg_tensor *param, void *ctx) {
    (void)param, (void)ctx;
    seen = cgi_nthreads();
}

/* Forward and backward of mean(gelu(linear(x[rows, in], w[out, in]))); returns the run's work. */
static double run_linear_at(int64_t rows, int64_t in, int64_t out, cg_precision prec) {
    cg_params *ps = cg_params_new();
    cg_tensor *w = cg_params_add(ps, "w", 2, S(out, in));
    cg_rng r;
    cg_rng_seed(&r, 1);
    cg_fill_normal(w, &r, 0, 0.02);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    CHECK(cg_graph_set_precision(g, prec) == CG_OK, "%s", cg_last_error());
    cg_tensor *x = cg_input(g, "x", CG_REAL, 2, S(rows, in));
    cg_fill_normal(x, &r, 0, 1);
    cg_tensor *loss = cg_mean_all(g, cg_gelu_tanh(g, cg_linear(g, x, w, NULL)));
    cg_graph_on_grad_ready(g, note_threads, NULL);
    seen = -1;
    CHECK(cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "run: %s", cg_last_error());
    const double work = cgi_graph_work(g);
    cg_graph_free(g);
    cg_params_free(ps);
    return work;
}

static double run_linear(int64_t rows, int64_t in, int64_t out) { return run_linear_at(rows, in, out, CG_FP32); }

/* bf16 products (oneDNN opens its own OpenMP team) must follow the run's decision too, on product
 * kernel kn (1 oneDNN's; 2 the fp32 units'). Returns false when this CPU cannot run kernel kn. */
static bool test_bf16_products_follow_the_run(int kn) {
    if (kn == 1 && !cgi_lp_product(1, 1, 1, 1, (const cgi_bf16[]){0x3f80}, 1, 1, (const cgi_bf16[]){0x3f80}, 1, 1, 1, 0,
                                   (float[]){0}, 1, 1, NULL, false))
        return false;
    {
        cgi_lp_force_kernel = kn;
        cg_set_threads(2);
        cgi_lp_exec_threads = 0;
        run_linear_at(1, 256, 768, CG_BF16);
        CHECK(seen == 1 && cgi_lp_exec_threads == 1, "kernel %d: a one-token bf16 run gave its product %d threads (kernels %d)",
              kn, cgi_lp_exec_threads, seen);
        run_linear_at(4096, 512, 1024, CG_BF16);
        CHECK(seen == 2 && cgi_lp_exec_threads == 2, "kernel %d: a training-sized bf16 run gave its product %d threads", kn,
              cgi_lp_exec_threads);
        CHECK(omp_get_max_threads() == 2, "OpenMP's count left at %d", omp_get_max_threads());
        cg_set_threads(0);
    }
    cgi_lp_force_kernel = 0;
    return true;
}

static void test_work_estimate(void) {
    /* linear: rows * out * in; gelu: rows * out elements; mean: rows * out read */
    const double work = run_linear(1, 256, 768);
    CHECK(work == 1.0 * 256 * 768 + 768 + 768, "work %.0f", work);
}

static void test_small_runs_stay_on_one_thread(void) {
    cg_set_threads(2);
    /* one token through a gpt-tiny-sized product: far below the threshold */
    run_linear(1, 256, 768);
    CHECK(seen == 1, "a kernel of a %.0f-multiply-add run saw %d threads", 1.0 * 256 * 768, seen);
    CHECK(cgi_nthreads() == 2, "after the run: %d threads", cgi_nthreads());
    /* an uncached generation step of gpt-tiny (216 tokens): still one thread */
    const double mid = run_linear(216, 256, 3072);
    CHECK(mid < CGI_RUN_PAR_MIN && seen == 1, "a %.0f-multiply-add run saw %d threads", mid, seen);
    /* a training-sized product: every thread, as parallel regions per op */
    cgi_set_team_large(0);
    const double work = run_linear(4096, 512, 1024);
    CHECK(work > CGI_RUN_PAR_MIN, "work %.0f", work);
    CHECK(seen == 2, "a kernel of a %.0f-multiply-add run saw %d threads", work, seen);
    /* ... or (CGRAD_TEAM_LARGE) as one team span: the kernels run on thread 0, sharing pieces */
    cgi_set_team_large(1), cgi_team_wait_for_helpers(true);
    cgi_team_counts before, after;
    cgi_team_stats(&before);
    run_linear(4096, 512, 1024);
    cgi_team_stats(&after);
    CHECK(seen == 1 && after.runs_with_helpers > before.runs_with_helpers && after.helper_pieces > before.helper_pieces,
          "a team span's kernel saw %d threads, %lld runs with helpers, %lld pieces by helpers", seen,
          after.runs_with_helpers - before.runs_with_helpers, after.helper_pieces - before.helper_pieces);
    cgi_set_team_large(-1), cgi_team_wait_for_helpers(false);
    CHECK(cgi_run_threads(CGI_RUN_PAR_MIN / 2) == 1 && cgi_run_threads(CGI_RUN_PAR_MIN) == 2, "threshold");
    cg_set_threads(1);
    run_linear(4096, 512, 1024);
    CHECK(seen == 1, "one thread set: %d", seen);
    cg_set_threads(0);
}

/* ---- the team (graph/team.c): products shared across small runs ---- */

typedef struct {
    cg_tensor *w[3];
    cg_real *y; /* the last run's output, copied out */
    int runs;
    int64_t rows; /* tokens a run: 1 as a cached generation step, more as an uncached one */
} chain;

/* `runs` graph runs of `rows` tokens through three gpt-tiny-sized linears (768, 1024 and 256
 * outputs), the way a generation step streams its weights; the last output is kept. */
static cg_status chain_runs(void *ctx) {
    chain *c = ctx;
    cg_graph *g = cg_graph_new(CG_EVAL);
    cg_status st = CG_OK;
    for (int r = 0; r < c->runs && !st; r++) {
        cg_graph_reset(g);
        cg_tensor *x = cg_input(g, "x", CG_REAL, 2, S(c->rows, 256));
        for (int64_t i = 0; i < c->rows * 256; i++) cg_data(x)[i] = (cg_real)sin(0.37 * (double)i + r);
        cg_tensor *h = cg_gelu_tanh(g, cg_linear(g, x, c->w[0], NULL)); /* [rows, 768] */
        h = cg_linear(g, cg_slice(g, h, 1, 0, 256), c->w[1], NULL);    /* [rows, 1024] */
        h = cg_linear(g, h, c->w[2], NULL);                              /* [rows, 256] */
        if (!h || (st = cg_graph_forward(g))) break;
        memcpy(c->y, cg_data(h), (size_t)(c->rows * 256) * sizeof(cg_real));
    }
    cg_graph_free(g);
    return st ? st : g ? CG_OK : CG_ERR_NOMEM;
}

/* cgi_team_pieces on its own: every piece runs exactly once and is done when the call returns,
 * even when the helper that took it is slow (200 us a piece, against 20 on thread 0). */
typedef struct {
    _Atomic int count[8];
    _Atomic int by_helpers;
    int bad;
} piece_log;

static void busy(double seconds) {
    for (const double t0 = omp_get_wtime(); omp_get_wtime() - t0 < seconds;) {
    }
}

static void log_piece(void *ctx, int q) {
    piece_log *l = ctx;
    const bool helper = omp_get_thread_num() != 0;
    busy(helper ? 200e-6 : 20e-6);
    if (helper) atomic_fetch_add(&l->by_helpers, 1);
    atomic_fetch_add(&l->count[q], 1);
}

static cg_status pieces_tasks(void *ctx) {
    piece_log *l = ctx;
    for (int task = 0; task < 40; task++) {
        for (int q = 0; q < 8; q++) atomic_store(&l->count[q], 0);
        cgi_team_pieces(log_piece, l, 8);
        for (int q = 0; q < 8; q++)
            if (atomic_load(&l->count[q]) != 1) l->bad++;
        busy(20e-6); /* the graph's other ops */
    }
    return CG_OK;
}

static void test_team_pieces(void) {
    cgi_team_set_guard(CGI_TEAM_GUARD_ON);
    cgi_team_wait_for_helpers(true); /* else a loaded machine may keep the helpers switched out */
    cg_set_threads(2);
    piece_log l = {.bad = 0};
    cgi_team_counts before, after;
    cgi_team_stats(&before);
    int spans = 0;
    for (; spans < 100 && !atomic_load(&l.by_helpers); spans++)
        CHECK(cg_run_with_team(pieces_tasks, &l) == CG_OK, "%s", cg_last_error());
    cgi_team_stats(&after);
    CHECK(l.bad == 0, "%d pieces were not done exactly once when cgi_team_pieces returned", l.bad);
    CHECK(atomic_load(&l.by_helpers) > 0, "the helper took no piece in 100 spans");
    /* the stats count every shared piece (and thread 0's tail wait, which a loaded machine can hide) */
    CHECK(after.pieces - before.pieces == 8 * 40 * (long long)spans && after.wait_ns >= before.wait_ns,
          "%lld shared pieces in %d spans of 40 tasks of 8", after.pieces - before.pieces, spans);
    cgi_team_set_guard(CGI_TEAM_GUARD_AUTO);
    cgi_team_wait_for_helpers(false);
    cg_set_threads(0);
}

/* cgi_par_ranges: ranges that cover [0, n) once, shared with a team's helpers from
 * CGI_TEAM_PART_MIN elements of work, whole on thread 0 below it and outside a team on one thread. */
enum { RANGE_N = 999 };
typedef struct {
    _Atomic int count[RANGE_N];
    _Atomic int by_helpers, calls;
    int64_t work;
    int bad, spans;
} range_log;

static void log_range(int64_t lo, int64_t hi, void *ctx) {
    range_log *l = ctx;
    atomic_fetch_add(&l->calls, 1);
    if (omp_get_thread_num() != 0) atomic_fetch_add(&l->by_helpers, 1);
    for (int64_t i = lo; i < hi; i++) atomic_fetch_add(&l->count[i], 1);
    busy(20e-6);
}

static cg_status ranges_tasks(void *ctx) {
    range_log *l = ctx;
    for (int task = 0; task < 20; task++) {
        for (int i = 0; i < RANGE_N; i++) atomic_store(&l->count[i], 0);
        cgi_par_ranges(RANGE_N, l->work, log_range, l);
        for (int i = 0; i < RANGE_N; i++)
            if (atomic_load(&l->count[i]) != 1) l->bad++;
    }
    l->spans++;
    return CG_OK;
}

static void test_team_ranges(void) {
    cgi_team_set_guard(CGI_TEAM_GUARD_ON);
    cgi_team_wait_for_helpers(true);
    cg_set_threads(2);
    range_log l = {.work = CGI_TEAM_PART_MIN};
    while (l.spans < 100 && !atomic_load(&l.by_helpers))
        CHECK(cg_run_with_team(ranges_tasks, &l) == CG_OK, "%s", cg_last_error());
    CHECK(l.bad == 0, "%d elements were not covered exactly once in a team", l.bad);
    CHECK(atomic_load(&l.by_helpers) > 0, "the helper took no range in %d spans", l.spans);
    range_log small = {.work = CGI_TEAM_PART_MIN - 1};
    CHECK(cg_run_with_team(ranges_tasks, &small) == CG_OK, "%s", cg_last_error());
    CHECK(small.bad == 0 && atomic_load(&small.calls) == 20 && atomic_load(&small.by_helpers) == 0,
          "below CGI_TEAM_PART_MIN: %d bad, %d calls (want 20, all on thread 0)", small.bad, atomic_load(&small.calls));
    cgi_team_set_guard(CGI_TEAM_GUARD_AUTO);
    cgi_team_wait_for_helpers(false);
    cg_set_threads(1);
    range_log one = {.work = 1 << 24};
    ranges_tasks(&one);
    CHECK(one.bad == 0 && atomic_load(&one.calls) == 20, "one thread: %d bad, %d calls (want 20)", one.bad,
          atomic_load(&one.calls));
    cg_set_threads(0);
}

/* A thread's first team span under the automatic guard shares its first run: a short training run
 * (a benchmark's few steps) must not spend its first 2 + 6 runs probing without the helpers. */
static cg_status one_run(void *ctx) {
    cgi_team_run_begin();
    cgi_par_ranges(RANGE_N, ((range_log *)ctx)->work, log_range, ctx);
    cgi_team_run_end(1e6);
    return CG_OK;
}

static void test_team_guard_starts_sharing(void) {
    cg_set_threads(2);
    cgi_team_set_guard(CGI_TEAM_GUARD_AUTO); /* a fresh guard */
    range_log l = {.work = CGI_TEAM_PART_MIN};
    cgi_team_counts before, after;
    cgi_team_stats(&before);
    CHECK(cg_run_with_team(one_run, &l) == CG_OK, "%s", cg_last_error());
    cgi_team_stats(&after);
    CHECK(after.runs_with_helpers - before.runs_with_helpers == 1 && after.runs_without == before.runs_without,
          "a fresh guard's first run: %lld with helpers, %lld without", after.runs_with_helpers - before.runs_with_helpers,
          after.runs_without - before.runs_without);
    cgi_team_set_guard(CGI_TEAM_GUARD_AUTO);
    cg_set_threads(0);
}


/* Between two tasks thread 0 runs 5 ms alone (a loss, an optimizer's small updates): in a large
 * run's span the helper keeps spinning and yielding, where it napped 200 us at a time after 2 ms and
 * took the next task up to a nap late; a generation span's helper (not large) still naps. */
static void two_tasks_apart(void *ctx, int q) {
    (void)ctx, (void)q;
    busy(20e-6);
}

static cg_status tasks_apart(void *ctx) {
    cgi_team_pieces(two_tasks_apart, NULL, 4);
    busy(*(const double *)ctx); /* thread 0 alone, seconds */
    cgi_team_pieces(two_tasks_apart, NULL, 4);
    return CG_OK;
}

static void test_team_large_never_naps(void) {
    const double alone = 5e-3;
    cg_set_threads(2);
    cgi_set_team_large(1), cgi_cores_force(0); /* a busy machine must not keep the run on one thread */
    cgi_team_counts before;
    cgi_team_stats(&before);
    for (int run = 0; run < 5; run++)
        CHECK(cgi_run_graph(cgi_run_par_min(), true, tasks_apart, (void *)&alone) == CG_OK, "%s", cg_last_error());
    cgi_team_counts d = team_delta(&before);
    CHECK(d.pieces == 40 && d.naps == 0,
          "large spans: %lld pieces shared (want 40), the helper napped %lld times", d.pieces, d.naps);
    /* a nap needs the helper back on a core after 2 ms idle and before the next task: beside other
     * processes a yielding helper may stay switched out through 5 ms, and find the next task first.
     * Here thread 0 runs 30 ms alone, some time slices, up to 50 runs until the helper naps. */
    const double long_alone = 30e-3;
    cgi_team_set_guard(CGI_TEAM_GUARD_ON);
    cgi_team_stats(&before);
    int runs = 0;
    for (d = team_delta(&before); runs < 50 && d.naps == 0; runs++, d = team_delta(&before))
        CHECK(cg_run_with_team(tasks_apart, (void *)&long_alone) == CG_OK, "%s", cg_last_error());
    CHECK(d.pieces == 8 * runs && d.naps > 0,
          "generation's spans: %lld pieces shared in %d runs (want %d), the helper napped %lld times", d.pieces, runs,
          8 * runs, d.naps);
    cgi_team_set_guard(CGI_TEAM_GUARD_AUTO);
    cgi_set_team_large(-1), cgi_cores_force(-1);
    cg_set_threads(0);
}

/* Products in a team: matrix-vector (rows 1) and matrix (rows 96: every product over 2^23
 * multiply-adds, so cut as outside a team) alike give one thread's bits, and the helpers take
 * pieces of them. */
static void test_team_products_match_one_thread(int64_t rows) {
    cg_params *ps = cg_params_new();
    chain c = {{cg_params_add(ps, "w0", 2, S(768, 256)), cg_params_add(ps, "w1", 2, S(1024, 256)),
                cg_params_add(ps, "w2", 2, S(256, 1024))},
               NULL, rows > 1 ? 10 : 60, rows};
    cg_rng r;
    cg_rng_seed(&r, 3);
    for (int i = 0; i < 3; i++) cg_fill_normal(c.w[i], &r, 0, 0.05);
    enum { MAX_ROWS = 96 };
    CHECK(rows <= MAX_ROWS, "rows %lld", (long long)rows);
    static cg_real one[MAX_ROWS * 256], team[MAX_ROWS * 256];
    const int n = (int)rows * 256;
    cg_set_threads(1);
    c.y = one;
    CHECK(cg_run_with_team(chain_runs, &c) == CG_OK, "%s", cg_last_error());
    /* helpers always on: they must take pieces, and the result must not depend on who did which */
    cgi_team_set_guard(CGI_TEAM_GUARD_ON);
    cgi_team_wait_for_helpers(true); /* else a loaded machine may keep the helpers switched out */
    cg_set_threads(2);
    c.y = team;
    long long pieces = 0;
    for (int attempt = 0; attempt < 100 && pieces == 0; attempt++) { /* a loaded machine may keep a helper asleep */
        cgi_team_counts before;
        cgi_team_stats(&before);
        CHECK(cg_run_with_team(chain_runs, &c) == CG_OK, "%s", cg_last_error());
        pieces = team_delta(&before).helper_pieces;
        int diff = -1;
        for (int i = 0; i < n && diff < 0; i++)
            if (memcmp(&one[i], &team[i], sizeof one[i])) diff = i;
        CHECK(diff < 0, "rows %lld: team output %d: %.9g, one thread %.9g", (long long)rows, diff,
              diff < 0 ? 0 : team[diff], diff < 0 ? 0 : one[diff]);
    }
    CHECK(pieces > 0, "rows %lld: the helpers took no piece in 100 spans of %d runs", (long long)rows, c.runs);
    cgi_team_set_guard(CGI_TEAM_GUARD_AUTO);
    cgi_team_wait_for_helpers(false);
    cg_set_threads(0);
    cg_params_free(ps);
}

/* Attention of one query row (a cached generation step) as a team's pieces, one head each: the
 * same bits as on one thread, and the values of a double-precision softmax. Key lengths 37 and 200
 * fit one key block (probabilities kept); 300 takes the online softmax over two blocks. */
enum { AH = 4, AD = 64, AMAX = 300 };
typedef struct {
    int64_t tk;
    const cg_real *q, *k, *v;
    cg_real *y;
    int runs;
} attn_case;

static cg_status attention_runs(void *ctx) {
    attn_case *a = ctx;
    cg_graph *g = cg_graph_new(CG_EVAL);
    cg_status st = g ? CG_OK : CG_ERR_NOMEM;
    for (int r = 0; r < a->runs && !st; r++) {
        cg_graph_reset(g);
        cg_tensor *q = cg_wrap(g, "q", CG_REAL, 4, S(1, AH, 1, AD), NULL, (void *)a->q);
        cg_tensor *k = cg_wrap(g, "k", CG_REAL, 4, S(1, AH, a->tk, AD), NULL, (void *)a->k);
        cg_tensor *v = cg_wrap(g, "v", CG_REAL, 4, S(1, AH, a->tk, AD), NULL, (void *)a->v);
        cg_tensor *o = cg_contiguous(g, cg_sdpa(g, q, k, v, 0.125, true, NULL));
        if (!o || (st = cg_graph_forward(g))) break;
        memcpy(a->y, cg_data(o), AH * AD * sizeof(cg_real));
    }
    cg_graph_free(g);
    return st;
}

static void test_team_attention(void) {
    static cg_real q[AH * AD], k[AH * AMAX * AD], v[AH * AMAX * AD];
    for (int i = 0; i < AH * AD; i++) q[i] = (cg_real)sin(0.71 * i);
    for (int i = 0; i < AH * AMAX * AD; i++) k[i] = (cg_real)cos(0.13 * i), v[i] = (cg_real)sin(0.29 * i + 1);
    const int64_t lens[3] = {37, 200, AMAX};
    for (int c = 0; c < 3; c++) {
        const int64_t tk = lens[c];
        cg_real one[AH * AD], team[AH * AD];
        /* k and v hold AMAX keys per head: the first tk of each head are the case's keys */
        static cg_real kc[AH * AMAX * AD], vc[AH * AMAX * AD];
        for (int h = 0; h < AH; h++) {
            memcpy(kc + h * tk * AD, k + h * AMAX * AD, (size_t)(tk * AD) * sizeof(cg_real));
            memcpy(vc + h * tk * AD, v + h * AMAX * AD, (size_t)(tk * AD) * sizeof(cg_real));
        }
        attn_case a = {tk, q, kc, vc, one, 1};
        cg_set_threads(1);
        CHECK(cg_run_with_team(attention_runs, &a) == CG_OK, "%s", cg_last_error());
        double worst = 0; /* against softmax(q k / 8) v in double */
        for (int h = 0; h < AH; h++) {
            double w[AMAX], mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j < tk; j++) {
                double dot = 0;
                for (int e = 0; e < AD; e++) dot += (double)q[h * AD + e] * kc[(h * tk + j) * AD + e];
                w[j] = dot / 8, mx = w[j] > mx ? w[j] : mx;
            }
            for (int64_t j = 0; j < tk; j++) sum += (w[j] = exp(w[j] - mx));
            for (int e = 0; e < AD; e++) {
                double o = 0;
                for (int64_t j = 0; j < tk; j++) o += w[j] / sum * vc[(h * tk + j) * AD + e];
                const double err = fabs(o - one[h * AD + e]);
                worst = err > worst ? err : worst;
            }
        }
        CHECK(worst < 1e-5, "Tk %lld: one thread is %.3g from the double-precision reference", (long long)tk, worst);
        cgi_team_set_guard(CGI_TEAM_GUARD_ON);
        cgi_team_wait_for_helpers(true); /* else a loaded machine may keep the helpers switched out */
        cg_set_threads(2);
        a.y = team, a.runs = 20;
        long long pieces = 0;
        for (int attempt = 0; attempt < 100 && pieces == 0; attempt++) {
            cgi_team_counts before;
            cgi_team_stats(&before);
            CHECK(cg_run_with_team(attention_runs, &a) == CG_OK, "%s", cg_last_error());
            pieces = team_delta(&before).helper_pieces;
            CHECK(!memcmp(one, team, sizeof one), "Tk %lld: attention in a team differs from one thread", (long long)tk);
        }
        CHECK(pieces > 0, "Tk %lld: the helpers took no head in 100 spans of 20 runs", (long long)tk);
        cgi_team_set_guard(CGI_TEAM_GUARD_AUTO);
        cgi_team_wait_for_helpers(false);
        cg_set_threads(0);
    }
}

/* A stall is a long wait after short pieces of thread 0's own, not a long wait after long ones. */
static void test_team_stall(void) {
    CHECK(cgi_team_stalled(500e-6, 10e-6), "a 500 us wait after 10 us pieces (a cached token's) is a stall");
    CHECK(!cgi_team_stalled(200e-6, 10e-6), "a 200 us wait is no stall");
    CHECK(!cgi_team_stalled(500e-6, 400e-6), "a 500 us wait after 400 us of thread 0's own pieces is an uneven split");
    CHECK(cgi_team_stalled(900e-6, 400e-6), "900 us after 400 us is a stall");
}

/* Sampled generation of a two-layer gpt-tiny: the same tokens on 1 thread, on 2 with the team's
 * helpers, and on 2 with the guard forced to rest them (which must happen after its first probe). */
static void test_team_generation(void) {
    cg_params *ps = cg_params_new();
    cg_model *m = cg_model_new(CG_ARCH_GPT2,
                               "{\"vocab_size\": 256, \"n_positions\": 64, \"n_embd\": 256, \"n_layer\": 2, \"n_head\": 4}", 0.0,
                               ps, 99);
    CHECK(m != NULL, "%s", cg_last_error());
    if (!m) return;
    enum { P = 8, N = 56 };
    const int32_t prompt[P] = {5, 17, 200, 3, 99, 42, 7, 128};
    const cg_sampling s = {1.0, 0, 0.0};
    int32_t ref[2][P + N], got[P + N];
    for (int cache = 0; cache < 2; cache++) {
        const int64_t n = cache ? N : 12;
        cg_set_threads(1);
        CHECK(cg_model_generate(m, prompt, P, n, &s, 11, cache, ref[cache]) == CG_OK, "%s", cg_last_error());
        const int modes[2] = {CGI_TEAM_GUARD_ON, CGI_TEAM_GUARD_FALLBACK};
        for (int k = 0; k < 2; k++) {
            cg_set_threads(2);
            cgi_team_set_guard(modes[k]);
            cgi_team_counts before;
            cgi_team_stats(&before);
            CHECK(cg_model_generate(m, prompt, P, n, &s, 11, cache, got) == CG_OK, "%s", cg_last_error());
            const cgi_team_counts d = team_delta(&before);
            int diff = -1;
            for (int i = 0; i < P + n && diff < 0; i++)
                if (got[i] != ref[cache][i]) diff = i;
            CHECK(diff < 0, "cache %d, guard %d: token %d is %d on 2 threads, %d on 1", cache, modes[k], diff,
                  diff < 0 ? 0 : got[diff], diff < 0 ? 0 : ref[cache][diff]);
            CHECK(d.runs_with_helpers + d.runs_without == n, "cache %d: %lld + %lld team runs for %lld tokens", cache,
                  d.runs_with_helpers, d.runs_without, (long long)n);
            if (modes[k] == CGI_TEAM_GUARD_ON)
                CHECK(d.runs_without == 0, "guard on: %lld runs rested the helpers", d.runs_without);
            else if (cache) /* one probe window with helpers, then rested for the rest */
                CHECK(d.runs_with_helpers <= 12 && d.runs_without >= 2 * d.runs_with_helpers,
                      "forced fallback: %lld runs with helpers, %lld without", d.runs_with_helpers, d.runs_without);
        }
    }
    cgi_team_set_guard(CGI_TEAM_GUARD_AUTO);
    cgi_team_wait_for_helpers(false);
    cg_set_threads(0);
    cg_model_free(m);
    cg_params_free(ps);
}

/* A small model's training step (below CGI_RUN_PAR_MIN, from CGI_RUN_TEAM_MIN) runs forward and
 * backward each as a team span (cgi_run_in_team): the helpers take pieces of its products, and
 * three AdamW steps give one thread's bits in every parameter. */
static void test_small_training_in_team(void) {
    enum { STEPS = 3, B = 12, T = 64 };
    cg_real *ref = NULL;
    int64_t span = 0;
    for (int threads = 1; threads <= 2; threads++) {
        cg_set_threads(threads);
        if (threads == 2) cgi_team_set_guard(CGI_TEAM_GUARD_ON), cgi_team_wait_for_helpers(true);
        cg_params *ps = cg_params_new();
        cg_model *m = cg_model_new(CG_ARCH_GPT2,
                                   "{\"vocab_size\": 65, \"n_positions\": 64, \"n_embd\": 128, \"n_layer\": 2, \"n_head\": 4}",
                                   0.0, ps, 7);
        cg_graph *g = cg_graph_new(CG_TRAIN);
        cg_model_graph mg;
        CHECK(m && g && cg_model_build(g, m, B, T, 0, &mg) == CG_OK, "%s", cg_last_error());
        if (!m || !g) return;
        const double work = cgi_graph_work(g);
        CHECK(work >= CGI_RUN_TEAM_MIN && work < CGI_RUN_PAR_MIN, "work %.0f: not a team run", work);
        CHECK(cgi_run_in_team(work) == (threads == 2), "%d threads: in team %d", threads, cgi_run_in_team(work));
        cg_rng r;
        cg_rng_seed(&r, 5);
        int32_t *ids = cg_idata(cg_model_graph_input(&mg, "input_ids")), *tg = cg_idata(cg_model_graph_input(&mg, "targets"));
        for (int i = 0; i < B * T; i++) ids[i] = (int32_t)(cg_rng_next(&r) % 65), tg[i] = (int32_t)(cg_rng_next(&r) % 65);
        cg_optim_config oc = cg_optim_defaults(CG_OPT_ADAMW);
        cg_optim *opt = cg_optim_new(ps, &oc);
        cgi_team_counts before;
        cgi_team_stats(&before);
        for (int k = 0; k < STEPS; k++) {
            cg_params_zero_grad(ps);
            CHECK(cg_graph_forward(g) == CG_OK && cg_graph_backward(g, mg.loss) == CG_OK &&
                      cg_optim_step(opt, 1e-3) == CG_OK, "step %d: %s", k, cg_last_error());
        }
        const cgi_team_counts d = team_delta(&before);
        if (threads == 2) {
            CHECK(d.runs_with_helpers == 2 * STEPS && d.runs_without == 0, "%lld team runs with helpers, %lld without for %d steps",
                  d.runs_with_helpers, d.runs_without, STEPS);
            CHECK(d.helper_pieces > 0, "the helpers took none of %lld pieces", d.pieces);
        } else CHECK(d.runs_with_helpers + d.runs_without == 0, "one thread opened %lld team runs", d.runs_with_helpers);
        span = cg_params_span(ps);
        const cg_real *v = cg_params_values(ps);
        if (threads == 1) {
            ref = malloc((size_t)span * sizeof *ref);
            if (ref) memcpy(ref, v, (size_t)span * sizeof *ref);
        } else if (ref) {
            int64_t diff = -1;
            for (int64_t i = 0; i < span && diff < 0; i++)
                if (memcmp(&v[i], &ref[i], sizeof *v)) diff = i;
            CHECK(diff < 0, "parameter %lld after %d steps: %.9g on 2 threads, %.9g on 1", (long long)diff, STEPS,
                  diff < 0 ? 0 : v[diff], diff < 0 ? 0 : ref[diff]);
        }
        cg_optim_free(opt);
        cg_graph_free(g);
        cg_model_free(m);
        cg_params_free(ps);
    }
    free(ref);
    cgi_team_set_guard(CGI_TEAM_GUARD_AUTO);
    cgi_team_wait_for_helpers(false);
    cg_set_threads(0);
}

/* `test_threads bf16` and `test_threads onednn` (their own ctest entries, skipped where they cannot
 * run): the bf16 products on the fp32 units (needs oneDNN) and on oneDNN's kernel (avx512_bf16). */
int main(int argc, char **argv) {
    unsetenv("CGRAD_RUN_PAR_MIN"); /* ctest sets 0 for the other tests: here the default is tested */
    const char *part = test_part(argc, argv), *why = cg_bf16_unavailable();
    if (!strcmp(part, "bf16") || !strcmp(part, "onednn")) {
        if (why) return test_skip(argv[0], why);
        if (!test_bf16_products_follow_the_run(!strcmp(part, "bf16") ? 2 : 1))
            return test_skip("test_threads onednn", "this CPU lacks avx512_bf16");
        TEST_END();
    }
    test_work_estimate();
    test_small_runs_stay_on_one_thread();
    test_team_pieces();
    test_team_large_never_naps();
    test_team_ranges();
    test_team_guard_starts_sharing();
    test_team_products_match_one_thread(1);
    test_team_products_match_one_thread(96);
    test_team_attention();
    test_team_stall();
    test_team_generation();
    test_small_training_in_team();
    TEST_END();
}
