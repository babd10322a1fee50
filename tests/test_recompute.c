/* SPDX-License-Identifier: MIT */
/* Gradient checkpointing (graph/checkpoint.c): every zoo model marks its blocks as segments, and
 * with checkpointing on, backward recomputes each segment's values. The reference is the same
 * model trained without it: loss and every parameter gradient must be equal bit for bit, with
 * dropout on (its masks must be redrawn exactly), at 1 and 2 threads, over two steps. The plan
 * must place everything in fewer bytes, and misuse of the segment calls is an error value. */
#include <stdint.h>
#include <string.h>

#include "../cgrad.h"
#include "check.h"

static const char *const gpt_cfg = "{\"vocab_size\": 50, \"n_positions\": 32, \"n_embd\": 32, \"n_layer\": 4, \"n_head\": 4}";
static const char *const bert_cfg = "{\"vocab_size\": 40, \"hidden_size\": 32, \"num_hidden_layers\": 3, "
                                    "\"num_attention_heads\": 4, \"intermediate_size\": 64, "
                                    "\"max_position_embeddings\": 32, \"type_vocab_size\": 2}";
static const char *const encdec_cfg = "{\"src_vocab_size\": 30, \"tgt_vocab_size\": 31, \"d_model\": 32, \"n_head\": 4, "
                                      "\"num_encoder_layers\": 2, \"num_decoder_layers\": 3, \"dim_feedforward\": 64, "
                                      "\"max_len\": 32, \"pad_id\": 0, \"bos_id\": 1, \"eos_id\": 2}";
static const char *const llama_cfg = "{\"vocab_size\": 50, \"hidden_size\": 32, \"intermediate_size\": 48, "
                                     "\"num_hidden_layers\": 3, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
                                     "\"max_position_embeddings\": 32, \"rms_norm_eps\": 1e-6}";
static const char *const cls_cfg = "{\"vocab_size\": 40, \"d_model\": 32, \"n_head\": 4, \"n_layer\": 3, "
                                   "\"dim_feedforward\": 64, \"max_len\": 32, \"num_classes\": 3}";

typedef struct {
    double loss[2];      /* per step */
    cg_real *grads;      /* after the last step, malloc'd */
    int64_t span;
    size_t plan_bytes;
} run_result;

/* Batch inputs by name: ids in the vocabulary, masks with one padded position, labels in range. */
static void fill(const cg_model_graph *mg, cg_arch arch, cg_rng *r) {
    for (int i = 0; i < mg->n_inputs; i++) {
        cg_tensor *t = mg->inputs[i];
        const char *name = cg_name(t);
        int32_t *d = cg_idata(t);
        const int64_t n = cg_numel(t), cols = cg_dim(t, -1);
        for (int64_t j = 0; j < n; j++) {
            const uint64_t u = cg_rng_next(r);
            if (!strcmp(name, "attention_mask") || !strcmp(name, "src_mask")) d[j] = j != n - 1;
            else if (!strcmp(name, "token_type_ids")) d[j] = (int32_t)(j % cols >= cols / 2);
            else if (!strcmp(name, "next_sentence_label")) d[j] = (int32_t)(u % 2);
            else if (!strcmp(name, "labels") && arch == CG_ARCH_CLASSIFIER) d[j] = (int32_t)(u % 3);
            else if (!strcmp(name, "labels")) d[j] = j % 3 ? -100 : (int32_t)(3 + u % 30);
            else d[j] = (int32_t)(3 + u % 27);
        }
    }
}

/* Two training steps of a fresh model (seeded the same each time) on the same batches. */
static bool run(cg_arch arch, const char *cfg, double dropout, int threads, bool ckpt, run_result *out) {
    memset(out, 0, sizeof *out);
    cg_set_threads(threads);
    cg_params *ps = cg_params_new();
    cg_model *m = cg_model_new(arch, cfg, dropout, ps, 7);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_model_graph mg;
    bool ok = m && g && cg_model_build(g, m, 2, 12, 10, &mg) == CG_OK;
    CHECK(ok, "%s: build: %s", cg_arch_name(arch), cg_last_error());
    if (ok) {
        cg_graph_set_checkpointing(g, ckpt);
        cg_graph_set_rng(g, 99, 0);
        cg_rng r;
        cg_rng_seed(&r, 5);
        for (int step = 0; ok && step < 2; step++) {
            fill(&mg, arch, &r);
            cg_params_zero_grad(ps);
            ok = cg_graph_forward(g) == CG_OK && cg_graph_backward(g, mg.loss) == CG_OK;
            CHECK(ok, "%s: step %d: %s", cg_arch_name(arch), step, cg_last_error());
            out->loss[step] = cg_item(mg.loss);
        }
        out->span = cg_params_span(ps);
        out->grads = malloc((size_t)out->span * sizeof(cg_real));
        if (out->grads) memcpy(out->grads, cg_params_grads(ps), (size_t)out->span * sizeof(cg_real));
        out->plan_bytes = cg_graph_plan_bytes(g);
    }
    cg_graph_free(g);
    cg_model_free(m);
    cg_params_free(ps);
    return ok && out->grads;
}

static void same_gradients(cg_arch arch, const char *cfg, double dropout, int threads) {
    run_result a, b;
    bool ok = run(arch, cfg, dropout, threads, false, &a) & run(arch, cfg, dropout, threads, true, &b);
    if (ok) {
        int64_t first = -1, differ = 0;
        double worst = 0;
        for (int64_t i = 0; i < a.span; i++)
            if (memcmp(&a.grads[i], &b.grads[i], sizeof(cg_real))) {
                if (first < 0) first = i;
                differ++;
                worst = fmax(worst, fabs((double)a.grads[i] - (double)b.grads[i]));
            }
        CHECK(differ == 0, "%s dropout %g, %d threads: %lld of %lld gradient elements differ with checkpointing "
              "(first at %lld: %.9g vs %.9g, worst |diff| %.3g)", cg_arch_name(arch), dropout, threads,
              (long long)differ, (long long)a.span, (long long)first, first >= 0 ? (double)a.grads[first] : 0.0,
              first >= 0 ? (double)b.grads[first] : 0.0, worst);
        CHECK(!memcmp(a.loss, b.loss, sizeof a.loss), "%s: losses %.9g %.9g vs %.9g %.9g", cg_arch_name(arch),
              a.loss[0], a.loss[1], b.loss[0], b.loss[1]);
        /* a gradient that is all zeros would match trivially */
        double norm = 0;
        for (int64_t i = 0; i < a.span; i++) norm += (double)a.grads[i] * a.grads[i];
        CHECK(norm > 1e-8 && isfinite(norm), "%s: gradient norm^2 %g", cg_arch_name(arch), norm);
        CHECK(b.plan_bytes < a.plan_bytes, "%s dropout %g: plan with checkpointing %zu bytes, without %zu",
              cg_arch_name(arch), dropout, b.plan_bytes, a.plan_bytes);
        if (threads == 2)
            printf("%-10s dropout %.1f: plan %8zu bytes without checkpointing, %8zu with (%.2fx)\n", cg_arch_name(arch),
                   dropout, a.plan_bytes, b.plan_bytes, (double)b.plan_bytes / (double)a.plan_bytes);
    }
    free(a.grads);
    free(b.grads);
}

/* A deeper GPT at a longer context: each block's activations dwarf the residual stream that
 * checkpointing keeps, so the plan must shrink to well under half. */
static void plan_shrinks(void) {
    const char *cfg = "{\"vocab_size\": 256, \"n_positions\": 128, \"n_embd\": 128, \"n_layer\": 6, \"n_head\": 4}";
    size_t bytes[2] = {0, 0};
    cg_params *ps = cg_params_new();
    cg_model *m = cg_model_new(CG_ARCH_GPT2, cfg, 0.1, ps, 1);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_model_graph mg;
    bool ok = m && g && cg_model_build(g, m, 2, 128, 0, &mg) == CG_OK;
    for (int on = 0; ok && on < 2; on++) { /* one graph, planned anew when the switch flips */
        cg_graph_set_checkpointing(g, on);
        CHECK(cg_graph_checkpointing(g) == on, "switch reads back");
        ok = cg_graph_forward(g) == CG_OK && cg_graph_backward(g, mg.loss) == CG_OK;
        bytes[on] = cg_graph_plan_bytes(g);
    }
    CHECK(ok, "%s", cg_last_error());
    printf("gpt 6x128, T 128, B 2: plan %.2f MB without checkpointing, %.2f MB with\n", bytes[0] / 1e6, bytes[1] / 1e6);
    CHECK(bytes[1] > 0 && bytes[1] * 2 < bytes[0], "plan bytes %zu with checkpointing should be under half of %zu",
          bytes[1], bytes[0]);
    cg_graph_free(g);
    cg_model_free(m);
    cg_params_free(ps);
}

/* A segment that holds the loss and a retained node, and a second segment reading the first's
 * values: hand-checkable gradients of sum(tanh(w * x)^2) through both. */
static void small_graph(void) {
    cg_params *ps = cg_params_new();
    cg_tensor *w = cg_params_add(ps, "w", 1, (int64_t[]){4});
    const cg_real wv[4] = {0.5, -1, 2, 0.25}, xv[4] = {1, 2, -0.5, 3};
    memcpy(cg_data(w), wv, sizeof wv);
    for (int on = 0; on < 2; on++) {
        cg_graph *g = cg_graph_new(CG_TRAIN);
        cg_graph_set_checkpointing(g, on);
        cg_tensor *x = cg_input(g, "x", CG_REAL, 1, (int64_t[]){4});
        cg_write(x, xv);
        CHECK(cg_checkpoint_begin(g) == CG_OK, "%s", cg_last_error());
        cg_tensor *h = cg_retain(cg_tanh(g, cg_mul(g, w, x)));
        CHECK(cg_checkpoint_end(g) == CG_OK, "%s", cg_last_error());
        CHECK(cg_checkpoint_begin(g) == CG_OK, "%s", cg_last_error());
        cg_tensor *loss = cg_sum_all(g, cg_square(g, h));
        CHECK(cg_checkpoint_end(g) == CG_OK, "%s", cg_last_error());
        cg_params_zero_grad(ps);
        CHECK(cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "%s", cg_last_error());
        double want_loss = 0;
        for (int i = 0; i < 4; i++) {
            const double th = tanh((double)wv[i] * xv[i]);
            want_loss += th * th;
            /* d/dw tanh(wx)^2 = 2 tanh (1 - tanh^2) x */
            CHECK_NEAR(cg_grad(w)[i], 2 * th * (1 - th * th) * xv[i], 1e-5);
            CHECK_NEAR(cg_data(h)[i], th, 1e-6);
        }
        CHECK_NEAR(cg_item(loss), want_loss, 1e-5);
        cg_graph_free(g);
    }
    cg_params_free(ps);
}

/* Dropout inside the fused attention kernel draws its mask from the step forward ran at: the
 * recompute, after forward has advanced the step, must draw the same one. */
static void sdpa_dropout(void) {
    cg_params *ps = cg_params_new();
    cg_tensor *qkv[3];
    cg_rng r;
    cg_rng_seed(&r, 11);
    for (int i = 0; i < 3; i++) {
        qkv[i] = cg_params_add(ps, (const char *[]){"q", "k", "v"}[i], 4, (int64_t[]){1, 2, 40, 8});
        cg_fill_normal(qkv[i], &r, 0, 1);
    }
    const cg_sdpa_opts opts = {.scale = 0.35, .causal = true, .dropout = 0.3};
    cg_real *grads[2] = {malloc((size_t)cg_params_span(ps) * sizeof(cg_real)),
                         malloc((size_t)cg_params_span(ps) * sizeof(cg_real))};
    bool ok = true;
    for (int on = 0; on < 2; on++) {
        cg_graph *g = cg_graph_new(CG_TRAIN);
        cg_graph_set_checkpointing(g, on);
        cg_graph_set_rng(g, 3, 0);
        cg_checkpoint_begin(g);
        cg_tensor *h = cg_tanh(g, cg_sdpa_ex(g, qkv[0], qkv[1], qkv[2], &opts));
        cg_checkpoint_end(g);
        cg_checkpoint_begin(g);
        cg_tensor *o = cg_sdpa_ex(g, h, qkv[1], qkv[2], &opts);
        cg_checkpoint_end(g);
        cg_tensor *loss = cg_sum_all(g, cg_square(g, o));
        for (int step = 0; step < 2; step++) { /* the second step draws other masks */
            cg_params_zero_grad(ps);
            ok &= loss && cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK;
        }
        CHECK(ok, "%s", cg_last_error());
        if (grads[on]) memcpy(grads[on], cg_params_grads(ps), (size_t)cg_params_span(ps) * sizeof(cg_real));
        cg_graph_free(g);
    }
    CHECK(ok && grads[0] && grads[1] && !memcmp(grads[0], grads[1], (size_t)cg_params_span(ps) * sizeof(cg_real)),
          "fused attention with dropout: gradients differ with checkpointing (q[0] %.9g vs %.9g)",
          grads[0] ? (double)grads[0][0] : 0.0, grads[1] ? (double)grads[1][0] : 0.0);
    free(grads[0]);
    free(grads[1]);
    cg_params_free(ps);
}

static void misuse(void) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    CHECK(cg_checkpoint_begin(NULL) == CG_ERR_ARG && strstr(cg_last_error(), "[checkpoint_begin]"), "%s", cg_last_error());
    CHECK(cg_checkpoint_end(g) == CG_ERR_STATE && strstr(cg_last_error(), "[checkpoint_end] no segment is open"), "%s",
          cg_last_error());
    CHECK(cg_checkpoint_begin(g) == CG_OK, "%s", cg_last_error());
    CHECK(cg_checkpoint_begin(g) == CG_ERR_STATE && strstr(cg_last_error(), "do not nest"), "%s", cg_last_error());
    cg_tensor *x = cg_input(g, "x", CG_REAL, 1, (int64_t[]){3});
    cg_tensor *y = cg_exp(g, x);
    CHECK(y != NULL, "%s", cg_last_error());
    /* forward refuses a segment left open, naming it */
    CHECK(cg_graph_forward(g) == CG_ERR_STATE && strstr(cg_last_error(), "segment 1") &&
          strstr(cg_last_error(), "cg_checkpoint_end"), "%s", cg_last_error());
    CHECK(cg_checkpoint_end(g) == CG_OK, "%s", cg_last_error());
    CHECK(cg_graph_forward(g) == CG_OK, "%s", cg_last_error());
    cg_graph_free(g);

    /* a model built inside the caller's own segment: its blocks would nest */
    cg_params *ps = cg_params_new();
    cg_model *m = cg_model_new(CG_ARCH_GPT2, gpt_cfg, 0, ps, 1);
    g = cg_graph_new(CG_TRAIN);
    cg_model_graph mg;
    cg_checkpoint_begin(g);
    CHECK(cg_model_build(g, m, 1, 4, 0, &mg) != CG_OK && strstr(cg_last_error(), "do not nest"), "%s", cg_last_error());
    cg_graph_free(g);
    cg_model_free(m);
    cg_params_free(ps);
}

int main(void) {
    misuse();
    small_graph();
    sdpa_dropout();
    const struct {
        cg_arch arch;
        const char *cfg;
    } models[] = {{CG_ARCH_GPT2, gpt_cfg}, {CG_ARCH_BERT, bert_cfg}, {CG_ARCH_ENCDEC, encdec_cfg}, {CG_ARCH_CLASSIFIER, cls_cfg},
                  {CG_ARCH_LLAMA, llama_cfg}};
    for (int threads = 1; threads <= 2; threads++)
        for (size_t i = 0; i < sizeof models / sizeof *models; i++) {
            same_gradients(models[i].arch, models[i].cfg, 0.1, threads);
            if (models[i].arch == CG_ARCH_GPT2) same_gradients(models[i].arch, models[i].cfg, 0, threads); /* fused attention */
        }
    plan_shrinks();
    TEST_END();
}
