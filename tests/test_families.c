/* SPDX-License-Identifier: MIT */
/* The Hugging Face families of the LLaMA-style decoder (Mistral, Qwen2, Qwen3, LLaMA's optional
 * fields): `cgrad step --arch llama` on each committed fixture (tests/make_family_fixtures.py, plain
 * torch written from transformers' modelling code) gives PyTorch's logits, loss and every gradient;
 * the sliding window holds through the KV cache (a replayed decode graph and generation, past the
 * window and past 256 keys); --checkpoint-activations changes no bit; config.json fields are honoured,
 * defaulted as transformers does, written back unchanged, or refused by name. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../cgrad.h"
#include "../cli/commands.h"
#include "../io/safetensors.h"
#include "../models/config_json.h"
#include "../models/llama.h"
#include "../models/zoo.h"
#include "check.h"
#include "st_check.h"
#include "decoder_check.h"

#define FIX CGRAD_TEST_DIR "/fixtures/models/"

/* max |a - b| over a tensor in two files, and max |b| in *scale (NAN when they do not pair up). */
static double max_diff(const cg_st *ours, const cg_st *ref, const char *name, double *scale) {
    int64_t n1 = 0, n2 = 0;
    cg_real *a = st_read_all(ours, name, &n1), *b = st_read_all(ref, name, &n2);
    double d = a && b && n1 == n2 ? 0 : NAN;
    *scale = 0;
    for (int64_t i = 0; a && b && n1 == n2 && i < n1; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        *scale = fmax(*scale, fabs((double)b[i]));
    }
    free(a);
    free(b);
    return d;
}

/* Tolerances, a few times what is achieved against the float64 references, whose values are rounded to
 * float32 once (CGRAD_THREADS=2; printed on each run). float32: logits max |diff| 4.8e-7 .. 8.0e-7
 * (scale ~3), the loss to its last bit, gradients 1.9e-7 .. 5.6e-7 of the model's largest |gradient|.
 * float64 (test_families_f64), where only the references' rounding is left: logits 5.7e-8 .. 8.2e-8,
 * loss <= 2.1e-7 (half a float32 ulp at 4.2), gradients 2.8e-8 .. 4.0e-8, AdamW parameters 3.1e-8.
 * AdamW in float32: its first steps move every element by about lr whatever its gradient's size, so
 * elements whose gradient is near rounding noise move either way; torch's own float32 run lands up to
 * 2.7e-3 (max |diff|) from the float64 reference. */
#ifdef CGRAD_DOUBLE
#define LOGITS_TOL 5e-7
#define LOSS_TOL 5e-7
#define GRAD_TOL 2e-7   /* of the largest |gradient| in the model */
#define ADAMW_TOL 2e-7  /* parameters after 3 AdamW steps, relative to each tensor's norm */
#else
#define LOGITS_TOL 5e-6
#define LOSS_TOL 5e-6
#define GRAD_TOL 5e-6
#define ADAMW_TOL 1e-2
#endif

static void parity(const char *name) {
    char cfg[512], w[512], b[512], out[256], exp_path[512], adam_path[512];
    snprintf(cfg, sizeof cfg, FIX "%s/config.json", name);
    snprintf(w, sizeof w, FIX "%s/weights.safetensors", name);
    snprintf(b, sizeof b, FIX "%s/batch.safetensors", name);
    snprintf(exp_path, sizeof exp_path, FIX "%s/expected.safetensors", name);
    snprintf(adam_path, sizeof adam_path, FIX "%s/adamw.safetensors", name);
    snprintf(out, sizeof out, "/tmp/cgrad_test_family_%s_%d.safetensors", name, (int)getpid());
    /* make_model_fixtures.py's AdamW: lr 1e-2, betas (0.9, 0.98), eps 1e-8, weight decay 0.1, 3 steps */
    char *argv[] = {"--arch", "llama", "--config", cfg, "--weights", w, "--batch", b, "--out", out, "--steps", "3",
                    "--optim", "adamw", "--lr", "0.01", "--beta1", "0.9", "--beta2", "0.98", "--eps", "1e-08",
                    "--weight-decay", "0.1"};
    int rc = cmd_step((int)(sizeof argv / sizeof argv[0]), argv);
    CHECK(rc == 0, "%s: cgrad step failed: %s", name, cg_last_error());
    cg_st *ours = cg_st_open(out), *ref = cg_st_open(exp_path), *adam = cg_st_open(adam_path);
    CHECK(ours && ref && adam, "%s: %s", name, cg_last_error());
    if (ours && ref && adam) {
        double scale, gmax = 0, gworst = 0, aworst = 0;
        const double dl = max_diff(ours, ref, "logits", &scale), dloss = max_diff(ours, ref, "loss", &scale);
        CHECK(dl <= LOGITS_TOL, "%s logits max |diff| %g", name, dl);
        CHECK(dloss <= LOSS_TOL, "%s loss diff %g", name, dloss);
        int ngrad = 0;
        for (int i = 0; i < cg_st_count(ref); i++) {
            const char *n = cg_st_name(ref, i);
            if (strncmp(n, "grad.", 5)) continue;
            const double d = max_diff(ours, ref, n, &scale);
            CHECK(!isnan(d), "%s: %s missing or of another size", name, n);
            gworst = fmax(gworst, d), gmax = fmax(gmax, scale), ngrad++;
        }
        CHECK(ngrad >= 18 && gworst <= GRAD_TOL * gmax, "%s: %d gradients, worst |diff| %g of the largest |grad| %g",
              name, ngrad, gworst, gmax);
        const double lossdiff = max_diff(ours, adam, "losses", &scale);
        CHECK(lossdiff <= LOSS_TOL * 4, "%s AdamW losses differ by %g", name, lossdiff);
        for (int i = 0; i < cg_st_count(adam); i++) {
            const char *n = cg_st_name(adam, i);
            if (!strcmp(n, "losses")) continue;
            int64_t n1 = 0, n2 = 0;
            cg_real *a = st_read_all(ours, n, &n1), *r = st_read_all(adam, n, &n2);
            double d2 = 0, r2 = 0;
            for (int64_t k = 0; a && r && n1 == n2 && k < n1; k++)
                d2 += ((double)a[k] - r[k]) * ((double)a[k] - r[k]), r2 += (double)r[k] * r[k];
            const double e = a && r && n1 == n2 ? sqrt(d2 / fmax(r2, 1e-30)) : INFINITY;
            CHECK(e <= ADAMW_TOL, "%s AdamW %s: relative error %g", name, n, e);
            aworst = fmax(aworst, e);
            free(a);
            free(r);
        }
        printf("%-9s parity: logits %.1e, loss %.1e, gradients %.1e of max |grad| %.2f (%d tensors), AdamW params "
               "%.1e\n", name, dl, dloss, gworst / gmax, gmax, ngrad, aworst);
    }
    cg_st_close(ours);
    cg_st_close(ref);
    cg_st_close(adam);
    unlink(out);
}

/* `cgrad step --checkpoint-activations` (each block recomputed in backward, the q/k norms, biases and
 * the window with it) writes the same file, byte for byte, as without. */
static void checkpointed(const char *name) {
    char cfg[512], w[512], b[512], out[2][256];
    snprintf(cfg, sizeof cfg, FIX "%s/config.json", name);
    snprintf(w, sizeof w, FIX "%s/weights.safetensors", name);
    snprintf(b, sizeof b, FIX "%s/batch.safetensors", name);
    char *files[2] = {NULL, NULL};
    size_t len[2] = {0, 0};
    for (int on = 0; on < 2; on++) {
        snprintf(out[on], sizeof out[on], "/tmp/cgrad_test_family_ckpt%d_%s_%d.safetensors", on, name, (int)getpid());
        char *argv[] = {"--arch", "llama", "--config", cfg, "--weights", w, "--batch", b, "--out", out[on],
                        "--steps", "2", "--checkpoint-activations"};
        CHECK(cmd_step((int)(sizeof argv / sizeof argv[0]) - !on, argv) == 0, "%s: %s", name, cg_last_error());
        files[on] = test_slurp(out[on], &len[on]);
        unlink(out[on]);
    }
    CHECK(files[0] && files[1] && len[0] == len[1] && len[0] > 1000 && !memcmp(files[0], files[1], len[0]),
          "%s: cgrad step with and without --checkpoint-activations wrote different files", name);
    free(files[0]);
    free(files[1]);
}

/* A small model of the family for the cache checks: vocabulary 13, the window shorter than the run. */
static cg_llama_config tiny(cg_llama_family f) {
    cg_llama_config c = {.family = f, .vocab_size = 13, .hidden_size = 16, .intermediate_size = 24,
                         .num_hidden_layers = 2, .num_attention_heads = 4, .num_key_value_heads = 2,
                         .max_position_embeddings = 48, .rms_norm_eps = 1e-6, .rope = {.theta = 10000.0}};
    if (f == CG_LLAMA_FAMILY_MISTRAL) c.sliding_window = 5;
    if (f == CG_LLAMA_FAMILY_QWEN2) c.qkv_bias = true, c.sliding_window = 3, c.use_sliding_window = true, c.max_window_layers = 1;
    if (f == CG_LLAMA_FAMILY_QWEN3) c.qk_norm = true, c.head_dim = 6, c.sliding_window = 4, c.use_sliding_window = true;
    return c;
}

static void spread(cg_params *ps, uint64_t seed) {
    cg_rng r;
    cg_rng_seed(&r, seed);
    for (int i = 0; i < cg_params_count(ps); i++) {
        cg_tensor *p = cg_params_at(ps, i);
        const bool bias = strstr(cg_name(p), ".bias") != NULL;
        if (cg_ndim(p) == 2) cg_fill_normal(p, &r, 0, 0.3);
        else cg_fill_normal(p, &r, bias ? 0 : 1.0, 0.2);
    }
}

/* Every new parameter's gradient against finite differences, in one model with all of them: q/k/v/o
 * and MLP biases, Qwen3's q/k norms, a window of 2 keys on layer 1 (Qwen's per-layer windows), a
 * head_dim of 6 against hidden / heads = 2. In the float64 build the worst relative error must be under
 * 1e-6; in float32 each element within the build's atol + rtol |numeric|. */
static void gradcheck(void) {
    cg_llama_config c = tiny(CG_LLAMA_FAMILY_QWEN3);
    c.hidden_size = 8, c.intermediate_size = 12, c.sliding_window = 2, c.max_window_layers = 1;
    c.qkv_bias = c.o_bias = c.mlp_bias = true;
    cg_params *ps = cg_params_new();
    cg_llama *m = cg_llama_new(&c, ps, 7);
    CHECK(m != NULL, "%s", cg_last_error());
    if (!m) return;
    spread(ps, 3);
    cg_rng r; /* unit-scale embeddings: RMSNorm's curvature at a small row would swamp float32 differences */
    cg_rng_seed(&r, 4);
    cg_fill_normal(cg_params_find(ps, "model.embed_tokens.weight"), &r, 0, 1.0);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    int64_t s[2] = {2, 5};
    cg_tensor *ids = cg_input(g, "ids", CG_INT32, 2, s), *tg = cg_input(g, "targets", CG_INT32, 2, s);
    for (int i = 0; i < 10; i++) {
        cg_idata(ids)[i] = (i * 7 + 3) % 13;
        cg_idata(tg)[i] = i == 4 ? -100 : (i * 5 + 1) % 13;
    }
    cg_tensor *loss = cg_cross_entropy(g, cg_llama_logits(g, m, ids), tg, -100);
    CHECK(loss != NULL, "%s", cg_last_error());
    enum { N = 8 };
    const char *names[N] = {"model.layers.0.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight",
                            "model.layers.0.self_attn.q_proj.bias",  "model.layers.1.self_attn.k_proj.bias",
                            "model.layers.1.self_attn.v_proj.bias",  "model.layers.1.self_attn.o_proj.bias",
                            "model.layers.0.mlp.down_proj.bias",     "model.layers.1.self_attn.k_proj.weight"};
    cg_tensor *in[N];
    for (int i = 0; i < N; i++) CHECK((in[i] = cg_params_find(ps, names[i])) != NULL, "no %s", names[i]);
    cg_gradcheck_result res[N];
    cg_status st = loss ? cg_gradcheck(g, loss, N, in, 0, res) : CG_ERR_ARG;
    CHECK(st == CG_OK, "%s", cg_last_error());
    double worst = 0;
    for (int i = 0; i < N && st == CG_OK; i++) {
        CHECK(res[i].pass, "%s: rel err %g abs %g; worst element %lld analytic %g numeric %g", names[i],
              res[i].max_rel_err, res[i].max_abs_err, (long long)res[i].worst, res[i].analytic, res[i].numeric);
        worst = fmax(worst, res[i].max_rel_err);
    }
#ifdef CGRAD_DOUBLE
    CHECK(worst <= CG_GRADCHECK_TOL, "worst relative error %g", worst);
#endif
    printf("families gradcheck: %d parameters, worst relative error %.1e\n", N, worst);
    cg_graph_free(g);
    cg_llama_free(m);
    cg_params_free(ps);
}

/* LLaMA's forward in the shared decoder checks' signatures. */
static cg_tensor *cached_fwd(cg_graph *g, const void *m, cg_tensor *ids, cg_kv_cache *kc) {
    return cg_llama_logits_cached(g, m, ids, kc);
}
static cg_tensor *full_fwd(cg_graph *g, const void *m, cg_tensor *ids) { return cg_llama_logits(g, m, ids); }
static cg_status generate(const void *m, const int32_t *prompt, int64_t n_prompt, int64_t n_new, const cg_sampling *s,
                         uint64_t seed, bool use_cache, int32_t *out) {
    return cg_llama_generate(m, prompt, n_prompt, n_new, s, seed, use_cache, out);
}

/* Decoding through the cache with a window: each position's logits are the full forward's (whose
 * window the PyTorch fixtures check), the replayed graph's bits a per-token graph's; past 256 keys
 * the attention visits key blocks from the window's start. */
static void window_cache(cg_llama_family f) {
    for (int long_run = 0; long_run < 2; long_run++) {
        cg_llama_config c = tiny(f);
        if (long_run) c.max_position_embeddings = 272, c.sliding_window = 40;
        cg_params *ps = cg_params_new();
        cg_llama *m = cg_llama_new(&c, ps, 21);
        CHECK(m != NULL, "%s", cg_last_error());
        if (!m) return;
        spread(ps, 8);
        const cg_llama_config *mc = cg_llama_cfg(m);
        const cg_decoder_info info = {cg_llama_family_name(f), mc->vocab_size, mc->max_position_embeddings,
                                      mc->num_hidden_layers, mc->num_key_value_heads, mc->head_dim, true};
        check_decode_replay(cached_fwd, full_fwd, m, &info, long_run ? 272 : 40, long_run ? 250 : 5);
        if (!long_run) check_cached_generation(generate, m, "llama generate");
        if (!long_run) check_step_positions(cached_fwd, full_fwd, m, &info, "max_position_embeddings");
        cg_llama_free(m);
        cg_params_free(ps);
    }
}

/* The window changes the numbers (else the checks above could not fail): logits at a position past
 * the window differ from full attention's, those within it do not. */
static void window_matters(void) {
    cg_llama_config c = tiny(CG_LLAMA_FAMILY_MISTRAL), full = c;
    full.sliding_window = 0;
    cg_params *ps = cg_params_new(), *ps2 = cg_params_new();
    cg_llama *m = cg_llama_new(&c, ps, 3), *m2 = cg_llama_new(&full, ps2, 3);
    spread(ps, 9);
    spread(ps2, 9);
    enum { T = 12 };
    cg_graph *g = cg_graph_new(CG_EVAL);
    cg_tensor *ids = cg_input(g, "ids", CG_INT32, 2, (int64_t[]){1, T});
    for (int i = 0; i < T; i++) cg_idata(ids)[i] = (i * 5 + 1) % 13;
    cg_tensor *a = cg_llama_logits(g, m, ids), *b = cg_llama_logits(g, m2, ids);
    CHECK(a && b && cg_graph_forward(g) == CG_OK, "%s", cg_last_error());
    double within = 0, past = 0;
    for (int i = 0; a && b && i < T * 13; i++) {
        const double d = fabs((double)cg_data(a)[i] - cg_data(b)[i]);
        if (i / 13 < c.sliding_window) within = fmax(within, d);
        else past = fmax(past, d);
    }
    CHECK(within == 0 && past > 1e-2, "window 5: logits within it differ by %g (want 0), past it by %g", within, past);
    cg_graph_free(g);
    cg_llama_free(m);
    cg_llama_free(m2);
    cg_params_free(ps);
    cg_params_free(ps2);
}

/* config.json's attention_dropout is honoured: it drops attention weights in a training graph (other
 * logits than without it), and an evaluation graph is unchanged. */
static void attention_dropout(void) {
    cg_llama_config c = tiny(CG_LLAMA_FAMILY_QWEN2), d = c;
    d.attention_dropout = 0.5;
    double diff[2] = {0, 0};
    for (int train = 0; train < 2; train++) {
        cg_params *ps = cg_params_new(), *ps2 = cg_params_new();
        cg_llama *m = cg_llama_new(&c, ps, 3), *m2 = cg_llama_new(&d, ps2, 3);
        spread(ps, 9);
        spread(ps2, 9);
        cg_graph *g = cg_graph_new(train ? CG_TRAIN : CG_EVAL);
        cg_graph_set_rng(g, 5, 0);
        cg_tensor *ids = cg_input(g, "ids", CG_INT32, 2, (int64_t[]){1, 8});
        for (int i = 0; i < 8; i++) cg_idata(ids)[i] = (i * 5 + 1) % 13;
        cg_tensor *a = cg_llama_logits(g, m, ids), *b = cg_llama_logits(g, m2, ids);
        cg_retain(a), cg_retain(b);
        CHECK(a && b && cg_graph_forward(g) == CG_OK, "%s", cg_last_error());
        for (int i = 0; a && b && i < 8 * 13; i++) diff[train] = fmax(diff[train], fabs((double)cg_data(a)[i] - cg_data(b)[i]));
        cg_graph_free(g);
        cg_llama_free(m);
        cg_llama_free(m2);
        cg_params_free(ps);
        cg_params_free(ps2);
    }
    CHECK(diff[0] == 0 && diff[1] > 1e-3, "attention_dropout 0.5: eval logits differ by %g (want 0), training by %g",
          diff[0], diff[1]);
}

static const char *base = "\"vocab_size\": 10, \"hidden_size\": 8, \"intermediate_size\": 16, \"num_hidden_layers\": 2, "
                          "\"num_attention_heads\": 2";

static cg_status parse(const char *model_type, const char *extra, cg_llama_config *c) {
    char buf[1024];
    snprintf(buf, sizeof buf, "{%s%s%s%s%s%s}", base, model_type ? ", \"model_type\": \"" : "", model_type ? model_type : "",
             model_type ? "\"" : "", *extra ? ", " : "", extra);
    return cg_llama_config_parse(buf, c);
}

static void config_fields(void) {
    cg_llama_config c;
    /* transformers' defaults for absent fields, per family */
    CHECK(parse("mistral", "", &c) == CG_OK && c.family == CG_LLAMA_FAMILY_MISTRAL && c.sliding_window == 4096 &&
              c.num_key_value_heads == 8 && c.max_position_embeddings == 131072 && !c.qkv_bias,
          "mistral defaults: window %lld, kv %lld: %s", (long long)c.sliding_window, (long long)c.num_key_value_heads,
          cg_last_error());
    CHECK(parse("mistral", "\"sliding_window\": null", &c) == CG_OK && c.sliding_window == 0, "mistral null window");
    CHECK(parse("qwen2", "\"num_key_value_heads\": 2, \"sliding_window\": 131072, \"max_window_layers\": 24", &c) == CG_OK &&
              c.qkv_bias && !c.o_bias && !c.use_sliding_window && cg_llama_layer_window(&c, 1) == 0 &&
              c.max_position_embeddings == 32768,
          "qwen2: q/k/v biases, o none, a window only with use_sliding_window: %s", cg_last_error());
    CHECK(parse("qwen2", "\"sliding_window\": 64, \"use_sliding_window\": true, \"max_window_layers\": 1", &c) == CG_OK &&
              cg_llama_layer_window(&c, 0) == 0 && cg_llama_layer_window(&c, 1) == 64,
          "qwen2: layers from max_window_layers on are windowed: %s", cg_last_error());
    CHECK(parse("qwen3", "\"layer_types\": [\"full_attention\", \"sliding_attention\"], \"sliding_window\": 16, "
                         "\"use_sliding_window\": true, \"max_window_layers\": 28", &c) == CG_OK && c.qk_norm && !c.qkv_bias &&
              c.head_dim == 128 && cg_llama_layer_window(&c, 0) == 0 && cg_llama_layer_window(&c, 1) == 16,
          "qwen3: q/k norm, head_dim 128 by default, layer_types over max_window_layers: %s", cg_last_error());
    /* transformers drops sliding_window without use_sliding_window: a "sliding_attention" layer then has none */
    CHECK(parse("qwen3", "\"layer_types\": [\"full_attention\", \"sliding_attention\"], \"sliding_window\": 16", &c) ==
                  CG_OK && cg_llama_layer_window(&c, 1) == 0,
          "qwen3: no window without use_sliding_window: %s", cg_last_error());
    CHECK(parse("qwen3", "\"attention_bias\": true", &c) == CG_OK && c.qkv_bias && c.o_bias, "qwen3 attention_bias");
    CHECK(parse(NULL, "\"attention_bias\": true, \"mlp_bias\": true, \"pretraining_tp\": 4, \"torch_dtype\": \"bfloat16\", "
                      "\"transformers_version\": \"4.44.0\", \"use_cache\": true, \"bos_token_id\": 128000",
                &c) == CG_OK && c.family == CG_LLAMA_FAMILY_LLAMA && c.qkv_bias && c.o_bias && c.mlp_bias,
          "llama biases and fields without effect: %s", cg_last_error());
    /* refused, naming the field */
    struct { const char *type, *extra, *needle; } bad[] = {
        {"mistral", "\"num_local_experts\": 8, \"num_experts_per_tok\": 2", "num_local_experts"},
        {"qwen2_moe", "", "mixture-of-experts"},
        {"llama", "\"num_experts_per_tok\": 2", "num_experts_per_tok"},
        {"mixtral", "\"router_jitter_noise\": 0.01", "router_jitter_noise"},
        {"mixtral", "\"num_local_experts\": 2, \"num_experts_per_tok\": 3", "num_experts_per_tok"},
        {"mixtral", "\"moe_intermediate_size\": 64", "moe_intermediate_size"},
        {"mixtral", "\"mlp_bias\": true", "mlp_bias"},
        {"gemma", "", "gemma"},
        {"llama", "\"sliding_window\": 4096", "sliding_window"},
        {"mistral", "\"use_sliding_window\": true", "use_sliding_window"},
        {"qwen2", "\"attention_bias\": true", "attention_bias"},
        {"llama", "\"partial_rotary_factor\": 0.5", "partial_rotary_factor"},
        {"llama", "\"quantization_config\": {\"bits\": 4}", "quantization_config"},
        {"qwen3", "\"hidden_act\": \"gelu_pytorch_tanh\"", "hidden_act"},
        {"qwen2", "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}", "yarn"},
        {"llama", "\"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2}", "dynamic"},
        {"mistral", "\"sliding_window\": 0", "sliding_window"},
        {"qwen2", "\"layer_types\": [\"sliding_attention\", \"full_attention\"], \"sliding_window\": 8", "layer_types"},
        {"qwen2", "\"layer_types\": [\"full_attention\"]", "layer_types"},
        {"llama", "\"attention_dropout\": 1.5", "attention_dropout"},
        {"llama", "\"architectures\": [\"LlamaForSequenceClassification\"]", "LlamaForSequenceClassification"},
        {"qwen2", "\"architectures\": [\"LlamaForCausalLM\"]", "Qwen2ForCausalLM"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cg_clear_error();
        CHECK(parse(bad[i].type, bad[i].extra, &c) == CG_ERR_FORMAT && strstr(cg_last_error(), bad[i].needle),
              "%s %s: %s", bad[i].type, bad[i].extra, cg_last_error());
    }
    /* found by fuzzing (tests/fuzz/corpus/config/qwen2_no_window_layer.json): use_sliding_window with no layer
     * from max_window_layers on wrote layer_types all full, which read back as use_sliding_window false */
    char *j1 = NULL, *j2 = NULL;
    cg_llama_config c2;
    CHECK(parse("qwen2", "\"use_sliding_window\": true, \"sliding_window\": 4, \"max_window_layers\": 2", &c) == CG_OK &&
              (j1 = cg_llama_config_json(&c)) && cg_llama_config_parse(j1, &c2) == CG_OK &&
              (j2 = cg_llama_config_json(&c2)) && !strcmp(j1, j2) && cg_llama_layer_window(&c2, 1) == 0,
          "no windowed layer, round trip:\n%s\n%s", j1 ? j1 : cg_last_error(), j2 ? j2 : "");
    free(j1);
    free(j2);
    /* every fixture's config: written back in its family's layout, and stable through a second trip */
    const char *names[5] = {"mistral", "qwen2", "qwen3", "llama_ext", "mixtral"};
    const char *types[5] = {"\"model_type\": \"mistral\"", "\"model_type\": \"qwen2\"", "\"model_type\": \"qwen3\"",
                            "\"model_type\": \"llama\"", "\"model_type\": \"mixtral\""};
    const char *classes[5] = {"MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "LlamaForCausalLM",
                              "MixtralForCausalLM"};
    for (int i = 0; i < 5; i++) {
        char path[512];
        snprintf(path, sizeof path, FIX "%s/config.json", names[i]);
        char *text = cgi_read_text(path, NULL), *j1 = NULL, *j2 = NULL;
        cg_llama_config c1, c2;
        CHECK(text && cg_llama_config_parse(text, &c1) == CG_OK && (j1 = cg_llama_config_json(&c1)) &&
                  cg_llama_config_parse(j1, &c2) == CG_OK && (j2 = cg_llama_config_json(&c2)) && !strcmp(j1, j2),
              "%s: config round trip: %s\n%s\n%s", names[i], cg_last_error(), j1 ? j1 : "", j2 ? j2 : "");
        CHECK(j1 && strstr(j1, types[i]) && strstr(j1, classes[i]),
              "%s: %s", names[i], j1 ? j1 : "");
        free(text);
        free(j1);
        free(j2);
    }
}

/* config.json files of released models (tests/fixtures/models/hf_configs/, as published): each loads
 * with the family's reading of it, or is refused naming what cgrad lacks. */
static void released_configs(void) {
    struct {
        const char *file, *refused;
        cg_llama_family f;
        int64_t kv, head_dim, window_last, positions;
        bool tied, qkv_bias, qk_norm;
    } want[] = {
        {"tinyllama-1.1b", NULL, CG_LLAMA_FAMILY_LLAMA, 4, 0, 0, 2048, false, false, false},
        {"llama-2-7b", NULL, CG_LLAMA_FAMILY_LLAMA, 32, 0, 0, 4096, false, false, false},
        {"llama-3.2-1b", NULL, CG_LLAMA_FAMILY_LLAMA, 8, 64, 0, 131072, true, false, false},
        {"llama-3.1-8b-instruct", NULL, CG_LLAMA_FAMILY_LLAMA, 8, 0, 0, 131072, false, false, false},
        {"smollm2-135m", NULL, CG_LLAMA_FAMILY_LLAMA, 3, 0, 0, 8192, true, false, false},
        {"mistral-7b-v0.1", NULL, CG_LLAMA_FAMILY_MISTRAL, 8, 0, 4096, 32768, false, false, false},
        {"mistral-7b-instruct-v0.3", NULL, CG_LLAMA_FAMILY_MISTRAL, 8, 0, 0, 32768, false, false, false},
        {"mistral-nemo-12b", NULL, CG_LLAMA_FAMILY_MISTRAL, 8, 128, 0, 1024000, false, false, false},
        {"qwen2.5-0.5b", NULL, CG_LLAMA_FAMILY_QWEN2, 2, 0, 0, 32768, true, true, false},
        {"qwen2-7b-instruct", NULL, CG_LLAMA_FAMILY_QWEN2, 4, 0, 0, 32768, false, true, false},
        {"qwen3-0.6b", NULL, CG_LLAMA_FAMILY_QWEN3, 8, 128, 0, 40960, true, false, true},
        {"qwen2.5-7b-instruct-yarn", "yarn", CG_LLAMA_FAMILY_QWEN2, 0, 0, 0, 0, false, false, false},
        {"mixtral-8x7b", NULL, CG_LLAMA_FAMILY_MIXTRAL, 8, 0, 0, 32768, false, false, false},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char path[512];
        snprintf(path, sizeof path, FIX "hf_configs/%s.json", want[i].file);
        char *text = cgi_read_text(path, NULL), *j1 = NULL, *j2 = NULL;
        cg_llama_config c, c2;
        cg_clear_error();
        const cg_status st = text ? cg_llama_config_parse(text, &c) : CG_ERR_IO;
        if (want[i].refused) {
            CHECK(st == CG_ERR_FORMAT && strstr(cg_last_error(), want[i].refused), "%s: %s", want[i].file, cg_last_error());
            free(text);
            continue;
        }
        CHECK(st == CG_OK, "%s: %s", want[i].file, cg_last_error());
        if (st == CG_OK)
            CHECK(c.family == want[i].f && c.num_key_value_heads == want[i].kv && c.head_dim == want[i].head_dim &&
                      cg_llama_layer_window(&c, c.num_hidden_layers - 1) == want[i].window_last &&
                      c.max_position_embeddings == want[i].positions && c.tie_word_embeddings == want[i].tied &&
                      c.qkv_bias == want[i].qkv_bias && !c.o_bias && !c.mlp_bias && c.qk_norm == want[i].qk_norm,
                  "%s: family %d, kv %lld, head_dim %lld, window %lld, positions %lld, tied %d, qkv bias %d, qk norm %d",
                  want[i].file, (int)c.family, (long long)c.num_key_value_heads, (long long)c.head_dim,
                  (long long)cg_llama_layer_window(&c, c.num_hidden_layers - 1), (long long)c.max_position_embeddings,
                  c.tie_word_embeddings, c.qkv_bias, c.qk_norm);
        CHECK(st == CG_OK && (j1 = cg_llama_config_json(&c)) && cg_llama_config_parse(j1, &c2) == CG_OK &&
                  (j2 = cg_llama_config_json(&c2)) && !strcmp(j1, j2),
              "%s: round trip: %s", want[i].file, cg_last_error());
        free(text);
        free(j1);
        free(j2);
    }
    cg_llama_config c;
    char *text = cgi_read_text(FIX "hf_configs/mixtral-8x7b.json", NULL);
    CHECK(text && cg_llama_config_parse(text, &c) == CG_OK && c.num_local_experts == 8 && c.num_experts_per_tok == 2 &&
              c.router_aux_loss_coef == 0.02 && !c.output_router_logits && c.rms_norm_eps == 1e-5 &&
              c.rope.theta == 1e6 && c.capacity_factor == 0,
          "mixtral-8x7b: 8 experts, 2 a token, coefficient 0.02: %s", cg_last_error());
    free(text);
    /* MixtralConfig's defaults: 8 experts, 2 a token, 0.001, rms_norm_eps 1e-5, rope_theta 1e6, no window */
    CHECK(parse("mixtral", "", &c) == CG_OK && c.num_local_experts == 8 && c.num_experts_per_tok == 2 &&
              c.router_aux_loss_coef == 0.001 && c.rms_norm_eps == 1e-5 && c.rope.theta == 1e6 &&
              cg_llama_layer_window(&c, 0) == 0 && c.num_key_value_heads == 8,
          "mixtral defaults: %s", cg_last_error());
    CHECK(parse("qwen2", "\"use_mrope\": true", &c) == CG_ERR_FORMAT && strstr(cg_last_error(), "use_mrope"), "%s",
          cg_last_error());
    CHECK(parse("llama", "\"rope_interleaved\": true", &c) == CG_ERR_FORMAT && strstr(cg_last_error(), "rope_interleaved"),
          "%s", cg_last_error());
}

/* The parameters each family declares, by Hugging Face name. */
static void family_params(void) {
    struct { cg_llama_family f; const char *has[3], *lacks[3]; } want[] = {
        {CG_LLAMA_FAMILY_QWEN2, {"model.layers.1.self_attn.k_proj.bias", "model.layers.0.self_attn.q_proj.bias", NULL},
         {"model.layers.0.self_attn.o_proj.bias", "model.layers.0.self_attn.q_norm.weight", NULL}},
        {CG_LLAMA_FAMILY_QWEN3, {"model.layers.0.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight", NULL},
         {"model.layers.0.self_attn.q_proj.bias", NULL, NULL}},
        {CG_LLAMA_FAMILY_MISTRAL, {"model.layers.1.mlp.down_proj.weight", NULL, NULL},
         {"model.layers.0.self_attn.q_proj.bias", "model.layers.0.self_attn.q_norm.weight", NULL}},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        cg_llama_config c = tiny(want[i].f);
        cg_params *ps = cg_params_new();
        cg_llama *m = cg_llama_new(&c, ps, 1);
        for (int k = 0; m && k < 3 && want[i].has[k]; k++)
            CHECK(cg_params_find(ps, want[i].has[k]), "%s lacks %s", cg_llama_family_name(want[i].f), want[i].has[k]);
        for (int k = 0; m && k < 3 && want[i].lacks[k]; k++)
            CHECK(!cg_params_find(ps, want[i].lacks[k]), "%s has %s", cg_llama_family_name(want[i].f), want[i].lacks[k]);
        cg_tensor *qn = cg_params_find(ps, "model.layers.0.self_attn.q_norm.weight");
        CHECK(!qn || cg_shape(qn)[0] == 6, "q_norm is [head_dim]");
        cg_llama_free(m);
        cg_params_free(ps);
    }
}

int main(void) {
    gradcheck();
    config_fields();
    released_configs();
    family_params();
    window_matters();
    attention_dropout();
    window_cache(CG_LLAMA_FAMILY_MISTRAL);
    window_cache(CG_LLAMA_FAMILY_QWEN2);
    window_cache(CG_LLAMA_FAMILY_QWEN3);
    const char *fixtures[6] = {"mistral", "qwen2", "qwen3", "llama_ext", "mixtral", "mixtral_noaux"};
    for (int i = 0; i < 6; i++) parity(fixtures[i]);
    for (int i = 0; i < 3; i++) checkpointed(fixtures[i]);
    checkpointed("mixtral");
    TEST_END();
}
