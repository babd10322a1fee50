/* SPDX-License-Identifier: MIT */
/* Building blocks of the model zoo. Everything here is composed from ops (no backward of its
 * own): parameter declaration helpers, attention over head-split tensors, positions, sampling. */
#ifndef CGRAD_LAYERS_H
#define CGRAD_LAYERS_H

#include "../graph/graph.h"

CG_BEGIN_DECLS

/* Adds parameter NAME (printf-style) drawn from normal(0, std) (std 0: zeros); NULL on error. */
cg_tensor *cg_param_normal(cg_params *ps, cg_rng *r, double std, int ndim, const int64_t *shape, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* Adds parameter NAME (printf-style) filled with value; NULL on error. */
cg_tensor *cg_param_const(cg_params *ps, double value, int ndim, const int64_t *shape, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Scaled dot-product attention on head-split q[B,H,Tq,D], k,v[B,H,Tk,D] -> [B,H,Tq,D]; scores
 * scaled by 1/sqrt(D), causal and key-padding (int32 [B,Tk], 1 keep) masks, dropout on weights.
 * The fused cg_sdpa, dropout included (memory linear in T). */
cg_tensor *cg_attention(cg_graph *g, cg_tensor *q, cg_tensor *k, cg_tensor *v, bool causal,
                        cg_tensor *key_padding, double dropout);

/* Multi-head attention from q[B,Tq,d], k,v[B,Tk,d] (already projected) -> [B,Tq,d] with heads merged. */
cg_tensor *cg_multi_head(cg_graph *g, cg_tensor *q, cg_tensor *k, cg_tensor *v, int heads, bool causal,
                         cg_tensor *key_padding, double dropout);

/* Post-LN residual sublayer (Vaswani, BERT): layernorm(x + dropout(sub)) with gain w, bias b. */
cg_tensor *cg_post_ln_residual(cg_graph *g, cg_tensor *x, cg_tensor *sub, double dropout, cg_tensor *w, cg_tensor *b,
                               double eps);

/* Pre-LN residual after a projection (GPT-2, LLaMA): x + dropout(a @ w^T + b), w [out, in] (b may be
 * NULL); one linear_add, whose product adds x while in cache, where dropout is the identity (p 0 or eval). */
cg_tensor *cg_residual_linear(cg_graph *g, cg_tensor *x, cg_tensor *a, cg_tensor *w, cg_tensor *b, double dropout);

/* int32 input [T] holding offset, offset+1, ... (position ids). */
cg_tensor *cg_position_ids(cg_graph *g, int64_t t, int64_t offset);

/* Input [T, d] holding the sinusoidal encoding of Vaswani et al. for positions offset.. . */
cg_tensor *cg_sinusoidal(cg_graph *g, int64_t t, int64_t d, int64_t offset);

/* How to pick the next token from logits. */
typedef struct {
    double temperature; /* 0: greedy (argmax) */
    int top_k;          /* keep the k most likely (0: all) */
    double top_p;       /* keep the smallest set with probability >= top_p (0 or 1: all) */
} cg_sampling;

/* Picks a token id from logits[v] as s says, drawing from r. */
int32_t cg_sample(const cg_real *logits, int64_t v, const cg_sampling *s, cg_rng *r);
/* Indices of the k largest of x[0..n) into idx, largest first (ties: lower index first; NaN counts
 * as the smallest); returns min(k, n). A heap of k: O(n log k) time, no allocation. */
int64_t cg_top_k(const cg_real *x, int64_t n, int64_t k, int32_t *idx);

/* Keys and values of earlier positions, kept across generation steps: per layer [heads, cap, head_dim]. */
typedef struct {
    cg_real *k;       /* keys: layers * heads * cap * head_dim */
    cg_real *v;       /* values, laid out as k */
    int64_t len;      /* positions held */
    int64_t cap;      /* positions there is room for */
    int64_t heads;    /* key/value heads */
    int64_t head_dim; /* features per head */
    cg_tensor *past;  /* a replayed decode graph's int32 [1, 1] input holding len at each run, or NULL: len is
                         read when the graph is built */
} cg_kv_cache;

/* The first position of a decoder step of t tokens through c into *past (0 when c is NULL; with c->past,
 * cap - 1, the furthest a replayed step may reach). CG_ERR_SHAPE, naming model and limit_name, when a
 * replayed step is not one token or the positions would exceed limit. */
cg_status cg_kv_cache_start(const cg_kv_cache *c, int64_t t, int64_t limit, const char *model, const char *limit_name,
                            int64_t *past);
/* Writes this step's keys (values if values) fresh[1, heads, T, head_dim] of layer into c after the
 * len positions held, and returns all of them, [1, heads, len + T, head_dim] read in place; with
 * c->past, the offset is read at each run and the result is all cap positions (see cg_cached_attention). */
cg_tensor *cg_kv_cache_extend(cg_graph *g, cg_kv_cache *c, int64_t layer, bool values, cg_tensor *fresh);
/* A decoder block's causal attention of q, k, v [1, H, T, D] (dropout on the weights): with a cache, k
 * and v extend layer's cache first and the keys held are the ones attended, its run-time length
 * included (c->past). */
cg_tensor *cg_cached_attention(cg_graph *g, cg_kv_cache *c, int64_t layer, cg_tensor *q, cg_tensor *k, cg_tensor *v,
                               double dropout);

/* A decoder's forward for generation: int32 ids [1, T] -> logits [1, T, vocab]; with a cache its
 * positions start at cache->len and each layer extends the cache (the caller then adds T to len). */
typedef cg_tensor *(*cg_decoder_forward)(cg_graph *g, const void *model, cg_tensor *ids, cg_kv_cache *cache);

/* What cg_decoder_generate needs to know of a decoder. */
typedef struct {
    const char *name;  /* for messages, e.g. "gpt generate" */
    int64_t vocab;     /* logits per position */
    int64_t context;   /* longest sequence */
    int64_t layers;    /* blocks, each with its cache */
    int64_t kv_heads;  /* key/value heads of a block */
    int64_t head_dim;  /* features per head */
    bool replays;      /* its forward honours cache->past (one token): one decode graph is built and replayed */
} cg_decoder_info;

/* Sampling loop shared by the zoo's decoders: n_new tokens after the prompt into out[n_prompt +
 * n_new] (prompt copied first); with use_cache the first step feeds the prompt and later steps one
 * token through cached keys and values, else every step recomputes the whole sequence. */
cg_status cg_decoder_generate(cg_decoder_forward fwd, const void *model, const cg_decoder_info *info,
                              const int32_t *prompt, int64_t n_prompt, int64_t n_new, const cg_sampling *s,
                              uint64_t seed, bool use_cache, int32_t *out);

CG_END_DECLS
#endif
