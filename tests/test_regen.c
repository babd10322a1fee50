/* SPDX-License-Identifier: MIT */
/* Values backward remakes (the plan's regen: a fused linear + GELU's output from its product, a
 * layer norm's output from its input; in a bf16 graph the layer norms' and the GELUs' bf16 values):
 * the gradients are those of the plan that keeps them, bit for bit, and the plan is smaller by the
 * values no longer kept across forward. `test_regen bf16` (its own ctest entry) runs the bf16 graph. */
#include <stdlib.h>
#include <string.h>

#include "../cgrad.h"
#include "../graph/internal.h"
#include "check.h"

enum { B = 2, T = 8, D = 32, L = 2, V = 61 };
static const char *GPT = "{\"vocab_size\": 61, \"n_positions\": 16, \"n_embd\": 32, \"n_layer\": 2, \"n_head\": 2}";

/* What one plan of the test's GPT remakes: how many values (and how many of them GELUs), its peak with the bf16 weight copies and the fp32 line it is held to. */
typedef struct {
    size_t plan, peak, line;
    int64_t span;
    int nregen, ngelu, plans;
} regen_run;

/* The set's gradients after one forward and backward of a batch x ctx GPT; CGRAD_REGEN as given
 * (NULL: the default). */
static cg_real *gpt_grads(const char *regen, cg_precision prec, int batch, int ctx, regen_run *r) {
    if (regen) setenv("CGRAD_REGEN", regen, 1);
    else unsetenv("CGRAD_REGEN");
    cg_params *ps = cg_params_new();
    cg_model *m = cg_model_new(CG_ARCH_GPT2, GPT, 0.1, ps, 11);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_model_graph mg;
    CHECK(g && cg_graph_set_precision(g, prec) == CG_OK, "%s", cg_last_error());
    CHECK(m && g && cg_model_build(g, m, batch, ctx, 0, &mg) == CG_OK, "%s", cg_last_error());
    int32_t *ids = cg_idata(cg_model_graph_input(&mg, "input_ids")), *tg = cg_idata(cg_model_graph_input(&mg, "targets"));
    for (int i = 0; i < batch * ctx; i++) ids[i] = (i * 7 + 3) % V, tg[i] = (i * 5 + 1) % V;
    cg_params_zero_grad(ps);
    CHECK(cg_graph_forward(g) == CG_OK && cg_graph_backward(g, mg.loss) == CG_OK, "%s", cg_last_error());
    *r = (regen_run){cg_graph_plan_bytes(g), g->regen_peak, g->regen_line, cg_params_span(ps), 0, 0, g->regen_plans};
    for (int i = 0; i < g->n; i++) {
        const cg_tensor *t = g->nodes[i];
        if (!t->regen) continue;
        r->nregen++;
        r->ngelu += t->op == CGI_OP_GELU || t->op == CGI_OP_GELU_TANH;
    }
    cg_real *out = malloc((size_t)r->span * sizeof *out);
    memcpy(out, cg_params_grads(ps), (size_t)r->span * sizeof *out);
    cg_graph_free(g);
    cg_model_free(m);
    cg_params_free(ps);
    unsetenv("CGRAD_REGEN");
    return out;
}

static cg_real *grads(bool regen, cg_precision prec, size_t *plan, int64_t *span, int *nregen) {
    regen_run r;
    cg_real *out = gpt_grads(regen ? NULL : "0", prec, B, T, &r);
    *plan = r.plan, *span = r.span, *nregen = r.nregen;
    return out;
}

/* In bf16 the linear and its GELU are two nodes, and the layer norms' and GELUs' values are stored
 * in bf16: each [B*T, D] layer norm and [B*T, 4D] GELU takes half a float's bytes. With 2 x 8
 * tokens the plan keeping them all, plus the bf16 weight copies, sits above the same graph's fp32
 * peak (by 2.7%); remaking them all takes it far below. The plan remakes only some: the layer
 * norms (a float value and its bf16 shadow for one pass, 3x cheaper per byte than a GELU's bf16
 * value for its pass) first, and stops at or below the line. Every way, the same gradients. */
static void bf16_graph(void) {
    regen_run on, off, all;
    cg_real *g_on = gpt_grads(NULL, CG_BF16, B, T, &on), *g_off = gpt_grads("0", CG_BF16, B, T, &off);
    cg_real *g_all = gpt_grads("all", CG_BF16, B, T, &all);
    CHECK(on.span == off.span && memcmp(g_on, g_off, (size_t)on.span * sizeof *g_on) == 0,
          "bf16: gradients differ with the values remade");
    CHECK(all.span == off.span && memcmp(g_all, g_off, (size_t)on.span * sizeof *g_on) == 0,
          "bf16: gradients differ with every value remade");
    CHECK(on.line > 0 && off.peak > on.line, "bf16: peak %zu bytes remaking none, fp32's %zu: the case needs remakes",
          off.peak, on.line);
    CHECK(on.peak <= on.line, "bf16: peak %zu bytes with the chosen remakes, above fp32's %zu", on.peak, on.line);
    CHECK(all.nregen == 3 * L + 1 && off.nregen == 0, "bf16: %d values remade with CGRAD_REGEN=all (want %d), %d with =0",
          all.nregen, 3 * L + 1, off.nregen);
    CHECK(on.nregen > 0 && on.nregen < all.nregen, "bf16: %d of %d values remade by default (want some, not all)",
          on.nregen, all.nregen);
    CHECK(on.ngelu == 0 || on.nregen - on.ngelu == 2 * L + 1, "bf16: %d GELUs remade before all %d layer norms (%d)",
          on.ngelu, 2 * L + 1, on.nregen - on.ngelu);
    /* the fp32 line's plan, the one remaking none, and a round's each: 8 rounds at most, then all */
    CHECK(on.plans >= 3 && on.plans <= 11, "bf16: the choice took %d plans (want 3 to 11)", on.plans);
    CHECK(all.plan < on.plan && on.plan < off.plan, "bf16: plans %zu (all remade) < %zu (default) < %zu (none) bytes",
          all.plan, on.plan, off.plan);
    free(g_on);
    free(g_off);
    free(g_all);
}

/* A post-LN block's residual add + layer norm (x -> linear -> add_layernorm(x, .) -> linear): its
 * output is remade from the sum it keeps for its own backward; the gradients are the kept run's,
 * bit for bit. In bf16 the remade output keeps no bf16 shadow from forward to backward. */
static cg_real *post_ln(bool regen, cg_precision prec, int *nregen) {
    if (regen) unsetenv("CGRAD_REGEN");
    else setenv("CGRAD_REGEN", "0", 1);
    cg_params *ps = cg_params_new();
    cg_tensor *w1 = cg_params_add(ps, "w1", 2, (int64_t[]){D, D}), *w2 = cg_params_add(ps, "w2", 2, (int64_t[]){D, D});
    cg_tensor *gain = cg_params_add(ps, "g", 1, (int64_t[]){D}), *bias = cg_params_add(ps, "b", 1, (int64_t[]){D});
    cg_rng r;
    cg_rng_seed(&r, 4);
    cg_fill_uniform(w1, &r, -0.3, 0.3), cg_fill_uniform(w2, &r, -0.3, 0.3), cg_fill_uniform(gain, &r, 0.5, 1.5);
    cg_fill_uniform(bias, &r, -0.5, 0.5);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    CHECK(cg_graph_set_precision(g, prec) == CG_OK, "%s", cg_last_error());
    cg_tensor *x = cg_requires_grad(cg_input(g, "x", CG_REAL, 2, (int64_t[]){B * T, D}));
    cg_tensor *u = cg_input(g, "u", CG_REAL, 2, (int64_t[]){B * T, D});
    cg_fill_uniform(x, &r, -1, 1), cg_fill_uniform(u, &r, -1, 1);
    cg_tensor *y = cg_add_layernorm(g, x, cg_linear(g, x, w1, NULL), gain, bias, 1e-5);
    cg_tensor *loss = cg_sum_all(g, cg_mul(g, cg_linear(g, y, w2, NULL), u));
    cg_params_zero_grad(ps);
    CHECK(loss && cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "%s", cg_last_error());
    *nregen = y->regen && !y->lp_shadowed && !y->lp_shadow;
    const int64_t span = cg_params_span(ps);
    cg_real *out = malloc((size_t)(span + B * T * D) * sizeof *out);
    memcpy(out, cg_params_grads(ps), (size_t)span * sizeof *out);
    cg_read_grad(x, out + span);
    cg_graph_free(g);
    cg_params_free(ps);
    unsetenv("CGRAD_REGEN");
    return out;
}

static void post_ln_case(cg_precision prec) {
    int n_on, n_off;
    cg_real *on = post_ln(true, prec, &n_on), *off = post_ln(false, prec, &n_off);
    CHECK(n_on == 1 && n_off == 0, "add_layernorm remade: %d (want 1), %d with CGRAD_REGEN=0", n_on, n_off);
    CHECK(memcmp(on, off, (size_t)(2 * D * D + 2 * D + B * T * D) * sizeof *on) == 0,
          "post-LN gradients differ with the add_layernorm output remade");
    free(on);
    free(off);
}

/* With 16 x 16 tokens the bf16 plan keeping every value is far below the fp32 line, and nothing
 * is remade; CGRAD_REGEN=all remakes them anyway, to the same gradients bit for bit, in a smaller
 * plan. */
static void bf16_remakes_only_above_fp32(void) {
    regen_run aut, all;
    cg_real *g_auto = gpt_grads(NULL, CG_BF16, 16, 16, &aut), *g_all = gpt_grads("all", CG_BF16, 16, 16, &all);
    CHECK(aut.nregen == 0 && all.nregen == 3 * L + 1, "bf16, 16 x 16 tokens: %d values remade by default (want 0), %d "
          "with CGRAD_REGEN=all (want %d)", aut.nregen, all.nregen, 3 * L + 1);
    CHECK(aut.plans == 2, "bf16, 16 x 16 tokens: %d plans (want 2: the fp32 line's, the one remaking none)", aut.plans);
    CHECK(aut.line > 0 && aut.peak <= aut.line, "bf16, 16 x 16 tokens: peak %zu bytes, fp32's %zu", aut.peak, aut.line);
    CHECK(all.plan < aut.plan, "bf16: plan %zu bytes remaking all, %zu by default", all.plan, aut.plan);
    CHECK(aut.span == all.span && memcmp(g_auto, g_all, (size_t)aut.span * sizeof *g_auto) == 0,
          "bf16: gradients differ with the values remade");
    free(g_auto);
    free(g_all);
}

int main(int argc, char **argv) {
    if (!strcmp(test_part(argc, argv), "bf16")) {
        const char *why = cg_bf16_unavailable();
        if (why) return test_skip("test_regen bf16", why);
        bf16_graph();
        post_ln_case(CG_BF16);
        bf16_remakes_only_above_fp32();
        TEST_END();
    }
    post_ln_case(CG_FP32);
    size_t plan_on, plan_off;
    int64_t span_on, span_off;
    int n_on, n_off;
    cg_real *on = grads(true, CG_FP32, &plan_on, &span_on, &n_on), *off = grads(false, CG_FP32, &plan_off, &span_off, &n_off);
    CHECK(span_on == span_off, "spans %lld and %lld", (long long)span_on, (long long)span_off);
    CHECK(memcmp(on, off, (size_t)span_on * sizeof *on) == 0, "gradients differ with the values remade");
    /* per layer: ln_1, ln_2 and the MLP's GELU output; and ln_f */
    CHECK(n_on == 3 * L + 1 && n_off == 0, "%d values remade (want %d), %d with CGRAD_REGEN=0", n_on, 3 * L + 1, n_off);
    /* Kept across forward without regen: per layer two layer norms' [B*T, D] and the GELU's [B*T, 4D]
     * (each 64-byte aligned: these shapes are whole lines). With regen each is alive only around its
     * backward readers, one at a time, and ln_f's stays (the loss's backward reads it at the peak). */
    const size_t row = (size_t)B * T * D * sizeof(cg_real), kept = (size_t)L * (2 * row + 4 * row);
    CHECK(plan_off - plan_on >= kept - 4 * row, "plan %zu bytes with regen, %zu without: saved %zu, want >= %zu", plan_on,
          plan_off, plan_off - plan_on, kept - 4 * row);
    free(on);
    free(off);
    TEST_END();
}
