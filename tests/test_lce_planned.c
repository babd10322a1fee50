/* SPDX-License-Identifier: MIT */
/* The fused linear + cross-entropy with the optimizer inside backward (cg_optim_attach): the plan
 * holds the head weight's gradient from the head's forward, which writes dW there ahead, and
 * backward only takes it. A few steps of a small model (embedding, tanh(linear), the head; tied or
 * untied, with or without a bias) against the unfused composite and against backward then
 * cg_optim_step; the upstream gradient not 1; gradients accumulated over two passes; a plan that
 * keeps the gradient from forward because that would raise its peak; checkpointing. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../cgrad.h"
#include "check.h"
#include "graph/internal.h"

enum { R = 1600, D = 40, V = 1000, STEPS = 3 }; /* about 1120 counted rows: 3 chunks of the head */

typedef struct {
    bool fused, tied, bias;
    bool attach;     /* the optimizer inside backward; else zero_grad, `passes` backwards, cg_optim_step */
    int passes;      /* backward passes per step without attach (accumulation) */
    double scale;    /* the loss times this: an upstream gradient of the head other than 1 */
    bool big_after;  /* plus sum(p * p) over a parameter larger than the rest, built after the head */
    bool checkpoint; /* the layer and the head in one checkpoint segment, checkpointing on */
    bool frozen;     /* the head's weight (untied) not trained: no plan buffer, dX and the bias's ahead */
} setup;

typedef struct {
    cg_real *values; /* the parameters after the steps */
    int64_t span;
    int ahead;       /* forwards after which the head's weight recorded a gradient written ahead */
    size_t plan_bytes;
} outcome;

static void fill_batch(cg_tensor *ids, cg_tensor *tg, int step) {
    cg_rng r;
    cg_rng_seed(&r, 100 + (uint64_t)step);
    for (int64_t i = 0; i < R; i++) {
        cg_idata(ids)[i] = (int32_t)(cg_rng_next(&r) % V);
        cg_idata(tg)[i] = cg_rng_next(&r) % 10 < 3 ? -100 : (int32_t)(cg_rng_next(&r) % V);
    }
}

static outcome run(setup s) {
    outcome out = {NULL, 0, 0, 0};
    cg_params *ps = cg_params_new();
    cg_tensor *emb = cg_params_add(ps, "emb", 2, (int64_t[]){V, D}), *a = cg_params_add(ps, "a", 2, (int64_t[]){D, D});
    cg_tensor *w = s.tied ? emb : cg_params_add(ps, "w", 2, (int64_t[]){V, D});
    cg_tensor *b = s.bias ? cg_params_add(ps, "b", 1, (int64_t[]){V}) : NULL;
    cg_tensor *big = s.big_after ? cg_params_add(ps, "big", 2, (int64_t[]){4000, 100}) : NULL;
    cg_rng r;
    cg_rng_seed(&r, 7);
    cg_fill_uniform(emb, &r, -0.5, 0.5);
    cg_fill_uniform(a, &r, -0.3, 0.3);
    if (!s.tied) cg_fill_uniform(w, &r, -0.5, 0.5);
    if (b) cg_fill_uniform(b, &r, -0.5, 0.5);
    if (big) cg_fill_uniform(big, &r, -0.01, 0.01);
    if (s.frozen) cg_param_set_trainable(w, false);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *ids = cg_input(g, "ids", CG_INT32, 1, (int64_t[]){R}), *tg = cg_input(g, "t", CG_INT32, 1, (int64_t[]){R});
    fill_batch(ids, tg, 0);
    cg_tensor *x = cg_embedding(g, emb, ids);
    if (s.checkpoint) cg_checkpoint_begin(g);
    cg_tensor *h = cg_tanh(g, cg_linear(g, x, a, NULL));
    cg_tensor *head = s.fused ? cg_linear_cross_entropy(g, h, w, b, tg, -100)
                              : cg_cross_entropy(g, cg_linear(g, h, w, b), tg, -100);
    if (s.checkpoint) cg_checkpoint_end(g), cg_graph_set_checkpointing(g, true);
    cg_tensor *l = s.scale != 1 ? cg_scale(g, head, s.scale) : head;
    if (big) l = cg_add(g, l, cg_sum_all(g, cg_mul(g, big, big)));
    cg_optim_config oc = cg_optim_defaults(CG_OPT_SGD);
    oc.momentum = 0.9;
    cg_optim *o = cg_optim_new(ps, &oc);
    CHECK(l && o && (!s.attach || cg_optim_attach(o, g) == CG_OK), "%s", cg_last_error());
    const double lr[STEPS] = {0.5, 0.3, 0.4};
    for (int step = 0; step < STEPS && l && o; step++) {
        fill_batch(ids, tg, step);
        if (!s.attach) cg_params_zero_grad(ps);
        for (int pass = 0; pass < (s.attach ? 1 : s.passes); pass++) {
            CHECK(cg_graph_forward(g) == CG_OK, "%s", cg_last_error());
            out.ahead += s.fused && w->grad_ahead == head;
            cg_status st = s.attach ? cg_optim_backward_step(o, g, l, lr[step]) : cg_graph_backward(g, l);
            CHECK(st == CG_OK, "%s", cg_last_error());
        }
        if (!s.attach) CHECK(cg_optim_step(o, lr[step]) == CG_OK, "%s", cg_last_error());
    }
    out.plan_bytes = cg_graph_plan_bytes(g);
    out.span = cg_params_span(ps);
    out.values = malloc((size_t)out.span * sizeof(cg_real));
    memcpy(out.values, cg_params_values(ps), (size_t)out.span * sizeof(cg_real));
    cg_optim_free(o);
    cg_graph_free(g);
    cg_params_free(ps);
    return out;
}

/* The largest difference between two runs' parameters, relative to the largest change the steps
 * made to any parameter (from the initial values, run with no steps). */
static double rel_diff(const outcome *x, const outcome *y, const outcome *init) {
    double worst = 0, moved = 1e-30;
    for (int64_t i = 0; i < x->span; i++) {
        worst = fmax(worst, fabs((double)x->values[i] - (double)y->values[i]));
        moved = fmax(moved, fabs((double)y->values[i] - (double)init->values[i]));
    }
    return worst / moved;
}

static outcome initial(setup s) {
    outcome o = {NULL, 0, 0, 0};
    cg_params *ps = cg_params_new();
    cg_params_add(ps, "emb", 2, (int64_t[]){V, D}), cg_params_add(ps, "a", 2, (int64_t[]){D, D});
    cg_tensor *w = s.tied ? NULL : cg_params_add(ps, "w", 2, (int64_t[]){V, D});
    cg_tensor *b = s.bias ? cg_params_add(ps, "b", 1, (int64_t[]){V}) : NULL;
    cg_tensor *big = s.big_after ? cg_params_add(ps, "big", 2, (int64_t[]){4000, 100}) : NULL;
    cg_rng r;
    cg_rng_seed(&r, 7);
    cg_fill_uniform(cg_params_at(ps, 0), &r, -0.5, 0.5);
    cg_fill_uniform(cg_params_at(ps, 1), &r, -0.3, 0.3);
    if (w) cg_fill_uniform(w, &r, -0.5, 0.5);
    if (b) cg_fill_uniform(b, &r, -0.5, 0.5);
    if (big) cg_fill_uniform(big, &r, -0.01, 0.01);
    o.span = cg_params_span(ps);
    o.values = malloc((size_t)o.span * sizeof(cg_real));
    memcpy(o.values, cg_params_values(ps), (size_t)o.span * sizeof(cg_real));
    cg_params_free(ps);
    return o;
}

/* Attached, fused: the gradients ahead every step, the parameters of backward + cg_optim_step bit
 * for bit (both write dW in forward, chunk after chunk), and the composite's within its tolerance. */
static void attached(const char *what, setup s) {
    outcome init = initial(s);
    s.fused = true, s.attach = true;
    outcome fa = run(s);
    s.attach = false, s.passes = 1;
    outcome fs = run(s);
    s.fused = false, s.attach = true;
    outcome ca = run(s);
    CHECK(fa.ahead == STEPS, "%s: the head's gradient written ahead in %d of %d attached steps", what, fa.ahead, STEPS);
    CHECK(fs.ahead == STEPS, "%s: ... in %d of %d separate steps", what, fs.ahead, STEPS);
    CHECK(fa.span == fs.span && !memcmp(fa.values, fs.values, (size_t)fa.span * sizeof(cg_real)),
          "%s: parameters differ between the optimizer inside backward and backward + step (%g relative)", what,
          rel_diff(&fa, &fs, &init));
    const double rel = rel_diff(&fa, &ca, &init);
    CHECK(rel <= 2e-5, "%s: parameters differ from the composite's by %g relative", what, rel);
    free(init.values), free(fa.values), free(fs.values), free(ca.values);
}

/* Without attach, over two backward passes a step: the second adds to what the first's forward wrote
 * ahead, and the result matches the composite's. */
static void accumulated(const char *what, setup s) {
    outcome init = initial(s);
    s.attach = false, s.passes = 2;
    s.fused = true;
    outcome f = run(s);
    s.fused = false;
    outcome c = run(s);
    CHECK(f.ahead >= STEPS, "%s: the gradient written ahead in %d forwards", what, f.ahead);
    const double rel = rel_diff(&f, &c, &init);
    CHECK(rel <= 2e-5, "%s: parameters differ from the composite's by %g relative", what, rel);
    free(init.values), free(f.values), free(c.values);
}

/* A parameter past the head larger than everything else: the plan peaks after the head's forward,
 * with that product's value, so holding dW from there would raise the peak: the plan keeps dW's
 * buffer from backward on, forward does not write it ahead, backward recomputes, and the results
 * still match the composite's. */
static void kept_for_the_peak(void) {
    setup s = {true, false, true, true, 1, 1.0, true, false, false};
    outcome init = initial(s);
    outcome fa = run(s);
    s.fused = false;
    outcome ca = run(s);
    CHECK(fa.ahead == 0, "big value past the head: the gradient written ahead in %d steps (want none)", fa.ahead);
    const double rel = rel_diff(&fa, &ca, &init);
    CHECK(rel <= 2e-5, "big value past the head: parameters differ from the composite's by %g relative", rel);
    free(init.values), free(fa.values), free(ca.values);
}

/* Checkpointing with the head in a segment: its forward runs again in backward, before the plan's
 * buffer for dW is live, so it is not written ahead there; the results match the composite's
 * without checkpointing (the composite's own cross-entropy inside a segment is not the reference:
 * it differed from its unsegmented self when this test was written). */
static void checkpointed(void) {
    setup s = {true, false, true, true, 1, 1.0, false, true, false};
    outcome init = initial(s);
    outcome fa = run(s);
    s.fused = false, s.checkpoint = false;
    outcome ca = run(s);
    const double rel = rel_diff(&fa, &ca, &init);
    CHECK(rel <= 2e-5, "checkpointed: parameters differ from the composite's by %g relative", rel);
    free(init.values), free(fa.values), free(ca.values);
}

/* A frozen head weight: nothing for the plan to hold; forward computes dX and the bias's gradient
 * ahead into its own scratch, as without the optimizer, with the same parameters bit for bit. */
static void frozen_head(void) {
    setup s = {true, false, true, true, 1, 1.0, false, false, true};
    outcome init = initial(s);
    outcome fa = run(s);
    s.attach = false;
    outcome fs = run(s);
    s.fused = false, s.attach = true;
    outcome ca = run(s);
    CHECK(!memcmp(fa.values, fs.values, (size_t)fa.span * sizeof(cg_real)),
          "frozen head: parameters differ between the optimizer inside backward and backward + step");
    const double rel = rel_diff(&fa, &ca, &init);
    CHECK(rel <= 2e-5, "frozen head: parameters differ from the composite's by %g relative", rel);
    free(init.values), free(fa.values), free(fs.values), free(ca.values);
}

int main(void) {
    attached("untied, bias", (setup){true, false, true, true, 1, 1.0, false, false, false});
    attached("untied, no bias", (setup){true, false, false, true, 1, 1.0, false, false, false});
    attached("tied, bias", (setup){true, true, true, true, 1, 1.0, false, false, false});
    attached("tied, no bias", (setup){true, true, false, true, 1, 1.0, false, false, false});
    attached("untied, loss x 0.5", (setup){true, false, true, true, 1, 0.5, false, false, false});
    attached("tied, loss x 2.5", (setup){true, true, false, true, 1, 2.5, false, false, false});
    accumulated("untied, 2 passes", (setup){true, false, true, false, 2, 1.0, false, false, false});
    accumulated("tied, 2 passes", (setup){true, true, true, false, 2, 1.0, false, false, false});
    kept_for_the_peak();
    checkpointed();
    frozen_head();
    TEST_END();
}
