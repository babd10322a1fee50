/* SPDX-License-Identifier: MIT */
/* LLaMA and its families, composed from ops: rmsnorm, rope, sdpa_ex (grouped-query heads, sliding
 * window), swiglu, linear. As in Hugging Face's LlamaForCausalLM, rotary embeddings use the half-split
 * (GPT-NeoX) pairing, so its checkpoints load without permuting q_proj and k_proj rows. The config's
 * reading and writing is in models/llama_config.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/llama.h"

/* A projection's weight and its bias (NULL when the family has none). */
typedef struct {
    cg_tensor *w, *b;
} proj;

typedef struct {
    cg_tensor *in_norm, *post_norm, *q_norm, *k_norm; /* q_norm, k_norm: Qwen3's, [head_dim] */
    proj q, k, v, o, gate, up, down;
    cg_moe *moe; /* Mixtral: the experts in place of gate, up, down */
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

/* A projection [out, in] named model.layers.<layer>.<name>.weight, with a zero bias when bias is set. */
static bool declare_proj(cg_params *ps, cg_rng *r, proj *p, int64_t out, int64_t in, bool bias, long long layer,
                         const char *name) {
    p->w = cg_param_normal(ps, r, 0.02 /* HF's initializer_range */, 2, (int64_t[]){out, in}, "model.layers.%lld.%s.weight",
                           layer, name);
    p->b = NULL;
    if (p->w && bias) p->b = cg_param_const(ps, 0, 1, &out, "model.layers.%lld.%s.bias", layer, name);
    return p->w && (!bias || p->b);
}

static bool config_ok(const cg_llama_config *c) {
    const int64_t hq = c->num_attention_heads, hk = kv_heads(c), hd = head_dim(c);
    if ((unsigned)c->family > CG_LLAMA_FAMILY_MIXTRAL) {
        cg_set_error(CG_ERR_ARG, "[llama] unknown family %d", (int)c->family);
        return false;
    }
    if (c->vocab_size <= 0 || c->hidden_size <= 0 || c->intermediate_size <= 0 || c->num_hidden_layers <= 0 || hq <= 0 ||
        hk <= 0 || hq % hk || hd <= 0 || hd % 2 || (c->head_dim <= 0 && c->hidden_size % hq) ||
        c->max_position_embeddings <= 0 || !(c->rms_norm_eps >= 0) || !(c->rope.theta > 1) ||
        !(c->dropout >= 0 && c->dropout < 1) || !(c->attention_dropout >= 0 && c->attention_dropout < 1) ||
        c->sliding_window < 0 || c->max_window_layers < 0) {
        cg_set_error(CG_ERR_ARG,
                 "[llama] bad config: vocab %lld, hidden %lld, intermediate %lld, layers %lld, heads %lld (dividing "
                 "hidden), kv heads %lld (dividing heads), head_dim %lld (even), positions %lld, rms_norm_eps %g, "
                 "rope_theta %g (> 1), dropout %g, attention_dropout %g, sliding_window %lld, max_window_layers %lld",
                 (long long)c->vocab_size, (long long)c->hidden_size, (long long)c->intermediate_size,
                 (long long)c->num_hidden_layers, (long long)hq, (long long)hk, (long long)hd,
                 (long long)c->max_position_embeddings, c->rms_norm_eps, c->rope.theta, c->dropout, c->attention_dropout,
                 (long long)c->sliding_window, (long long)c->max_window_layers);
        return false;
    }
    if (c->num_local_experts > 0 &&
        (c->num_experts_per_tok < 1 || c->num_experts_per_tok > c->num_local_experts || !(c->capacity_factor >= 0) ||
         !(c->router_aux_loss_coef >= 0) || c->mlp_bias)) {
        cg_set_error(CG_ERR_ARG, "[llama] bad mixture of experts: num_local_experts %lld, num_experts_per_tok %lld (1.."
                     "experts), capacity_factor %g, router_aux_loss_coef %g (>= 0), mlp_bias %d (experts have none)",
                     (long long)c->num_local_experts, (long long)c->num_experts_per_tok, c->capacity_factor,
                     c->router_aux_loss_coef, (int)c->mlp_bias);
        return false;
    }
    return true;
}

/* The feed-forward of layer n: a mixture of experts (Mixtral) or the SwiGLU MLP. */
static bool declare_ffn(cg_params *ps, cg_rng *r, const cg_llama_config *c, llama_block *b, long long n) {
    const int64_t d = c->hidden_size, f = c->intermediate_size;
    if (c->num_local_experts > 0) {
        char prefix[64];
        snprintf(prefix, sizeof prefix, "model.layers.%lld.block_sparse_moe", n);
        const cg_moe_config mc = {.hidden_size = d, .intermediate_size = f, .num_experts = c->num_local_experts,
                                  .top_k = c->num_experts_per_tok, .capacity_factor = c->capacity_factor};
        return (b->moe = cg_moe_new(&mc, ps, r, prefix)) != NULL;
    }
    return declare_proj(ps, r, &b->gate, f, d, c->mlp_bias, n, "mlp.gate_proj") &&
           declare_proj(ps, r, &b->up, f, d, c->mlp_bias, n, "mlp.up_proj") &&
           declare_proj(ps, r, &b->down, d, f, c->mlp_bias, n, "mlp.down_proj");
}

cg_llama *cg_llama_new(const cg_llama_config *cfg, cg_params *ps, uint64_t seed) {
    if (!cfg || !ps) {
        cg_set_error(CG_ERR_ARG, "[llama] NULL config or parameter set");
        return NULL;
    }
    const cg_llama_config *c = cfg;
    if (!config_ok(c)) return NULL;
    const int64_t hq = c->num_attention_heads, hk = kv_heads(c), hd = head_dim(c);
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
    const int64_t d = c->hidden_size;
    const double std = 0.02; /* HF's initializer_range */
    bool ok = (m->embed = cg_param_normal(ps, &r, std, 2, (int64_t[]){c->vocab_size, d}, "model.embed_tokens.weight"));
    for (int64_t i = 0; ok && i < c->num_hidden_layers; i++) {
        llama_block *b = &l[i];
        const long long n = (long long)i;
        ok = declare_proj(ps, &r, &b->q, hq * hd, d, c->qkv_bias, n, "self_attn.q_proj") &&
             declare_proj(ps, &r, &b->k, hk * hd, d, c->qkv_bias, n, "self_attn.k_proj") &&
             declare_proj(ps, &r, &b->v, hk * hd, d, c->qkv_bias, n, "self_attn.v_proj") &&
             declare_proj(ps, &r, &b->o, d, hq * hd, c->o_bias, n, "self_attn.o_proj") &&
             declare_ffn(ps, &r, c, b, n) &&
             (!c->qk_norm || ((b->q_norm = cg_param_const(ps, 1, 1, &hd, "model.layers.%lld.self_attn.q_norm.weight", n)) &&
                              (b->k_norm = cg_param_const(ps, 1, 1, &hd, "model.layers.%lld.self_attn.k_norm.weight", n)))) &&
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
    for (int64_t i = 0; m->layers && i < m->cfg.num_hidden_layers; i++) cg_moe_free(m->layers[i].moe);
    free(m->layers);
    free(m);
}

const cg_llama_config *cg_llama_cfg(const cg_llama *m) { return m ? &m->cfg : NULL; }

cg_status cg_llama_set_capacity_factor(cg_llama *m, double capacity_factor) {
    if (!m || m->cfg.num_local_experts <= 0)
        return cg_set_error(CG_ERR_ARG, "[llama] capacity_factor %g: the model has no mixture-of-experts layers", capacity_factor);
    if (!(capacity_factor >= 0) || !isfinite(capacity_factor))
        return cg_set_error(CG_ERR_ARG, "[llama] capacity_factor %g must be a finite number >= 0 (0: dropless)", capacity_factor);
    for (int64_t i = 0; i < m->cfg.num_hidden_layers; i++) {
        cg_status st = cg_moe_set_capacity_factor(m->layers[i].moe, capacity_factor);
        if (st) return st;
    }
    m->cfg.capacity_factor = capacity_factor;
    return CG_OK;
}

/* Projects x to heads [B, heads, T, D] (a view), each head RMS-normalised over its D features when
 * norm is set (Qwen3), then rotated at positions past.. when rope is set (at: past is read when the
 * graph runs). */
static cg_tensor *heads_of(cg_graph *g, cg_tensor *x, const proj *p, cg_tensor *norm, double eps, int64_t heads,
                           int64_t past, cg_tensor *at, const cg_rope_config *rope) {
    cg_tensor *y = cg_linear(g, x, p->w, p->b);
    if (norm && y) { /* [B, T, heads * D] -> [B, T, heads, D]: the norm runs over contiguous rows */
        const int64_t *s = cg_shape(y), d = s[2] / heads;
        y = cg_reshape(g, cg_rmsnorm(g, cg_reshape(g, y, 4, (int64_t[]){s[0], s[1], heads, d}), norm, eps), 3, s);
    }
    cg_tensor *h = cg_split_heads(g, y, (int)heads);
    return !rope ? h : at ? cg_rope_at(g, h, at, rope) : cg_rope(g, h, past, rope);
}

/* The blocks and the final norm: the hidden states [B, T, hidden] the LM head reads; a Mixtral's
 * router logits go to router_logits[num_hidden_layers] when it is set. */
static cg_tensor *llama_hidden(cg_graph *g, const cg_llama *m, cg_tensor *ids, cg_kv_cache *cache,
                               cg_tensor **router_logits) {
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
    /* attention dropout inside the fused kernel: the config's attention_dropout, else the model's dropout */
    cg_sdpa_opts attn = {.scale = 1.0 / sqrt((double)c->head_dim), .causal = true,
                         .dropout = c->attention_dropout > 0 ? c->attention_dropout : p, .past = at};
    cg_tensor *x = cg_dropout(g, cg_embedding(g, m->embed, ids), p);
    for (int64_t i = 0; i < c->num_hidden_layers; i++) {
        const llama_block *b = &m->layers[i];
        if (cg_checkpoint_begin(g)) return NULL; /* each block is a checkpoint segment */
        cg_tensor *h = cg_rmsnorm(g, x, b->in_norm, eps);
        cg_tensor *q = heads_of(g, h, &b->q, b->q_norm, eps, c->num_attention_heads, past, at, &c->rope),
                  *k = heads_of(g, h, &b->k, b->k_norm, eps, c->num_key_value_heads, past, at, &c->rope),
                  *v = heads_of(g, h, &b->v, NULL, eps, c->num_key_value_heads, past, at, NULL);
        if (cache) k = cg_kv_cache_extend(g, cache, i, false, k), v = cg_kv_cache_extend(g, cache, i, true, v);
        attn.window = cg_llama_layer_window(c, i); /* key j seen by query i iff i - window < j <= i */
        cg_tensor *a = cg_merge_heads(g, cg_sdpa_ex(g, q, k, v, &attn));
        /* the residual adds stay ops of their own here: as linear_add (cg_residual_linear, GPT-2's
         * blocks) llama-tiny's one-thread step took 1.1-1.4% longer (3 interleaved A/B runs) */
        x = cg_add(g, x, cg_dropout(g, cg_linear(g, a, b->o.w, b->o.b), p));
        h = cg_rmsnorm(g, x, b->post_norm, eps);
        cg_tensor *ffn;
        if (b->moe) ffn = cg_moe_forward(g, b->moe, h, router_logits ? &router_logits[i] : NULL);
        else ffn = cg_linear(g, cg_swiglu(g, cg_linear(g, h, b->gate.w, b->gate.b), cg_linear(g, h, b->up.w, b->up.b)),
                             b->down.w, b->down.b);
        x = cg_add(g, x, cg_dropout(g, ffn, p));
        if (cg_checkpoint_end(g)) return NULL;
    }
    return cg_rmsnorm(g, x, m->norm, eps);
}

static cg_tensor *llama_forward(cg_graph *g, const void *model, cg_tensor *ids, cg_kv_cache *cache) {
    const cg_llama *m = model;
    cg_tensor *x = llama_hidden(g, m, ids, cache, NULL);
    return x ? cg_linear(g, x, m->head, NULL) : NULL;
}

/* llama_hidden, and for a Mixtral *aux_loss = the load-balancing loss over its layers' router logits
 * (NULL for a dense model). */
static cg_tensor *llama_hidden_aux(cg_graph *g, const cg_llama *m, cg_tensor *ids, cg_tensor **aux_loss) {
    *aux_loss = NULL;
    if (!m || m->cfg.num_local_experts <= 0) return llama_hidden(g, m, ids, NULL, NULL);
    const int64_t n = m->cfg.num_hidden_layers;
    cg_tensor **router = calloc((size_t)n, sizeof *router); /* build time only */
    if (!router) {
        cg_set_error(CG_ERR_NOMEM, "[llama] out of memory");
        return NULL;
    }
    cg_tensor *x = llama_hidden(g, m, ids, NULL, router);
    if (x) *aux_loss = cg_moe_load_balancing_loss(g, (int)n, router, m->cfg.num_experts_per_tok);
    free(router);
    return x && *aux_loss ? x : NULL;
}

cg_tensor *cg_llama_logits(cg_graph *g, const cg_llama *m, cg_tensor *ids) { return llama_forward(g, m, ids, NULL); }

cg_tensor *cg_llama_logits_aux(cg_graph *g, const cg_llama *m, cg_tensor *ids, cg_tensor **aux_loss) {
    if (!aux_loss) return llama_forward(g, m, ids, NULL);
    cg_tensor *x = llama_hidden_aux(g, m, ids, aux_loss);
    return x ? cg_linear(g, x, m->head, NULL) : NULL;
}

cg_tensor *cg_llama_loss(cg_graph *g, const cg_llama *m, cg_tensor *ids, cg_tensor *targets, int ignore_index) {
    cg_tensor *aux;
    cg_tensor *x = llama_hidden_aux(g, m, ids, &aux);
    cg_tensor *loss = x ? cg_linear_cross_entropy(g, x, m->head, NULL, targets, ignore_index) : NULL;
    return cg_llama_add_aux_loss(g, m, loss, aux);
}

cg_tensor *cg_llama_add_aux_loss(cg_graph *g, const cg_llama *m, cg_tensor *loss, cg_tensor *aux_loss) {
    if (!loss || !aux_loss || !m->cfg.output_router_logits) return loss; /* as MixtralForCausalLM */
    return cg_add(g, loss, cg_scale(g, aux_loss, m->cfg.router_aux_loss_coef));
}

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
