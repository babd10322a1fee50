/* SPDX-License-Identifier: MIT */
/* One interface over the model zoo, for tools that handle every architecture alike (the cgrad
 * command, benchmarks, parity tests): a model from its config.json, weights by Hugging Face /
 * torch names, and a training graph whose inputs carry the batch tensor names. */
#ifndef CGRAD_ZOO_H
#define CGRAD_ZOO_H

#include "../graph/graph.h"
#include "../io/safetensors.h"
#include "bert.h"
#include "classifier.h"
#include "cnn.h"
#include "encdec.h"
#include "gpt.h"
#include "llama.h"
#include "vit.h"

CG_BEGIN_DECLS

/* The zoo's model families. */
typedef enum {
    CG_ARCH_GPT2,      /* GPT-2 decoder, language modelling */
    CG_ARCH_BERT,      /* BERT encoder, masked LM and next sentence (or a classification head) */
    CG_ARCH_ENCDEC,    /* encoder-decoder, sequence to sequence */
    CG_ARCH_CLASSIFIER, /* encoder with mean pooling, text classification */
    CG_ARCH_LLAMA,      /* LLaMA decoder (RMSNorm, SwiGLU, RoPE, grouped-query attention), language modelling;
                           also Mistral, Qwen2 and Qwen3, by config.json's model_type (cg_llama_family) */
    CG_ARCH_VIT,        /* Vision Transformer, image classification */
    CG_ARCH_CNN         /* convolutional network, image classification */
} cg_arch;

/* Arch named "gpt2", "bert", "encdec", "classifier", "llama", "vit" or "cnn"; CG_ERR_ARG otherwise. */
cg_status cg_arch_parse(const char *name, cg_arch *arch);
/* The arch's name. */
const char *cg_arch_name(cg_arch arch);

typedef struct cg_model cg_model; /* any zoo model behind one interface (opaque) */

/* Model from a config.json text of the arch; declares its parameters in ps (seeded init);
 * dropout applies everywhere (the config's own dropout fields are ignored, but for the LLaMA families'
 * attention_dropout, which takes the attention weights' when set). */
cg_model *cg_model_new(cg_arch arch, const char *config_json, double dropout, cg_params *ps, uint64_t seed);
/* Frees the model (not its parameters). */
void cg_model_free(cg_model *m);
/* The model's arch. */
cg_arch cg_model_arch(const cg_model *m);
/* The parameter set the model was declared in. */
cg_params *cg_model_params(const cg_model *m);
/* The config as config.json text; malloc'd, caller frees. */
char *cg_model_config_json(const cg_model *m);
/* The wrapped model, or NULL if the arch differs. */
cg_gpt *cg_model_gpt(cg_model *m);
/* The wrapped model, or NULL if the arch differs. */
cg_bert *cg_model_bert(cg_model *m);
/* The wrapped model, or NULL if the arch differs. */
cg_encdec *cg_model_encdec(cg_model *m);
/* The wrapped model, or NULL if the arch differs. */
cg_classifier *cg_model_classifier(cg_model *m);
/* The wrapped model, or NULL if the arch differs. */
cg_llama *cg_model_llama(cg_model *m);
/* The wrapped model, or NULL if the arch differs. */
cg_vit *cg_model_vit(cg_model *m);
/* The wrapped model, or NULL if the arch differs. */
cg_cnn *cg_model_cnn(cg_model *m);
/* True for the image classifiers (vit, cnn): they train on pixel_values, labels. */
bool cg_model_is_image(const cg_model *m);
/* An image model's input shape [C, H, W] into chw; false for other archs. */
bool cg_model_image_shape(const cg_model *m, int64_t chw[3]);
/* True for the language-model decoders (gpt2, llama): they generate and train on input_ids, targets. */
bool cg_model_is_decoder(const cg_model *m);
/* A decoder's longest sequence (n_positions, max_position_embeddings); 0 for other archs. */
int64_t cg_model_context(const cg_model *m);
/* A decoder's generation (cg_gpt_generate, cg_llama_generate); CG_ERR_ARG for other archs. */
cg_status cg_model_generate(const cg_model *m, const int32_t *prompt, int64_t n_prompt, int64_t n_new,
                            const cg_sampling *s, uint64_t seed, bool use_cache, int32_t *out);

/* Loads every parameter from f by the arch's names: GPT-2 names may carry a "transformer."
 * prefix, tied duplicates (lm_head.weight of GPT-2 and of a tied LLaMA, cls.predictions.decoder.*)
 * must equal their twin in shape and value, known buffers (attn.bias masks, position_ids, rotary
 * inv_freq) are skipped; any other unknown tensor or a missing parameter is an error naming it, and
 * the values pass every check of cg_st_load_run (shapes, dtypes, byte ranges, finite values) before
 * any parameter changes. */
cg_status cg_model_load(cg_model *m, const cg_st *f);
/* As cg_model_load, for starting from another model's weights: a parameter the file lacks keeps
 * its value (a new head stays initialised) and a tensor that matches no parameter is skipped (the
 * old head), but names that match must match in shape. *kept and *skipped (either may be NULL)
 * receive malloc'd comma-separated names, or NULL when there are none; the caller frees them. */
cg_status cg_model_load_partial(cg_model *m, const cg_st *f, char **kept, char **skipped);
/* Writes the weights at path as transformers' save_pretrained does (model.safetensors): the
 * arch's Hugging Face names (gpt2 under "transformer.", tied lm_head.weight and BERT's tied decoder
 * left out), "format": "pt" metadata; LoRA adapters are not written (cg_lora_merge first). */
cg_status cg_model_save_hf(cg_model *m, const char *path);
/* Writes every parameter under its own name to a safetensors file at path (LoRA adapters excepted:
 * cg_lora_save writes those; cg_lora_merge first to fold them into the weights written here). */
cg_status cg_model_save(cg_model *m, const char *path);

/* A training graph: the batch inputs (named as in the batch files: gpt2 and llama input_ids, targets;
 * bert input_ids, token_type_ids, attention_mask, labels, next_sentence_label; encdec src,
 * src_mask, tgt_in, tgt_out; classifier, and bert with num_labels > 0, input_ids, attention_mask,
 * labels; vit and cnn pixel_values (real [B, C, H, W]), labels) and the outputs. */
typedef struct {
    cg_tensor *loss;       /* the scalar to train on */
    cg_tensor *logits;     /* the model's output logits (NULL where the head is fused with the loss) */
    cg_tensor *mlm_loss;   /* bert only: the masked-LM part of loss */
    cg_tensor *nsp_loss;   /* bert only: the next-sentence part of loss */
    cg_tensor *nsp_logits; /* bert only: next-sentence logits [B, 2] */
    int n_inputs;          /* entries used in inputs */
    cg_tensor *inputs[5];  /* the batch inputs, in the order listed above */
} cg_model_graph;

/* Training graphs fuse the LM head with its loss, in row chunks (logits NULL): GPT-2's and LLaMA's
 * over every position, BERT's masked-LM head over the labelled positions only; on gives every
 * position's logits instead, as `cgrad step` needs. */
void cg_model_set_full_logits(cg_model *m, bool on);
/* Adds inputs and loss to g for batch rows of t tokens (encdec: t target, s source tokens; images:
 * t and s unused). The
 * losses are retained; logits are retained in eval graphs (and the classifier's always): in a
 * training graph cg_retain them to read them, which costs their gradient's memory. */
cg_status cg_model_build(cg_graph *g, cg_model *m, int64_t batch, int64_t t, int64_t s, cg_model_graph *out);
/* Classes of a classification model (classifier, vit, cnn, or bert with num_labels > 0); 0 otherwise. */
int64_t cg_model_num_classes(const cg_model *m);
/* Longest sequence any model takes (positions; cg_model_context: decoders only). */
int64_t cg_model_max_len(const cg_model *m);
/* Adds a classification model to g: ids [B, T] int32, attention_mask [B, T] (may be NULL) ->
 * logits [B, classes] (vit, cnn: ids are the pixels [B, C, H, W], no mask); NULL (message set) for a
 * model without a classification head. */
cg_tensor *cg_model_class_logits(cg_graph *g, cg_model *m, cg_tensor *ids, cg_tensor *attention_mask);
/* The input of that name, or NULL. */
cg_tensor *cg_model_graph_input(const cg_model_graph *mg, const char *name);

CG_END_DECLS
#endif
