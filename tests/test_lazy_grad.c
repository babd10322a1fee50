/* SPDX-License-Identifier: MIT */
/* Lazy parameter-gradient zeroing (graph/params.c): cg_params_zero_grad marks gradients stale and
 * their first writer in the next backward assigns them. Hand-derived gradients, accumulation over
 * backward calls, stale gradients that must read as zero (cg_read_grad, clipping's norm, a pointer
 * kept from cg_grad), and whole models trained bit for bit as with eager zeroing (a set whose block
 * was handed out by cg_params_grads is zeroed at once, the old path). Also run with
 * CGRAD_GEMM_BLIS=1, where dW may go through scratch and a transposed add. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cgrad.h"
#include "check.h"

enum { M = 3, K = 4, N = 2 };

static bool bits_equal(const cg_real *a, const cg_real *b, int64_t n) { return memcmp(a, b, (size_t)n * sizeof *a) == 0; }

/* loss = sum(linear(x, W, b) * c): dW[j,k] = sum_i c[i,j] x[i,k], db[j] = sum_i c[i,j]. A second
 * graph reads only U (loss2 = sum(U * U), dU = 2U), so U's gradient goes stale in the first. */
static void hand_derived(void) {
    cg_params *ps = cg_params_new();
    cg_tensor *W = cg_params_add(ps, "W", 2, (int64_t[]){N, K}), *b = cg_params_add(ps, "b", 1, (int64_t[]){N}),
              *U = cg_params_add(ps, "U", 1, (int64_t[]){3});
    cg_real xv[M * K], cv[M * N], wv[N * K], uv[3] = {0.5f, -1.25f, 2};
    for (int i = 0; i < M * K; i++) xv[i] = (cg_real)(0.25 * i - 1);
    for (int i = 0; i < M * N; i++) cv[i] = (cg_real)(i + 1) * (i % 2 ? -1 : 1);
    for (int i = 0; i < N * K; i++) wv[i] = (cg_real)(0.1 * i);
    cg_write(W, wv), cg_write(U, uv), cg_fill(b, 0.5);
    cg_graph *g = cg_graph_new(CG_TRAIN), *g2 = cg_graph_new(CG_TRAIN);
    cg_tensor *x = cg_input(g, "x", CG_REAL, 2, (int64_t[]){M, K}), *c = cg_input(g, "c", CG_REAL, 2, (int64_t[]){M, N});
    cg_tensor *loss = cg_sum_all(g, cg_mul(g, cg_linear(g, x, W, b), c)), *loss2 = cg_sum_all(g2, cg_mul(g2, U, U));
    CHECK(loss && loss2, "%s", cg_last_error());
    memcpy(cg_data(x), xv, sizeof xv), memcpy(cg_data(c), cv, sizeof cv);
    double dw[N * K] = {0}, db[N] = {0}, sq = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            db[j] += cv[i * N + j];
            for (int k = 0; k < K; k++) dw[j * K + k] += (double)cv[i * N + j] * xv[i * K + k];
        }
    for (int i = 0; i < N * K; i++) sq += dw[i] * dw[i];
    for (int j = 0; j < N; j++) sq += db[j] * db[j];

    cg_real first[N * K + N], got[N * K + N], gu[3];
    CHECK(!cg_graph_forward(g2) && !cg_graph_backward(g2, loss2), "%s", cg_last_error());
    cg_params_zero_grad(ps); /* U's 2U goes stale: nothing below may see it */
    CHECK(!cg_graph_forward(g) && !cg_graph_backward(g, loss), "%s", cg_last_error());
    const double norm = cg_clip_grad_norm(ps, INFINITY); /* before anything reads U (reading settles it) */
    CHECK(fabs(norm - sqrt(sq)) < 1e-5 * sqrt(sq), "norm %.9g, hand %.9g: a stale gradient counted", norm, sqrt(sq));
    cg_read_grad(W, first), cg_read_grad(b, first + N * K), cg_read_grad(U, gu);
    for (int i = 0; i < N * K; i++) CHECK(fabs(first[i] - dw[i]) < 1e-5, "dW[%d] = %g, hand %g", i, (double)first[i], dw[i]);
    for (int j = 0; j < N; j++) CHECK(fabs(first[N * K + j] - db[j]) < 1e-5, "db[%d] = %g, hand %g", j, (double)first[N * K + j], db[j]);
    CHECK(gu[0] == 0 && gu[1] == 0 && gu[2] == 0, "unused U reads %g %g %g after zero_grad", (double)gu[0], (double)gu[1], (double)gu[2]);

    /* a second backward without zero_grad adds: exactly twice */
    CHECK(!cg_graph_forward(g) && !cg_graph_backward(g, loss), "%s", cg_last_error());
    cg_read_grad(W, got), cg_read_grad(b, got + N * K);
    int twice = 0;
    for (int i = 0; i < N * K + N; i++) twice += got[i] == 2 * first[i];
    CHECK(twice == N * K + N, "only %d of %d gradients doubled", twice, N * K + N);

    /* zero_grad then backward: the first gradient again; a read between them sees zeros */
    cg_params_zero_grad(ps);
    cg_read_grad(W, got);
    int zeros = 0;
    for (int i = 0; i < N * K; i++) zeros += got[i] == 0;
    CHECK(zeros == N * K, "after zero_grad dW has %d of %d zeros", zeros, N * K);
    cg_params_zero_grad(ps);
    CHECK(!cg_graph_forward(g) && !cg_graph_backward(g, loss), "%s", cg_last_error());
    cg_read_grad(W, got), cg_read_grad(b, got + N * K);
    CHECK(bits_equal(got, first, N * K + N), "zero_grad + backward differs from the first backward");
    CHECK(!cg_graph_forward(g) && !cg_graph_backward(g, loss) && !cg_graph_forward(g2) && !cg_graph_backward(g2, loss2),
          "%s", cg_last_error());
    cg_params_zero_grad(ps);
    CHECK(!cg_graph_forward(g) && !cg_graph_backward(g, loss), "%s", cg_last_error());
    cg_real *blk = cg_params_grads(ps); /* the block handed out: read as zero where stale */
    CHECK(blk && bits_equal(cg_grad(W), first, N * K) && cg_grad(U)[0] == 0 && cg_grad(U)[2] == 0,
          "the gradient block after zero_grad + backward");

    /* a pointer kept from cg_grad reads zero right after zero_grad, with nothing else called */
    cg_params *ps2 = cg_params_new();
    cg_tensor *V = cg_params_add(ps2, "V", 1, (int64_t[]){3});
    cg_write(V, uv);
    cg_graph *g3 = cg_graph_new(CG_TRAIN);
    cg_tensor *loss3 = cg_sum_all(g3, cg_mul(g3, V, V));
    cg_real *kept = cg_grad(V);
    CHECK(!cg_graph_forward(g3) && !cg_graph_backward(g3, loss3) && kept[1] == 2 * uv[1], "dV = 2V: %g", (double)kept[1]);
    cg_params_zero_grad(ps2);
    CHECK(kept[0] == 0 && kept[1] == 0 && kept[2] == 0, "a kept gradient pointer reads %g %g %g after zero_grad",
          (double)kept[0], (double)kept[1], (double)kept[2]);
    cg_graph_free(g3);
    cg_params_free(ps2);
    cg_graph_free(g);
    cg_graph_free(g2);
    cg_params_free(ps);
}

/* Deterministic batch: ids in [3, 3 + span) (the encoder-decoder's pad, bos and eos below 3), masks
 * 1, BERT's labels on every third position. */
static void fill(const cg_model_graph *mg, int step, int span) {
    for (int k = 0; k < mg->n_inputs; k++) {
        cg_tensor *t = mg->inputs[k];
        const char *nm = cg_name(t);
        int32_t *d = cg_idata(t);
        for (int64_t i = 0; d && i < cg_numel(t); i++) {
            const int32_t id = (int32_t)(3 + (i * 7 + k * 5 + step * 3) % span);
            if (strstr(nm, "mask")) d[i] = 1;
            else if (strstr(nm, "token_type")) d[i] = (int32_t)(i % 2);
            else if (strstr(nm, "next_sentence")) d[i] = (int32_t)((i + step) % 2);
            else if (!strcmp(nm, "labels")) d[i] = i % 3 ? -100 : id;
            else d[i] = id;
        }
    }
}

/* Three AdamW steps of two micro-batches each, clipped, with an extra decayed parameter that only
 * the first step's side graph reaches: lazily zeroed (set A) and eagerly (set B, its gradient block
 * handed out) must give the same bits in every value, gradient and norm. */
static void model_matches_eager(cg_arch arch, const char *json, int64_t t, int64_t s) {
    cg_params *ps[2];
    cg_model *m[2];
    cg_graph *g[2], *side[2];
    cg_model_graph mg[2];
    cg_tensor *extra[2], *side_loss[2];
    double norms[2][3];
    for (int v = 0; v < 2; v++) {
        ps[v] = cg_params_new();
        m[v] = cg_model_new(arch, json, 0.0, ps[v], 5);
        CHECK(m[v] != NULL, "%s", cg_last_error());
        if (!m[v]) return;
        extra[v] = cg_params_add(ps[v], "extra", 1, (int64_t[]){40});
        cg_fill(extra[v], 0.75);
        g[v] = cg_graph_new(CG_TRAIN);
        CHECK(cg_model_build(g[v], m[v], 2, t, s, &mg[v]) == CG_OK, "%s", cg_last_error());
        side[v] = cg_graph_new(CG_TRAIN);
        side_loss[v] = cg_sum_all(side[v], cg_mul(side[v], extra[v], extra[v]));
        if (v == 1) cg_params_grads(ps[v]); /* B: zero_grad clears at once, backward adds into zeros */
        cg_optim_config oc = cg_optim_defaults(CG_OPT_ADAMW);
        cg_optim *opt = cg_optim_new(ps[v], &oc);
        for (int step = 0; step < 3; step++) {
            cg_params_zero_grad(ps[v]);
            for (int micro = 0; micro < 2; micro++) {
                fill(&mg[v], 2 * step + micro, 11);
                CHECK(!cg_graph_forward(g[v]) && !cg_graph_backward(g[v], mg[v].loss), "%s", cg_last_error());
            }
            if (step == 0) CHECK(!cg_graph_forward(side[v]) && !cg_graph_backward(side[v], side_loss[v]), "%s", cg_last_error());
            /* step 1 unclipped: the optimizer alone must read the stale side gradient as zero */
            norms[v][step] = step == 1 ? 0 : cg_clip_grad_norm(ps[v], 0.05);
            CHECK(cg_optim_step(opt, 1e-2) == CG_OK, "%s", cg_last_error());
        }
        cg_optim_free(opt);
    }
    CHECK(memcmp(norms[0], norms[1], sizeof norms[0]) == 0, "arch %d: norms %.9g %.9g %.9g, eager %.9g %.9g %.9g", (int)arch,
          norms[0][0], norms[0][1], norms[0][2], norms[1][0], norms[1][1], norms[1][2]);
    const int64_t span = cg_params_span(ps[0]);
    CHECK(span == cg_params_span(ps[1]) && bits_equal(cg_params_values(ps[0]), cg_params_values(ps[1]), span),
          "arch %d: values after 3 steps differ from eager zeroing", (int)arch);
    int differ = 0;
    for (int i = 0; i < cg_params_count(ps[0]); i++) {
        cg_tensor *p = cg_params_at(ps[0], i);
        cg_real *buf = malloc((size_t)cg_numel(p) * sizeof *buf);
        cg_read_grad(p, buf);
        differ += !bits_equal(buf, cg_grad(cg_params_at(ps[1], i)), cg_numel(p));
        free(buf);
    }
    CHECK(differ == 0, "arch %d: %d parameter gradients differ from eager zeroing", (int)arch, differ);
    cg_real e[40];
    cg_read_grad(extra[0], e);
    CHECK(e[0] == 0 && e[39] == 0, "the side parameter's gradient reads %g after unused steps", (double)e[0]);
    for (int v = 0; v < 2; v++) {
        cg_graph_free(g[v]), cg_graph_free(side[v]);
        cg_model_free(m[v]);
        cg_params_free(ps[v]);
    }
}

/* A weight read through views: a transpose covers the parameter (its first write may assign), a
 * slice does not (the rows it leaves must read zero, not the last step's gradient). P [4, K]:
 * loss = sum(linear(x, P[0:2]) * c) + sum(linear(x, P^T^T) * c) in a graph, sum(P * P) in another. */
static void views_of_a_weight(void) {
    cg_params *ps = cg_params_new();
    cg_tensor *P = cg_params_add(ps, "P", 2, (int64_t[]){4, K});
    cg_real pv[4 * K], xv[M * K], cv[M * N];
    for (int i = 0; i < 4 * K; i++) pv[i] = (cg_real)(i % 5 - 2);
    for (int i = 0; i < M * K; i++) xv[i] = (cg_real)(0.5 * i - 2);
    for (int i = 0; i < M * N; i++) cv[i] = (cg_real)(i - 1);
    cg_write(P, pv);
    cg_graph *side = cg_graph_new(CG_TRAIN), *g = cg_graph_new(CG_TRAIN), *gt = cg_graph_new(CG_TRAIN);
    cg_tensor *l_side = cg_sum_all(side, cg_mul(side, P, P));
    cg_tensor *x = cg_input(g, "x", CG_REAL, 2, (int64_t[]){M, K}), *c = cg_input(g, "c", CG_REAL, 2, (int64_t[]){M, N});
    cg_tensor *l_slice = cg_sum_all(g, cg_mul(g, cg_linear(g, x, cg_slice(g, P, 0, 0, 2), NULL), c));
    cg_tensor *xt = cg_input(gt, "x", CG_REAL, 2, (int64_t[]){M, K}), *ct = cg_input(gt, "c", CG_REAL, 2, (int64_t[]){M, 4});
    cg_tensor *l_tr = cg_sum_all(gt, cg_mul(gt, cg_linear(gt, xt, cg_transpose(gt, cg_transpose(gt, P, 0, 1), 0, 1), NULL), ct));
    CHECK(l_side && l_slice && l_tr, "%s", cg_last_error());
    memcpy(cg_data(x), xv, sizeof xv), memcpy(cg_data(c), cv, sizeof cv), memcpy(cg_data(xt), xv, sizeof xv);
    for (int i = 0; i < M * 4; i++) cg_data(ct)[i] = (cg_real)(i % 3 - 1);
    cg_real got[4 * K];
    for (int pass = 0; pass < 2; pass++) {
        cg_tensor *l = pass ? l_tr : l_slice;
        cg_graph *gl = pass ? gt : g;
        CHECK(!cg_graph_forward(side) && !cg_graph_backward(side, l_side), "%s", cg_last_error()); /* dP = 2P */
        cg_params_zero_grad(ps);
        CHECK(!cg_graph_forward(gl) && !cg_graph_backward(gl, l), "%s", cg_last_error());
        cg_read_grad(P, got);
        const int rows = pass ? 4 : 2;
        const cg_real *cc = pass ? cg_data(ct) : cv;
        int bad = 0;
        for (int j = 0; j < 4; j++)
            for (int k = 0; k < K; k++) {
                double want = 0;
                for (int i = 0; j < rows && i < M; i++) want += (double)cc[i * rows + j] * xv[i * K + k];
                bad += fabs(got[j * K + k] - want) > 1e-5;
            }
        CHECK(bad == 0, "%s view: %d of %d gradient elements wrong (a stale row kept?)", pass ? "transposed" : "sliced", bad, 4 * K);
    }
    cg_graph_free(side), cg_graph_free(g), cg_graph_free(gt);
    cg_params_free(ps);
}

/* add and sub claim their inputs: a first writer copies (or, broadcast, sums) the output's
 * gradient over whatever the buffer held, later writers add. loss = sum(((x + x) - b) * c) +
 * sum((x[1:3] + h[0:2] - P) * c2), h = 2x + 0: x + x (the second source adds), a broadcast b, views
 * of two roots, a stale parameter; twice with other c, over the plan's reused memory. */
static void add_claims(void) {
    enum { R = 4, C = 5 };
    cg_params *ps = cg_params_new();
    cg_tensor *P = cg_params_add(ps, "P", 2, (int64_t[]){2, C});
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = cg_requires_grad(cg_input(g, "x", CG_REAL, 2, (int64_t[]){R, C}));
    cg_tensor *b = cg_requires_grad(cg_input(g, "b", CG_REAL, 1, (int64_t[]){C}));
    cg_tensor *c = cg_input(g, "c", CG_REAL, 2, (int64_t[]){R, C}), *c2 = cg_input(g, "c2", CG_REAL, 2, (int64_t[]){2, C});
    cg_tensor *h = cg_add_scalar(g, cg_scale(g, x, 2), 0);
    cg_tensor *s = cg_add(g, cg_slice(g, x, 0, 1, 3), cg_slice(g, h, 0, 0, 2));
    cg_tensor *l1 = cg_sum_all(g, cg_mul(g, cg_sub(g, cg_add(g, x, x), b), c));
    cg_tensor *l2 = cg_sum_all(g, cg_mul(g, cg_sub(g, s, P), c2));
    cg_tensor *loss = cg_add(g, l1, l2);
    CHECK(loss != NULL, "%s", cg_last_error());
    for (int i = 0; i < R * C; i++) cg_data(x)[i] = (cg_real)(0.5 * i - 3);
    for (int j = 0; j < C; j++) cg_data(b)[j] = (cg_real)j;
    for (int round = 0; round < 2; round++) {
        cg_params_zero_grad(ps);
        for (int i = 0; i < R * C; i++) cg_data(c)[i] = (cg_real)((i % 7) - 3 + round);
        for (int i = 0; i < 2 * C; i++) cg_data(c2)[i] = (cg_real)((i % 3) + 0.5 * round);
        CHECK(!cg_graph_forward(g) && !cg_graph_backward(g, loss), "%s", cg_last_error());
        /* dx = 2c + [rows 1..2] c2 + 2 * [rows 0..1] c2 (through h); db = -colsum(c); dP = -c2 */
        double dx[R * C], db[C] = {0};
        for (int i = 0; i < R * C; i++) dx[i] = 2.0 * cg_data(c)[i];
        for (int r = 0; r < 2; r++)
            for (int j = 0; j < C; j++) {
                dx[(r + 1) * C + j] += cg_data(c2)[r * C + j];
                dx[r * C + j] += 2.0 * cg_data(c2)[r * C + j];
            }
        for (int i = 0; i < R * C; i++) db[i % C] -= cg_data(c)[i];
        int bad = 0;
        for (int i = 0; i < R * C; i++) bad += cg_grad(x)[i] != (cg_real)dx[i];
        for (int j = 0; j < C; j++) bad += cg_grad(b)[j] != (cg_real)db[j];
        cg_real gp[2 * C];
        cg_read_grad(P, gp);
        for (int i = 0; i < 2 * C; i++) bad += gp[i] != -cg_data(c2)[i];
        CHECK(bad == 0, "round %d: %d gradients of x, b, P differ from the hand values", round, bad);
    }
    cg_graph_free(g);
    cg_params_free(ps);
}

int main(void) {
    hand_derived();
    views_of_a_weight();
    add_claims();
    model_matches_eager(CG_ARCH_GPT2, "{\"vocab_size\": 16, \"n_positions\": 16, \"n_embd\": 32, \"n_layer\": 1, \"n_head\": 2}",
                        16, 0);
    model_matches_eager(CG_ARCH_BERT,
                        "{\"vocab_size\": 16, \"hidden_size\": 32, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
                        "\"intermediate_size\": 64, \"max_position_embeddings\": 16, \"type_vocab_size\": 2}",
                        16, 0);
    model_matches_eager(CG_ARCH_ENCDEC,
                        "{\"src_vocab_size\": 16, \"tgt_vocab_size\": 16, \"d_model\": 32, \"n_head\": 2, "
                        "\"num_encoder_layers\": 1, \"num_decoder_layers\": 1, \"dim_feedforward\": 64, \"max_len\": 16, "
                        "\"pad_id\": 0, \"bos_id\": 1, \"eos_id\": 2}",
                        16, 16);
    TEST_END();
}
