/* SPDX-License-Identifier: MIT */
/* LoRA adapters: a linear through an adapted weight equals one through the merged weight, for
 * every way a model reads a weight (itself, a block of rows, transposed); the adapter's
 * gradients match finite differences; the base stays frozen while a GPT fine-tunes; merging
 * leaves the model's outputs unchanged; bad requests are errors. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include <cgrad/cgrad.h>
#include "graph/internal.h"
#include "ops/bf16_internal.h"

enum { R = 6, C = 5, RANK = 2, N = 3 };

/* y = x @ w^T through P (with adapter) for the read `mode`: 0 plain, 1 rows [2, 5), 2 transposed. */
static cg_tensor *read_weight(cg_graph *g, cg_tensor *p, cg_tensor *x, int mode) {
    if (mode == 0) return cg_linear(g, x, p, NULL);
    if (mode == 1) return cg_linear(g, x, cg_slice(g, p, 0, 2, 5), NULL);
    return cg_linear(g, x, cg_transpose(g, p, 0, 1), NULL);
}

static int64_t in_dim(int mode) { return mode == 2 ? R : C; }
static int64_t out_dim(int mode) { return mode == 0 ? R : mode == 1 ? 3 : C; }

/* The same product with the adapter and with P + s B A written by hand, for each read mode. */
static void test_matches_merged_weight(void) {
    for (int mode = 0; mode < 3; mode++) {
        cg_params *ps = cg_params_new();
        cg_rng r;
        cg_rng_seed(&r, 3);
        cg_tensor *p = cg_params_add(ps, "w", 2, (int64_t[]){R, C});
        cg_fill_uniform(p, &r, -1, 1);
        CHECK(cg_lora_add(ps, p, RANK, 4.0, &r) == CG_OK, "%s", cg_last_error());
        cg_tensor *a = cg_params_find(ps, "w.lora_A"), *b = cg_params_find(ps, "w.lora_B");
        CHECK(a && b && cg_dim(a, 0) == RANK && cg_dim(a, 1) == C && cg_dim(b, 0) == R && cg_dim(b, 1) == RANK,
              "adapter shapes");
        CHECK(!cg_param_trainable(p) && cg_param_trainable(a) && cg_param_trainable(b), "base frozen, adapter trains");
        cg_fill_uniform(b, &r, -1, 1); /* B starts at zero; give it values so the path shows */

        double merged[R][C];
        for (int i = 0; i < R; i++)
            for (int j = 0; j < C; j++) {
                double acc = 0;
                for (int q = 0; q < RANK; q++) acc += cg_data(b)[i * RANK + q] * cg_data(a)[q * C + j];
                merged[i][j] = cg_data(p)[i * C + j] + 4.0 / RANK * acc;
            }
        cg_graph *g = cg_graph_new(CG_EVAL);
        cg_tensor *x = cg_input(g, "x", CG_REAL, 2, (int64_t[]){N, in_dim(mode)});
        cg_fill_uniform(x, &r, -1, 1);
        cg_tensor *y = read_weight(g, p, x, mode);
        cg_real got[N * R];
        CHECK(y && !cg_graph_forward(g) && !cg_read(y, got), "mode %d: %s", mode, cg_last_error());
        double worst = 0;
        for (int n = 0; n < N; n++)
            for (int o = 0; o < out_dim(mode); o++) {
                double want = 0;
                for (int i = 0; i < in_dim(mode); i++) {
                    const double wv = mode == 0 ? merged[o][i] : mode == 1 ? merged[o + 2][i] : merged[i][o];
                    want += cg_data(x)[n * in_dim(mode) + i] * wv;
                }
                worst = fmax(worst, fabs(want - got[n * out_dim(mode) + o]));
            }
        CHECK(worst < 1e-5, "mode %d: adapted product differs from the merged weight's by %g", mode, worst);

        /* after cg_lora_merge the base alone holds P + s B A and B is zero: same outputs */
        CHECK(cg_lora_merge(ps) == CG_OK, "merge: %s", cg_last_error());
        double wdiff = 0;
        for (int i = 0; i < R; i++)
            for (int j = 0; j < C; j++) wdiff = fmax(wdiff, fabs(cg_data(p)[i * C + j] - merged[i][j]));
        CHECK(wdiff < 1e-6, "merged base off by %g", wdiff);
        cg_real again[N * R];
        CHECK(!cg_graph_forward(g) && !cg_read(y, again), "rerun");
        double ydiff = 0;
        for (int k = 0; k < N * out_dim(mode); k++) ydiff = fmax(ydiff, fabs(again[k] - got[k]));
        CHECK(ydiff < 1e-5, "mode %d: outputs moved by %g after merging", mode, ydiff);
        cg_graph_free(g);
        cg_params_free(ps);
    }
}

static void test_adapter_gradients(void) {
    for (int mode = 0; mode < 3; mode++) {
        cg_params *ps = cg_params_new();
        cg_rng r;
        cg_rng_seed(&r, 8);
        cg_tensor *p = cg_params_add(ps, "w", 2, (int64_t[]){R, C});
        cg_fill_uniform(p, &r, -1, 1);
        cg_lora_add(ps, p, RANK, 2.0, &r);
        cg_fill_uniform(cg_params_find(ps, "w.lora_B"), &r, -1, 1);
        cg_graph *g = cg_graph_new(CG_TRAIN);
        cg_tensor *x = cg_requires_grad(cg_input(g, "x", CG_REAL, 2, (int64_t[]){N, in_dim(mode)}));
        cg_fill_uniform(x, &r, -1, 1);
        cg_tensor *y = cg_tanh(g, read_weight(g, p, x, mode));
        cg_tensor *in[3] = {cg_params_find(ps, "w.lora_A"), cg_params_find(ps, "w.lora_B"), x};
        cg_gradcheck_result res[3];
        CHECK(y && cg_gradcheck(g, y, 3, in, 0, res) == CG_OK, "mode %d: %s", mode, cg_last_error());
        for (int i = 0; i < 3; i++)
            CHECK(res[i].max_rel_err < CG_GRADCHECK_TOL, "mode %d: d/d %s rel err %g", mode, res[i].name,
                  res[i].max_rel_err);
        CHECK(cg_read_grad(p, (cg_real[R * C]){0}) == CG_OK, "base gradient readable");
        double gsum = 0;
        for (int k = 0; k < R * C; k++) gsum += fabs(cg_grad(p)[k]);
        CHECK(gsum == 0, "the frozen base got a gradient (sum |g| = %g)", gsum);
        cg_graph_free(g);
        cg_params_free(ps);
    }
}

/* One adapted linear y (fused, or composed under CGRAD_LORA_UNFUSED=1) in a graph of precision prec,
 * the weight read in place from bf16 when wb is not NULL: sum(y u), then dX, dA and dB into out
 * (FO floats, the first FM * FN for y's loss and zeros); the graph's node count. */
enum { FM = 6, FK = 40, FN = 24, FR = 4, FO = FM * FN + FM * FK + FR * FK + FN * FR };
static uint16_t fused_wbits[FN * FK]; /* the weight in bf16 */
static int adapted_linear(const uint16_t *wb, cg_precision prec, bool fused, cg_real *out) {
    cg_params *ps = cg_params_new();
    cg_tensor *p = cg_params_add(ps, "w", 2, (int64_t[]){FN, FK});
    cg_rng r;
    cg_rng_seed(&r, 11);
    cg_fill_uniform(p, &r, -1, 1);
    static cg_real wv[FN * FK];
    CHECK(cg_read(p, wv) == CG_OK, "%s", cg_last_error());
    for (int i = 0; i < FN * FK; i++) { /* its values rounded to bf16 (to nearest even), for the mapped runs */
        float v = (float)wv[i];
        uint32_t bits;
        memcpy(&bits, &v, sizeof bits);
        fused_wbits[i] = (uint16_t)((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
    }
    CHECK(cg_lora_add(ps, p, FR, 2.0 * FR, &r) == CG_OK, "%s", cg_last_error());
    cg_tensor *a = cg_params_find(ps, "w.lora_A"), *b = cg_params_find(ps, "w.lora_B");
    cg_fill_uniform(b, &r, -1, 1);
    if (wb) CHECK(cg_param_map(p, wb, CG_MAP_BF16) == CG_OK, "%s", cg_last_error());
    CHECK(cg_params_compact(ps) == CG_OK, "%s", cg_last_error());
    if (!fused) setenv("CGRAD_LORA_UNFUSED", "1", 1);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    CHECK(cg_graph_set_precision(g, prec) == CG_OK, "%s", cg_last_error());
    cg_tensor *x = cg_requires_grad(cg_input(g, "x", CG_REAL, 2, (int64_t[]){FM, FK}));
    cg_fill_uniform(x, &r, -1, 1);
    cg_tensor *u = cg_input(g, "u", CG_REAL, 2, (int64_t[]){FM, FN});
    cg_fill_uniform(u, &r, -1, 1);
    cg_tensor *y = cg_linear(g, x, p, NULL);
    cg_tensor *loss = cg_sum_all(g, cg_mul(g, y, u));
    unsetenv("CGRAD_LORA_UNFUSED");
    const int nodes = cg_graph_size(g);
    cg_params_zero_grad(ps);
    CHECK(cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "%s", cg_last_error());
    /* y stays unretained, so its gradient may turn bf16 in place: the loss sum(y u) stands for it */
    for (int i = 0; i < FM * FN; i++) out[i] = 0;
    out[0] = cg_item(loss);
    CHECK(cg_read_grad(x, out + FM * FN) == CG_OK &&
              cg_read_grad(a, out + FM * FN + FM * FK) == CG_OK && cg_read_grad(b, out + FM * FN + FM * FK + FR * FK) == CG_OK,
          "%s", cg_last_error());
    cg_graph_free(g);
    cg_params_free(ps);
    return nodes;
}

/* The largest |a - b| over the FO values, relative to the largest |b|. */
static double rel_diff(const cg_real *a, const cg_real *b) {
    double d = 0, m = 0;
    for (int i = 0; i < FO; i++) d = fmax(d, fabs(a[i] - b[i])), m = fmax(m, fabs(b[i]));
    return d / m;
}

/* The fused node (one node for the adapted linear) gives the composed path's output and gradients:
 * the same float products in fp32, and in bf16 with the weight read in place the same roundings of
 * the operands (only the order of the float additions differs); each within bf16's error of fp32. */
static void test_fused_matches_composed(void) {
    static cg_real ref[FO], got[FO], f32[FO];
    const int n_composed = adapted_linear(NULL, CG_FP32, false, ref), n_fused = adapted_linear(NULL, CG_FP32, true, got);
    CHECK(n_fused < n_composed, "fused graph: %d nodes, composed %d", n_fused, n_composed);
    CHECK(rel_diff(got, ref) < 1e-6, "fp32: fused vs composed rel diff %g", rel_diff(got, ref));
    memcpy(f32, ref, sizeof ref);
    if (cg_bf16_unavailable()) {
        printf("bf16 products unavailable here (%s): the fused bf16 check skipped\n", cg_bf16_unavailable());
        return;
    }
    static uint16_t wb[FN * FK];
    memcpy(wb, fused_wbits, sizeof wb);
    adapted_linear(wb, CG_BF16, false, ref);
    adapted_linear(wb, CG_BF16, true, got);
    CHECK(rel_diff(got, ref) < 1e-5, "bf16: fused vs composed rel diff %g", rel_diff(got, ref));
    CHECK(rel_diff(got, f32) < 3e-2 && rel_diff(got, f32) > 0, "bf16 fused vs fp32: rel diff %g", rel_diff(got, f32));
}

/* One adapted linear large enough for the bf16 backward's one-region path (256 x 512 x 512 =
 * 2^26 multiply-adds: dX in column blocks, one per thread, beside the adapter's products), its
 * weight frozen and read in place from bf16, in a graph of precision prec: the loss, dX, dA and dB
 * into out; *threads gets cgi_lp_exec_threads after backward (the one-region path leaves its
 * thread count there, the sequential one its last rank-r product's, 1). y_only: the graph is y
 * alone, forward only: y [BM, BN] into out, *threads after forward (the same way). */
enum { BM = 256, BK = 512, BN = 512, BR = 8, BO = 1 + BM * BK + BR * BK + BN * BR };
static void big_adapted_linear(const uint16_t *wb, cg_precision prec, cg_real *out, int *threads, bool y_only) {
    cg_params *ps = cg_params_new();
    cg_tensor *p = cg_params_add(ps, "w", 2, (int64_t[]){BN, BK});
    cg_rng r;
    cg_rng_seed(&r, 5);
    CHECK(cg_lora_add(ps, p, BR, 2.0 * BR, &r) == CG_OK, "%s", cg_last_error());
    cg_fill_uniform(cg_params_find(ps, "w.lora_B"), &r, -0.5, 0.5);
    CHECK(cg_param_map(p, wb, CG_MAP_BF16) == CG_OK && cg_params_compact(ps) == CG_OK, "%s", cg_last_error());
    cg_graph *g = cg_graph_new(CG_TRAIN);
    CHECK(cg_graph_set_precision(g, prec) == CG_OK, "%s", cg_last_error());
    cg_tensor *x = cg_requires_grad(cg_input(g, "x", CG_REAL, 2, (int64_t[]){BM, BK}));
    cg_fill_uniform(x, &r, -1, 1);
    cg_tensor *u = cg_input(g, "u", CG_REAL, 2, (int64_t[]){BM, BN});
    cg_fill_uniform(u, &r, -1, 1);
    cg_tensor *y = cg_linear(g, x, p, NULL);
    cgi_lp_exec_threads = 0;
    if (y_only) {
        CHECK(cg_graph_forward(g) == CG_OK && cg_read(y, out) == CG_OK, "%s", cg_last_error());
        *threads = cgi_lp_exec_threads;
        cg_graph_free(g);
        cg_params_free(ps);
        return;
    }
    cg_tensor *loss = cg_sum_all(g, cg_mul(g, y, u));
    cg_params_zero_grad(ps);
    CHECK(cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "%s", cg_last_error());
    *threads = cgi_lp_exec_threads;
    out[0] = cg_item(loss);
    CHECK(cg_read_grad(x, out + 1) == CG_OK && cg_read_grad(cg_params_find(ps, "w.lora_A"), out + 1 + BM * BK) == CG_OK &&
              cg_read_grad(cg_params_find(ps, "w.lora_B"), out + 1 + BM * BK + BR * BK) == CG_OK,
          "%s", cg_last_error());
    cg_graph_free(g);
    cg_params_free(ps);
}

/* The largest |a - b| over n values, relative to the largest |b|. */
static double rel_diff_n(const cg_real *a, const cg_real *b, int n) {
    double d = 0, m = 0;
    for (int i = 0; i < n; i++) d = fmax(d, fabs(a[i] - b[i])), m = fmax(m, fabs(b[i]));
    return d / m;
}

/* bf16 LoRA backward on two threads in one region (CGRAD_LORA_OVERLAP, the default) against the
 * sequential products (=0): the same bf16 operands, only the float additions' order differs; the
 * same bits on every run; within bf16's error of the fp32 graph on the same weights. */
static void test_bf16_backward_one_region(void) {
    if (cg_bf16_unavailable() || strcmp(cg_bf16_kernel(), "onednn") || cg_threads() < 2) {
        printf("the one-region bf16 backward needs oneDNN's bf16 kernel and 2 threads (here %s, %d): check skipped\n",
               cg_bf16_unavailable() ? cg_bf16_unavailable() : cg_bf16_kernel(), cg_threads());
        return;
    }
    static uint16_t wb[BN * BK];
    for (int i = 0; i < BN * BK; i++) wb[i] = (uint16_t)(0x3c00 + (i * 7919) % 512 + (i % 3 ? 0 : 0x8000)); /* +-[0.008, 0.03] */
    static cg_real one[BO], again[BO], seq[BO], f32[BO];
    int t_one, t_again, t_seq, t_f32;
    big_adapted_linear(wb, CG_BF16, one, &t_one, false);
    big_adapted_linear(wb, CG_BF16, again, &t_again, false);
    setenv("CGRAD_LORA_OVERLAP", "0", 1);
    big_adapted_linear(wb, CG_BF16, seq, &t_seq, false);
    unsetenv("CGRAD_LORA_OVERLAP");
    big_adapted_linear(wb, CG_FP32, f32, &t_f32, false);
    CHECK(t_one == 2 && t_again == 2 && t_seq == 1, "last bf16 product's threads: one region %d, %d; sequential %d", t_one,
          t_again, t_seq);
    CHECK(!memcmp(one, again, sizeof one), "one-region backward: two runs differ");
    CHECK(rel_diff_n(one, seq, BO) < 1e-5, "one region vs sequential: rel diff %g", rel_diff_n(one, seq, BO));
    CHECK(rel_diff_n(one + 1 + BM * BK, seq + 1 + BM * BK, BR * BK) < 1e-5, "dA: rel diff %g",
          rel_diff_n(one + 1 + BM * BK, seq + 1 + BM * BK, BR * BK));
    CHECK(rel_diff_n(one + 1 + BM * BK + BR * BK, seq + 1 + BM * BK + BR * BK, BN * BR) < 1e-5, "dB: rel diff %g",
          rel_diff_n(one + 1 + BM * BK + BR * BK, seq + 1 + BM * BK + BR * BK, BN * BR));
    CHECK(rel_diff_n(one, f32, BO) < 3e-2 && rel_diff_n(one, f32, BO) > 0, "bf16 vs fp32: rel diff %g",
          rel_diff_n(one, f32, BO));
}

/* bf16 LoRA forward on two threads in one region (CGRAD_LORA_FWD_OVERLAP, the default: x A^T on
 * thread 0 beside the base product's column blocks, then low B^T per block) against the sequential
 * products (=0): the same bf16 operands; the same bits on every run; within bf16's error of fp32. */
static void test_bf16_forward_one_region(void) {
    if (cg_bf16_unavailable() || strcmp(cg_bf16_kernel(), "onednn") || cg_threads() < 2) {
        printf("the one-region bf16 forward needs oneDNN's bf16 kernel and 2 threads (here %s, %d): check skipped\n",
               cg_bf16_unavailable() ? cg_bf16_unavailable() : cg_bf16_kernel(), cg_threads());
        return;
    }
    enum { YN = BM * BN };
    static uint16_t wb[BN * BK];
    for (int i = 0; i < BN * BK; i++) wb[i] = (uint16_t)(0x3c00 + (i * 7919) % 512 + (i % 3 ? 0 : 0x8000)); /* +-[0.008, 0.03] */
    static cg_real one[YN], again[YN], seq[YN], f32[YN];
    int t_one, t_again, t_seq, t_f32;
    big_adapted_linear(wb, CG_BF16, one, &t_one, true);
    big_adapted_linear(wb, CG_BF16, again, &t_again, true);
    setenv("CGRAD_LORA_FWD_OVERLAP", "0", 1);
    big_adapted_linear(wb, CG_BF16, seq, &t_seq, true);
    unsetenv("CGRAD_LORA_FWD_OVERLAP");
    big_adapted_linear(wb, CG_FP32, f32, &t_f32, true);
    CHECK(t_one == 2 && t_again == 2 && t_seq == 1, "last bf16 product's threads: one region %d, %d; sequential %d", t_one,
          t_again, t_seq);
    CHECK(!memcmp(one, again, sizeof one), "one-region forward: two runs differ");
    CHECK(rel_diff_n(one, seq, YN) < 1e-6, "one region vs sequential: rel diff %g", rel_diff_n(one, seq, YN));
    CHECK(rel_diff_n(one, f32, YN) < 3e-2 && rel_diff_n(one, f32, YN) > 0, "bf16 vs fp32: rel diff %g",
          rel_diff_n(one, f32, YN));
}

/* The one-region bf16 forward and backward held on one thread by the cores guard (as under load)
 * run the same pieces in turn: the bits of the two-thread run, not the sequential path's. */
static void test_bf16_one_region_guarded(void) {
    if (cg_bf16_unavailable() || strcmp(cg_bf16_kernel(), "onednn") || cg_threads() < 2) {
        printf("the one-region bf16 products need oneDNN's bf16 kernel and 2 threads (here %s, %d): check skipped\n",
               cg_bf16_unavailable() ? cg_bf16_unavailable() : cg_bf16_kernel(), cg_threads());
        return;
    }
    static uint16_t wb[BN * BK];
    for (int i = 0; i < BN * BK; i++) wb[i] = (uint16_t)(0x3c00 + (i * 7919) % 512 + (i % 3 ? 0 : 0x8000));
    static cg_real two[BO], held[BO], y_two[BM * BN], y_held[BM * BN];
    int t_two, t_held, ty_two, ty_held;
    big_adapted_linear(wb, CG_BF16, two, &t_two, false);
    big_adapted_linear(wb, CG_BF16, y_two, &ty_two, true);
    cgi_cores_force(1);
    big_adapted_linear(wb, CG_BF16, held, &t_held, false);
    big_adapted_linear(wb, CG_BF16, y_held, &ty_held, true);
    cgi_cores_force(-1);
    CHECK(t_two == 2 && ty_two == 2 && t_held == 1 && ty_held == 1, "threads: two %d, %d; held %d, %d", t_two, ty_two,
          t_held, ty_held);
    CHECK(!memcmp(two, held, sizeof two), "backward held on one thread differs from two: rel diff %g",
          rel_diff_n(held, two, BO));
    CHECK(!memcmp(y_two, y_held, sizeof y_two), "forward held on one thread differs from two: rel diff %g",
          rel_diff_n(y_held, y_two, BM * BN));
}

/* A tiny GPT fine-tuned through adapters on its attention and MLP: only adapters move, the loss
 * falls, and merging then gives the same logits without the adapter path. */
static void test_gpt_finetune(void) {
    const char *cfg = "{\"vocab_size\": 11, \"n_positions\": 8, \"n_embd\": 16, \"n_layer\": 2, \"n_head\": 2}";
    cg_params *ps = cg_params_new();
    cg_model *m = cg_model_new(CG_ARCH_GPT2, cfg, 0, ps, 5);
    CHECK(m != NULL, "model: %s", cg_last_error());
    if (!m) return;
    const int base_count = cg_params_count(ps);
    cg_rng r;
    cg_rng_seed(&r, 9);
    const int added = cg_lora_apply(ps, "attn.c_attn,attn.c_proj,mlp.c_fc", 4, 8.0, &r);
    CHECK(added == 6, "adapters added: %d (%s)", added, added < 0 ? cg_last_error() : "");
    CHECK(cg_params_count(ps) == base_count + 2 * added, "%d parameters", cg_params_count(ps));
    int trainable = 0;
    for (int i = 0; i < cg_params_count(ps); i++) {
        cg_tensor *t = cg_params_at(ps, i);
        trainable += cg_param_trainable(t);
        CHECK(cg_param_trainable(t) == cg_lora_is_adapter(t), "%s trainable %d", cg_name(t), cg_param_trainable(t));
        if (cg_lora_is_adapter(t)) CHECK(cg_lora_base(ps, t) != NULL, "%s has no base", cg_name(t));
    }
    CHECK(trainable == 2 * added, "%d trainable", trainable);
    const int64_t span = cg_params_span(ps);
    cg_real *before = malloc((size_t)span * sizeof *before);
    memcpy(before, cg_params_values(ps), (size_t)span * sizeof *before);

    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_model_graph mg;
    CHECK(cg_model_build(g, m, 4, 8, 0, &mg) == CG_OK, "build: %s", cg_last_error());
    int32_t ids[32], tgt[32];
    for (int i = 0; i < 32; i++) ids[i] = (int32_t)(i % 11), tgt[i] = (int32_t)((i + 1) % 11);
    cg_write_ids(mg.inputs[0], ids);
    cg_write_ids(mg.inputs[1], tgt);
    cg_optim_config oc = cg_optim_defaults(CG_OPT_ADAMW);
    cg_optim *opt = cg_optim_new(ps, &oc);
    double first = 0, last = 0;
    for (int step = 0; step < 60; step++) {
        cg_graph_forward(g);
        cg_params_zero_grad(ps);
        cg_graph_backward(g, mg.loss);
        cg_optim_step(opt, 3e-2);
        last = cg_item(mg.loss);
        if (step == 0) first = last;
    }
    CHECK(last < first - 0.15, "loss %g -> %g: the adapters did not learn", first, last);
    int base_moved = 0, adapter_moved = 0;
    for (int i = 0; i < cg_params_count(ps); i++) {
        cg_tensor *t = cg_params_at(ps, i);
        const int64_t off = cg_data(t) - cg_params_values(ps);
        const bool moved = memcmp(cg_data(t), before + off, (size_t)cg_numel(t) * sizeof(cg_real)) != 0;
        if (cg_lora_is_adapter(t)) adapter_moved += moved;
        else base_moved += moved;
    }
    CHECK(base_moved == 0 && adapter_moved == 2 * added, "base tensors moved: %d, adapters moved: %d", base_moved,
          adapter_moved);

    /* adapters alone on disk: a fresh model from the base file plus them computes the same loss, and
     * with the moments restored one more step gives the same parameters bit for bit */
    const char *base_path = "test_lora_base.safetensors", *ad_path = "test_lora_adapters.safetensors";
    CHECK(cg_model_save(m, base_path) == CG_OK, "save base: %s", cg_last_error());
    CHECK(cg_lora_save(ps, opt, ad_path) == CG_OK, "save adapters: %s", cg_last_error());
    cg_st *af = cg_st_open(ad_path);
    CHECK(af && cg_st_count(af) == 3 * 2 * added, "adapter file holds %d tensors", af ? cg_st_count(af) : -1);
    for (int i = 0; af && i < cg_st_count(af); i++) CHECK(strstr(cg_st_name(af, i), ".lora_"), "%s", cg_st_name(af, i));
    cg_st_close(af);
    cg_st *bf = cg_st_open(base_path);
    CHECK(bf && cg_st_count(bf) == base_count, "base file holds %d tensors, the model %d", bf ? cg_st_count(bf) : -1,
          base_count);
    cg_params *ps2 = cg_params_new();
    cg_model *m2 = cg_model_new(CG_ARCH_GPT2, cfg, 0, ps2, 77);
    CHECK(bf && cg_model_load(m2, bf) == CG_OK, "load base: %s", cg_last_error());
    cg_st_close(bf);
    CHECK(cg_lora_load(ps2, ad_path) == CG_OK, "load adapters: %s", cg_last_error());
    CHECK(cg_params_count(ps2) == cg_params_count(ps), "%d parameters after loading", cg_params_count(ps2));
    cg_optim *opt2 = cg_optim_new(ps2, &oc);
    CHECK(cg_lora_load_optim(opt2, ps2, ad_path) == CG_OK, "load moments: %s", cg_last_error());
    CHECK(cg_optim_steps(opt2) == cg_optim_steps(opt), "steps %lld", (long long)cg_optim_steps(opt2));
    cg_graph *g2 = cg_graph_new(CG_TRAIN);
    cg_model_graph mg2;
    cg_model_build(g2, m2, 4, 8, 0, &mg2);
    cg_write_ids(mg2.inputs[0], ids);
    cg_write_ids(mg2.inputs[1], tgt);
    cg_graph *gs[2] = {g, g2};
    cg_model_graph *mgs[2] = {&mg, &mg2};
    cg_params *pss[2] = {ps, ps2};
    cg_optim *opts[2] = {opt, opt2};
    double losses[2];
    for (int k = 0; k < 2; k++) {
        cg_graph_forward(gs[k]);
        losses[k] = cg_item(mgs[k]->loss);
        cg_params_zero_grad(pss[k]);
        cg_graph_backward(gs[k], mgs[k]->loss);
        cg_optim_step(opts[k], 3e-2);
    }
    CHECK(losses[0] == losses[1], "reloaded fine-tune loss %.9g, original %.9g", losses[1], losses[0]);
    int differ = 0;
    for (int i = 0; i < cg_params_count(ps); i++)
        differ += memcmp(cg_data(cg_params_at(ps, i)), cg_data(cg_params_find(ps2, cg_name(cg_params_at(ps, i)))),
                         (size_t)cg_numel(cg_params_at(ps, i)) * sizeof(cg_real)) != 0;
    CHECK(differ == 0, "%d tensors differ after one resumed step", differ);
    CHECK(cg_lora_load(ps2, ad_path) == CG_ERR_FORMAT && strstr(cg_last_error(), ad_path), "loading twice: %s",
          cg_last_error());
    CHECK(cg_lora_load(ps2, base_path) == CG_ERR_FORMAT, "a model file is no adapter file");
    cg_optim_free(opt2);
    cg_graph_free(g2);
    cg_model_free(m2);
    cg_params_free(ps2);
    remove(base_path);
    remove(ad_path);

    /* merged: the same logits from an eval graph built after the merge (B = 0 there) */
    cg_graph *e = cg_graph_new(CG_EVAL);
    cg_model_graph eg;
    cg_model_build(e, m, 4, 8, 0, &eg);
    cg_write_ids(eg.inputs[0], ids);
    cg_write_ids(eg.inputs[1], tgt);
    cg_graph_forward(e);
    const double adapted = cg_item(eg.loss);
    cg_lora_merge(ps);
    cg_graph_forward(e);
    CHECK_NEAR(cg_item(eg.loss), adapted, 1e-5);
    /* exported: the merged weights alone, in a model that never had adapters */
    CHECK(cg_model_save(m, "test_lora_merged.safetensors") == CG_OK, "export: %s", cg_last_error());
    cg_params *ps3 = cg_params_new();
    cg_model *m3 = cg_model_new(CG_ARCH_GPT2, cfg, 0, ps3, 1);
    cg_st *mf = cg_st_open("test_lora_merged.safetensors");
    CHECK(mf && cg_model_load(m3, mf) == CG_OK, "load merged: %s", cg_last_error());
    cg_st_close(mf);
    remove("test_lora_merged.safetensors");
    cg_graph *e3 = cg_graph_new(CG_EVAL);
    cg_model_graph eg3;
    cg_model_build(e3, m3, 4, 8, 0, &eg3);
    cg_write_ids(eg3.inputs[0], ids);
    cg_write_ids(eg3.inputs[1], tgt);
    cg_graph_forward(e3);
    CHECK_NEAR(cg_item(eg3.loss), adapted, 1e-5);
    cg_graph_free(e3);
    cg_model_free(m3);
    cg_params_free(ps3);
    free(before);
    cg_optim_free(opt);
    cg_graph_free(g);
    cg_graph_free(e);
    cg_model_free(m);
    cg_params_free(ps);
}

static void test_errors(void) {
    cg_params *ps = cg_params_new(), *other = cg_params_new();
    cg_rng r;
    cg_rng_seed(&r, 1);
    cg_tensor *w = cg_params_add(ps, "w", 2, (int64_t[]){4, 3}), *bias = cg_params_add(ps, "b", 1, (int64_t[]){4});
    cg_tensor *foreign = cg_params_add(other, "f", 2, (int64_t[]){4, 3});
    CHECK(cg_lora_add(ps, w, 0, 1, &r) == CG_ERR_ARG && strstr(cg_last_error(), "rank 0"), "%s", cg_last_error());
    CHECK(cg_lora_add(ps, w, 4, 1, &r) == CG_ERR_ARG && strstr(cg_last_error(), "[1, 3]"), "%s", cg_last_error());
    CHECK(cg_lora_add(ps, bias, 1, 1, &r) == CG_ERR_ARG && strstr(cg_last_error(), "2-D"), "%s", cg_last_error());
    CHECK(cg_lora_add(ps, foreign, 1, 1, &r) == CG_ERR_ARG, "a parameter of another set");
    CHECK(cg_lora_add(ps, w, 1, NAN, &r) == CG_ERR_ARG && strstr(cg_last_error(), "alpha"), "%s", cg_last_error());
    CHECK(cg_lora_add(ps, w, 2, 1, &r) == CG_OK, "%s", cg_last_error());
    CHECK(cg_lora_add(ps, w, 2, 1, &r) == CG_ERR_ARG && strstr(cg_last_error(), "already"), "%s", cg_last_error());
    CHECK(cg_lora_apply(ps, "nothing", 1, 1, &r) == -1 && strstr(cg_last_error(), "nothing"), "%s", cg_last_error());
    /* a weight read through a column block is neither rows nor their transpose */
    cg_graph *g = cg_graph_new(CG_EVAL);
    cg_tensor *x = cg_input(g, "x", CG_REAL, 2, (int64_t[]){2, 2});
    CHECK(cg_linear(g, x, cg_slice(g, w, 1, 0, 2), NULL) == NULL && strstr(cg_last_error(), "[lora]"), "%s",
          cg_last_error());
    cg_graph_free(g);
    cg_params_free(ps);
    cg_params_free(other);
}

int main(void) {
    cg_set_threads(2);
    test_matches_merged_weight();
    test_adapter_gradients();
    test_fused_matches_composed();
    test_bf16_backward_one_region();
    test_bf16_forward_one_region();
    test_bf16_one_region_guarded();
    test_gpt_finetune();
    test_errors();
    TEST_END();
}
