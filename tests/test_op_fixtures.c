/* SPDX-License-Identifier: MIT */
/* topk, one_hot, the comparisons, the casts, cumsum, scatter_add, index_add, gather, index_select,
 * bmm, the grouped and segment linears and expand feeding other ops, held to torch: each case of
 * tests/fixtures/ops/ops.txt (made by tests/make_op_fixtures.py) replayed through cgrad's op, its
 * outputs (int32 ones exactly) and the gradient of sum_k sum(y_k * r_k) for every input that takes
 * one, at the conv fixtures' bounds (torch_fixtures.h). Built in float32 and float64. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cgrad/cgrad.h>
#include "check.h"
#include "torch_fixtures.h"

enum { MAX_PARTS = 8, MAX_CASES = 64 };

/* One case being replayed: its graph, the inputs whose gradient torch gave, and the outputs. */
typedef struct {
    const char *name;
    cg_graph *g;
    cg_tensor *grad_in[MAX_PARTS];
    const char *grad_name[MAX_PARTS];
    int ngrad;
    cg_tensor *out[MAX_PARTS];
    char out_part[MAX_PARTS][16];
    bool weighted[MAX_PARTS]; /* an output of its own, in the loss if torch gave its r */
    int nout;
    bool built; /* every op returned a tensor */
} fx_case;

static const char *replayed[MAX_CASES];
static int nreplayed;

static fx_case begin(const char *name) {
    if (nreplayed < MAX_CASES) replayed[nreplayed++] = name;
    return (fx_case){.name = name, .g = cg_graph_new(CG_TRAIN), .built = true};
}
/* A real input whose gradient is compared with torch's d<part>. */
static cg_tensor *grad_input(fx_case *k, const char *part) {
    cg_tensor *t = cg_requires_grad(fx_input(k->g, fx_find(k->name, part), CG_REAL));
    if (k->ngrad < MAX_PARTS) k->grad_in[k->ngrad] = t, k->grad_name[k->ngrad++] = part;
    return t;
}
/* An input that takes no gradient, real or int32. */
static cg_tensor *input(fx_case *k, const char *part, cg_dtype dtype) {
    return fx_input(k->g, fx_find(k->name, part), dtype);
}
/* The next output: y0, y1, ... in the fixture, weighted by r0, r1, ... where torch gave one. */
static void output(fx_case *k, cg_tensor *y) {
    if (!y) k->built = false;
    if (k->nout < MAX_PARTS)
        snprintf(k->out_part[k->nout], 16, "y%d", k->nout), k->weighted[k->nout] = true, k->out[k->nout++] = cg_retain(y);
}
/* One more tensor compared with an output already named (another route to the same values). */
static void output_as(fx_case *k, cg_tensor *y, const char *part) {
    if (!y) k->built = false;
    if (k->nout < MAX_PARTS) snprintf(k->out_part[k->nout], 16, "%s", part), k->out[k->nout++] = cg_retain(y);
}

/* Runs forward and backward of sum_k sum(y_k * r_k), and compares outputs and gradients with torch. */
static void finish(fx_case *k) {
    CHECK(k->built, "%s: %s", k->name, cg_last_error());
    cg_tensor *loss = NULL;
    for (int i = 0; k->built && i < k->nout; i++) {
        char r_part[16];
        snprintf(r_part, sizeof r_part, "r%s", k->out_part[i] + 1);
        const fx_tensor *r = fx_find(k->name, r_part);
        if (!r || !k->weighted[i]) continue;
        cg_tensor *term = cg_sum_all(k->g, cg_mul(k->g, k->out[i], fx_input(k->g, r, CG_REAL)));
        loss = loss ? cg_add(k->g, loss, term) : term;
    }
    bool ran = k->built && !cg_graph_forward(k->g) && (!loss || !cg_graph_backward(k->g, loss));
    CHECK(!k->built || ran, "%s: %s", k->name, cg_last_error());
    for (int i = 0; ran && i < k->nout; i++)
        if (cg_tensor_dtype(k->out[i]) == CG_INT32) fx_compare_ints(k->name, k->out_part[i], k->out[i]);
        else fx_compare(k->name, k->out_part[i], k->out[i], false);
    for (int i = 0; ran && i < k->ngrad; i++) {
        char d_part[16];
        snprintf(d_part, sizeof d_part, "d%s", k->grad_name[i]);
        fx_compare(k->name, d_part, k->grad_in[i], true);
    }
    cg_graph_free(k->g);
}

/* ---- topk ---- */

static void topk_case(const char *name, int64_t kk, int axis, bool largest) {
    fx_case k = begin(name);
    cg_tensor *x = grad_input(&k, "x"), *values = NULL, *indices = NULL;
    if (x) cg_topk(k.g, x, kk, axis, largest, &values, &indices);
    output(&k, values);
    output(&k, indices);
    finish(&k);
}

static void test_topk(void) {
    topk_case("topk_last", 3, -1, true);
    topk_case("topk_axis0_smallest", 2, 0, false);
    topk_case("topk_mid", 4, 1, true);
    topk_case("topk_all_smallest", 5, 2, false);
    topk_case("topk_nan_largest", 3, 1, true);
    topk_case("topk_nan_smallest", 6, 1, false);
}

/* ---- one_hot, comparisons, casts ---- */

static void compare_case(const char *name, cg_dtype dtype) {
    fx_case k = begin(name);
    cg_tensor *a = input(&k, "a", dtype), *b = input(&k, "b", dtype);
    cg_tensor *(*const ops[6])(cg_graph *, cg_tensor *, cg_tensor *) = {cg_eq, cg_ne, cg_lt, cg_le, cg_gt, cg_ge};
    for (int i = 0; i < 6; i++) output(&k, ops[i](k.g, a, b));
    finish(&k);
}

static void test_masks_casts(void) {
    fx_case k = begin("one_hot");
    cg_tensor *ids = input(&k, "i", CG_INT32);
    output(&k, cg_one_hot(k.g, ids, 5, CG_INT32));
    output_as(&k, cg_one_hot(k.g, ids, 5, CG_REAL), "y0");
    finish(&k);

    compare_case("compare_row", CG_REAL);
    compare_case("compare_both", CG_REAL);
    compare_case("compare_int", CG_INT32);

    k = begin("to_int");
    output(&k, cg_to_int(k.g, input(&k, "x", CG_REAL)));
    finish(&k);
    k = begin("to_real");
    output(&k, cg_to_real(k.g, input(&k, "i", CG_INT32)));
    finish(&k);
}

/* ---- cumsum ---- */

static void cumsum_case(const char *name, int axis, bool reverse) {
    fx_case k = begin(name);
    output(&k, cg_cumsum(k.g, grad_input(&k, "x"), axis, reverse));
    finish(&k);
}

static void test_cumsum(void) {
    cumsum_case("cumsum_0", 0, false);
    cumsum_case("cumsum_1_reverse", 1, true);
    cumsum_case("cumsum_2", 2, false);
    cumsum_case("cumsum_m1_reverse", -1, true);
    cumsum_case("cumsum_0_reverse", 0, true);
    fx_case k = begin("cumsum_transposed");
    output(&k, cg_cumsum(k.g, cg_transpose(k.g, grad_input(&k, "x"), 0, 1), 1, false));
    finish(&k);
}

/* ---- scatters and their adjoints ---- */

static void scatter_case(const char *name, int axis, bool index_add) {
    fx_case k = begin(name);
    cg_tensor *x = grad_input(&k, "x"), *i = input(&k, "i", CG_INT32), *s = grad_input(&k, "s");
    output(&k, index_add ? cg_index_add(k.g, x, axis, i, s) : cg_scatter_add(k.g, x, axis, i, s));
    finish(&k);
}

static void select_case(const char *name, int axis, bool gather) {
    fx_case k = begin(name);
    cg_tensor *x = grad_input(&k, "x"), *i = input(&k, "i", CG_INT32);
    output(&k, gather ? cg_gather(k.g, x, axis, i) : cg_index_select(k.g, x, axis, i));
    finish(&k);
}

static void test_scatter(void) {
    scatter_case("scatter_add_0", 0, false);
    scatter_case("scatter_add_1", 1, false);
    scatter_case("scatter_add_last", -1, false);
    scatter_case("index_add_0", 0, true);
    scatter_case("index_add_1", 1, true);
    select_case("gather_1", 1, true);
    select_case("gather_0", 0, true);
    select_case("index_select_0", 0, false);
    select_case("index_select_2", 2, false);
}

/* ---- batched products ---- */

static void test_products(void) {
    fx_case k = begin("bmm");
    cg_tensor *a = grad_input(&k, "a"), *b = grad_input(&k, "b");
    output(&k, cg_bmm(k.g, a, b));
    finish(&k);
    k = begin("bmm_transposed"); /* a transposed view read in place */
    a = grad_input(&k, "a"), b = grad_input(&k, "b");
    output(&k, cg_bmm(k.g, cg_transpose(k.g, a, 1, 2), b));
    finish(&k);
    k = begin("grouped_linear");
    cg_tensor *x = grad_input(&k, "x"), *w = grad_input(&k, "w");
    output(&k, cg_grouped_linear(k.g, x, w, grad_input(&k, "bias")));
    finish(&k);
    k = begin("grouped_linear_nobias");
    x = grad_input(&k, "x"), w = grad_input(&k, "w");
    output(&k, cg_grouped_linear(k.g, x, w, NULL));
    finish(&k);
    k = begin("segment_linear");
    x = grad_input(&k, "x"), w = grad_input(&k, "w");
    output(&k, cg_segment_linear(k.g, x, w, input(&k, "ends", CG_INT32)));
    finish(&k);
}

/* ---- expand feeding other ops ---- */

/* x[3, 1, 4] expanded to [2, 3, 5, 4]: a new leading axis and a repeated one, both stride 0. */
static cg_tensor *expanded(fx_case *k) {
    cg_tensor *e = cg_expand(k->g, grad_input(k, "x"), 4, (int64_t[]){2, -1, 5, -1});
    CHECK(!e || (cg_strides(e)[0] == 0 && cg_strides(e)[2] == 0), "%s: expand is not a zero-stride view", k->name);
    return e;
}

static void test_expand(void) {
    fx_case k = begin("expand_mul"); /* read in place */
    cg_tensor *e = expanded(&k);
    output(&k, cg_mul(k.g, e, grad_input(&k, "z")));
    finish(&k);
    k = begin("expand_add"); /* read in place, broadcast once more */
    e = expanded(&k);
    output(&k, cg_add(k.g, e, grad_input(&k, "b")));
    finish(&k);
    k = begin("expand_matmul"); /* a contiguous copy */
    e = expanded(&k);
    output(&k, cg_matmul(k.g, e, grad_input(&k, "m")));
    finish(&k);
    k = begin("expand_sum"); /* a contiguous copy */
    output(&k, cg_sum(k.g, expanded(&k), 2, false));
    finish(&k);
    k = begin("expand_two_ops"); /* one view, two readers: their gradients add over the repeats */
    e = expanded(&k);
    output(&k, cg_mul(k.g, e, grad_input(&k, "z")));
    output(&k, cg_matmul(k.g, e, grad_input(&k, "m")));
    finish(&k);
}

/* Every case in the file was replayed: a fixture added to the script without its C case fails. */
static void test_all_replayed(void) {
    for (int i = 0; i < nfx; i++) {
        const char *dot = strchr(fx[i].name, '.');
        bool found = false;
        for (int j = 0; dot && !found && j < nreplayed; j++)
            found = strlen(replayed[j]) == (size_t)(dot - fx[i].name) && !strncmp(replayed[j], fx[i].name, (size_t)(dot - fx[i].name));
        CHECK(found, "fixture %s: no case replays it", fx[i].name);
    }
}

int main(void) {
    if (!fx_load(CGRAD_TEST_DIR "/fixtures/ops/ops.txt")) {
        CHECK(false, "cannot read %s", CGRAD_TEST_DIR "/fixtures/ops/ops.txt");
        TEST_END();
    }
    test_topk();
    test_masks_casts();
    test_cumsum();
    test_scatter();
    test_products();
    test_expand();
    test_all_replayed();
    fx_free();
    TEST_END();
}
