/* SPDX-License-Identifier: MIT */
/* BERT-style encoder (Hugging Face BertForPreTraining layout): token, position and segment
 * embeddings with LayerNorm, post-LN encoder with exact GELU, masked-LM head tied to the word
 * embeddings, next-sentence head on the tanh pooler over [CLS]; or, with num_labels > 0, a
 * classification head on the pooler instead of both (BertForSequenceClassification). */
#ifndef CGRAD_BERT_H
#define CGRAD_BERT_H

#include "../graph/graph.h"

CG_BEGIN_DECLS

/* BERT's hyperparameters, named as in Hugging Face's config.json. */
typedef struct {
    int64_t vocab_size;              /* token embedding rows */
    int64_t hidden_size;             /* model width d */
    int64_t num_hidden_layers;       /* encoder layers */
    int64_t num_attention_heads;     /* heads per layer (divides hidden_size) */
    int64_t intermediate_size;       /* feed-forward width */
    int64_t max_position_embeddings; /* longest sequence */
    int64_t type_vocab_size;         /* segment (token type) embedding rows */
    int64_t num_labels;    /* > 0: the classification head classifier.{weight,bias} replaces the pretraining heads */
    double layer_norm_eps; /* 1e-12 in BERT */
    double dropout;        /* hidden and attention dropout */
} cg_bert_config;

/* The nodes a BERT forward adds to a graph. */
typedef struct {
    cg_tensor *hidden;     /* [B, T, d] last encoder layer */
    cg_tensor *mlm_logits; /* [B, T, vocab] (NULL in a classifier) */
    cg_tensor *nsp_logits; /* [B, 2] (NULL in a classifier) */
    cg_tensor *cls_logits; /* [B, num_labels], NULL without the head */
    cg_tensor *mlm_loss;   /* fused masked-LM loss when labels were given, else NULL */
} cg_bert_outputs;

typedef struct cg_bert cg_bert; /* a BERT: config and parameters (opaque) */

/* Reads a Hugging Face BERT config.json text (num_labels from "num_labels" or id2label, else 0). */
cg_status cg_bert_config_parse(const char *json, cg_bert_config *cfg);
/* Writes cfg as a BERT config.json text; malloc'd, caller frees. */
char *cg_bert_config_json(const cg_bert_config *cfg);
/* Declares the parameters in ps (normal(0, 0.02) init, seeded); the model borrows ps. */
cg_bert *cg_bert_new(const cg_bert_config *cfg, cg_params *ps, uint64_t seed);
/* Frees the model (not its parameters). */
void cg_bert_free(cg_bert *m);
/* The model's configuration. */
const cg_bert_config *cg_bert_cfg(const cg_bert *m);
/* Adds the model to g. ids [B, T] int32; token_types and attention_mask (1 keep, 0 pad) may be NULL.
 * With mlm_labels (int32 [B, T], -100 ignored) the masked-LM head is the fused
 * cg_linear_cross_entropy over the labelled positions only: out->mlm_logits is then NULL and
 * out->mlm_loss holds the loss. Without, out->mlm_logits has every position. */
cg_status cg_bert_forward_ex(cg_graph *g, const cg_bert *m, cg_tensor *ids, cg_tensor *token_types,
                             cg_tensor *attention_mask, cg_tensor *mlm_labels, cg_bert_outputs *out);
/* cg_bert_forward_ex without labels: every position's masked-LM logits. */
cg_status cg_bert_forward(cg_graph *g, const cg_bert *m, cg_tensor *ids, cg_tensor *token_types,
                          cg_tensor *attention_mask, cg_bert_outputs *out);
/* Pre-training loss: mean masked-LM cross-entropy (labels -100 ignored) + next-sentence cross-entropy. */
cg_tensor *cg_bert_pretraining_loss(cg_graph *g, const cg_bert_outputs *o, cg_tensor *labels,
                                    cg_tensor *next_sentence_label, cg_tensor **mlm_loss, cg_tensor **nsp_loss);

/* Fill-mask inference: for ids[n] (one sequence, [CLS] ... [SEP]), writes the top_k most likely
 * tokens and their probabilities at the first position holding mask_id into top_ids/top_probs. */
cg_status cg_bert_fill_mask(const cg_bert *m, const int32_t *ids, int64_t n, int32_t mask_id, int top_k,
                            int32_t *top_ids, double *top_probs);

CG_END_DECLS
#endif
