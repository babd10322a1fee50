/* The per-run thread decision (graph/threads.c): a graph run whose estimated work is below
 * CGI_RUN_PAR_MIN keeps every op on one thread, since waking a second thread for each of its
 * small ops cost more than it saved (a cached generation step ran slower on 2 threads than on 1);
 * a larger run uses every thread; outside a run the count is the user's again. The work estimate
 * is checked against hand-counted multiply-adds. */
#include <stdlib.h>

#include "../cgrad.h"
#include "check.h"
#include "graph/internal.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})

static int seen = -1; /* cgi_nthreads() as a kernel of the run sees it */

static void note_threads(cg_tensor *param, void *ctx) {
    (void)param, (void)ctx;
    seen = cgi_nthreads();
}

/* Forward and backward of mean(gelu(linear(x[rows, in], w[out, in]))); returns the run's work. */
static double run_linear(int64_t rows, int64_t in, int64_t out) {
    cg_params *ps = cg_params_new();
    cg_tensor *w = cg_params_add(ps, "w", 2, S(out, in));
    cg_rng r;
    cg_rng_seed(&r, 1);
    cg_fill_normal(w, &r, 0, 0.02);
    cg_graph *g = cg_graph_new(CG_TRAIN);
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
    TEST_END();
}
