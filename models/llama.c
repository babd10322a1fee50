/* SPDX-License-Identifier: MIT */
/* LLaMA, composed from ops: rmsnorm, rope, sdpa_ex (grouped-query heads), swiglu, linear. As in
 * Hugging Face's LlamaForCausalLM, rotary embeddings use the half-split (GPT-NeoX) pairing, so its
 * checkpoints load without permuting q_proj and k_proj rows. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/config_json.h"
#include "models/llama.h"

typedef struct {
    cg_tensor *in_norm, *q, *k, *v, *o, *post_norm, *gate, *up, *down;
} llama_block;

struct cg_llama {
    cg_llama_config cfg;
    cg_tensor *embed, *norm, *head; /* head == embed when tied */
    llama_block *layers;
};

static int64_t head_dim(const cg_llama_config *c) {
    return c->head_dim > 0 ? c->head_dim : c->num_attention_heads > 0 ? c->hidden_size / c->num_attention_heads : 0;
}

static int64_t kv_heads(const cg_llama_config *c) {
    return c->num_key_value_heads > 0 ? c->num_key_value_heads : c->num_attention_heads;
}

/* rope_scaling: null, or {"rope_type" (or the older "type"): "linear" | "llama3" | "default", ...}. */
static bool parse_rope_scaling(const cJSON *o, cg_rope_config *r, const char *what) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "rope_scaling");
    if (!s || cJSON_IsNull(s)) return true;
    if (!cJSON_IsObject(s)) return cg_set_error(CG_ERR_FORMAT, "[%s] rope_scaling must be an object or null", what), false;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(s, "rope_type");
    if (!ty) ty = cJSON_GetObjectItemCaseSensitive(s, "type");
    const char *t = cJSON_IsString(ty) ? ty->valuestring : NULL;
    double factor = 0, lo = 0, hi = 0;
    int64_t orig = 0;
    if (!t) return cg_set_error(CG_ERR_FORMAT, "[%s] rope_scaling needs a \"rope_type\" string", what), false;
    if (!strcmp(t, "default")) return true;
    if (!cgi_json_num(s, "factor", true, 0, &factor, what)) return false;
    if (!strcmp(t, "linear")) {
        if (!(factor >= 1)) return cg_set_error(CG_ERR_FORMAT, "[%s] rope_scaling factor %g must be >= 1", what, factor), false;
        r->linear_factor = factor;
        return true;
    }
    if (!strcmp(t, "llama3")) {
        if (!cgi_json_num(s, "low_freq_factor", true, 0, &lo, what) ||
            !cgi_json_num(s, "high_freq_factor", true, 0, &hi, what) ||
            !cgi_json_int(s, "original_max_position_embeddings", true, 0, &orig, what))
            return false;
        if (!(factor >= 1 && lo > 0 && hi > lo && orig > 0))
            return cg_set_error(CG_ERR_FORMAT, "[%s] rope_scaling llama3 needs factor %g >= 1, 0 < low_freq_factor %g < "
                            "high_freq_factor %g and original_max_position_embeddings %lld > 0",
                            what, factor, lo, hi, (long long)orig), false;
        r->llama3_factor = factor, r->llama3_low_freq_factor = lo, r->llama3_high_freq_factor = hi;
        r->llama3_original_context = orig;
        return true;
    }
    return cg_set_error(CG_ERR_FORMAT, "[%s] rope_scaling type \"%s\" is not supported (linear, llama3)", what, t), false;
}

/* A boolean field that must be absent, null or equal to want; *out gets it. */
static bool json_bool(const cJSON *o, const char *key, bool dflt, bool *out, const char *what) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = dflt;
    if (!f || cJSON_IsNull(f)) return true;
    if (!cJSON_IsBool(f)) return cg_set_error(CG_ERR_FORMAT, "[%s] field \"%s\" must be true or false", what, key), false;
    *out = cJSON_IsTrue(f);
    return true;
}

cg_status cg_llama_config_parse(const char *json, cg_llama_config *c) {
    const char *what = "llama config";
    if (!c) return cg_set_error(CG_ERR_ARG, "[%s] NULL config", what);
    cJSON *o = cgi_json_object(json, what);
    if (!o) return CG_ERR_FORMAT;
    memset(c, 0, sizeof *c);
    bool attn_bias = false, mlp_bias = false;
    bool ok = cgi_json_int(o, "vocab_size", true, 0, &c->vocab_size, what) &&
              cgi_json_int(o, "hidden_size", true, 0, &c->hidden_size, what) &&
              cgi_json_int(o, "intermediate_size", true, 0, &c->intermediate_size, what) &&
              cgi_json_int(o, "num_hidden_layers", true, 0, &c->num_hidden_layers, what) &&
              cgi_json_int(o, "num_attention_heads", true, 0, &c->num_attention_heads, what) &&
              cgi_json_int(o, "num_key_value_heads", false, 0, &c->num_key_value_heads, what) &&
              cgi_json_int(o, "head_dim", false, 0, &c->head_dim, what) &&
              cgi_json_int(o, "max_position_embeddings", false, 2048, &c->max_position_embeddings, what) &&
              cgi_json_num(o, "rms_norm_eps", false, 1e-6, &c->rms_norm_eps, what) &&
              cgi_json_num(o, "rope_theta", false, 10000.0, &c->rope.theta, what) &&
              parse_rope_scaling(o, &c->rope, what) &&
              json_bool(o, "tie_word_embeddings", false, &c->tie_word_embeddings, what) &&
              json_bool(o, "attention_bias", false, &attn_bias, what) && json_bool(o, "mlp_bias", false, &mlp_bias, what);
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(o, "hidden_act");
    if (ok && act && !cJSON_IsNull(act) && !(cJSON_IsString(act) && !strcmp(act->valuestring, "silu")))
        ok = !cg_set_error(CG_ERR_FORMAT, "[%s] hidden_act must be \"silu\" (SwiGLU)", what);
    if (ok && (attn_bias || mlp_bias))
        ok = !cg_set_error(CG_ERR_FORMAT, "[%s] %s true is not supported: LLaMA's projections have no biases", what,
                       attn_bias ? "attention_bias" : "mlp_bias");
    cJSON_Delete(o);
    return ok ? CG_OK : CG_ERR_FORMAT;
}

/* The shortest text that reads back as v (1e-06, not %.17g's 9.9999999999999995e-07). */
static const char *num(char *buf, double v) {
    for (int digits = 6; digits <= 17; digits++)
        if (snprintf(buf, 32, "%.*g", digits, v), strtod(buf, NULL) == v) break;
    return buf;
}

char *cg_llama_config_json(const cg_llama_config *c) {
    char scaling[320] = "null", n[6][32];
    if (c->rope.llama3_factor > 0)
        snprintf(scaling, sizeof scaling,
                 "{\"rope_type\": \"llama3\", \"factor\": %s, \"low_freq_factor\": %s, \"high_freq_factor\": "
                 "%s, \"original_max_position_embeddings\": %lld}",
                 num(n[0], c->rope.llama3_factor), num(n[1], c->rope.llama3_low_freq_factor),
                 num(n[2], c->rope.llama3_high_freq_factor), (long long)c->rope.llama3_original_context);
    else if (c->rope.linear_factor > 0)
        snprintf(scaling, sizeof scaling, "{\"rope_type\": \"linear\", \"factor\": %s}", num(n[0], c->rope.linear_factor));
    char *s = malloc(2048); /* the longest config, every number at its widest, is about 1100 bytes */
    if (!s) return NULL;
    snprintf(s, 2048,
             "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": %lld, "
             "\"hidden_size\": %lld, \"intermediate_size\": %lld, \"num_hidden_layers\": %lld, "
             "\"num_attention_heads\": %lld, \"num_key_value_heads\": %lld, \"head_dim\": %lld, "
             "\"max_position_embeddings\": %lld, \"rms_norm_eps\": %s, \"rope_theta\": %s, \"rope_scaling\": %s, "
             "\"tie_word_embeddings\": %s, \"hidden_act\": \"silu\", \"attention_bias\": false, \"mlp_bias\": false}",
             (long long)c->vocab_size, (long long)c->hidden_size, (long long)c->intermediate_size,
             (long long)c->num_hidden_layers, (long long)c->num_attention_heads, (long long)kv_heads(c),
             (long long)head_dim(c), (long long)c->max_position_embeddings, num(n[4], c->rms_norm_eps), num(n[5], c->rope.theta), scaling,
             c->tie_word_embeddings ? "true" : "false");
    return s;
}

cg_llama *cg_llama_new(const cg_llama_config *cfg, cg_params *ps, uint64_t seed) {
    if (!cfg || !ps) {
        cg_set_error(CG_ERR_ARG, "[llama] NULL config or parameter set");
        return NULL;
    }
    const cg_llama_config *c = cfg;
    const int64_t hq = c->num_attention_heads, hk = kv_heads(c), hd = head_dim(c);
    if (c->vocab_size <= 0 || c->hidden_size <= 0 || c->intermediate_size <= 0 || c->num_hidden_layers <= 0 || hq <= 0 ||
        hk <= 0 || hq % hk || hd <= 0 || hd % 2 || (c->head_dim <= 0 && c->hidden_size % hq) ||
        c->max_position_embeddings <= 0 || !(c->rms_norm_eps >= 0) || !(c->rope.theta > 1) ||
        !(c->dropout >= 0 && c->dropout < 1)) {
        cg_set_error(CG_ERR_ARG,
                 "[llama] bad config: vocab %lld, hidden %lld, intermediate %lld, layers %lld, heads %lld (dividing "
                 "hidden), kv heads %lld (dividing heads), head_dim %lld (even), positions %lld, rms_norm_eps %g, "
                 "rope_theta %g (> 1), dropout %g",
                 (long long)c->vocab_size, (long long)c->hidden_size, (long long)c->intermediate_size,
                 (long long)c->num_hidden_layers, (long long)hq, (long long)hk, (long long)hd,
                 (long long)c->max_position_embeddings, c->rms_norm_eps, c->rope.theta, c->dropout);
        return NULL;
    }
    cg_llama *m = calloc(1, sizeof *m);
    llama_block *l = calloc((size_t)c->num_hidden_layers, sizeof *l);
    if (!m || !l) {
        free(m);
        free(l);
        cg_set_error(CG_ERR_NOMEM, "[llama] out of memory");
        return NULL;
    }
    m->cfg = *c;
    m->cfg.num_key_value_heads = hk;
    m->cfg.head_dim = hd;
    m->cfg.rope.dims = 0, m->cfg.rope.interleaved = false; /* HF: every feature, half-split pairs */
    m->layers = l;
    cg_rng r;
    cg_rng_seed(&r, seed);
    const int64_t d = c->hidden_size, f = c->intermediate_size;
    const double std = 0.02; /* HF's initializer_range */
    bool ok = (m->embed = cg_param_normal(ps, &r, std, 2, (int64_t[]){c->vocab_size, d}, "model.embed_tokens.weight"));
    for (int64_t i = 0; ok && i < c->num_hidden_layers; i++) {
        llama_block *b = &l[i];
        const long long n = (long long)i;
        ok = (b->q = cg_param_normal(ps, &r, std, 2, (int64_t[]){hq * hd, d}, "model.layers.%lld.self_attn.q_proj.weight", n)) &&
             (b->k = cg_param_normal(ps, &r, std, 2, (int64_t[]){hk * hd, d}, "model.layers.%lld.self_attn.k_proj.weight", n)) &&
             (b->v = cg_param_normal(ps, &r, std, 2, (int64_t[]){hk * hd, d}, "model.layers.%lld.self_attn.v_proj.weight", n)) &&
             (b->o = cg_param_normal(ps, &r, std, 2, (int64_t[]){d, hq * hd}, "model.layers.%lld.self_attn.o_proj.weight", n)) &&
             (b->gate = cg_param_normal(ps, &r, std, 2, (int64_t[]){f, d}, "model.layers.%lld.mlp.gate_proj.weight", n)) &&
             (b->up = cg_param_normal(ps, &r, std, 2, (int64_t[]){f, d}, "model.layers.%lld.mlp.up_proj.weight", n)) &&
             (b->down = cg_param_normal(ps, &r, std, 2, (int64_t[]){d, f}, "model.layers.%lld.mlp.down_proj.weight", n)) &&
             (b->in_norm = cg_param_const(ps, 1, 1, &d, "model.layers.%lld.input_layernorm.weight", n)) &&
             (b->post_norm = cg_param_const(ps, 1, 1, &d, "model.layers.%lld.post_attention_layernorm.weight", n));
    }
    ok = ok && (m->norm = cg_param_const(ps, 1, 1, &d, "model.norm.weight"));
    if (ok) m->head = c->tie_word_embeddings ? m->embed
                                             : cg_param_normal(ps, &r, std, 2, (int64_t[]){c->vocab_size, d}, "lm_head.weight");
    if (!ok || !m->head) {
        cg_llama_free(m);
        return NULL;
    }
    return m;
}

void cg_llama_free(cg_llama *m) {
    if (!m) return;
    free(m->layers);
    free(m);
}

const cg_llama_config *cg_llama_cfg(const cg_llama *m) { return m ? &m->cfg : NULL; }

/* Projects x to heads [B, heads, T, D] (a view), rotated at positions past.. when rope is set (at:
 * past is read when the graph runs). */
static cg_tensor *heads_of(cg_graph *g, cg_tensor *x, cg_tensor *w, int64_t heads, int64_t past, cg_tensor *at,
                           const cg_rope_config *rope) {
    cg_tensor *h = cg_split_heads(g, cg_linear(g, x, w, NULL), (int)heads);
    return !rope ? h : at ? cg_rope_at(g, h, at, rope) : cg_rope(g, h, past, rope);
}

static cg_tensor *llama_forward(cg_graph *g, const void *model, cg_tensor *ids, cg_kv_cache *cache) {
    const cg_llama *m = model;
    if (!m) {
        cg_set_error(CG_ERR_ARG, "[llama] model is NULL");
        return NULL;
    }
    if (!cg_graph_check_inputs(g, "llama", 1, &ids)) return NULL;
    const cg_llama_config *c = &m->cfg;
    if (cg_tensor_dtype(ids) != CG_INT32 || cg_ndim(ids) != 2) {
        cg_set_error(CG_ERR_SHAPE, "[llama] ids%s must be int32 [B, T]", cg_shape_str(ids));
        return NULL;
    }
    cg_tensor *at = cache ? cache->past : NULL; /* a replayed decode step reads its position at each run */
    const int64_t t = cg_shape(ids)[1];
    int64_t past;
    if (cg_kv_cache_start(cache, t, c->max_position_embeddings, "llama", "max_position_embeddings", &past) != CG_OK)
        return NULL;
    const double eps = c->rms_norm_eps, p = c->dropout;
    /* attention dropout inside the fused kernel, as Hugging Face's attention_dropout */
    const cg_sdpa_opts attn = {.scale = 1.0 / sqrt((double)c->head_dim), .causal = true, .dropout = p, .past = at};
    cg_tensor *x = cg_dropout(g, cg_embedding(g, m->embed, ids), p);
    for (int64_t i = 0; i < c->num_hidden_layers; i++) {
        const llama_block *b = &m->layers[i];
        if (cg_checkpoint_begin(g)) return NULL; /* each block is a checkpoint segment */
        cg_tensor *h = cg_rmsnorm(g, x, b->in_norm, eps);
        cg_tensor *q = heads_of(g, h, b->q, c->num_attention_heads, past, at, &c->rope),
                  *k = heads_of(g, h, b->k, c->num_key_value_heads, past, at, &c->rope),
                  *v = heads_of(g, h, b->v, c->num_key_value_heads, past, at, NULL);
        if (cache) k = cg_kv_cache_extend(g, cache, i, false, k), v = cg_kv_cache_extend(g, cache, i, true, v);
        cg_tensor *a = cg_merge_heads(g, cg_sdpa_ex(g, q, k, v, &attn));
        x = cg_add(g, x, cg_dropout(g, cg_linear(g, a, b->o, NULL), p));
        h = cg_rmsnorm(g, x, b->post_norm, eps);
        cg_tensor *f = cg_swiglu(g, cg_linear(g, h, b->gate, NULL), cg_linear(g, h, b->up, NULL));
        x = cg_add(g, x, cg_dropout(g, cg_linear(g, f, b->down, NULL), p));
        if (cg_checkpoint_end(g)) return NULL;
    }
    return cg_linear(g, cg_rmsnorm(g, x, m->norm, eps), m->head, NULL);
}

cg_tensor *cg_llama_logits(cg_graph *g, const cg_llama *m, cg_tensor *ids) { return llama_forward(g, m, ids, NULL); }

cg_tensor *cg_llama_logits_cached(cg_graph *g, const cg_llama *m, cg_tensor *ids, cg_kv_cache *cache) {
    if (!cache) {
        cg_set_error(CG_ERR_ARG, "[llama] NULL cache (cg_llama_logits runs without one)");
        return NULL;
    }
    return llama_forward(g, m, ids, cache);
}

cg_status cg_llama_generate(const cg_llama *m, const int32_t *prompt, int64_t n_prompt, int64_t n_new,
                            const cg_sampling *s, uint64_t seed, bool use_cache, int32_t *out) {
    if (!m) return cg_set_error(CG_ERR_ARG, "[llama generate] model is NULL");
    const cg_llama_config *c = &m->cfg;
    const cg_decoder_info info = {"llama generate", c->vocab_size, c->max_position_embeddings, c->num_hidden_layers,
                                  c->num_key_value_heads, c->head_dim,
                                  true /* RoPE and attention read the position at each run */};
    return cg_decoder_generate(llama_forward, m, &info, prompt, n_prompt, n_new, s, seed, use_cache, out);
}
