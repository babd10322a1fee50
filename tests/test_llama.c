/* SPDX-License-Identifier: MIT */
/* LLaMA: gradients of the whole model against finite differences (grouped-query heads, RoPE with
 * LLaMA 3 scaling), logits with the key/value cache equal to the full forward at every position,
 * generation with and without the cache, Hugging Face loading (rotary buffers, tied head), config
 * errors. Parity with PyTorch is in test_models (fixtures from tests/make_llama_fixtures.py). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../cgrad.h"
#include "../models/config_json.h"
#include "../models/llama.h"
#include "check.h"
#include "decoder_check.h"

#define FIX CGRAD_TEST_DIR "/fixtures/models/llama/"

static cg_llama_config tiny(void) {
    cg_llama_config c = {.vocab_size = 13, .hidden_size = 16, .intermediate_size = 24, .num_hidden_layers = 2,
                         .num_attention_heads = 4, .num_key_value_heads = 2, .max_position_embeddings = 48,
                         .rms_norm_eps = 1e-6, .rope = {.theta = 10000.0}};
    return c;
}

/* Spreads the weights so every path carries signal and sampling has choices. */
static void spread(cg_params *ps, uint64_t seed, double std) {
    cg_rng r;
    cg_rng_seed(&r, seed);
    for (int i = 0; i < cg_params_count(ps); i++) {
        cg_tensor *p = cg_params_at(ps, i);
        if (cg_ndim(p) == 2) cg_fill_normal(p, &r, 0, std);
        else cg_fill_normal(p, &r, 1.0, 0.2);
    }
}

/* fused: the head fused with its loss (cg_llama_loss), else cross_entropy over the full logits;
 * tied: the head is the token embedding. Returns every parameter's gradient from one more backward
 * (malloc'd, *span reals). */
static cg_real *test_gradcheck(bool fused, bool tied, int64_t *span) {
    cg_llama_config c = tiny();
    c.tie_word_embeddings = tied;
    c.hidden_size = 8, c.intermediate_size = 12, c.num_hidden_layers = 1;
    c.rope.llama3_factor = 4, c.rope.llama3_low_freq_factor = 1, c.rope.llama3_high_freq_factor = 4;
    c.rope.llama3_original_context = 8;
    cg_params *ps = cg_params_new();
    cg_llama *m = cg_llama_new(&c, ps, 7);
    CHECK(m != NULL, "%s", cg_last_error());
    spread(ps, 3, 0.3);
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
    cg_tensor *loss = fused ? cg_llama_loss(g, m, ids, tg, -100) : cg_cross_entropy(g, cg_llama_logits(g, m, ids), tg, -100);
    CHECK(loss != NULL, "%s", cg_last_error());
    const char *names[6] = {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                            "model.layers.0.self_attn.k_proj.weight", "model.layers.0.mlp.gate_proj.weight",
                            "model.layers.0.input_layernorm.weight", "lm_head.weight"};
    const int nin = tied ? 5 : 6; /* tied: no lm_head.weight */
    cg_tensor *in[6];
    for (int i = 0; i < nin; i++) in[i] = cg_params_find(ps, names[i]);
    cg_gradcheck_result res[6];
    cg_status st = cg_gradcheck(g, loss, nin, in, 0, res);
    CHECK(st == CG_OK, "%s", cg_last_error());
    /* elementwise |analytic - numeric| <= atol + rtol |numeric| (float32's central differences
     * carry an O(eps^2) truncation error that a max relative error over tiny entries magnifies) */
    for (int i = 0; i < nin && st == CG_OK; i++)
        CHECK(res[i].pass, "%s: rel err %g abs %g; worst element %lld analytic %g numeric %g", names[i],
              res[i].max_rel_err, res[i].max_abs_err, (long long)res[i].worst, res[i].analytic, res[i].numeric);
#ifdef CGRAD_DOUBLE
    for (int i = 0; i < nin && st == CG_OK; i++)
        CHECK(res[i].max_rel_err <= CG_GRADCHECK_TOL, "%s: rel err %g", names[i], res[i].max_rel_err);
#endif
    cg_real *grads = backward_grads(g, loss, ps, span);
    cg_llama_free(m);
    cg_params_free(ps);
    return grads;
}

/* The fused head against the full logits, with its own lm_head and tied to the embedding: each passes
 * the finite differences, and their gradients agree to rounding (the same sums in another order). */
static void test_fused_head(void) {
    for (int tied = 0; tied < 2; tied++) {
        int64_t n0, n1;
        cg_real *unfused = test_gradcheck(false, tied, &n0), *fused = test_gradcheck(true, tied, &n1);
        check_same_grads(fused, n1, unfused, n0, tied ? "llama, tied" : "llama, own lm_head");
    }
}

/* Feeding a prompt of 4 and then one token at a time through the cache gives, at every position,
 * the logits of one full forward over the whole sequence: keys are rotated at their own positions
 * (rope offset = cache length) and the grouped K/V heads are cached once. */
static void test_cache_logits(void) {
    cg_llama_config c = tiny();
    c.rope.linear_factor = 2;
    cg_params *ps = cg_params_new();
    cg_llama *m = cg_llama_new(&c, ps, 11);
    spread(ps, 5, 0.3);
    enum { N = 12, P = 4 };
    const int64_t v = c.vocab_size, hd = c.hidden_size / c.num_attention_heads;
    int32_t seq[N];
    for (int i = 0; i < N; i++) seq[i] = (i * 5 + 2) % 13;
    cg_graph *g = cg_graph_new(CG_EVAL);
    cg_tensor *ids = cg_input(g, "ids", CG_INT32, 2, (int64_t[]){1, N});
    memcpy(cg_idata(ids), seq, sizeof seq);
    cg_tensor *full = cg_llama_logits(g, m, ids);
    CHECK(full && cg_graph_forward(g) == CG_OK, "%s", cg_last_error());
    cg_real *want = malloc(N * v * sizeof *want);
    memcpy(want, cg_data(full), N * v * sizeof *want);
    size_t per = (size_t)(c.num_hidden_layers * c.num_key_value_heads * hd * N);
    cg_kv_cache kc = {.k = malloc(per * sizeof(cg_real)), .v = malloc(per * sizeof(cg_real)), .cap = N,
                      .heads = c.num_key_value_heads, .head_dim = hd};
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < N * v; i++) scale = fmax(scale, fabs((double)want[i]));
    for (int64_t at = 0; at < N;) {
        const int64_t t = at == 0 ? P : 1;
        cg_graph_reset(g);
        ids = cg_input(g, "ids", CG_INT32, 2, (int64_t[]){1, t});
        memcpy(cg_idata(ids), seq + at, (size_t)t * sizeof(int32_t));
        cg_tensor *lg = cg_llama_logits_cached(g, m, ids, &kc);
        CHECK(lg && cg_graph_forward(g) == CG_OK, "at %lld: %s", (long long)at, cg_last_error());
        if (!lg) break;
        for (int64_t i = 0; i < t * v; i++) worst = fmax(worst, fabs((double)cg_data(lg)[i] - want[at * v + i]));
        kc.len += t, at += t;
    }
    CHECK(worst <= 1e-5 * fmax(scale, 1), "cached logits differ from the full forward by %g (scale %g)", worst, scale);
    printf("llama cache: %d positions, max |cached - full| %.2e (logit scale %.2f)\n", N, worst, scale);
    /* past the cache's room: an error naming the op, not a write out of bounds */
    cg_graph_reset(g);
    ids = cg_input(g, "ids", CG_INT32, 2, (int64_t[]){1, 1});
    cg_idata(ids)[0] = 1;
    CHECK(cg_llama_logits_cached(g, m, ids, &kc) == NULL && strstr(cg_last_error(), "append_into"), "full cache: %s",
          cg_last_error());
    CHECK(cg_llama_logits_cached(g, m, ids, NULL) == NULL, "a NULL cache is refused");
    free(kc.k);
    free(kc.v);
    free(want);
    cg_graph_free(g);
    cg_llama_free(m);
    cg_params_free(ps);
}

/* LLaMA's cached forward in cg_decoder_forward's signature, for the shared check_decode_replay. */
static cg_tensor *llama_cached_fwd(cg_graph *g, const void *m, cg_tensor *ids, cg_kv_cache *kc) {
    return cg_llama_logits_cached(g, m, ids, kc);
}
static cg_tensor *llama_full(cg_graph *g, const void *m, cg_tensor *ids) { return cg_llama_logits(g, m, ids); }

/* One replayed decode graph (RoPE's offset and attention's past read at each run) gives, at every
 * position, the bits of a graph built for that token, and the full forward's logits to rounding. Past
 * 256 keys the attention leaves its single key block for the online softmax. */
static void test_decode_replay(int64_t n, int64_t p) {
    cg_llama_config c = tiny();
    c.max_position_embeddings = n;
    c.rope.linear_factor = 2;
    cg_params *ps = cg_params_new();
    cg_llama *m = cg_llama_new(&c, ps, 13);
    spread(ps, 6, 0.3);
    const cg_llama_config *mc = cg_llama_cfg(m); /* head_dim filled in */
    const cg_decoder_info info = {"llama", mc->vocab_size, mc->max_position_embeddings, mc->num_hidden_layers,
                                  mc->num_key_value_heads, mc->head_dim, true};
    check_decode_replay(llama_cached_fwd, llama_full, m, &info, n, p);
    check_step_positions(llama_cached_fwd, llama_full, m, &info, "max_position_embeddings");
    cg_llama_free(m);
    cg_params_free(ps);
}

/* cg_llama_generate through the shared decoder check's signature. */
static cg_status generate(const void *m, const int32_t *prompt, int64_t n_prompt, int64_t n_new, const cg_sampling *s,
                         uint64_t seed, bool use_cache, int32_t *out) {
    return cg_llama_generate(m, prompt, n_prompt, n_new, s, seed, use_cache, out);
}

static void test_generate(void) {
    cg_llama_config c = tiny();
    cg_params *ps = cg_params_new();
    cg_llama *m = cg_llama_new(&c, ps, 11);
    spread(ps, 5, 0.3);
    check_cached_generation(generate, m, "llama generate");
    cg_llama_free(m);
    cg_params_free(ps);
}

static cg_model *fixture_model(cg_params **ps) {
    char *cfg = cgi_read_text(FIX "config.json", NULL);
    *ps = cg_params_new();
    cg_model *m = cg_model_new(CG_ARCH_LLAMA, cfg, 0, *ps, 1);
    free(cfg);
    CHECK(m != NULL, "%s", cg_last_error());
    return m;
}

static cg_status load(cg_model *m, const char *path) {
    cg_st *f = cg_st_open(path);
    cg_status st = f ? cg_model_load(m, f) : CG_ERR_IO;
    cg_st_close(f);
    return st;
}

static void test_hf_files(void) {
    cg_params *ps, *ps2;
    cg_model *m = fixture_model(&ps), *m2 = fixture_model(&ps2);
    CHECK(load(m, FIX "weights.safetensors") == CG_OK, "%s", cg_last_error());
    CHECK(load(m2, FIX "weights_hf_buffers.safetensors") == CG_OK, "rotary inv_freq buffers are skipped: %s",
          cg_last_error());
    CHECK(cg_params_numel(ps) == cg_params_numel(ps2) &&
              !memcmp(cg_params_values(ps), cg_params_values(ps2), (size_t)cg_params_numel(ps) * sizeof(cg_real)),
          "with and without buffers: the same values");
    const cg_llama_config *c = cg_llama_cfg(cg_model_llama(m));
    CHECK(c->num_key_value_heads == 2 && c->head_dim == 8 && c->rope.llama3_factor == 4 &&
              c->rope.llama3_original_context == 64 && !c->tie_word_embeddings,
          "config read: kv heads %lld, head_dim %lld, llama3 factor %g", (long long)c->num_key_value_heads,
          (long long)c->head_dim, c->rope.llama3_factor);
    CHECK(cg_params_find(ps, "model.layers.1.self_attn.k_proj.weight") &&
              cg_shape(cg_params_find(ps, "model.layers.1.self_attn.k_proj.weight"))[0] == 16,
          "k_proj has num_key_value_heads * head_dim rows");
    /* save -> config text -> new model -> load: identical values and config */
    char path[128];
    snprintf(path, sizeof path, "/tmp/cgrad_llama_rt_%d.safetensors", (int)getpid());
    CHECK(cg_model_save(m, path) == CG_OK, "%s", cg_last_error());
    char *j = cg_model_config_json(m);
    cg_params *ps3 = cg_params_new();
    cg_model *m3 = cg_model_new(CG_ARCH_LLAMA, j, 0, ps3, 99);
    CHECK(m3 && load(m3, path) == CG_OK, "%s", cg_last_error());
    char *j3 = m3 ? cg_model_config_json(m3) : NULL;
    CHECK(j3 && !strcmp(j, j3), "config round trip:\n%s\n%s", j, j3 ? j3 : "");
    CHECK(m3 && !memcmp(cg_params_values(ps), cg_params_values(ps3), (size_t)cg_params_numel(ps) * sizeof(cg_real)),
          "save -> load: identical bytes");
    free(j3);
    cg_model_free(m3);
    cg_params_free(ps3);
    unlink(path);
    /* a wrong shape names the tensor */
    cg_llama_config bad = *c;
    bad.num_key_value_heads = 4;
    char *jb = cg_llama_config_json(&bad);
    cg_params *ps4 = cg_params_new();
    cg_model *m4 = cg_model_new(CG_ARCH_LLAMA, jb, 0, ps4, 1);
    CHECK(m4 && load(m4, FIX "weights.safetensors") == CG_ERR_SHAPE && strstr(cg_last_error(), "k_proj.weight"),
          "MHA config on a GQA file: %s", cg_last_error());
    cg_model_free(m4);
    cg_params_free(ps4);
    free(jb);
    /* tied: no lm_head parameter; a stored lm_head.weight must equal the embedding */
    bad = *c;
    bad.tie_word_embeddings = true;
    jb = cg_llama_config_json(&bad);
    ps4 = cg_params_new();
    m4 = cg_model_new(CG_ARCH_LLAMA, jb, 0, ps4, 1);
    CHECK(m4 && !cg_params_find(ps4, "lm_head.weight") && cg_params_count(ps4) == cg_params_count(ps) - 1,
          "tied: one parameter fewer");
    CHECK(m4 && load(m4, FIX "weights.safetensors") == CG_ERR_FORMAT && strstr(cg_last_error(), "lm_head.weight"),
          "tied model, untied file: %s", cg_last_error());
    CHECK(m4 && cg_model_save(m4, path) == CG_OK && load(m4, path) == CG_OK, "tied round trip: %s", cg_last_error());
    unlink(path);
    cg_model_free(m4);
    cg_params_free(ps4);
    free(jb);
    free(j);
    cg_model_free(m2);
    cg_params_free(ps2);
    cg_model_free(m);
    cg_params_free(ps);
}

static void test_config(void) {
    cg_llama_config c;
    const char *base = "\"vocab_size\": 10, \"hidden_size\": 8, \"intermediate_size\": 16, \"num_hidden_layers\": 1, "
                       "\"num_attention_heads\": 2";
    char buf[512];
    snprintf(buf, sizeof buf, "{%s}", base);
    CHECK(cg_llama_config_parse(buf, &c) == CG_OK && c.rms_norm_eps == 1e-6 && c.rope.theta == 10000 &&
              c.max_position_embeddings == 2048 && c.num_key_value_heads == 0,
          "defaults: %s", cg_last_error());
    CHECK(cg_llama_config_parse("{\"hidden_size\": 8}", &c) == CG_ERR_FORMAT && strstr(cg_last_error(), "vocab_size"),
          "missing field: %s", cg_last_error());
    struct { const char *extra, *needle; } bad[] = {
        {"\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 2}", "yarn"},
        {"\"rope_scaling\": {\"type\": \"linear\"}", "factor"},
        {"\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 4, \"high_freq_factor\": 1, "
         "\"original_max_position_embeddings\": 8192}", "llama3"},
        {"\"hidden_act\": \"gelu\"", "hidden_act"},
        {"\"attention_bias\": 1", "attention_bias"},
        {"\"tie_word_embeddings\": 1", "tie_word_embeddings"},
        {"\"rope_theta\": 1e999", "rope_theta"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(buf, sizeof buf, "{%s, %s}", base, bad[i].extra);
        CHECK(cg_llama_config_parse(buf, &c) == CG_ERR_FORMAT && strstr(cg_last_error(), bad[i].needle),
              "%s: %s", bad[i].extra, cg_last_error());
    }
    snprintf(buf, sizeof buf, "{%s, \"rope_scaling\": {\"type\": \"linear\", \"factor\": 4}, \"rope_theta\": 500000}", base);
    CHECK(cg_llama_config_parse(buf, &c) == CG_OK && c.rope.linear_factor == 4 && c.rope.theta == 500000, "%s",
          cg_last_error());
    /* shapes the model cannot have: kv heads not dividing the heads, an odd head width */
    cg_llama_config t = tiny();
    cg_params *ps = cg_params_new();
    t.num_key_value_heads = 3;
    CHECK(cg_llama_new(&t, ps, 1) == NULL && strstr(cg_last_error(), "kv heads 3"), "%s", cg_last_error());
    t = tiny();
    t.head_dim = 5;
    CHECK(cg_llama_new(&t, ps, 1) == NULL && strstr(cg_last_error(), "head_dim 5"), "%s", cg_last_error());
    t = tiny();
    t.num_key_value_heads = 1; /* multi-query attention is fine */
    cg_llama *m = cg_llama_new(&t, ps, 1);
    CHECK(m != NULL, "MQA: %s", cg_last_error());
    cg_llama_free(m);
    cg_params_free(ps);
}

int main(void) {
    test_fused_head();
    test_cache_logits();
    test_decode_replay(40, 5);
    test_decode_replay(272, 250);
    test_generate();
    test_hf_files();
    test_config();
    TEST_END();
}
