/* SPDX-License-Identifier: MIT */
/* LLaMA-style decoders (Touvron et al. 2023) and the Hugging Face families built on them: RMSNorm
 * pre-norm blocks, SwiGLU feed-forward, rotary positions (RoPE) on queries and keys, grouped-query
 * attention (fewer key/value heads than query heads), final RMSNorm and an LM head. The family
 * (config.json's model_type) adds what sets it apart: Mistral's sliding-window attention, Qwen2's
 * q/k/v biases, Qwen3's per-head q/k RMSNorm. Parameters carry Hugging Face names and layouts
 * (nn.Linear weights [out, in]): model.embed_tokens.weight, model.layers.0.self_attn.q_proj.weight
 * (and .bias when the family has one), model.layers.0.self_attn.q_norm.weight (Qwen3),
 * model.layers.0.mlp.gate_proj.weight, ..., model.norm.weight, lm_head.weight (absent when
 * tie_word_embeddings: the head is then the token embedding). Mixtral replaces each MLP by a mixture of
 * experts (models/moe.h): model.layers.0.block_sparse_moe.gate.weight, ...experts.0.w1.weight. */
#ifndef CGRAD_LLAMA_H
#define CGRAD_LLAMA_H

#include "../graph/graph.h"
#include "../ops/ops.h"
#include "layers.h"
#include "moe.h"

CG_BEGIN_DECLS

/* The Hugging Face families this decoder implements, by config.json's model_type. */
typedef enum {
    CG_LLAMA_FAMILY_LLAMA,   /* "llama": LlamaForCausalLM (LLaMA 1, 2, 3) */
    CG_LLAMA_FAMILY_MISTRAL, /* "mistral": MistralForCausalLM, sliding-window attention on every layer */
    CG_LLAMA_FAMILY_QWEN2,   /* "qwen2": Qwen2ForCausalLM, biases on q/k/v (not o) */
    CG_LLAMA_FAMILY_QWEN3,   /* "qwen3": Qwen3ForCausalLM, per-head RMSNorm of q and k before RoPE */
    CG_LLAMA_FAMILY_MIXTRAL  /* "mixtral": MixtralForCausalLM, a mixture of SwiGLU experts in place of the MLP */
} cg_llama_family;

/* LLaMA's hyperparameters, named as in Hugging Face's config.json. */
typedef struct {
    cg_llama_family family;          /* model_type; decides the class and which fields exist */
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
    bool qkv_bias;                   /* q/k/v projections have biases (Qwen2 always; attention_bias in LLaMA, Qwen3) */
    bool o_bias;                     /* o_proj has a bias (attention_bias in LLaMA and Qwen3) */
    bool mlp_bias;                   /* gate/up/down projections have biases (LLaMA's mlp_bias) */
    bool qk_norm;                    /* RMSNorm of each query and key head over head_dim before RoPE (Qwen3) */
    int64_t sliding_window;          /* key j is seen by query i iff i - window < j <= i (0: every earlier key) */
    bool use_sliding_window;         /* Qwen2/3: the window applies, from layer max_window_layers on */
    int64_t max_window_layers;       /* Qwen2/3: the first layers, which keep full attention */
    double attention_dropout;        /* dropout of the attention weights in training (config.json's) */
    double dropout;                  /* embedding and residual dropout, and attention's when attention_dropout is 0 */
    int64_t num_local_experts;       /* Mixtral: experts per layer (0: a dense MLP) */
    int64_t num_experts_per_tok;     /* Mixtral: experts each token is routed to */
    double router_aux_loss_coef;     /* Mixtral: weight of the load-balancing loss added to the training loss */
    bool output_router_logits;       /* Mixtral: add the load-balancing loss to the loss (as transformers does) */
    double capacity_factor;          /* Mixtral: expert capacity (cgrad's config.json field, not Hugging Face's): 0 dropless */
} cg_llama_config;
typedef struct cg_llama cg_llama; /* a LLaMA: config and parameters (opaque) */

/* Reads a Hugging Face config.json text of model_type "llama" (also when absent), "mistral", "qwen2",
 * "qwen3" or "mixtral": vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads are
 * required, the family's other fields optional with transformers' defaults. A field that would change
 * the numbers and that cgrad does not implement (a rope_scaling type other than linear and llama3, a
 * hidden_act other than silu, Mixtral's router_jitter_noise, another family's MoE fields, a field the family does not know) is an error naming it;
 * Mixtral also reads capacity_factor, cgrad's own field (0 or absent: dropless, as Hugging Face's Mixtral);
 * fields without effect on the numbers (torch_dtype, bos_token_id, use_cache, ...) are accepted. */
cg_status cg_llama_config_parse(const char *json, cg_llama_config *cfg);
/* Writes cfg as config.json text of its family (model_type, architectures, the family's fields);
 * malloc'd, caller frees. */
char *cg_llama_config_json(const cg_llama_config *cfg);
/* The family's model_type ("llama", "mistral", "qwen2", "qwen3", "mixtral"). */
const char *cg_llama_family_name(cg_llama_family family);
/* The family's transformers class ("LlamaForCausalLM", "MistralForCausalLM", ...). */
const char *cg_llama_family_class(cg_llama_family family);
/* Keys visible to each query at layer i: the sliding window there, or 0 for every earlier key. */
int64_t cg_llama_layer_window(const cg_llama_config *cfg, int64_t layer);
/* Declares the parameters in ps (normal(0, 0.02) matrices, unit norms, seeded); the model borrows ps. */
cg_llama *cg_llama_new(const cg_llama_config *cfg, cg_params *ps, uint64_t seed);
/* Frees the model (not its parameter set). */
void cg_llama_free(cg_llama *m);
/* The model's configuration. */
const cg_llama_config *cg_llama_cfg(const cg_llama *m);
/* Sets a Mixtral's capacity_factor (0: dropless) in its config and every MoE layer, for graphs built
 * afterwards; CG_ERR_ARG naming the value if it is negative or not finite, or if m has no experts. */
cg_status cg_llama_set_capacity_factor(cg_llama *m, double capacity_factor);
/* Adds the model to g: int32 ids [B, T] -> logits [B, T, vocab]. */
cg_tensor *cg_llama_logits(cg_graph *g, const cg_llama *m, cg_tensor *ids);
/* cg_llama_logits, and for a Mixtral *aux_loss (may be NULL) = the load-balancing loss over its layers'
 * router logits (cg_moe_load_balancing_loss, not yet scaled by router_aux_loss_coef); NULL for a dense model. */
cg_tensor *cg_llama_logits_aux(cg_graph *g, const cg_llama *m, cg_tensor *ids, cg_tensor **aux_loss);
/* The model with its LM head (tied or not) fused with the mean cross-entropy against targets [B, T]
 * (ignore_index skipped): the scalar loss, computed in row chunks without materialising the logits.
 * A Mixtral that outputs its router logits adds router_aux_loss_coef x its load-balancing loss, as
 * MixtralForCausalLM's loss does. */
cg_tensor *cg_llama_loss(cg_graph *g, const cg_llama *m, cg_tensor *ids, cg_tensor *targets, int ignore_index);
/* loss + router_aux_loss_coef x aux_loss when the model outputs its router logits, else loss (NULL stays NULL). */
cg_tensor *cg_llama_add_aux_loss(cg_graph *g, const cg_llama *m, cg_tensor *loss, cg_tensor *aux_loss);
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
