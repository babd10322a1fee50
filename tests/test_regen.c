/* SPDX-License-Identifier: MIT */
/* Values backward remakes (the plan's regen: a fused linear + GELU's output from its product, a
 * layer norm's output from its input): the gradients are those of the plan that keeps them, bit for
 * bit, and the plan is smaller by the values no longer kept across forward. */
#include <stdlib.h>
#include <string.h>

#include "../cgrad.h"
#include "../graph/internal.h"
#include "check.h"

enum { B = 2, T = 8, D = 32, L = 2, V = 61 };
static const char *GPT = "{\"vocab_size\": 61, \"n_positions\": 16, \"n_embd\": 32, \"n_layer\": 2, \"n_head\": 2}";

/* The set's gradients after one forward and backward, and the plan's size; regen on or off. */
static cg_real *grads(bool regen, size_t *plan, int64_t *span, int *nregen) {
    if (regen) unsetenv("CGRAD_REGEN");
    else setenv("CGRAD_REGEN", "0", 1);
    cg_params *ps = cg_params_new();
    cg_model *m = cg_model_new(CG_ARCH_GPT2, GPT, 0.1, ps, 11);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_model_graph mg;
    CHECK(m && g && cg_model_build(g, m, B, T, 0, &mg) == CG_OK, "%s", cg_last_error());
    int32_t *ids = cg_idata(cg_model_graph_input(&mg, "input_ids")), *tg = cg_idata(cg_model_graph_input(&mg, "targets"));
    for (int i = 0; i < B * T; i++) ids[i] = (i * 7 + 3) % V, tg[i] = (i * 5 + 1) % V;
    cg_params_zero_grad(ps);
    CHECK(cg_graph_forward(g) == CG_OK && cg_graph_backward(g, mg.loss) == CG_OK, "%s", cg_last_error());
    *plan = cg_graph_plan_bytes(g);
    *span = cg_params_span(ps);
    *nregen = 0;
    for (int i = 0; i < g->n; i++) *nregen += g->nodes[i]->regen;
    cg_real *out = malloc((size_t)*span * sizeof *out);
    memcpy(out, cg_params_grads(ps), (size_t)*span * sizeof *out);
    cg_graph_free(g);
    cg_model_free(m);
    cg_params_free(ps);
    unsetenv("CGRAD_REGEN");
    return out;
}

int main(void) {
    size_t plan_on, plan_off;
    int64_t span_on, span_off;
    int n_on, n_off;
    cg_real *on = grads(true, &plan_on, &span_on, &n_on), *off = grads(false, &plan_off, &span_off, &n_off);
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
