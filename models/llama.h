/* SPDX-License-Identifier: MIT */
/* LLaMA-style decoder (Touvron et al. 2023): RMSNorm pre-norm blocks, SwiGLU feed-forward, rotary
 * positions (RoPE) on queries and keys, grouped-query attention (fewer key/value heads than query
 * heads), final RMSNorm and an untied LM head. Parameters carry Hugging Face LlamaForCausalLM names
 * and layouts (nn.Linear weights [out, in], no biases): model.embed_tokens.weight,
 * model.layers.0.self_attn.q_proj.weight, model.layers.0.mlp.gate_proj.weight, ..., model.norm.weight,
 * lm_head.weight (absent when tie_word_embeddings: the head is then the token embedding). */
#ifndef CGRAD_LLAMA_H
#define CGRAD_LLAMA_H

#include "../graph/graph.h"
#include "../ops/ops.h"
#include "layers.h"

CG_BEGIN_DECLS

/* LLaMA's hyperparameters, named as in Hugging Face's config.json. */
typedef struct {
    int64_t vocab_size;              /* token embedding rows and output logits */
    int64_t hidden_size;             /* model width */
    int64_t intermediate_size;       /* SwiGLU width */
    int64_t num_hidden_layers;       /* decoder blocks */
    int64_t num_attention_heads;     /* query heads */
    int64_t num_key_value_heads;     /* key/value heads, dividing the query heads (0: as many as queries) */
    int64_t head_dim;                /* features per head (0: hidden_size / num_attention_heads) */
    int64_t max_position_embeddings; /* longest context */
    double rms_norm_eps;             /* 1e-6 in LLaMA 2 */
    cg_rope_config rope;             /* rope_theta and rope_scaling ("linear" or "llama3"); the model rotates
                                        all of head_dim in HF's half-split pairing (dims, interleaved ignored) */
    bool tie_word_embeddings;        /* the LM head is the token embedding (no lm_head.weight) */
    double dropout;                  /* embedding, residual and attention dropout (HF LLaMA: attention_dropout, 0) */
} cg_llama_config;

typedef struct cg_llama cg_llama; /* a LLaMA: config and parameters (opaque) */

/* Reads a Hugging Face LLaMA config.json text: vocab_size, hidden_size, intermediate_size,
 * num_hidden_layers, num_attention_heads are required; num_key_value_heads, head_dim,
 * max_position_embeddings (2048), rms_norm_eps (1e-6), rope_theta (10000), rope_scaling (null,
 * {"rope_type"|"type": "linear"|"llama3", "factor", ...}), tie_word_embeddings (false) are
 * optional; hidden_act must be "silu" and attention_bias / mlp_bias false; other fields ignored. */
cg_status cg_llama_config_parse(const char *json, cg_llama_config *cfg);
/* Writes cfg as a LLaMA config.json text (model_type "llama"); malloc'd, caller frees. */
char *cg_llama_config_json(const cg_llama_config *cfg);
/* Declares the parameters in ps (normal(0, 0.02) matrices, unit norms, seeded); the model borrows ps. */
cg_llama *cg_llama_new(const cg_llama_config *cfg, cg_params *ps, uint64_t seed);
/* Frees the model (not its parameter set). */
void cg_llama_free(cg_llama *m);
/* The model's configuration. */
const cg_llama_config *cg_llama_cfg(const cg_llama *m);
/* Adds the model to g: int32 ids [B, T] -> logits [B, T, vocab]. */
cg_tensor *cg_llama_logits(cg_graph *g, const cg_llama *m, cg_tensor *ids);
/* cg_llama_logits for ids [1, T] at positions cache->len..: each layer reads the keys and values of
 * earlier positions from cache (allocated for num_hidden_layers x num_key_value_heads x head_dim)
 * and writes this step's after them; the caller adds T to cache->len after the forward. */
cg_tensor *cg_llama_logits_cached(cg_graph *g, const cg_llama *m, cg_tensor *ids, cg_kv_cache *cache);
/* Generates n_new tokens after the prompt into out[n_prompt + n_new] (prompt copied first);
 * with use_cache each step feeds only the new token, rotated at its position, through cached keys
 * and values (Hk heads per layer). */
cg_status cg_llama_generate(const cg_llama *m, const int32_t *prompt, int64_t n_prompt, int64_t n_new,
                            const cg_sampling *s, uint64_t seed, bool use_cache, int32_t *out);

CG_END_DECLS
#endif
