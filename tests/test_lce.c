/* SPDX-License-Identifier: MIT */
/* The fused linear + cross-entropy against its composite twin cross_entropy(linear(x, w, b)),
 * forward and backward, over several row chunks, with ignored rows and strided weights. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../cgrad.h"
#include "check.h"
#include "graph/internal.h"

typedef struct {
    int64_t rows, d, v;
    bool bias, wt;    /* a bias; the weight a transposed view */
    bool bias_view;   /* the bias a strided view (every other element) */
    int counted;      /* -1: about 70% of rows counted; else rows counted from the first, the rest ignored */
    int threads;      /* 0: as set */
    bool param;       /* w and b are parameters, zero_grad'ed before forward: forward writes the gradients ahead */
    int between;      /* 1: w's gradient read between forward and backward, 2: read and zero_grad'ed again;
                       * 3: the loss times 2.5; 4: plus sum(w * w), whose rule writes w's gradient first;
                       * 5: w frozen (only x and b take gradients) */
} lce_case;

static cgi_team_counts passes; /* team pieces during the last run's forward and backward */

static void run(bool fused, const lce_case *k, double *loss, cg_real **grads) {
    const int64_t rows = k->rows, d = k->d, v = k->v;
    if (k->threads) cg_set_threads(k->threads);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_rng r;
    cg_rng_seed(&r, 11);
    cg_params *ps = k->param ? cg_params_new() : NULL;
    const int64_t *wshape = k->wt ? (int64_t[]){d, v} : (int64_t[]){v, d}, *bshape = (int64_t[]){v, 2};
    cg_tensor *x = cg_requires_grad(cg_input(g, "x", CG_REAL, 2, (int64_t[]){rows, d}));
    cg_tensor *wl = ps ? cg_params_add(ps, "w", 2, wshape) : cg_requires_grad(cg_input(g, "w", CG_REAL, 2, wshape));
    cg_tensor *bl = !k->bias ? NULL
                    : ps     ? cg_params_add(ps, "b", k->bias_view ? 2 : 1, bshape)
                             : cg_requires_grad(cg_input(g, "b", CG_REAL, k->bias_view ? 2 : 1, bshape));
    if (k->between == 5) cg_param_set_trainable(wl, false);
    cg_fill_uniform(x, &r, -1, 1);
    cg_fill_uniform(wl, &r, -0.5, 0.5);
    if (bl) cg_fill_uniform(bl, &r, -1, 1);
    cg_tensor *w = k->wt ? cg_transpose(g, wl, 0, 1) : wl;
    cg_tensor *b = bl && k->bias_view ? cg_squeeze(g, cg_slice(g, bl, 1, 1, 2), 1) : bl;
    cg_tensor *tg = cg_input(g, "t", CG_INT32, 1, (int64_t[]){rows});
    for (int64_t i = 0; i < rows; i++) {
        const bool counted = k->counted < 0 ? (cg_rng_next(&r) % 10) >= 3 : i < k->counted;
        cg_idata(tg)[i] = counted ? (int32_t)(cg_rng_next(&r) % (uint64_t)v) : -100;
    }
    cg_tensor *l = fused ? cg_linear_cross_entropy(g, x, w, b, tg, -100)
                         : cg_cross_entropy(g, cg_linear(g, x, w, b), tg, -100);
    if (k->between == 3) l = cg_scale(g, l, 2.5);
    if (k->between == 4) l = cg_add(g, l, cg_sum_all(g, cg_mul(g, wl, wl)));
    if (ps) cg_params_zero_grad(ps);
    cgi_team_counts before;
    cgi_team_stats(&before);
    CHECK(l && cg_graph_forward(g) == CG_OK, "%s", cg_last_error());
    if (k->between == 1 || k->between == 2) {
        cg_real *tmp = malloc((size_t)cg_numel(wl) * sizeof *tmp);
        cg_read_grad(wl, tmp);
        free(tmp);
        if (k->between == 2) cg_params_zero_grad(ps);
    }
    CHECK(cg_graph_backward(g, l) == CG_OK, "%s", cg_last_error());
    cgi_team_stats(&passes);
    passes.pieces -= before.pieces, passes.helper_pieces -= before.helper_pieces;
    *loss = cg_item(l);
    cg_tensor *leaves[3] = {x, k->between == 5 ? NULL : wl, bl};
    for (int i = 0; i < 3; i++) {
        grads[i] = NULL;
        if (!leaves[i]) continue;
        grads[i] = malloc((size_t)cg_numel(leaves[i]) * sizeof(cg_real));
        cg_read_grad(leaves[i], grads[i]);
    }
    cg_graph_free(g);
    if (ps) cg_params_free(ps);
    if (k->threads) cg_set_threads(0);
}

static void compare(const char *what, lce_case k) {
    double la, lb;
    cg_real *ga[3], *gb[3];
    run(true, &k, &la, ga);
    run(false, &k, &lb, gb);
    CHECK(fabs(la - lb) <= 1e-5 * fabs(lb), "%s: loss %.8g vs %.8g", what, la, lb);
    const int64_t n[3] = {k.rows * k.d, k.v * k.d, k.bias_view ? 2 * k.v : k.v};
    for (int i = 0; i < 3; i++) {
        if (!ga[i]) continue;
        double worst = 0, big = 1e-30;
        for (int64_t j = 0; j < n[i]; j++) {
            worst = fmax(worst, fabs((double)ga[i][j] - (double)gb[i][j]));
            big = fmax(big, fabs((double)gb[i][j]));
        }
        /* all rows ignored: every gradient is exactly zero */
        CHECK(k.counted == 0 ? worst == 0 && big == 1e-30 : worst / big <= 2e-5, "%s: gradient %d differs by %g relative",
              what, i, worst / big);
        free(ga[i]);
        free(gb[i]);
    }
}

/* The fused op's slabs and partial sums depend on the shapes only: 1 and 2 threads give the same bits. */
static void same_bits(const char *what, lce_case k) {
    double l1, l2;
    cg_real *g1[3], *g2[3];
    k.threads = 1;
    run(true, &k, &l1, g1);
    k.threads = 2;
    run(true, &k, &l2, g2);
    CHECK(l1 == l2, "%s: loss %.9g at 1 thread, %.9g at 2", what, l1, l2);
    const int64_t n[3] = {k.rows * k.d, k.v * k.d, k.v};
    for (int i = 0; i < 3; i++) {
        if (!g1[i]) continue;
        CHECK(!memcmp(g1[i], g2[i], (size_t)n[i] * sizeof(cg_real)), "%s: gradient %d differs between 1 and 2 threads",
              what, i);
        free(g1[i]);
        free(g2[i]);
    }
}

/* Parameters' gradients are zeroed lazily (cg_params_zero_grad marks them stale): the op's dW is
 * then assigned on its first write. After zero_grad a second pass reads exactly the first's
 * gradients; without it, twice them (one chunk: the same products added once more). */
static void lazy_zero(int64_t rows, int64_t v) {
    cg_params *ps = cg_params_new();
    const int64_t d = 24;
    cg_tensor *w = cg_params_add(ps, "w", 2, (int64_t[]){v, d}), *b = cg_params_add(ps, "b", 1, (int64_t[]){v});
    cg_rng r;
    cg_rng_seed(&r, 5);
    cg_fill_uniform(w, &r, -0.5, 0.5);
    cg_fill_uniform(b, &r, -1, 1);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = cg_input(g, "x", CG_REAL, 2, (int64_t[]){rows, d}), *tg = cg_input(g, "t", CG_INT32, 1, (int64_t[]){rows});
    cg_fill_uniform(x, &r, -1, 1);
    for (int64_t i = 0; i < rows; i++) cg_idata(tg)[i] = i % 4 == 3 ? -100 : (int32_t)(cg_rng_next(&r) % (uint64_t)v);
    cg_tensor *l = cg_linear_cross_entropy(g, x, w, b, tg, -100);
    const int64_t n = v * d + v;
    cg_real *first = malloc((size_t)n * sizeof *first), *got = malloc((size_t)n * sizeof *got);
    CHECK(l && !cg_graph_forward(g) && !cg_graph_backward(g, l), "%s", cg_last_error());
    cg_read_grad(w, first), cg_read_grad(b, first + v * d);
    cg_params_zero_grad(ps);
    CHECK(!cg_graph_forward(g) && !cg_graph_backward(g, l), "%s", cg_last_error());
    cg_read_grad(w, got), cg_read_grad(b, got + v * d);
    CHECK(!memcmp(first, got, (size_t)n * sizeof *got), "rows %lld: gradients after a lazy zero_grad differ from the first pass",
          (long long)rows);
    CHECK(!cg_graph_forward(g) && !cg_graph_backward(g, l), "%s", cg_last_error());
    cg_read_grad(w, got), cg_read_grad(b, got + v * d);
    int64_t twice = 0;
    for (int64_t i = 0; i < n; i++) twice += got[i] == 2 * first[i];
    CHECK(rows > 512 || twice == n, "rows %lld: %lld of %lld gradients doubled", (long long)rows, (long long)twice, (long long)n);
    free(first), free(got);
    cg_graph_free(g);
    cg_params_free(ps);
}

/* The rows a chunk holds (iarg[2]) once the plan is made: over 8200 classes of 16 features the
 * op's own limit is 256 rows; targets that count at most half the rows size it from their count n
 * (n + 4 sqrt(n), in 16-row steps) up to 3/2 of that limit, so 300 counted rows of 600 run in one
 * chunk of 384. Every row counted, 400 of 1000 (496 rows, past 384), targets that are not a graph
 * input (their data comes at run time) and a bf16 graph keep the op's own limit. */
static void chunk_rows(void) {
    const struct {
        int64_t rows, counted;
        bool view, bf16;
        int64_t want;
    } cases[] = {{600, 300, false, false, 384}, {600, 600, false, false, 256}, {1000, 400, false, false, 256},
                 {600, 300, true, false, 256},  {600, 300, false, true, 256},   {600, 100, false, false, 256}};
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
        const int64_t rows = cases[i].rows;
        cg_graph *g = cg_graph_new(CG_TRAIN);
        if (cases[i].bf16 && cg_graph_set_precision(g, CG_BF16) != CG_OK) { /* not in a double build */
            cg_graph_free(g);
            continue;
        }
        cg_tensor *x = cg_input(g, "x", CG_REAL, 2, (int64_t[]){rows, 16}),
                  *w = cg_input(g, "w", CG_REAL, 2, (int64_t[]){8200, 16});
        cg_tensor *t = cg_input(g, "t", CG_INT32, 1, (int64_t[]){rows});
        for (int64_t r = 0; r < rows; r++) cg_idata(t)[r] = r < cases[i].counted ? (int32_t)r : -100;
        cg_tensor *tv = cases[i].view ? cg_reshape(g, cg_reshape(g, t, 2, (int64_t[]){2, rows / 2}), 1, &rows) : t;
        cg_tensor *l = cg_linear_cross_entropy(g, x, w, NULL, tv, -100);
        CHECK(l && cg_graph_forward(g) == CG_OK, "case %d: %s", i, cg_last_error());
        CHECK(l && l->iarg[1] == cases[i].counted && l->iarg[2] == cases[i].want,
              "case %d: %lld counted rows in chunks of %lld rows, want %lld in chunks of %lld", i,
              l ? (long long)l->iarg[1] : -1LL, l ? (long long)l->iarg[2] : -1LL, (long long)cases[i].counted,
              (long long)cases[i].want);
        cg_graph_free(g);
    }
}

/* Asked to (CGRAD_HEAD_CHUNK=auto), the plan halves the head's chunks where their logits are live at
 * its peak, with the optimizer inside backward (cg_optim_attach): 1024 rows of a d 520 head (over
 * 512 features, 512-row chunks) run in 4 chunks of 256, the scratch smaller by 256 rows of logits,
 * and the step's parameters are those of 512-row chunks but for rounding. By default it keeps 512. */
static void halved_by_plan(void) {
    enum { R = 1024, D = 520, V = 3000 };
    cg_real *after[2];
    size_t aux[2] = {0, 0};
    int64_t cap[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        if (k == 0) unsetenv("CGRAD_HEAD_CHUNK");
        else setenv("CGRAD_HEAD_CHUNK", "auto", 1);
        cg_params *ps = cg_params_new();
        cg_tensor *w = cg_params_add(ps, "w", 2, (int64_t[]){V, D});
        cg_rng r;
        cg_rng_seed(&r, 3);
        cg_fill_uniform(w, &r, -0.05, 0.05);
        cg_graph *g = cg_graph_new(CG_TRAIN);
        cg_tensor *x = cg_input(g, "x", CG_REAL, 2, (int64_t[]){R, D}), *tg = cg_input(g, "t", CG_INT32, 1, (int64_t[]){R});
        cg_fill_uniform(x, &r, -1, 1);
        for (int i = 0; i < R; i++) cg_idata(tg)[i] = (int32_t)(cg_rng_next(&r) % V);
        cg_tensor *l = cg_linear_cross_entropy(g, x, w, NULL, tg, -100);
        cg_optim_config oc = cg_optim_defaults(CG_OPT_SGD);
        cg_optim *o = cg_optim_new(ps, &oc);
        CHECK(l && o && cg_optim_attach(o, g) == CG_OK && cg_graph_forward(g) == CG_OK &&
                  cg_optim_backward_step(o, g, l, 1.0) == CG_OK,
              "%s", cg_last_error());
        cap[k] = l->iarg[2], aux[k] = l->aux_bytes;
        after[k] = malloc((size_t)(V * D) * sizeof(cg_real));
        cg_read(w, after[k]);
        cg_optim_free(o);
        cg_graph_free(g);
        cg_params_free(ps);
    }
    unsetenv("CGRAD_HEAD_CHUNK");
    CHECK(cap[0] == 512 && cap[1] == 256, "chunks of %lld rows kept, %lld halved (want 512 and 256)", (long long)cap[0],
          (long long)cap[1]);
    const size_t logits = (size_t)(256 * V) * sizeof(cg_real);
    CHECK(aux[0] >= aux[1] + logits, "scratch %zu bytes in 512-row chunks, %zu in 256: want %zu less", aux[0], aux[1], logits);
    double worst = 0;
    for (int64_t i = 0; i < (int64_t)V * D; i++) worst = fmax(worst, fabs((double)after[0][i] - (double)after[1][i]));
    CHECK(worst <= 1e-6, "parameters after the step differ by %g between 512- and 256-row chunks", worst);
    free(after[0]), free(after[1]);
}

typedef struct {
    lce_case k;
    double loss;
    cg_real *grads[3];
} team_run;

static cg_status run_in_team(void *ctx) {
    team_run *r = ctx;
    run(true, &r->k, &r->loss, r->grads);
    return CG_OK;
}

/* A vocabulary of one slab (at most 256 classes) is cut into parts by rows and by columns
 * (ops/loss_head.c): as a team's pieces, which the helpers take, with the same bits at 1 and 2 threads
 * and the composite's values. */
static void one_slab_shared(const char *what, lce_case k) {
    compare(what, k);
    same_bits(what, k);
    cgi_team_set_guard(CGI_TEAM_GUARD_ON);
    cgi_team_wait_for_helpers(true); /* else a loaded machine may keep the helpers switched out */
    cg_set_threads(2);
    long long pieces = 0, helped = 0;
    for (int attempt = 0; attempt < 20 && helped == 0; attempt++) {
        team_run r = {k, 0, {NULL, NULL, NULL}};
        CHECK(cg_run_with_team(run_in_team, &r) == CG_OK, "%s", cg_last_error());
        pieces = passes.pieces, helped = passes.helper_pieces;
        double l1;
        cg_real *g1[3];
        k.threads = 1;
        run(true, &k, &l1, g1);
        k.threads = 0;
        cg_set_threads(2);
        CHECK(l1 == r.loss, "%s: loss %.9g at 1 thread, %.9g in a team", what, l1, r.loss);
        const int64_t n[3] = {k.rows * k.d, k.v * k.d, k.v};
        for (int i = 0; i < 3; i++) {
            if (g1[i]) CHECK(!memcmp(g1[i], r.grads[i], (size_t)n[i] * sizeof(cg_real)), "%s: gradient %d differs", what, i);
            free(g1[i]);
            free(r.grads[i]);
        }
    }
    CHECK(pieces > 0 && helped > 0, "%s: the helpers took %lld of %lld pieces of the head", what, helped, pieces);
    cg_set_threads(0);
    cgi_team_set_guard(CGI_TEAM_GUARD_AUTO);
    cgi_team_wait_for_helpers(false);
}

int main(void) {
    chunk_rows();
    halved_by_plan();
    compare("1600 rows (about 1120 counted: 3 balanced chunks), bias", (lce_case){1600, 32, 300, true, false, false, -1, 0, false, 0});
    compare("600 rows (one chunk, backward reuses forward's logits), bias", (lce_case){600, 32, 300, true, false, false, -1, 0, false, 0});
    compare("257 rows, no bias, transposed weight view", (lce_case){257, 16, 129, false, true, false, -1, 0, false, 0});
    compare("40 rows, one chunk", (lce_case){40, 8, 50, true, false, false, -1, 0, false, 0});
    /* the fused path's slabs (at most 256 columns): 1000 columns are 4 of 256, 256, 256, 232; with
     * 1100 rows, 2 chunks of about 385 rows, so backward recomputes a chunk slab by slab */
    compare("1100 rows x 1000 classes: 4 slabs, 2 chunks, bias", (lce_case){1100, 40, 1000, true, false, false, -1, 0, false, 0});
    compare("13 classes: one slab narrower than a tile", (lce_case){30, 12, 13, true, false, false, -1, 0, false, 0});
    compare("strided bias view, transposed weight, 4 slabs", (lce_case){200, 24, 777, true, true, true, -1, 0, false, 0});
    compare("one counted row", (lce_case){50, 16, 600, true, false, false, 1, 0, false, 0});
    compare("every row ignored", (lce_case){50, 16, 600, true, false, false, 0, 0, false, 0});
    compare("513 counted rows: 2 chunks of 257 and 256", (lce_case){513, 16, 300, true, false, false, 513, 0, false, 0});
    /* a wide vocabulary: 512 rows of float logits would pass 8 MiB, so chunks of at most 416 rows */
    compare("600 rows x 5000 classes: 2 chunks under 8 MiB of logits", (lce_case){600, 16, 5000, true, false, false, -1, 0, false, 0});
    same_bits("1100 rows x 1000 classes", (lce_case){1100, 40, 1000, true, false, false, -1, 0, false, 0});
    same_bits("300 rows x 2000 classes, one chunk", (lce_case){300, 64, 2000, true, false, false, -1, 0, false, 0});
    /* parameters: forward computes the gradients ahead (dW into w's stale gradient), backward takes them */
    compare("params: 1100 rows x 1000 classes, 2 chunks, bias", (lce_case){1100, 40, 1000, true, false, false, -1, 0, true, 0});
    compare("params: 600 rows, one chunk, bias", (lce_case){600, 32, 300, true, false, false, -1, 0, true, 0});
    compare("params: strided bias view, transposed weight", (lce_case){200, 24, 777, true, true, true, -1, 0, true, 0});
    compare("params: w's gradient read before backward", (lce_case){1100, 40, 1000, true, false, false, -1, 0, true, 1});
    compare("params: read and zeroed again before backward", (lce_case){1100, 40, 1000, true, false, false, -1, 0, true, 2});
    compare("params: one chunk, read and zeroed again", (lce_case){300, 40, 1000, true, false, false, -1, 0, true, 2});
    compare("params: loss x 2.5", (lce_case){1100, 40, 1000, true, false, false, -1, 0, true, 3});
    compare("params: plus sum(w * w)", (lce_case){1100, 40, 1000, true, false, false, -1, 0, true, 4});
    compare("params: frozen weight", (lce_case){1100, 40, 1000, true, false, false, -1, 0, true, 5});
    compare("params: every row ignored", (lce_case){50, 16, 600, true, false, false, 0, 0, true, 0});
    same_bits("params: 1100 rows x 1000 classes", (lce_case){1100, 40, 1000, true, false, false, -1, 0, true, 0});
    /* sparse targets (BERT's masked-LM labels): 300 of 600 rows counted over 8200 classes, where the
     * op's own limit is 256 rows (2 chunks), run in one chunk sized from them; 400 of 1000 in 2 */
    compare("300 of 600 rows counted: one chunk", (lce_case){600, 16, 8200, true, false, false, 300, 0, false, 0});
    compare("400 of 1000 rows counted: 2 chunks", (lce_case){1000, 16, 8200, true, false, false, 400, 0, false, 0});
    compare("params, 300 of 600 rows counted: one chunk", (lce_case){600, 16, 8200, true, false, false, 300, 0, true, 0});
    compare("params, 300 of 600 counted: read and zeroed again", (lce_case){600, 16, 8200, true, false, false, 300, 0, true, 2});
    same_bits("300 of 600 rows counted: one chunk", (lce_case){600, 16, 8200, true, false, false, 300, 0, false, 0});
    lazy_zero(100, 600);
    lazy_zero(1000, 300);
    one_slab_shared("one slab: 1000 rows x 256 classes, bias", (lce_case){1000, 48, 256, true, false, false, -1, 0, false, 0});
    one_slab_shared("one slab: 700 rows x 65 classes, transposed weight", (lce_case){700, 40, 65, false, true, false, -1, 0, false, 0});
    one_slab_shared("one slab, params: 1100 rows x 200 classes, 3 chunks", (lce_case){1100, 32, 200, true, false, false, -1, 0, true, 0});
    one_slab_shared("one slab: strided bias, 90 rows x 13 classes", (lce_case){90, 12, 13, true, false, true, -1, 0, false, 0});
    TEST_END();
}
