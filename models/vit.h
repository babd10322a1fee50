/* SPDX-License-Identifier: MIT */
/* A small Vision Transformer (Dosovitskiy et al., "An Image is Worth 16x16 Words"): a conv2d patch
 * embedding (kernel = stride = patch_size), a learned [CLS] token or mean pooling over the patches,
 * learned position embeddings, pre-norm encoder blocks (LayerNorm, multi-head attention, LayerNorm,
 * GELU MLP), a final LayerNorm and a linear classification head. Parameters: patch_embed.{weight,bias},
 * cls_token (with the [CLS] token), pos_embed, blocks.{i}.norm1.*, blocks.{i}.attn.{q,k,v,o}.*,
 * blocks.{i}.norm2.*, blocks.{i}.mlp.fc1.*, blocks.{i}.mlp.fc2.*, norm.*, head.*. */
#ifndef CGRAD_VIT_H
#define CGRAD_VIT_H

#include "../graph/graph.h"

CG_BEGIN_DECLS

/* The ViT's hyperparameters. */
typedef struct {
    int64_t image_size;   /* square images of this side */
    int64_t num_channels; /* input channels (1: greyscale) */
    int64_t patch_size;   /* side of a patch (divides image_size) */
    int64_t d_model;      /* model width */
    int64_t n_head;       /* heads per layer (divides d_model) */
    int64_t n_layer;      /* encoder blocks */
    int64_t mlp_dim;      /* MLP width (0: 4 * d_model) */
    int64_t num_classes;  /* outputs of the head */
    int64_t cls_token;    /* 1: classify from a learned [CLS] token; 0: from the mean over patches */
    double layer_norm_eps; /* LayerNorm epsilon */
    double dropout;       /* dropout probability */
} cg_vit_config;

typedef struct cg_vit cg_vit; /* a ViT: config and parameters (opaque) */

/* Reads config.json text (image_size, num_channels, patch_size, d_model, n_head, n_layer, mlp_dim,
 * num_classes, cls_token, layer_norm_eps). */
cg_status cg_vit_config_parse(const char *json, cg_vit_config *cfg);
/* Writes cfg as config.json text; malloc'd, caller frees. */
char *cg_vit_config_json(const cg_vit_config *cfg);
/* Declares the parameters in ps (seeded init); the model borrows ps. */
cg_vit *cg_vit_new(const cg_vit_config *cfg, cg_params *ps, uint64_t seed);
/* Frees the model (not its parameters). */
void cg_vit_free(cg_vit *m);
/* The model's configuration. */
const cg_vit_config *cg_vit_cfg(const cg_vit *m);
/* Adds the model to g: pixels [B, C, H, W] -> logits [B, classes]. */
cg_tensor *cg_vit_logits(cg_graph *g, const cg_vit *m, cg_tensor *pixels);

CG_END_DECLS
#endif
