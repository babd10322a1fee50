/* SPDX-License-Identifier: MIT */
/* A small convolutional classifier: n_layer stages of conv2d (3x3, padding 1) + ReLU + 2x2 max
 * pooling, the channels doubling from `channels` at every stage, then an optional hidden linear
 * layer with ReLU and a linear head. Parameters: convs.{i}.{weight,bias}, fc.{weight,bias} (when
 * hidden > 0), head.{weight,bias}. */
#ifndef CGRAD_CNN_H
#define CGRAD_CNN_H

#include "../graph/graph.h"

CG_BEGIN_DECLS

/* The CNN's hyperparameters. */
typedef struct {
    int64_t image_size;   /* square images of this side (divisible by 2^n_layer) */
    int64_t num_channels; /* input channels (1: greyscale) */
    int64_t channels;     /* output channels of the first conv; each later stage doubles them */
    int64_t n_layer;      /* conv + pool stages */
    int64_t hidden;       /* width of the hidden linear layer (0: none) */
    int64_t num_classes;  /* outputs of the head */
    double dropout;       /* dropout before the head */
} cg_cnn_config;

typedef struct cg_cnn cg_cnn; /* a CNN: config and parameters (opaque) */

/* Reads config.json text (image_size, num_channels, channels, n_layer, hidden, num_classes). */
cg_status cg_cnn_config_parse(const char *json, cg_cnn_config *cfg);
/* Writes cfg as config.json text; malloc'd, caller frees. */
char *cg_cnn_config_json(const cg_cnn_config *cfg);
/* Declares the parameters in ps (seeded He-normal init, zero biases); the model borrows ps. */
cg_cnn *cg_cnn_new(const cg_cnn_config *cfg, cg_params *ps, uint64_t seed);
/* Frees the model (not its parameters). */
void cg_cnn_free(cg_cnn *m);
/* The model's configuration. */
const cg_cnn_config *cg_cnn_cfg(const cg_cnn *m);
/* Adds the model to g: pixels [B, C, H, W] -> logits [B, classes]. */
cg_tensor *cg_cnn_logits(cg_graph *g, const cg_cnn *m, cg_tensor *pixels);

CG_END_DECLS
#endif
