/* SPDX-License-Identifier: MIT */
/* Parallel regions a backward pass enters (issue 11). Under OMP_WAIT_POLICY=passive every region
 * that uses a second thread wakes it (140-180 us in a KVM guest, graph/threads.c), so rules that
 * can write a gradient in their own region should not leave a separate zeroing region before it.
 * This program counts the regions by defining GOMP_parallel itself (calls from the statically
 * linked library bind to it; it forwards to libgomp's) and holds each leaner path to the bits of
 * the path it replaces, on 1 to 3 threads, and checks that backward enters no cgi_zero region:
 * - a linear reading a computed node through a reshape that covers it (the out-projection reads
 *   attention's output so) is that node's first writer: it assigns dX, as it does on the node
 *   itself, and nothing zeroes the gradient first;
 * - an embedding zeroes its table's gradient inside its own scatter region when it writes it first. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cgrad.h"
#include "check.h"
#include "graph/internal.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})

static long regions, zeroings; /* regions entered with more than one thread; those of them cgi_zero's */
static void (*zero_fn)(void *), (*last_fn)(void *); /* cgi_zero's outlined region body; the last region's */

void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags) {
    static void (*real)(void (*)(void *), void *, unsigned, unsigned);
    if (!real) real = (void (*)(void (*)(void *), void *, unsigned, unsigned))dlsym(RTLD_NEXT, "GOMP_parallel");
    if ((num_threads ? num_threads : (unsigned)omp_get_max_threads()) != 1 && !omp_in_parallel()) {
        regions++;
        zeroings += fn == zero_fn;
        last_fn = fn;
    }
    real(fn, data, num_threads, flags);
}

/* Finds cgi_zero's region body by zeroing 4 MB on two threads. */
static void find_zero_fn(void) {
    enum { BYTES = 4 << 20 };
    char *p = malloc(BYTES);
    cg_set_threads(2);
    const long before = regions;
    cgi_zero(p, BYTES);
    CHECK(regions == before + 1, "cgi_zero of 4 MB on 2 threads entered %ld regions", regions - before);
    zero_fn = last_fn;
    cg_set_threads(0);
    free(p);
}

/* loss = sum(linear(v, w)) with v = gelu(x)[4, 256, 256] read as [1024, 256] (view) or as the
 * [1024, 256] node itself; returns the regions backward entered, x's and w's gradients in dx, dw. */
static long run_linear_on(bool view, cg_real *dx, cg_real *dw) {
    enum { B = 4, T = 256, D = 256, O = 96 };
    cg_rng r;
    cg_rng_seed(&r, 3);
    cg_params *ps = cg_params_new();
    cg_tensor *w = cg_params_add(ps, "w", 2, S(O, D));
    cg_fill_normal(w, &r, 0, 0.1);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = view ? cg_input(g, "x", CG_REAL, 3, S(B, T, D)) : cg_input(g, "x", CG_REAL, 2, S(B * T, D));
    cg_fill_normal(x, &r, 0, 1);
    cg_requires_grad(x);
    cg_tensor *h = cg_gelu(g, x), *v = view ? cg_reshape(g, h, 2, S(B * T, D)) : h;
    cg_tensor *loss = cg_sum_all(g, cg_linear(g, v, w, NULL));
    long got = -1;
    cg_params_zero_grad(ps);
    if (cg_graph_forward(g) == CG_OK) {
        regions = zeroings = 0;
        if (cg_graph_backward(g, loss) == CG_OK) got = regions;
    }
    CHECK(zeroings == 0, "linear on a %s: backward entered %ld zeroing regions", view ? "view" : "node", zeroings);
    CHECK(got >= 0, "linear on a %s: %s", view ? "view" : "node", cg_last_error());
    if (got >= 0) {
        memcpy(dx, cg_grad(x), sizeof(cg_real) * B * T * D);
        memcpy(dw, cg_grad(w), sizeof(cg_real) * O * D);
    }
    cg_graph_free(g);
    cg_params_free(ps);
    return got;
}

static void test_linear_through_a_view(void) {
    const size_t nx = 4 * 256 * 256, nw = 96 * 256;
    cg_real *dx = malloc(sizeof(cg_real) * nx), *dw = malloc(sizeof(cg_real) * nw), *rx = malloc(sizeof(cg_real) * nx),
            *rw = malloc(sizeof(cg_real) * nw);
    /* the GELU's value kept: remade in backward (regen) on the node, it would add its own region there
     * (a value read through a view is never remade) */
    setenv("CGRAD_REGEN", "0", 1);
    for (int th = 1; th <= 3; th++) {
        cg_set_threads(th);
        const long plain = run_linear_on(false, rx, rw), viewed = run_linear_on(true, dx, dw);
        CHECK(viewed == plain, "%d threads: backward through the reshape entered %ld regions, on the node itself %ld "
              "(a zeroing region before the linear?)", th, viewed, plain);
        CHECK(!memcmp(dx, rx, sizeof(cg_real) * nx) && !memcmp(dw, rw, sizeof(cg_real) * nw),
              "%d threads: gradients through the reshape differ from those on the node", th);
    }
    cg_set_threads(0);
    unsetenv("CGRAD_REGEN");
    free(dx), free(dw), free(rx), free(rw);
}

/* cgi_grad_begin_whole: a view holding all of a fresh node's gradient (a reshape, a transpose) makes its
 * caller the first writer; a slice, or the node once written, does not. */
static void test_grad_begin_views(void) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = cg_input(g, "x", CG_REAL, 2, S(8, 6));
    cg_requires_grad(x);
    cg_tensor *h = cg_gelu(g, x), *rs = cg_reshape(g, h, 3, S(2, 4, 6)), *tr = cg_permute(g, h, (const int[]){1, 0}),
              *sl = cg_slice(g, h, 0, 0, 4);
    cg_tensor *loss = cg_sum_all(g, cg_add(g, cg_sum_all(g, rs), cg_add(g, cg_sum_all(g, tr), cg_sum_all(g, sl))));
    CHECK(loss && cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "%s", cg_last_error());
    cgi_resolve_views(g);
    cg_tensor *views[3] = {rs, tr, sl};
    const bool want[3] = {true, true, false};
    for (int i = 0; i < 3; i++) {
        g->epoch++;
        CHECK(cgi_grad_begin_whole(views[i]) == want[i], "view %d: cgi_grad_begin_whole gave %d, want %d", i, !want[i], want[i]);
        CHECK(!cgi_grad_begin(rs), "view %d: a second writer in one pass was told it is the first", i);
    }
    cg_graph_free(g);
}

/* A linear (plain, and fused with GELU, which claims its bias first) whose x holds all of a storage
 * that its bias is a slice of: dX assigns only as the first writer, before the bias's terms are
 * added, so both keep their terms (finite differences). */
static void test_view_with_aliased_bias(void) {
    for (int fused = 0; fused < 2; fused++) {
        cg_graph *g = cg_graph_new(CG_TRAIN);
        cg_tensor *pool = cg_requires_grad(cg_input(g, "pool", CG_REAL, 1, S(24)));
        cg_tensor *w = cg_requires_grad(cg_input(g, "w", CG_REAL, 2, S(4, 4))), *R = cg_input(g, "R", CG_REAL, 2, S(6, 4));
        cg_rng r;
        cg_rng_seed(&r, 5);
        cg_fill_uniform(pool, &r, -1, 1);
        cg_fill_uniform(w, &r, -1, 1);
        cg_fill_uniform(R, &r, -1, 1);
        cg_tensor *x = cg_reshape(g, pool, 2, S(6, 4)), *b = cg_slice(g, pool, 0, 2, 6);
        cg_tensor *y = fused ? cg_linear_gelu(g, x, w, b, false) : cg_linear(g, x, w, b);
        cg_tensor *loss = cg_sum_all(g, cg_mul(g, y, R));
        cg_gradcheck_result res[2];
        CHECK(cg_gradcheck(g, loss, 2, (cg_tensor *[]){pool, w}, 0, res) == CG_OK, "%s", cg_last_error());
        for (int i = 0; i < 2; i++)
            CHECK(res[i].pass, "%s, input %d: element %lld analytic %g numeric %g", fused ? "linear_gelu" : "linear", i,
                  (long long)res[i].worst, res[i].analytic, res[i].numeric);
        cg_graph_free(g);
    }
}

/* d(table) of an embedding (used twice: the second adds) against the scatter sum done by hand; the
 * table's first writer zeroes it in its own region, so backward enters no zeroing region. */
static void test_embedding_zeroes_in_its_region(void) {
    enum { V = 5000, D = 64, N = 2048 }; /* the outputs stay below cgi_zero's threshold, the table not */
    cg_rng r;
    cg_rng_seed(&r, 9);
    int32_t *ids = malloc(sizeof(int32_t) * N);
    for (int i = 0; i < N; i++) ids[i] = (int32_t)(cg_rng_next(&r) % (i % 7 ? V : 13)); /* repeats */
    cg_real *want = calloc((size_t)V * D, sizeof(cg_real));
    for (int e = 0; e < 2; e++) /* backward runs the second embedding first */
        for (int i = 0; i < N; i++)
            for (int j = 0; j < D; j++) want[(int64_t)ids[i] * D + j] += (cg_real)(e ? 1.0 : 2.0);
    for (int th = 1; th <= 3; th++) {
        cg_set_threads(th);
        cg_params *ps = cg_params_new();
        cg_tensor *w = cg_params_add(ps, "table", 2, S(V, D));
        cg_fill_normal(w, &r, 0, 1);
        cg_graph *g = cg_graph_new(CG_TRAIN);
        cg_tensor *id = cg_input(g, "ids", CG_INT32, 1, S(N));
        memcpy(cg_idata(id), ids, sizeof(int32_t) * N);
        cg_tensor *a = cg_embedding(g, w, id), *b = cg_scale(g, cg_embedding(g, w, id), 2.0);
        cg_tensor *loss = cg_add(g, cg_sum_all(g, a), cg_sum_all(g, b));
        for (int pass = 0; pass < 2; pass++) { /* the second pass finds last pass's gradient to replace */
            cg_params_zero_grad(ps);
            long got = -1;
            if (cg_graph_forward(g) == CG_OK) {
                regions = zeroings = 0;
                if (cg_graph_backward(g, loss) == CG_OK) got = regions;
            }
            CHECK(got >= 0, "%s", cg_last_error());
            CHECK(zeroings == 0, "%d threads, pass %d: backward entered %ld zeroing regions (of %ld)", th, pass, zeroings, got);
            CHECK(!memcmp(cg_grad(w), want, sizeof(cg_real) * V * D), "%d threads, pass %d: d(table) differs from the scatter sum",
                  th, pass);
        }
        cg_graph_free(g);
        cg_params_free(ps);
    }
    cg_set_threads(0);
    free(ids), free(want);
}

int main(void) {
    find_zero_fn();
    test_grad_begin_views();
    test_linear_through_a_view();
    test_view_with_aliased_bias();
    test_embedding_zeroes_in_its_region();
    TEST_END();
}
