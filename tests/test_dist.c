/* SPDX-License-Identifier: MIT */
/* The pieces of data-parallel training that run in one process: the backward sweep's
 * gradient-ready callback (each parameter reported once, only when its gradient is final, tied
 * weights included) and the reducer's micro-batch sum (in order, bit for bit). The multi-rank
 * runs are tests/mpi_exact.sh and tests/mpi_fault.sh under mpirun. */
#include <string.h>

#include <cgrad/cgrad.h>
#include "check.h"

enum { B = 2, T = 8, V = 11 };

typedef struct {
    cg_params *ps;
    int calls[64];       /* reports per parameter index */
    cg_real *snap;       /* each parameter's gradient as it was when reported */
    int order[64], n;
} seen;

static int index_of(cg_params *ps, const cg_tensor *p) {
    for (int i = 0; i < cg_params_count(ps); i++)
        if (cg_params_at(ps, i) == p) return i;
    return -1;
}

static void on_ready(cg_tensor *p, void *ctx) {
    seen *s = ctx;
    const int i = index_of(s->ps, p);
    if (i < 0) return;
    s->calls[i]++;
    s->order[s->n++] = i;
    const int64_t off = cg_grad(p) - cg_params_grads(s->ps);
    memcpy(s->snap + off, cg_grad(p), (size_t)cg_numel(p) * sizeof(cg_real));
}

/* A 2-layer GPT with tied embeddings: wte is read by the first node and by the LM head. */
static cg_graph *gpt_graph(cg_params *ps, cg_gpt **m, cg_tensor **ids, cg_tensor **tg, cg_tensor **loss) {
    cg_gpt_config cfg = {.vocab_size = V, .n_positions = T, .n_embd = 16, .n_layer = 2, .n_head = 2, .layer_norm_epsilon = 1e-5};
    *m = cg_gpt_new(&cfg, ps, 7);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    const int64_t shape[2] = {B, T};
    *ids = cg_input(g, "ids", CG_INT32, 2, shape);
    *tg = cg_input(g, "targets", CG_INT32, 2, shape);
    *loss = cg_cross_entropy(g, cg_gpt_logits(g, *m, *ids), *tg, -100);
    return g;
}

static void fill_batch(cg_tensor *ids, cg_tensor *tg, uint64_t seed) {
    cg_rng r;
    cg_rng_seed(&r, seed);
    for (int i = 0; i < B * T; i++) cg_idata(ids)[i] = (int32_t)(cg_rng_next(&r) % V), cg_idata(tg)[i] = (int32_t)(cg_rng_next(&r) % V);
}

static void test_grad_ready(void) {
    cg_params *ps = cg_params_new();
    cg_gpt *m;
    cg_tensor *ids, *tg, *loss;
    cg_graph *g = gpt_graph(ps, &m, &ids, &tg, &loss);
    cg_tensor *unused = cg_params_add(ps, "unused", 1, (int64_t[]){3}); /* in the set, not in the graph */
    const int n = cg_params_count(ps);
    seen s = {.ps = ps, .snap = calloc((size_t)cg_params_span(ps), sizeof(cg_real))};
    cg_graph_on_grad_ready(g, on_ready, &s);
    fill_batch(ids, tg, 1);
    cg_params_zero_grad(ps);
    CHECK(!cg_graph_forward(g) && !cg_graph_backward(g, loss), "%s", cg_last_error());
    int once = 0;
    for (int i = 0; i < n; i++) once += s.calls[i] == (cg_params_at(ps, i) == unused ? 0 : 1);
    CHECK(once == n, "%d of %d parameters reported exactly once (the unused one never)", once, n);
    /* final means final: nothing was added to a gradient after it was reported */
    int64_t differ = 0;
    for (int i = 0; i < n; i++) {
        cg_tensor *p = cg_params_at(ps, i);
        const int64_t off = cg_grad(p) - cg_params_grads(ps);
        differ += memcmp(s.snap + off, cg_grad(p), (size_t)cg_numel(p) * sizeof(cg_real)) != 0;
    }
    CHECK(differ == 0, "%lld parameters' gradients changed after they were reported final", (long long)differ);
    /* wte feeds the first node and the tied LM head, so it is final only at the end, although the
     * head's rule runs first; the final LayerNorm comes first */
    const int wte = index_of(ps, cg_params_find(ps, "wte.weight")), lnf = index_of(ps, cg_params_find(ps, "ln_f.weight"));
    int wte_at = -1, last_block = -1;
    for (int k = 0; k < s.n; k++) {
        if (s.order[k] == wte) wte_at = k;
        if (!strncmp(cg_name(cg_params_at(ps, s.order[k])), "h.", 2)) last_block = k;
    }
    CHECK(wte_at > last_block && last_block > 0, "wte (read by the LM head, backward's first rule) reported after every "
                                                 "block parameter: at %d, last block parameter at %d", wte_at, last_block);
    CHECK(s.n > 2 && s.order[0] == lnf, "ln_f.weight reported first (got %s)", cg_name(cg_params_at(ps, s.order[0])));
    /* removing the callback stops the reports */
    cg_graph_on_grad_ready(g, NULL, NULL);
    s.n = 0;
    CHECK(!cg_graph_forward(g) && !cg_graph_backward(g, loss), "%s", cg_last_error());
    CHECK(s.n == 0, "%d reports after the callback was removed", s.n);
    free(s.snap);
    cg_graph_free(g);
    cg_gpt_free(m);
    cg_params_free(ps);
}

/* The reducer in a world of one: 3 micro-batches give ((g0 + g1) + g2) * (1/3) bit for bit,
 * against gradients computed one batch at a time. */
static void test_reducer_micro(void) {
    cg_params *ps = cg_params_new();
    cg_gpt *m;
    cg_tensor *ids, *tg, *loss;
    cg_graph *g = gpt_graph(ps, &m, &ids, &tg, &loss);
    const int64_t span = cg_params_span(ps);
    cg_real *gk[3], *want = calloc((size_t)span, sizeof(cg_real));
    for (int k = 0; k < 3; k++) {
        gk[k] = calloc((size_t)span, sizeof(cg_real));
        fill_batch(ids, tg, 10 + k);
        cg_params_zero_grad(ps);
        CHECK(!cg_graph_forward(g) && !cg_graph_backward(g, loss), "%s", cg_last_error());
        memcpy(gk[k], cg_params_grads(ps), (size_t)span * sizeof(cg_real));
    }
    for (int64_t i = 0; i < span; i++) want[i] = (cg_real)((gk[0][i] + gk[1][i]) + gk[2][i]) * (cg_real)(1.0 / 3);
    cg_dist *d = cg_dist_init(0);
    CHECK(d && cg_dist_size(d) == 1 && cg_dist_rank(d) == 0, "a process not started by mpirun is a world of one");
    cg_dist_reducer *r = cg_dist_reducer_new(d, ps, 3, 256, true);
    cg_dist_reducer_attach(r, g);
    for (int k = 0; k < 3; k++) {
        CHECK(!cg_dist_reducer_begin(r, k), "%s", cg_last_error());
        fill_batch(ids, tg, 10 + k);
        CHECK(!cg_graph_forward(g) && !cg_graph_backward(g, loss), "%s", cg_last_error());
    }
    CHECK(!cg_dist_reducer_finish(r), "%s", cg_last_error());
    int64_t bad = 0;
    for (int64_t i = 0; i < span; i++) bad += memcmp(&want[i], &cg_params_grads(ps)[i], sizeof(cg_real)) != 0;
    CHECK(bad == 0, "%lld of %lld gradient elements differ from ((g0 + g1) + g2) / 3", (long long)bad, (long long)span);
    CHECK(cg_dist_reducer_begin(r, 3) == CG_ERR_ARG, "micro-batch 3 of 3 is refused");
    double x[2] = {1.5, -2};
    CHECK(!cg_dist_sum(d, x, 2) && x[0] == 1.5 && x[1] == -2, "a sum over one rank leaves the values");
    CHECK(!cg_dist_check(d, "--lr", "0.1"), "one rank always agrees with itself");
    cg_dist_reducer_free(r);
    cg_dist_free(d);
    for (int k = 0; k < 3; k++) free(gk[k]);
    free(want);
    cg_graph_free(g);
    cg_gpt_free(m);
    cg_params_free(ps);
}

/* ZeRO-1's optimizer half: two optimizers over the same parameters, each sharded to one half of
 * the block, update exactly what one unsharded optimizer updates. */
static void test_optim_shard(void) {
    cg_params *ps[3];
    cg_optim *o[3];
    cg_gpt *m[3];
    cg_gpt_config cfg = {.vocab_size = V, .n_positions = T, .n_embd = 16, .n_layer = 1, .n_head = 2, .layer_norm_epsilon = 1e-5};
    cg_optim_config oc = cg_optim_defaults(CG_OPT_ADAMW);
    for (int k = 0; k < 3; k++) {
        ps[k] = cg_params_new();
        m[k] = cg_gpt_new(&cfg, ps[k], 3);
        o[k] = cg_optim_new(ps[k], &oc);
        cg_optim_decay_matrices_only(o[k], true);
    }
    const int64_t span = cg_params_span(ps[0]), half = (span / 2 + 15) / 16 * 16;
    CHECK(cg_optim_shard(o[1], 0, half) == CG_OK && cg_optim_shard(o[2], half, span) == CG_OK, "%s", cg_last_error());
    CHECK(cg_optim_shard(o[2], 3, span) == CG_ERR_ARG, "a shard must start at a multiple of 16");
    int64_t lo, hi;
    cg_optim_shard_range(o[2], &lo, &hi);
    CHECK(lo == half && hi == span, "shard [%lld, %lld)", (long long)lo, (long long)hi);
    cg_real *init = malloc((size_t)span * sizeof(cg_real));
    memcpy(init, cg_params_values(ps[1]), (size_t)span * sizeof(cg_real));
    cg_rng r;
    cg_rng_seed(&r, 5);
    for (int step = 0; step < 3; step++) {
        for (int64_t i = 0; i < span; i++) { /* the same gradient for all three */
            const cg_real gv = (cg_real)cg_rng_normal(&r);
            for (int k = 0; k < 3; k++) cg_params_grads(ps[k])[i] = gv;
        }
        for (int k = 0; k < 3; k++) cg_optim_step(o[k], 1e-2);
    }
    const cg_real *want = cg_params_values(ps[0]), *a = cg_params_values(ps[1]), *b = cg_params_values(ps[2]);
    int64_t bad = 0;
    for (int64_t i = 0; i < span; i++) bad += memcmp(&want[i], i < half ? &a[i] : &b[i], sizeof(cg_real)) != 0;
    CHECK(bad == 0, "%lld of %lld values differ between the sharded and unsharded updates", (long long)bad, (long long)span);
    const size_t rest = (size_t)(span - half) * sizeof(cg_real);
    CHECK(!memcmp(cg_params_values(ps[1]) + half, init + half, rest) && memcmp(want + half, init + half, rest),
          "the first shard left the second half alone (which the unsharded optimizer changed)");
    free(init);
    CHECK(!memcmp(cg_optim_moment2(o[2]), cg_optim_moment2(o[0]) + half, (size_t)(span - half) * sizeof(cg_real)),
          "the second shard's moments start at its first element");
    for (int k = 0; k < 3; k++) cg_optim_free(o[k]), cg_gpt_free(m[k]), cg_params_free(ps[k]);
}

int main(void) {
    test_optim_shard();
    test_grad_ready();
    test_reducer_micro();
    TEST_END();
}
