/* SPDX-License-Identifier: MIT */
/* GPT-style decoder (GPT-2 layout): learned positions, pre-LN blocks with tanh-GELU, causal
 * attention, final LayerNorm, LM head tied to the token embedding. Parameters carry Hugging
 * Face GPT-2 names and layouts (Conv1D weights [in, out]): wte.weight, h.0.attn.c_attn.weight... */
#ifndef CGRAD_GPT_H
#define CGRAD_GPT_H

#include "../graph/graph.h"
#include "layers.h"

CG_BEGIN_DECLS

/* GPT-2's hyperparameters, named as in Hugging Face's config.json. */
typedef struct {
    int64_t vocab_size;        /* token embedding rows and output logits */
    int64_t n_positions;       /* longest context */
    int64_t n_embd;            /* model width */
    int64_t n_layer;           /* transformer blocks */
    int64_t n_head;            /* heads per block (divides n_embd) */
    int64_t n_inner;           /* feed-forward width; 0 means 4 * n_embd */
    double layer_norm_epsilon; /* 1e-5 in GPT-2 */
    double dropout;            /* residual, embedding and attention dropout */
} cg_gpt_config;

typedef struct cg_gpt cg_gpt; /* a GPT: config and parameters (opaque) */

/* Reads a Hugging Face GPT-2 config.json text (n_embd, n_layer, n_head, n_positions, vocab_size,
 * layer_norm_epsilon, n_inner; null n_inner means 4 * n_embd; other fields ignored). */
cg_status cg_gpt_config_parse(const char *json, cg_gpt_config *cfg);
/* Writes cfg as a GPT-2 config.json text; malloc'd, caller frees. */
char *cg_gpt_config_json(const cg_gpt_config *cfg);
/* Declares the parameters in ps (GPT-2 initialisation seeded by seed); the model borrows ps. */
cg_gpt *cg_gpt_new(const cg_gpt_config *cfg, cg_params *ps, uint64_t seed);
/* Frees the model (not its parameter set). */
void cg_gpt_free(cg_gpt *m);
/* The model's configuration. */
const cg_gpt_config *cg_gpt_cfg(const cg_gpt *m);
/* Adds the model to g: int32 ids [B, T] -> logits [B, T, vocab]. */
cg_tensor *cg_gpt_logits(cg_graph *g, const cg_gpt *m, cg_tensor *ids);
/* The model with its tied LM head fused with the mean cross-entropy against targets [B, T]
 * (ignore_index skipped): the scalar loss, computed in row chunks without materialising the logits. */
cg_tensor *cg_gpt_loss(cg_graph *g, const cg_gpt *m, cg_tensor *ids, cg_tensor *targets, int ignore_index);
/* cg_gpt_logits for ids [1, T] at positions cache->len.. through cache (see cg_kv_cache); with
 * cache->past set, one token at the position read from it at each run (a replayed decode graph). */
cg_tensor *cg_gpt_logits_cached(cg_graph *g, const cg_gpt *m, cg_tensor *ids, cg_kv_cache *cache);
/* Generates n_new tokens after the prompt into out[n_prompt + n_new] (prompt copied first);
 * with use_cache each step feeds only the new token through cached keys and values. */
cg_status cg_gpt_generate(const cg_gpt *m, const int32_t *prompt, int64_t n_prompt, int64_t n_new,
                          const cg_sampling *s, uint64_t seed, bool use_cache, int32_t *out);

CG_END_DECLS
#endif
