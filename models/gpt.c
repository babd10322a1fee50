/* SPDX-License-Identifier: MIT */
/* GPT-2, composed from ops. The optional key/value cache lets generation feed one token at a
 * time: each layer's keys and values for earlier positions are read in place from the cache. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/config_json.h"
#include "models/gpt.h"
#include "ops/ops.h"

typedef struct {
    cg_tensor *ln1_w, *ln1_b, *attn_w, *attn_b, *proj_w, *proj_b, *ln2_w, *ln2_b, *fc_w, *fc_b, *fc2_w, *fc2_b;
} gpt_block;

struct cg_gpt {
    cg_gpt_config cfg;
    cg_tensor *wte, *wpe, *lnf_w, *lnf_b;
    gpt_block *h;
};

cg_status cg_gpt_config_parse(const char *json, cg_gpt_config *c) {
    const char *what = "gpt2 config";
    if (!c) return cg_set_error(CG_ERR_ARG, "[%s] NULL config", what);
    cJSON *o = cgi_json_object(json, what);
    if (!o) return CG_ERR_FORMAT;
    memset(c, 0, sizeof *c);
    bool ok = cgi_json_int(o, "vocab_size", true, 0, &c->vocab_size, what) &&
              cgi_json_int(o, "n_positions", true, 0, &c->n_positions, what) &&
              cgi_json_int(o, "n_embd", true, 0, &c->n_embd, what) &&
              cgi_json_int(o, "n_layer", true, 0, &c->n_layer, what) &&
              cgi_json_int(o, "n_head", true, 0, &c->n_head, what) &&
              cgi_json_int(o, "n_inner", false, 0, &c->n_inner, what) &&
              cgi_json_num(o, "layer_norm_epsilon", false, 1e-5, &c->layer_norm_epsilon, what);
    cJSON_Delete(o);
    return ok ? CG_OK : CG_ERR_FORMAT;
}

char *cg_gpt_config_json(const cg_gpt_config *c) {
    char *s = malloc(512);
    if (!s) return NULL;
    snprintf(s, 512,
             "{\"model_type\": \"gpt2\", \"vocab_size\": %lld, \"n_positions\": %lld, \"n_embd\": %lld, "
             "\"n_layer\": %lld, \"n_head\": %lld, \"n_inner\": %lld, \"layer_norm_epsilon\": %.17g}",
             (long long)c->vocab_size, (long long)c->n_positions, (long long)c->n_embd, (long long)c->n_layer,
             (long long)c->n_head, (long long)(c->n_inner ? c->n_inner : 4 * c->n_embd), c->layer_norm_epsilon);
    return s;
}

static int64_t ff_width(const cg_gpt_config *c) { return c->n_inner > 0 ? c->n_inner : 4 * c->n_embd; }

cg_gpt *cg_gpt_new(const cg_gpt_config *cfg, cg_params *ps, uint64_t seed) {
    if (!cfg || !ps) {
        cg_set_error(CG_ERR_ARG, "[gpt] NULL config or parameter set");
        return NULL;
    }
    const cg_gpt_config *c = cfg;
    if (c->vocab_size <= 0 || c->n_positions <= 0 || c->n_embd <= 0 || c->n_layer <= 0 || c->n_head <= 0 ||
        c->n_embd % c->n_head || c->n_inner < 0 || !(c->dropout >= 0 && c->dropout < 1)) {
        cg_set_error(CG_ERR_ARG, "[gpt] bad config: vocab %lld, positions %lld, n_embd %lld, n_layer %lld, n_head %lld "
                 "(must divide n_embd), n_inner %lld, dropout %g", (long long)c->vocab_size, (long long)c->n_positions,
                 (long long)c->n_embd, (long long)c->n_layer, (long long)c->n_head, (long long)c->n_inner, c->dropout);
        return NULL;
    }
    cg_gpt *m = calloc(1, sizeof *m);
    gpt_block *h = calloc((size_t)c->n_layer, sizeof *h);
    if (!m || !h) {
        free(m);
        free(h);
        cg_set_error(CG_ERR_NOMEM, "[gpt] out of memory");
        return NULL;
    }
    m->cfg = *c;
    if (m->cfg.layer_norm_epsilon <= 0) m->cfg.layer_norm_epsilon = 1e-5;
    m->h = h;
    cg_rng r;
    cg_rng_seed(&r, seed);
    const int64_t d = c->n_embd, f = ff_width(c);
    const double std = 0.02, proj_std = 0.02 / sqrt(2.0 * (double)c->n_layer); /* GPT-2's residual scaling */
    bool ok = (m->wte = cg_param_normal(ps, &r, std, 2, (int64_t[]){c->vocab_size, d}, "wte.weight")) &&
              (m->wpe = cg_param_normal(ps, &r, 0.01, 2, (int64_t[]){c->n_positions, d}, "wpe.weight"));
    for (int64_t i = 0; ok && i < c->n_layer; i++) {
        gpt_block *b = &h[i];
        ok = (b->ln1_w = cg_param_const(ps, 1, 1, &d, "h.%lld.ln_1.weight", (long long)i)) &&
             (b->ln1_b = cg_param_const(ps, 0, 1, &d, "h.%lld.ln_1.bias", (long long)i)) &&
             (b->attn_w = cg_param_normal(ps, &r, std, 2, (int64_t[]){d, 3 * d}, "h.%lld.attn.c_attn.weight", (long long)i)) &&
             (b->attn_b = cg_param_const(ps, 0, 1, (int64_t[]){3 * d}, "h.%lld.attn.c_attn.bias", (long long)i)) &&
             (b->proj_w = cg_param_normal(ps, &r, proj_std, 2, (int64_t[]){d, d}, "h.%lld.attn.c_proj.weight", (long long)i)) &&
             (b->proj_b = cg_param_const(ps, 0, 1, &d, "h.%lld.attn.c_proj.bias", (long long)i)) &&
             (b->ln2_w = cg_param_const(ps, 1, 1, &d, "h.%lld.ln_2.weight", (long long)i)) &&
             (b->ln2_b = cg_param_const(ps, 0, 1, &d, "h.%lld.ln_2.bias", (long long)i)) &&
             (b->fc_w = cg_param_normal(ps, &r, std, 2, (int64_t[]){d, f}, "h.%lld.mlp.c_fc.weight", (long long)i)) &&
             (b->fc_b = cg_param_const(ps, 0, 1, &f, "h.%lld.mlp.c_fc.bias", (long long)i)) &&
             (b->fc2_w = cg_param_normal(ps, &r, proj_std, 2, (int64_t[]){f, d}, "h.%lld.mlp.c_proj.weight", (long long)i)) &&
             (b->fc2_b = cg_param_const(ps, 0, 1, &d, "h.%lld.mlp.c_proj.bias", (long long)i));
    }
    ok = ok && (m->lnf_w = cg_param_const(ps, 1, 1, &d, "ln_f.weight")) &&
         (m->lnf_b = cg_param_const(ps, 0, 1, &d, "ln_f.bias"));
    if (!ok) {
        cg_gpt_free(m);
        return NULL;
    }
    return m;
}

void cg_gpt_free(cg_gpt *m) {
    if (!m) return;
    free(m->h);
    free(m);
}

const cg_gpt_config *cg_gpt_cfg(const cg_gpt *m) { return m ? &m->cfg : NULL; }

/* Conv1D: y = x @ W + b with W stored [in, out]; cg_linear wants [out, in], a transposed view. */
static cg_tensor *conv1d(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *b) {
    return cg_linear(g, x, cg_transpose(g, w, 0, 1), b);
}

/* The blocks and the final layer norm: the hidden states [B, T, d] the LM head reads. */
static cg_tensor *gpt_hidden(cg_graph *g, const cg_gpt *m, cg_tensor *ids, cg_kv_cache *cache) {
    if (!m) {
        cg_set_error(CG_ERR_ARG, "[gpt] model is NULL");
        return NULL;
    }
    if (!cg_graph_check_inputs(g, "gpt", 1, &ids)) return NULL;
    const cg_gpt_config *c = &m->cfg;
    if (cg_tensor_dtype(ids) != CG_INT32 || cg_ndim(ids) != 2) {
        cg_set_error(CG_ERR_SHAPE, "[gpt] ids%s must be int32 [B, T]", cg_shape_str(ids));
        return NULL;
    }
    const bool replay = cache && cache->past;
    const int64_t t = cg_shape(ids)[1];
    int64_t past;
    if (cg_kv_cache_start(cache, t, c->n_positions, "gpt", "n_positions", &past) != CG_OK) return NULL;
    const double eps = c->layer_norm_epsilon, p = c->dropout;
    const int heads = (int)c->n_head;
    cg_tensor *pos = replay ? cache->past : cg_position_ids(g, t, past);
    cg_tensor *x = cg_add(g, cg_embedding(g, m->wte, ids), cg_embedding(g, m->wpe, pos));
    x = cg_dropout(g, x, p);
    for (int64_t i = 0; i < c->n_layer; i++) {
        const gpt_block *b = &m->h[i];
        if (cg_checkpoint_begin(g)) return NULL; /* each block is a checkpoint segment */
        cg_tensor *qkv[3];
        cg_split(g, conv1d(g, cg_layernorm(g, x, b->ln1_w, b->ln1_b, eps), b->attn_w, b->attn_b), -1, 3, NULL, qkv);
        cg_tensor *q = cg_split_heads(g, qkv[0], heads), *k = cg_split_heads(g, qkv[1], heads),
                  *v = cg_split_heads(g, qkv[2], heads);
        cg_tensor *a = cg_merge_heads(g, cg_cached_attention(g, cache, i, q, k, v, p));
        x = cg_residual_linear(g, x, a, cg_transpose(g, b->proj_w, 0, 1), b->proj_b, p);
        cg_tensor *f = cg_linear_gelu(g, cg_layernorm(g, x, b->ln2_w, b->ln2_b, eps), cg_transpose(g, b->fc_w, 0, 1),
                                      b->fc_b, true);
        x = cg_residual_linear(g, x, f, cg_transpose(g, b->fc2_w, 0, 1), b->fc2_b, p);
        if (cg_checkpoint_end(g)) return NULL;
    }
    return cg_layernorm(g, x, m->lnf_w, m->lnf_b, eps);
}

static cg_tensor *gpt_forward(cg_graph *g, const void *model, cg_tensor *ids, cg_kv_cache *cache) {
    const cg_gpt *m = model;
    cg_tensor *x = gpt_hidden(g, m, ids, cache);
    return x ? cg_linear(g, x, m->wte, NULL) : NULL; /* the LM head is the token embedding, tied */
}

cg_tensor *cg_gpt_logits(cg_graph *g, const cg_gpt *m, cg_tensor *ids) { return gpt_forward(g, m, ids, NULL); }

cg_tensor *cg_gpt_loss(cg_graph *g, const cg_gpt *m, cg_tensor *ids, cg_tensor *targets, int ignore_index) {
    cg_tensor *x = gpt_hidden(g, m, ids, NULL);
    return x ? cg_linear_cross_entropy(g, x, m->wte, NULL, targets, ignore_index) : NULL;
}

cg_tensor *cg_gpt_logits_cached(cg_graph *g, const cg_gpt *m, cg_tensor *ids, cg_kv_cache *cache) {
    if (!cache) {
        cg_set_error(CG_ERR_ARG, "[gpt] NULL cache (cg_gpt_logits runs without one)");
        return NULL;
    }
    return gpt_forward(g, m, ids, cache);
}

cg_status cg_gpt_generate(const cg_gpt *m, const int32_t *prompt, int64_t n_prompt, int64_t n_new,
                          const cg_sampling *s, uint64_t seed, bool use_cache, int32_t *out) {
    if (!m) return cg_set_error(CG_ERR_ARG, "[gpt generate] model is NULL");
    const cg_gpt_config *c = &m->cfg;
    const cg_decoder_info info = {"gpt generate", c->vocab_size, c->n_positions, c->n_layer, c->n_head,
                                  c->n_embd / c->n_head, true};
    return cg_decoder_generate(gpt_forward, m, &info, prompt, n_prompt, n_new, s, seed, use_cache, out);
}
