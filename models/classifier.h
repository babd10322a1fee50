/* SPDX-License-Identifier: MIT */
/* Classification transformer (Bloem, "Transformers from scratch"): token + learned position
 * embeddings, post-LN encoder blocks, mean pooling over the unpadded positions, a linear layer to
 * class logits. Parameters: token_emb.weight, pos_emb.weight, blocks.{i}.attn.{q,k,v,o}.*,
 * blocks.{i}.norm1.*, blocks.{i}.ff.0.*, blocks.{i}.ff.2.*, blocks.{i}.norm2.*, toprobs.*. */
#ifndef CGRAD_CLASSIFIER_H
#define CGRAD_CLASSIFIER_H

#include "../graph/graph.h"

CG_BEGIN_DECLS

/* The classifier's hyperparameters (an encoder with mean pooling and a linear head). */
typedef struct {
    int64_t vocab_size;      /* token embedding rows */
    int64_t d_model;         /* model width */
    int64_t n_head;          /* heads per layer (divides d_model) */
    int64_t n_layer;         /* encoder layers */
    int64_t dim_feedforward; /* feed-forward width */
    int64_t max_len;         /* longest sequence */
    int64_t num_classes;     /* outputs of the head */
    double layer_norm_eps;   /* LayerNorm epsilon */
    double dropout;          /* dropout probability */
} cg_classifier_config;

typedef struct cg_classifier cg_classifier; /* a classifier: config and parameters (opaque) */

/* Reads config.json text (vocab_size, d_model, n_head, n_layer, dim_feedforward, max_len,
 * num_classes, layer_norm_eps). */
cg_status cg_classifier_config_parse(const char *json, cg_classifier_config *cfg);
/* Writes cfg as config.json text; malloc'd, caller frees. */
char *cg_classifier_config_json(const cg_classifier_config *cfg);
/* Declares the parameters in ps (seeded init); the model borrows ps. */
cg_classifier *cg_classifier_new(const cg_classifier_config *cfg, cg_params *ps, uint64_t seed);
/* Frees the model (not its parameters). */
void cg_classifier_free(cg_classifier *m);
/* The model's configuration. */
const cg_classifier_config *cg_classifier_cfg(const cg_classifier *m);
/* Adds the model to g: ids [B, T] int32, attention_mask [B, T] (1 keep, 0 pad; may be NULL) -> logits [B, C]. */
cg_tensor *cg_classifier_logits(cg_graph *g, const cg_classifier *m, cg_tensor *ids, cg_tensor *attention_mask);

CG_END_DECLS
#endif
