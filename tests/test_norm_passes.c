/* SPDX-License-Identifier: MIT */
/* The passes of the layer norms (ops/norm.c), bit for bit:
 * - add_layernorm's output and every gradient must be those of cg_add followed by cg_layernorm,
 *   which form the same sum and reduce it in the same order;
 * - backward remakes a layer norm's and an add_layernorm's output from the statistics forward kept,
 *   without summing the rows again: the gradients must be those of the plan that keeps the outputs
 *   (CGRAD_REGEN=0), and the outputs must have been remade (the test fails if the plan stops).
 * - in a post-LN block the norm's summands share one gradient buffer, which the op writes once: every
 *   gradient must be the composed block's, and a summand read again later must not share.
 * The bias's gradient (the blocks' partial rows summed a vector of columns at a time) against its
 * sums by hand. Widths 256, 48 and 67 (a row's tail past the 16 lanes); two threads under ctest. */
#include <stdlib.h>
#include <string.h>

#include "../cgrad.h"
#include "check.h"
#include "graph/internal.h"

enum { MAXT = 8 };

typedef struct {
    cg_real *v[MAXT];
    int64_t n[MAXT];
    int count, remade;
} result;

static void result_free(result *r) {
    for (int i = 0; i < r->count; i++) free(r->v[i]);
}

/* r holds a copy of each of ts's gradients, or of its value where bit i of values is set. */
static void result_take(result *r, cg_tensor *const *ts, int count, unsigned values) {
    for (int i = 0; i < count; i++) {
        r->n[i] = cg_numel(ts[i]);
        r->v[i] = malloc((size_t)r->n[i] * sizeof(cg_real));
        CHECK(((values >> i) & 1 ? cg_read(ts[i], r->v[i]) : cg_read_grad(ts[i], r->v[i])) == CG_OK, "read %d: %s", i,
              cg_last_error());
    }
    r->count = count;
}

static cg_tensor *leaf(cg_graph *g, const char *name, int nd, const int64_t *shape, cg_rng *rng, bool grad) {
    cg_tensor *t = cg_input(g, name, CG_REAL, nd, shape);
    if (grad) t = cg_requires_grad(t);
    if (t) cg_fill_uniform(t, rng, -1.5, 1.5);
    return t;
}

/* y = LN(x + r) (fused or composed) over [rows, d]; loss = sum(y * R). Reads y, then the gradients of
 * x, r, gain and bias. */
static result fused_or_composed(int64_t rows, int64_t d, bool fused) {
    result res = {0};
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_rng rng;
    cg_rng_seed(&rng, 5);
    const int64_t sh[2] = {rows, d};
    cg_tensor *x = leaf(g, "x", 2, sh, &rng, true), *r = leaf(g, "r", 2, sh, &rng, true);
    cg_tensor *gain = leaf(g, "gain", 1, &d, &rng, true), *bias = leaf(g, "bias", 1, &d, &rng, true);
    cg_tensor *R = leaf(g, "R", 2, sh, &rng, false);
    cg_tensor *y = cg_retain(fused ? cg_add_layernorm(g, x, r, gain, bias, 1e-5)
                                   : cg_layernorm(g, cg_add(g, x, r), gain, bias, 1e-5));
    cg_tensor *loss = cg_sum_all(g, cg_mul(g, y, R));
    if (!loss || cg_graph_forward(g) || cg_graph_backward(g, loss)) {
        CHECK(0, "[%lld, %lld] %s: %s", (long long)rows, (long long)d, fused ? "fused" : "composed", cg_last_error());
        cg_graph_free(g);
        return res;
    }
    cg_tensor *ts[6] = {y, x, r, gain, bias, R};
    result_take(&res, ts, 6, 1u << 0 | 1u << 5); /* y's and R's values, the others' gradients */
    cg_graph_free(g);
    return res;
}

/* Two blocks as a post-LN and a pre-LN model have them: h = add_layernorm(x, r) -> linear, then
 * layernorm -> linear; the linears' weight gradients read the norms' outputs in backward, which the
 * plan remakes unless CGRAD_REGEN=0. Reads the gradients of x, r, the weights, gains and biases. */
static result two_blocks(int64_t rows, int64_t d, const char *regen) {
    result res = {0};
    if (regen) setenv("CGRAD_REGEN", regen, 1);
    else unsetenv("CGRAD_REGEN");
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_rng rng;
    cg_rng_seed(&rng, 9);
    const int64_t sh[2] = {rows, d}, wsh[2] = {d, d};
    cg_tensor *x = leaf(g, "x", 2, sh, &rng, true), *r = leaf(g, "r", 2, sh, &rng, true);
    cg_tensor *g1 = leaf(g, "g1", 1, &d, &rng, true), *b1 = leaf(g, "b1", 1, &d, &rng, true);
    cg_tensor *g2 = leaf(g, "g2", 1, &d, &rng, true), *b2 = leaf(g, "b2", 1, &d, &rng, true);
    cg_tensor *w1 = leaf(g, "w1", 2, wsh, &rng, true), *w2 = leaf(g, "w2", 2, wsh, &rng, true);
    cg_tensor *R = leaf(g, "R", 2, sh, &rng, false);
    cg_tensor *n1 = cg_add_layernorm(g, x, r, g1, b1, 1e-5);
    cg_tensor *n2 = cg_layernorm(g, cg_linear(g, n1, w1, NULL), g2, b2, 1e-5);
    cg_tensor *loss = cg_sum_all(g, cg_mul(g, cg_linear(g, n2, w2, NULL), R));
    if (!loss || cg_graph_forward(g) || cg_graph_backward(g, loss)) {
        CHECK(0, "two blocks [%lld, %lld] regen %s: %s", (long long)rows, (long long)d, regen ? regen : "default",
              cg_last_error());
        cg_graph_free(g);
        unsetenv("CGRAD_REGEN");
        return res;
    }
    res.remade = n1->regen + n2->regen;
    cg_tensor *ts[8] = {x, r, g1, b1, g2, b2, w1, w2};
    result_take(&res, ts, 8, 0);
    cg_graph_free(g);
    unsetenv("CGRAD_REGEN");
    return res;
}

/* The bias's gradient of y = LN(x + r) under loss = sum(y * R) is R's column sums, which the op
 * takes in 32 blocks of ceil(rows / 32) rows, each summed down its rows, then the blocks in order:
 * summed so here by hand, it must be the op's bit for bit. */
static void bias_by_hand(const result *f, int64_t rows, int64_t d) {
    const cg_real *R = f->v[5], *got = f->v[4];
    const int64_t per = (rows + 31) / 32;
    int64_t bad = -1;
    cg_real want_bad = 0;
    for (int64_t j = 0; j < d && bad < 0; j++) {
        cg_real total = 0;
        for (int64_t b = 0; b < 32; b++) {
            cg_real part = 0;
            for (int64_t i = b * per; i < rows && i < (b + 1) * per; i++) part += R[i * d + j];
            total += part;
        }
        if (memcmp(&total, &got[j], sizeof total)) bad = j, want_bad = total;
    }
    CHECK(bad < 0, "d %lld: the bias's gradient [%lld] = %.9g, by hand %.9g", (long long)d, (long long)bad,
          bad < 0 ? 0.0 : (double)got[bad], (double)want_bad);
}

/* A post-LN block: r = tanh(a); x = linear(gelu(linear(r, wq)), wo); y = LN(r + x) (fused, as the
 * zoo's blocks order the summands, or with late LN(x + r); or composed); loss = sum(y * R). The fused norm's summands share one gradient buffer (graph/plan.c:
 * r's other reader, the first linear, comes before x's linear), so it writes dS once; with late, r
 * is also read between x's linear and the norm (y * (r + 1)), whose rule would add into r's gradient
 * before x's linear read its dY from the same buffer, so they must not share. Reads the gradients of a,
 * wq, wo, gain and bias, and whether x's and r's gradients were one buffer. */
static result post_ln_block(int64_t rows, int64_t d, bool fused, bool late, bool *shared) {
    result res = {0};
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_rng rng;
    cg_rng_seed(&rng, 13);
    const int64_t sh[2] = {rows, d}, wsh[2] = {d, d};
    cg_tensor *a = leaf(g, "a", 2, sh, &rng, true), *wq = leaf(g, "wq", 2, wsh, &rng, true);
    cg_tensor *wo = leaf(g, "wo", 2, wsh, &rng, true), *gain = leaf(g, "gain", 1, &d, &rng, true);
    cg_tensor *bias = leaf(g, "bias", 1, &d, &rng, true), *R = leaf(g, "R", 2, sh, &rng, false);
    cg_tensor *r = cg_tanh(g, a);
    cg_tensor *x = cg_linear(g, cg_gelu(g, cg_linear(g, r, wq, NULL)), wo, NULL);
    cg_tensor *r1 = late ? cg_add_scalar(g, r, 1) : NULL; /* r read between x's linear and the norm */
    cg_tensor *y = fused ? (late ? cg_add_layernorm(g, x, r, gain, bias, 1e-5) : cg_add_layernorm(g, r, x, gain, bias, 1e-5))
                         : cg_layernorm(g, cg_add(g, x, r), gain, bias, 1e-5);
    if (late) y = cg_mul(g, y, r1);
    cg_tensor *loss = cg_sum_all(g, cg_mul(g, y, R));
    if (!loss || cg_graph_forward(g) || cg_graph_backward(g, loss)) {
        CHECK(0, "post-LN block [%lld, %lld]: %s", (long long)rows, (long long)d, cg_last_error());
        cg_graph_free(g);
        return res;
    }
    *shared = x->grad == r->grad;
    cg_tensor *ts[5] = {a, wq, wo, gain, bias};
    result_take(&res, ts, 5, 0);
    cg_graph_free(g);
    return res;
}

/* Every value of a equals b's, bit for bit. */
static void same_bits(const result *a, const result *b, const char *what, int64_t d) {
    CHECK(a->count == b->count, "%s d %lld: %d against %d tensors", what, (long long)d, a->count, b->count);
    for (int i = 0; i < a->count && i < b->count; i++) {
        int64_t bad = -1;
        for (int64_t j = 0; j < a->n[i] && bad < 0; j++)
            if (memcmp(&a->v[i][j], &b->v[i][j], sizeof(cg_real))) bad = j;
        CHECK(bad < 0, "%s d %lld: tensor %d element %lld: %.9g against %.9g", what, (long long)d, i, (long long)bad,
              bad < 0 ? 0.0 : (double)a->v[i][bad], bad < 0 ? 0.0 : (double)b->v[i][bad]);
    }
}

int main(void) {
    const int64_t widths[] = {256, 48, 67};
    for (int k = 0; k < 3; k++) {
        const int64_t d = widths[k], rows = 200;
        result f = fused_or_composed(rows, d, true), c = fused_or_composed(rows, d, false);
        same_bits(&f, &c, "add_layernorm against add + layernorm", d);
        bias_by_hand(&f, rows, d);
        result_free(&f), result_free(&c);
        for (int late = 0; late < 2; late++) {
            bool shared = false, composed_shared = false;
            result f2 = post_ln_block(rows, d, true, late, &shared), c2 = post_ln_block(rows, d, false, late, &composed_shared);
            CHECK(shared == !late, "d %lld, r read %s x's linear: x's and r's gradients %s one buffer", (long long)d,
                  late ? "after" : "only before", shared ? "are" : "are not");
            same_bits(&f2, &c2, late ? "post-LN block, r read late: fused against composed" :
                                       "post-LN block, one gradient buffer: fused against composed", d);
            result_free(&f2), result_free(&c2);
        }
        result kept = two_blocks(rows, d, "0"), remade = two_blocks(rows, d, NULL);
        CHECK(kept.remade == 0 && remade.remade == 2, "d %lld: %d outputs remade with CGRAD_REGEN=0 (want 0), %d by "
              "default (want 2)", (long long)d, kept.remade, remade.remade);
        same_bits(&remade, &kept, "gradients with the norms' outputs remade against kept", d);
        result_free(&kept), result_free(&remade);
    }
    TEST_END();
}
