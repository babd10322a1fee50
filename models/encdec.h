/* SPDX-License-Identifier: MIT */
/* Encoder-decoder transformer (Vaswani et al. 2017) laid out as torch.nn.Transformer
 * (batch_first, post-LN, ReLU): embeddings scaled by sqrt(d_model), sinusoidal positions, final
 * LayerNorm on each stack, a generator projection. Parameter names are src_emb.weight,
 * tgt_emb.weight, transformer.<nn.Transformer state_dict names>, generator.{weight,bias}. */
#ifndef CGRAD_ENCDEC_H
#define CGRAD_ENCDEC_H

#include "../graph/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The encoder-decoder's hyperparameters, with torch.nn.Transformer's names. */
typedef struct {
    int64_t src_vocab_size;     /* source embedding rows */
    int64_t tgt_vocab_size;     /* target embedding rows and output logits */
    int64_t d_model;            /* model width */
    int64_t n_head;             /* heads per layer (divides d_model) */
    int64_t num_encoder_layers; /* encoder layers */
    int64_t num_decoder_layers; /* decoder layers */
    int64_t dim_feedforward;    /* feed-forward width */
    int64_t max_len;            /* longest source or target */
    int64_t pad_id;             /* padding token */
    int64_t bos_id;             /* first token of every decoded sequence */
    int64_t eos_id;             /* token that ends decoding */
    double layer_norm_eps;      /* LayerNorm epsilon */
    double dropout;             /* dropout probability */
} cg_encdec_config;

typedef struct cg_encdec cg_encdec; /* an encoder-decoder: config and parameters (opaque) */

/* Reads a config.json text with torch.nn.Transformer's argument names (see docs/models.md). */
cg_status cg_encdec_config_parse(const char *json, cg_encdec_config *cfg);
/* Writes cfg as config.json text; malloc'd, caller frees. */
char *cg_encdec_config_json(const cg_encdec_config *cfg);
/* Declares the parameters in ps (Xavier-uniform matrices, as nn.Transformer); the model borrows ps. */
cg_encdec *cg_encdec_new(const cg_encdec_config *cfg, cg_params *ps, uint64_t seed);
/* Frees the model (not its parameters). */
void cg_encdec_free(cg_encdec *m);
/* The model's configuration. */
const cg_encdec_config *cg_encdec_cfg(const cg_encdec *m);
/* Encoder: src [B, S] int32, src_mask [B, S] (1 keep, 0 pad; may be NULL) -> memory [B, S, d]. */
cg_tensor *cg_encdec_encode(cg_graph *g, const cg_encdec *m, cg_tensor *src, cg_tensor *src_mask);
/* Decoder over memory: tgt_in [B, T] -> logits [B, T, tgt_vocab] (causal self-attention, padded
 * source keys hidden from cross-attention). */
cg_tensor *cg_encdec_decode(cg_graph *g, const cg_encdec *m, cg_tensor *memory, cg_tensor *src_mask, cg_tensor *tgt_in);
/* Both: logits [B, T, tgt_vocab] for every target position. */
cg_tensor *cg_encdec_logits(cg_graph *g, const cg_encdec *m, cg_tensor *src, cg_tensor *src_mask, cg_tensor *tgt_in);
/* Both and the generator fused with the mean cross-entropy against tgt_out [B, T] (ignore_index
 * skipped): the scalar loss, without materialising the logits (training graphs). */
cg_tensor *cg_encdec_loss(cg_graph *g, const cg_encdec *m, cg_tensor *src, cg_tensor *src_mask, cg_tensor *tgt_in,
                          cg_tensor *tgt_out, int ignore_index);
/* Translates one source sequence: greedy when beam <= 1, else beam search with beam hypotheses
 * (length-normalised scores). Writes the tokens after bos, up to eos (excluded), into out[max_len]. */
cg_status cg_encdec_translate(const cg_encdec *m, const int32_t *src, int64_t n_src, int beam, int64_t max_len,
                              int32_t *out, int64_t *n_out);

#ifdef __cplusplus
}
#endif
#endif
