/* The per-run thread decision (graph/threads.c): a graph run whose estimated work is below
 * CGI_RUN_PAR_MIN keeps every op on one thread, since waking a second thread for each of its
 * small ops cost more than it saved (a cached generation step ran slower on 2 threads than on 1);
 * a larger run uses every thread; outside a run the count is the user's again. The work estimate
 * is checked against hand-counted multiply-adds. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "../cgrad.h"
#include "check.h"
#include "graph/internal.h"
#include "ops/bf16_internal.h"

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

/* oneDNN's bf16 products open their own OpenMP team: it must follow the run's decision too */
static void test_bf16_products_follow_the_run(void) {
    const char *why = cg_bf16_unavailable();
    if (why) {
        printf("test_threads: skipping the bf16 check: %s\n", why);
        return;
    }
    cg_set_threads(2);
    cgi_lp_exec_threads = 0;
    run_linear_at(1, 256, 768, CG_BF16);
    CHECK(seen == 1 && cgi_lp_exec_threads == 1, "a one-token bf16 run gave oneDNN %d threads (kernels %d)",
          cgi_lp_exec_threads, seen);
    run_linear_at(4096, 512, 1024, CG_BF16);
    CHECK(seen == 2 && cgi_lp_exec_threads == 2, "a training-sized bf16 run gave oneDNN %d threads", cgi_lp_exec_threads);
    CHECK(omp_get_max_threads() == 2, "OpenMP's count left at %d", omp_get_max_threads());
    cg_set_threads(0);
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
    /* a training-sized product: every thread */
    const double work = run_linear(4096, 512, 1024);
    CHECK(work > CGI_RUN_PAR_MIN, "work %.0f", work);
    CHECK(seen == 2, "a kernel of a %.0f-multiply-add run saw %d threads", work, seen);
    CHECK(cgi_run_threads(CGI_RUN_PAR_MIN / 2) == 1 && cgi_run_threads(CGI_RUN_PAR_MIN) == 2, "threshold");
    cg_set_threads(1);
    run_linear(4096, 512, 1024);
    CHECK(seen == 1, "one thread set: %d", seen);
    cg_set_threads(0);
}

int main(void) {
    unsetenv("CGRAD_RUN_PAR_MIN"); /* ctest sets 0 for the other tests: here the default is tested */
    test_work_estimate();
    test_small_runs_stay_on_one_thread();
    test_bf16_products_follow_the_run();
    TEST_END();
}
