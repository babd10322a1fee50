/* SPDX-License-Identifier: MIT */
/* The mixture-of-experts layer (models/moe.h): float64 gradient checks of the routed layer, dropless
 * and with a capacity, and of the load-balancing loss, at inputs whose routing is away from ties
 * (checked: top-k choices are piecewise constant); the routed layer equal to the dense formulation,
 * forward and every gradient; capacity dropping on a hand-built case; the load-balancing loss against
 * a plain loop; errors naming what is wrong. Mixtral's parity with PyTorch is in test_families. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../cgrad.h"
#include "../models/llama.h"
#include "../models/moe.h"
#include "check.h"

#ifdef CGRAD_DOUBLE
#define SAME_TOL 1e-12 /* routed against dense: the same products summed in another order */
#else
#define SAME_TOL 2e-6
#endif

enum { D = 6, F = 5, E = 4, K = 2, B = 2, T = 5, N = B * T };

static cg_moe *layer(cg_params *ps, double capacity_factor, uint64_t seed) {
    cg_rng r;
    cg_rng_seed(&r, seed);
    const cg_moe_config c = {.hidden_size = D, .intermediate_size = F, .num_experts = E, .top_k = K,
                             .capacity_factor = capacity_factor};
    cg_moe *m = cg_moe_new(&c, ps, &r, "moe");
    for (int i = 0; m && i < cg_params_count(ps); i++) cg_fill_normal(cg_params_at(ps, i), &r, 0, 0.5);
    return m;
}

#ifdef CGRAD_DOUBLE
/* The smallest gap between a row's k-th and (k+1)-th router probability (from logits [N, E]). */
static double routing_margin(const cg_real *logits, int64_t n, int64_t e, int64_t k) {
    double worst = INFINITY;
    for (int64_t i = 0; i < n; i++) {
        double p[16], mx = -INFINITY, s = 0;
        for (int64_t j = 0; j < e; j++) mx = fmax(mx, (double)logits[i * e + j]);
        for (int64_t j = 0; j < e; j++) s += p[j] = exp((double)logits[i * e + j] - mx);
        for (int64_t j = 0; j < e; j++) p[j] /= s;
        for (int64_t a = 0; a < e; a++) /* sort descending */
            for (int64_t b = a + 1; b < e; b++)
                if (p[b] > p[a]) { const double t = p[a]; p[a] = p[b], p[b] = t; }
        if (k < e) worst = fmin(worst, p[k - 1] - p[k]);
    }
    return worst;
}
#endif

static cg_tensor *input_x(cg_graph *g, uint64_t seed) {
    cg_tensor *x = cg_requires_grad(cg_input(g, "x", CG_REAL, 3, (int64_t[]){B, T, D}));
    cg_rng r;
    cg_rng_seed(&r, seed);
    cg_fill_normal(x, &r, 0, 1);
    return x;
}

/* The routed layer's output and load-balancing loss against finite differences, for x and every
 * parameter (float64 build; the float32 differences at its step would cross routing boundaries). */
static void gradcheck(double capacity_factor) {
#ifdef CGRAD_DOUBLE
    cg_params *ps = cg_params_new();
    cg_moe *m = layer(ps, capacity_factor, 11);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = input_x(g, 12), *logits = NULL;
    cg_tensor *y = cg_moe_forward(g, m, x, &logits);
    cg_tensor *aux = cg_moe_load_balancing_loss(g, 1, &logits, K);
    CHECK(y && aux && !cg_graph_forward(g), "%s", cg_last_error());
    if (!y || !aux) goto done;
    cg_retain(logits);
    cg_graph_forward(g);
    const double margin = routing_margin(cg_data(logits), N, E, K);
    CHECK(margin > 1e-3, "inputs near a routing tie (margin %g): pick others", margin);
    cg_tensor *in[1 + 1 + 3 * E];
    int n = 0;
    in[n++] = x;
    for (int i = 0; i < cg_params_count(ps); i++) in[n++] = cg_params_at(ps, i);
    cg_gradcheck_result res[1 + 1 + 3 * E];
    for (int which = 0; which < 2; which++) {
        CHECK(!cg_gradcheck(g, which ? aux : y, n, in, 0, res), "%s", cg_last_error());
        double worst = 0;
        for (int i = 0; i < n; i++) {
            CHECK(res[i].pass && res[i].max_rel_err < CG_GRADCHECK_TOL, "capacity %g, %s: d %s: rel err %g",
                  capacity_factor, which ? "aux loss" : "output", res[i].name, res[i].max_rel_err);
            worst = fmax(worst, res[i].max_rel_err);
        }
        printf("gradcheck capacity_factor %g, %s: %d inputs, worst relative error %.1e (routing margin %.1e)\n",
               capacity_factor, which ? "load-balancing loss" : "output", n, worst, margin);
    }
done:
    cg_graph_free(g);
    cg_moe_free(m);
    cg_params_free(ps);
#else
    (void)capacity_factor;
#endif
}

/* Runs routed or dense on the same inputs; out[N * D] the output, grads[...] x's gradient and every
 * parameter's, of loss = sum(y * w) + aux. */
static void run(bool dense, double capacity_factor, double *out, double *grads, int64_t *ngrads) {
    cg_params *ps = cg_params_new();
    cg_moe *m = layer(ps, capacity_factor, 21);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = input_x(g, 22), *logits = NULL, *w = cg_input(g, "w", CG_REAL, 3, (int64_t[]){B, T, D});
    cg_rng r;
    cg_rng_seed(&r, 23);
    cg_fill_normal(w, &r, 0, 1);
    cg_tensor *y = dense ? cg_moe_forward_dense(g, m, x, &logits) : cg_moe_forward(g, m, x, &logits);
    cg_tensor *loss = cg_add(g, cg_sum_all(g, cg_mul(g, cg_retain(y), w)), cg_moe_load_balancing_loss(g, 1, &logits, K));
    CHECK(loss && !cg_graph_forward(g) && !cg_graph_backward(g, loss), "%s", cg_last_error());
    *ngrads = 0;
    for (int64_t i = 0; loss && i < N * D; i++) out[i] = cg_data(y)[i];
    for (int i = -1; loss && i < cg_params_count(ps); i++) {
        cg_tensor *p = i < 0 ? x : cg_params_at(ps, i);
        for (int64_t j = 0; j < cg_numel(p); j++) grads[(*ngrads)++] = cg_grad(p)[j];
    }
    cg_graph_free(g);
    cg_moe_free(m);
    cg_params_free(ps);
}

static void routed_equals_dense(double capacity_factor) {
    enum { MAXG = N * D + E * D + 3 * E * F * D };
    static double y1[N * D], y2[N * D], g1[MAXG], g2[MAXG];
    int64_t n1 = 0, n2 = 0;
    run(false, capacity_factor, y1, g1, &n1);
    run(true, capacity_factor, y2, g2, &n2);
    double dy = 0, dg = 0, sy = 0, sg = 0;
    for (int64_t i = 0; i < N * D; i++) dy = fmax(dy, fabs(y1[i] - y2[i])), sy = fmax(sy, fabs(y2[i]));
    for (int64_t i = 0; i < n1 && n1 == n2; i++) dg = fmax(dg, fabs(g1[i] - g2[i])), sg = fmax(sg, fabs(g2[i]));
    CHECK(n1 == MAXG && n1 == n2 && dy <= SAME_TOL * fmax(sy, 1) && dg <= SAME_TOL * fmax(sg, 1) && sy > 0.1 && sg > 0.1,
          "capacity %g: routed vs dense: output max |diff| %g (scale %g), gradients %g (scale %g), %lld/%lld values",
          capacity_factor, dy, sy, dg, sg, (long long)n1, (long long)n2);
    printf("routed = dense, capacity_factor %g: output %.1e, %lld gradients %.1e\n", capacity_factor, dy, (long long)n1, dg);
}

/* The capacity drops tokens in the cases above (or the comparison there would not test dropping):
 * rows of the output change against dropless, and some become exactly 0 (every choice dropped) or not. */
static void capacity_changes_output(void) {
    enum { MAXG = N * D + E * D + 3 * E * F * D };
    static double y1[N * D], y2[N * D], g1[MAXG], g2[MAXG];
    int64_t n1 = 0, n2 = 0, changed = 0;
    run(false, 0, y1, g1, &n1);
    run(false, 0.75, y2, g2, &n2);
    for (int64_t i = 0; i < N; i++) {
        double d = 0;
        for (int64_t j = 0; j < D; j++) d = fmax(d, fabs(y1[i * D + j] - y2[i * D + j]));
        changed += d > 1e-3;
    }
    CHECK(changed >= 1 && changed < N, "capacity 0.75 changed %lld of %d tokens' outputs", (long long)changed, N);
    printf("capacity_factor 0.75 (4 slots an expert) drops choices of %lld of %d tokens\n", (long long)changed, N);
}

/* Every token prefers expert 0 (top-1); capacity ceil(1 * 1 * 4 / 2) = 2 keeps the first two tokens,
 * whose output is expert 0's (weight 1), and drops the last two (output 0); dropless keeps all four. */
static void capacity_drops(void) {
    for (int dropless = 0; dropless < 2; dropless++) {
        cg_params *ps = cg_params_new();
        cg_rng r;
        cg_rng_seed(&r, 5);
        const cg_moe_config c = {.hidden_size = 3, .intermediate_size = 4, .num_experts = 2, .top_k = 1,
                                 .capacity_factor = dropless ? 0 : 1};
        cg_moe *m = cg_moe_new(&c, ps, &r, "moe");
        CHECK(m != NULL, "%s", cg_last_error());
        if (!m) return;
        for (int i = 0; i < cg_params_count(ps); i++) cg_fill_normal(cg_params_at(ps, i), &r, 0, 0.5);
        cg_real *gate = cg_data(cg_params_find(ps, "moe.gate.weight")); /* [2, 3]: expert 0 reads x's sum */
        for (int j = 0; j < 3; j++) gate[j] = 1, gate[3 + j] = -1;
        cg_graph *g = cg_graph_new(CG_EVAL);
        cg_tensor *x = cg_input(g, "x", CG_REAL, 2, (int64_t[]){4, 3});
        for (int i = 0; i < 12; i++) cg_data(x)[i] = (cg_real)(0.5 + 0.1 * i);
        cg_tensor *y = cg_retain(cg_moe_forward(g, m, x, NULL));
        /* expert 0 alone, densely */
        cg_tensor *ref = cg_retain(cg_linear(g, cg_swiglu(g, cg_linear(g, x, cg_params_find(ps, "moe.experts.0.w1.weight"), NULL),
                                                          cg_linear(g, x, cg_params_find(ps, "moe.experts.0.w3.weight"), NULL)),
                                             cg_params_find(ps, "moe.experts.0.w2.weight"), NULL));
        CHECK(y && ref && !cg_graph_forward(g), "%s", cg_last_error());
        for (int i = 0; y && ref && i < 4; i++)
            for (int j = 0; j < 3; j++) {
                const double got = cg_data(y)[i * 3 + j], want = i < 2 || dropless ? cg_data(ref)[i * 3 + j] : 0;
                CHECK(fabs(got - want) <= 1e-6 && (want != 0 || got == 0), "%s: token %d feature %d: %g, want %g",
                      dropless ? "dropless" : "capacity 2", i, j, got, want);
            }
        cg_graph_free(g);
        cg_moe_free(m);
        cg_params_free(ps);
    }
}

/* load_balancing_loss_func by a loop: two layers' logits concatenated, k = 2 of 3 experts. */
static void aux_loss_loop(void) {
    enum { L = 2, R = 4, X = 3, KK = 2 };
    const double lg[L][R][X] = {{{1.0, 0.2, -0.5}, {0.1, 0.9, 0.3}, {-0.2, 0.0, 1.4}, {0.8, 0.7, -1.0}},
                                {{0.3, -0.4, 0.2}, {2.0, 0.1, 0.5}, {-1.0, 0.6, 0.4}, {0.0, 1.1, 0.2}}};
    double f[KK][X] = {{0}}, pm[X] = {0};
    for (int l = 0; l < L; l++)
        for (int i = 0; i < R; i++) {
            double p[X], s = 0;
            for (int j = 0; j < X; j++) s += p[j] = exp(lg[l][i][j]);
            int first = 0, second = -1;
            for (int j = 0; j < X; j++) pm[j] += p[j] / s / (L * R), first = p[j] > p[first] ? j : first;
            for (int j = 0; j < X; j++)
                if (j != first && (second < 0 || p[j] > p[second])) second = j;
            f[0][first] += 1.0 / (L * R), f[1][second] += 1.0 / (L * R);
        }
    double want = 0;
    for (int k = 0; k < KK; k++)
        for (int j = 0; j < X; j++) want += f[k][j] * pm[j];
    want *= X;
    cg_graph *g = cg_graph_new(CG_EVAL);
    cg_tensor *in[L];
    for (int l = 0; l < L; l++) {
        in[l] = cg_input(g, "logits", CG_REAL, 2, (int64_t[]){R, X});
        for (int i = 0; i < R * X; i++) cg_data(in[l])[i] = (cg_real)lg[l][i / X][i % X];
    }
    cg_tensor *aux = cg_retain(cg_moe_load_balancing_loss(g, L, in, KK));
    CHECK(aux && !cg_graph_forward(g) && fabs(cg_item(aux) - want) < 1e-6, "aux loss %g, want %g: %s",
          aux ? (double)cg_item(aux) : NAN, want, cg_last_error());
    printf("load-balancing loss of 2 layers x 4 tokens, top-2 of 3: %.6f (loop %.6f)\n", aux ? (double)cg_item(aux) : NAN,
           want);
    cg_graph_free(g);
}

/* Experts with LoRA adapters compute w + scale B A in the routed layer as in the dense one, forward and
 * the adapters' gradients: with one adapted expert (a mix: the slot path applies it through cg_linear)
 * and with every expert's three matrices adapted (the dropless segment products run the adapters, by
 * segments too: the graph has segment_linear nodes and no linear for the experts). */
static void lora_experts(void) {
    for (int all = 0; all < 2; all++) {
        cg_params *ps = cg_params_new();
        cg_moe *m = layer(ps, 0, 31);
        cg_rng r;
        cg_rng_seed(&r, 32);
        const int np = cg_params_count(ps);
        for (int i = 0; m && i < np; i++) {
            cg_tensor *p = cg_params_at(ps, i);
            if (!strstr(cg_name(p), "experts.") || (!all && strcmp(cg_name(p), "moe.experts.1.w1.weight"))) continue;
            CHECK(cg_lora_add(ps, p, 2, 4.0, &r) == CG_OK, "%s", cg_last_error());
        }
        for (int i = 0; i < cg_params_count(ps); i++)
            if (strstr(cg_name(cg_params_at(ps, i)), "lora_B")) cg_fill_normal(cg_params_at(ps, i), &r, 0, 1);
        enum { MAXG = 3 * E * 2 * (2 * (F + D)) };
        static double y[2][N * D], gr[2][MAXG];
        int ng[2] = {0, 0};
        for (int dense = 0; m && dense < 2; dense++) {
            cg_params_zero_grad(ps);
            cg_graph *g = cg_graph_new(CG_TRAIN);
            cg_tensor *x = input_x(g, 33);
            cg_tensor *out = cg_retain(dense ? cg_moe_forward_dense(g, m, x, NULL) : cg_moe_forward(g, m, x, NULL));
            cg_tensor *loss = cg_sum_all(g, cg_square(g, out));
            CHECK(loss && !cg_graph_forward(g) && !cg_graph_backward(g, loss), "%s", cg_last_error());
            for (int i = 0; out && i < N * D; i++) y[dense][i] = cg_data(out)[i];
            for (int i = 0; loss && i < cg_params_count(ps); i++) {
                cg_tensor *p = cg_params_at(ps, i);
                if (!strstr(cg_name(p), "lora_")) continue;
                for (int64_t j = 0; j < cg_numel(p) && ng[dense] < MAXG; j++) gr[dense][ng[dense]++] = cg_grad(p)[j];
            }
            if (!dense && all) {
                char path[64];
                snprintf(path, sizeof path, "/tmp/cgrad_test_moe_lora_%d.dot", (int)getpid());
                size_t len = 0;
                char *dot = cg_graph_dot(g, path) ? NULL : test_slurp(path, &len);
                unlink(path);
                CHECK(dot && strstr(dot, "segment_linear") && !strstr(dot, " linear\\n[10,5]"),
                      "every expert adapted: the dropless layer should run them by segments");
                free(dot);
            }
            cg_graph_free(g);
        }
        double dy = 0, dg = 0, sg = 0;
        for (int i = 0; i < N * D; i++) dy = fmax(dy, fabs(y[0][i] - y[1][i]));
        for (int i = 0; i < ng[0] && ng[0] == ng[1]; i++) dg = fmax(dg, fabs(gr[0][i] - gr[1][i])), sg = fmax(sg, fabs(gr[1][i]));
        CHECK(m && dy <= SAME_TOL * 10 && ng[0] == ng[1] && ng[0] == (all ? 3 * E * 2 * (F + D) : 2 * (F + D)) &&
                  dg <= SAME_TOL * 10 * fmax(sg, 1) && sg > 0,
              "%s: routed and dense differ by %g (output), %g (adapters' gradients, scale %g, %d/%d values)",
              all ? "every expert adapted" : "one adapted expert", dy, dg, sg, ng[0], ng[1]);
        printf("LoRA on %s: routed = dense, output %.1e, %d adapter gradients %.1e\n", all ? "every expert" : "one expert", dy,
               ng[0], dg);
        cg_moe_free(m);
        cg_params_free(ps);
    }
}

/* cg_segment_linear_each: segment e through its own weight tensor, read in place. Three parameters
 * [3, 4] over x[6, 4] with ends {2, 2, 5} (an empty segment, a row past the last end) give the stacked
 * op's output and gradients on a copy stacked [3, 3, 4], bit for bit (the same products); weights that
 * are inputs (not parameters) are stacked by the op and give them too; in float64 the parameters'
 * and x's gradients match finite differences. */
static void segment_each(void) {
    cg_params *ps = cg_params_new();
    cg_rng r;
    cg_rng_seed(&r, 41);
    cg_tensor *w[3], *stack = cg_params_add(ps, "stack", 3, (int64_t[]){3, 3, 4});
    for (int e = 0; e < 3; e++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", e);
        w[e] = cg_params_add(ps, name, 2, (int64_t[]){3, 4});
        cg_fill_normal(w[e], &r, 0, 1);
        for (int j = 0; stack && j < 12; j++) cg_data(stack)[e * 12 + j] = cg_data(w[e])[j];
    }
    double y[3][18], dx[3][24], dw[3][36];
    for (int way = 0; way < 3; way++) { /* 0: parameters in place, 1: the stacked parameter, 2: inputs */
        cg_params_zero_grad(ps);
        cg_graph *g = cg_graph_new(CG_TRAIN);
        cg_tensor *x = cg_requires_grad(cg_input(g, "x", CG_REAL, 2, (int64_t[]){6, 4})),
                  *ends = cg_input(g, "ends", CG_INT32, 1, (int64_t[]){3}), *up = cg_input(g, "up", CG_REAL, 2, (int64_t[]){6, 3});
        cg_rng rx;
        cg_rng_seed(&rx, 42);
        cg_fill_normal(x, &rx, 0, 1);
        cg_fill_normal(up, &rx, 0, 1);
        cg_idata(ends)[0] = 2, cg_idata(ends)[1] = 2, cg_idata(ends)[2] = 5;
        cg_tensor *in[3];
        for (int e = 0; e < 3; e++) {
            in[e] = way < 2 ? w[e] : cg_requires_grad(cg_input(g, "wi", CG_REAL, 2, (int64_t[]){3, 4}));
            if (way == 2) memcpy(cg_data(in[e]), cg_data(w[e]), 12 * sizeof(cg_real));
        }
        cg_tensor *out = cg_retain(way == 1 ? cg_segment_linear(g, x, stack, ends) : cg_segment_linear_each(g, x, 3, in, ends));
        cg_tensor *loss = cg_sum_all(g, cg_mul(g, out, up));
        CHECK(loss && !cg_graph_forward(g) && !cg_graph_backward(g, loss), "way %d: %s", way, cg_last_error());
        for (int i = 0; loss && i < 18; i++) y[way][i] = cg_data(out)[i];
        for (int i = 0; loss && i < 24; i++) dx[way][i] = cg_grad(x)[i];
        for (int i = 0; loss && i < 36; i++)
            dw[way][i] = way == 1 ? cg_grad(stack)[i] : cg_grad(in[i / 12])[i % 12];
#ifdef CGRAD_DOUBLE
        if (way == 0) {
            cg_tensor *chk[4] = {x, w[0], w[1], w[2]};
            cg_gradcheck_result res[4];
            CHECK(!cg_gradcheck(g, out, 4, chk, 0, res), "%s", cg_last_error());
            for (int i = 0; i < 4; i++)
                CHECK(res[i].pass && res[i].max_rel_err < CG_GRADCHECK_TOL, "segment_linear_each: d %s: rel err %g",
                      res[i].name, res[i].max_rel_err);
        }
#endif
        cg_graph_free(g);
    }
    for (int way = 1; way < 3; way++) {
        CHECK(!memcmp(y[0], y[way], sizeof y[0]) && !memcmp(dx[0], dx[way], sizeof dx[0]) && !memcmp(dw[0], dw[way], sizeof dw[0]),
              "segment_linear_each on parameters differs from %s", way == 1 ? "the stacked op" : "weights given as inputs");
    }
    CHECK(y[0][17] == 0 && y[0][12] != 0 && dw[0][12] == 0 && dw[0][0] != 0,
          "row 5 past the last end is 0 (%g), the empty segment's weight has no gradient (%g)", y[0][17], dw[0][12]);
    /* errors name the op and the shapes */
    cg_graph *g = cg_graph_new(CG_EVAL);
    cg_tensor *x = cg_input(g, "x", CG_REAL, 2, (int64_t[]){6, 5}), *ends = cg_input(g, "ends", CG_INT32, 1, (int64_t[]){3});
    CHECK(!cg_segment_linear_each(g, x, 3, w, ends) && strstr(cg_last_error(), "[segment_linear] x[6,5], w[0][3,4]"), "%s",
          cg_last_error());
    CHECK(!cg_segment_linear_each(g, x, 0, w, ends) && strstr(cg_last_error(), "n >= 1"), "%s", cg_last_error());
    cg_graph_free(g);
    cg_params_free(ps);
}

/* The dropless layer reads its experts where they are: no node of its graph copies them into a stack
 * (cg_concat), as the layer did on every step before. */
static void no_expert_copy(void) {
    cg_params *ps = cg_params_new();
    cg_moe *m = layer(ps, 0, 51);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = input_x(g, 52), *logits = NULL;
    cg_tensor *loss = cg_sum_all(g, cg_square(g, cg_moe_forward(g, m, x, &logits)));
    char path[64];
    snprintf(path, sizeof path, "/tmp/cgrad_test_moe_%d.dot", (int)getpid());
    CHECK(loss && !cg_graph_forward(g) && !cg_graph_backward(g, loss) && !cg_graph_dot(g, path), "%s", cg_last_error());
    size_t len = 0;
    char *dot = test_slurp(path, &len);
    unlink(path);
    CHECK(dot && strstr(dot, "segment_linear") && !strstr(dot, " concat"),
          "the dropless layer's graph copies its experts (a concat node) or has no segment_linear");
    free(dot);
    cg_graph_free(g);
    cg_moe_free(m);
    cg_params_free(ps);
}

/* Capacity 1.0 (ceil(1 * 2 * 10 / 4) = 5 slots an expert): the layer's count of dropped (token, choice)
 * pairs equals the overflow counted here from the router logits, first choices served first and then
 * in token order (Switch's order); the routed layer at that capacity equals the dense reference (above);
 * dropless drops none. */
static void dropped_count(void) {
    for (int dropless = 0; dropless < 2; dropless++) {
        cg_params *ps = cg_params_new();
        cg_moe *m = layer(ps, dropless ? 0 : 1.0, 61);
        cg_graph *g = cg_graph_new(CG_EVAL);
        cg_tensor *x = input_x(g, 62), *logits = NULL, *dropped = NULL;
        cg_tensor *y = cg_moe_forward_counted(g, m, x, &logits, &dropped);
        CHECK(y && cg_retain(logits) && cg_retain(dropped) && cg_ndim(dropped) == 0 && !cg_graph_forward(g), "%s",
              cg_last_error());
        if (!y || !dropped) goto next;
        int load[E] = {0}, want = 0;
        int choice[N][K];
        for (int i = 0; i < N; i++) /* top-2 of the logits (softmax keeps the order) */
            for (int k = 0; k < K; k++) {
                int best = -1;
                for (int j = 0; j < E; j++)
                    if ((k == 0 || j != choice[i][0]) && (best < 0 || cg_data(logits)[i * E + j] > cg_data(logits)[i * E + best]))
                        best = j;
                choice[i][k] = best;
            }
        for (int k = 0; k < K; k++)
            for (int i = 0; i < N; i++) want += ++load[choice[i][k]] > (dropless ? N : 5);
        const double got = cg_item(dropped);
        CHECK(got == want && (dropless ? want == 0 : want > 0), "%s: %g choices dropped, counted %d", dropless ? "dropless" : "capacity 1",
              got, want);
        printf("%s: %g of %d choices dropped (counted from the logits: %d)\n", dropless ? "dropless" : "capacity_factor 1",
               got, N * K, want);
    next:
        cg_graph_free(g);
        cg_moe_free(m);
        cg_params_free(ps);
    }
}

/* capacity_factor in a Mixtral config.json (cgrad's field): read, written back only when not 0, refused
 * negative or outside Mixtral; cg_llama_set_capacity_factor reaches every layer (a capacity that drops
 * changes the logits, one past every token's count gives dropless ones), and refuses bad values. */
static void llama_capacity(void) {
    const char *base = "{\"model_type\": \"mixtral\", \"vocab_size\": 11, \"hidden_size\": 8, \"intermediate_size\": 6, "
                       "\"num_hidden_layers\": 2, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, "
                       "\"num_local_experts\": 4, \"num_experts_per_tok\": 2%s}";
    char text[512];
    cg_llama_config c;
    snprintf(text, sizeof text, base, ", \"capacity_factor\": 1.25");
    CHECK(cg_llama_config_parse(text, &c) == CG_OK && c.capacity_factor == 1.25, "%s", cg_last_error());
    char *js = cg_llama_config_json(&c);
    CHECK(js && strstr(js, "\"capacity_factor\": 1.25"), "written back: %s", js ? js : cg_last_error());
    free(js);
    snprintf(text, sizeof text, base, "");
    CHECK(cg_llama_config_parse(text, &c) == CG_OK && c.capacity_factor == 0, "%s", cg_last_error());
    js = cg_llama_config_json(&c);
    CHECK(js && !strstr(js, "capacity_factor"), "dropless writes no capacity_factor: %s", js ? js : cg_last_error());
    free(js);
    snprintf(text, sizeof text, base, ", \"capacity_factor\": -0.5");
    CHECK(cg_llama_config_parse(text, &c) != CG_OK && strstr(cg_last_error(), "capacity_factor"), "%s", cg_last_error());
    CHECK(cg_llama_config_parse("{\"model_type\": \"llama\", \"vocab_size\": 11, \"hidden_size\": 8, \"intermediate_size\": 6, "
                                "\"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"capacity_factor\": 1}", &c) != CG_OK &&
              strstr(cg_last_error(), "capacity_factor"), "a dense family refuses it: %s", cg_last_error());
    snprintf(text, sizeof text, base, "");
    cg_llama_config_parse(text, &c);
    double logits[3][2 * 6 * 11];
    const double caps[3] = {0, 0.5, 100};
    for (int v = 0; v < 3; v++) {
        cg_params *ps = cg_params_new();
        cg_llama *m = cg_llama_new(&c, ps, 7);
        for (int i = 0; m && i < cg_params_count(ps); i++) { /* wide weights, so routing is far from uniform */
            cg_rng r;
            cg_rng_seed(&r, 70 + (uint64_t)i);
            if (cg_ndim(cg_params_at(ps, i)) == 2) cg_fill_normal(cg_params_at(ps, i), &r, 0, 0.5);
        }
        CHECK(m && cg_llama_set_capacity_factor(m, caps[v]) == CG_OK && cg_llama_cfg(m)->capacity_factor == caps[v], "%s",
              cg_last_error());
        cg_graph *g = cg_graph_new(CG_EVAL);
        cg_tensor *ids = cg_input(g, "ids", CG_INT32, 2, (int64_t[]){2, 6});
        for (int i = 0; i < 12; i++) cg_idata(ids)[i] = (i * 7 + 3) % 11;
        cg_tensor *out = cg_retain(cg_llama_logits(g, m, ids));
        CHECK(out && !cg_graph_forward(g), "%s", cg_last_error());
        for (int i = 0; out && i < 2 * 6 * 11; i++) logits[v][i] = cg_data(out)[i];
        if (v == 0) {
            CHECK(cg_llama_set_capacity_factor(m, -1) == CG_ERR_ARG && strstr(cg_last_error(), "capacity_factor -1"), "%s",
                  cg_last_error());
            CHECK(cg_llama_set_capacity_factor(m, NAN) == CG_ERR_ARG && cg_llama_cfg(m)->capacity_factor == 0, "%s",
                  cg_last_error());
        }
        cg_graph_free(g);
        cg_llama_free(m);
        cg_params_free(ps);
    }
    double d_half = 0, d_big = 0;
    for (int i = 0; i < 2 * 6 * 11; i++)
        d_half = fmax(d_half, fabs(logits[1][i] - logits[0][i])), d_big = fmax(d_big, fabs(logits[2][i] - logits[0][i]));
    CHECK(d_half > 1e-4 && d_big <= SAME_TOL * 10, "Mixtral logits: capacity 0.5 moves them by %g (want > 0), capacity 100 "
          "by %g (want 0: nothing dropped)", d_half, d_big);
    cg_llama_config dense = c;
    dense.family = CG_LLAMA_FAMILY_LLAMA, dense.num_local_experts = 0;
    cg_params *ps = cg_params_new();
    cg_llama *m = cg_llama_new(&dense, ps, 7);
    CHECK(m && cg_llama_set_capacity_factor(m, 1) == CG_ERR_ARG && strstr(cg_last_error(), "no mixture-of-experts"), "%s",
          cg_last_error());
    cg_llama_free(m);
    cg_params_free(ps);
}

static void errors(void) {
    cg_params *ps = cg_params_new();
    cg_rng r;
    cg_rng_seed(&r, 1);
    const cg_moe_config bad = {.hidden_size = 4, .intermediate_size = 4, .num_experts = 2, .top_k = 3};
    CHECK(!cg_moe_new(&bad, ps, &r, "moe") && strstr(cg_last_error(), "top_k 3"), "%s", cg_last_error());
    const cg_moe_config neg = {.hidden_size = 4, .intermediate_size = 4, .num_experts = 2, .top_k = 1, .capacity_factor = -1};
    CHECK(!cg_moe_new(&neg, ps, &r, "moe") && strstr(cg_last_error(), "capacity_factor"), "%s", cg_last_error());
    const cg_moe_config ok = {.hidden_size = 4, .intermediate_size = 4, .num_experts = 2, .top_k = 1};
    cg_moe *m = cg_moe_new(&ok, ps, &r, "moe");
    cg_graph *g = cg_graph_new(CG_EVAL);
    cg_tensor *x = cg_input(g, "x", CG_REAL, 2, (int64_t[]){3, 5});
    CHECK(m && !cg_moe_forward(g, m, x, NULL) && strstr(cg_last_error(), "[moe] x[3,5]"), "%s", cg_last_error());
    cg_tensor *l1 = cg_input(g, "a", CG_REAL, 2, (int64_t[]){3, 2}), *l2 = cg_input(g, "b", CG_REAL, 2, (int64_t[]){3, 4});
    cg_tensor *ls[2] = {l1, l2};
    CHECK(!cg_moe_load_balancing_loss(g, 2, ls, 1) && strstr(cg_last_error(), "router logits 1"), "%s", cg_last_error());
    cg_graph_free(g);
    /* segment ends are data: ends that fall, or pass the rows, fail the forward run naming them */
    for (int k = 0; k < 2; k++) {
        g = cg_graph_new(CG_EVAL);
        cg_tensor *rows = cg_input(g, "x", CG_REAL, 2, (int64_t[]){4, 3}), *w = cg_input(g, "w", CG_REAL, 3, (int64_t[]){2, 2, 3}),
                  *ends = cg_input(g, "ends", CG_INT32, 1, (int64_t[]){2});
        cg_idata(ends)[0] = k ? 1 : 3, cg_idata(ends)[1] = k ? 5 : 2;
        cg_tensor *y = cg_segment_linear(g, rows, w, ends);
        CHECK(y && cg_graph_forward(g) == CG_ERR_RANGE && strstr(cg_last_error(), k ? "ends[1] = 5" : "ends[1] = 2"),
              "segment ends {%d, %d}: %s", cg_idata(ends)[0], cg_idata(ends)[1], cg_last_error());
        CHECK(!cg_segment_linear(g, rows, w, cg_input(g, "e3", CG_INT32, 1, (int64_t[]){3})) &&
                  strstr(cg_last_error(), "[segment_linear]"), "%s", cg_last_error());
        cg_graph_free(g);
    }
    cg_moe_free(m);
    cg_params_free(ps);
}

int main(void) {
    gradcheck(0);
    gradcheck(0.75); /* capacity ceil(0.75 * 2 * 10 / 4) = 4 of the 5 slots a balanced expert would need */
    routed_equals_dense(0);
    routed_equals_dense(0.75);
    routed_equals_dense(1.0);
    capacity_changes_output();
    capacity_drops();
    aux_loss_loop();
    lora_experts();
    segment_each();
    no_expert_copy();
    dropped_count();
    llama_capacity();
    errors();
    TEST_END();
}
