/* SPDX-License-Identifier: MIT */
/* Internal to the cgrad command: what `train` and the inference commands share. A task is one
 * architecture's data (tokenized once), the way it fills a batch into a model graph's named int32
 * inputs, and its held-out evaluation; a loaded checkpoint is a model, its tokenizer and the
 * training settings that made it. */
#ifndef CGRAD_CLI_SESSION_H
#define CGRAD_CLI_SESSION_H

#include <signal.h>
#include <stdio.h>

#include <cjson/cJSON.h>

#include "cgrad.h"

/* ---- tasks: one arch's data ---- */

typedef struct {
    cg_arch arch;
    const cg_tokenizer *tok; /* borrowed */
    int64_t batch, t, s;     /* graph shape: rows, tokens (encdec: target), source tokens */
    cg_lm_data *lm;          /* gpt2 */
    cg_mlm_data *mlm;        /* bert */
    cg_seq2seq_data *s2s;    /* encdec */
    cg_textcls_data *cls;    /* classifier */
    cg_image_set img[2];     /* vit, cnn: the training and the test images (img[1] is the held-out split) */
    int32_t pad_id, bos_id, eos_id, cls_id; /* encdec specials sit after the tokenizer's ids */
    cg_rng rng;              /* lm/mlm training draws (checkpointed) */
    cg_data_cursor cur;      /* seq2seq/textcls training order (checkpointed) */
    uint64_t eval_seed;      /* lm/mlm held-out draws restart from this at every evaluation */
    const int32_t *label_map; /* classifier: data label id -> model class (NULL: the same) */
    cg_dist *dist;           /* held-out batches are split over its ranks and the sums reduced (NULL: local) */
} cli_task;

typedef struct {
    double loss;             /* mean over held-out tokens (lm, mlm: mean of batch means) */
    double mlm_loss, nsp_loss; /* bert */
    double accuracy;         /* classifier: share of rows right; NAN otherwise */
    int64_t batches, items;  /* batches run, rows (classifier) or target tokens (encdec) */
} cli_eval;

/* Loads the arch's data from data_path (and val_path for TSV archs, may be NULL) with tok;
 * context caps T. On failure a message is in cg_last_error(). Free with cli_task_free. */
cg_status cli_task_open(cli_task *t, cg_arch arch, const cg_tokenizer *tok, const char *data_path,
                        const char *val_path, double val_fraction, int64_t batch, int64_t context);
/* Frees the task's data. */
void cli_task_free(cli_task *t);
/* The directory of an image set named by --data: "fashion-mnist" is Debian's dataset-fashion-mnist
 * (setup.sh installs it); anything else is a directory of MNIST-layout IDX files. */
const char *cli_image_dir(const char *data);
/* The task's examples in a split (images, pairs or labelled texts; 0 for lm and mlm). */
int64_t cli_task_count(const cli_task *t, bool val);
/* Fills the graph's inputs with the next training batch (advances rng or cursor). */
cg_status cli_task_train_batch(cli_task *t, const cg_model_graph *mg);
/* Runs up to max_batches held-out batches through g (CG_EVAL graph of the task's shape); val
 * false evaluates the training split. *stop (may be NULL) aborts early when it becomes nonzero. */
cg_status cli_task_eval(cli_task *t, bool val, cg_graph *g, const cg_model_graph *mg, int64_t max_batches,
                        volatile sig_atomic_t *stop, cli_eval *out);
/* Greedy exact-match rate of an encdec model over the first n held-out pairs (-1 if none). */
double cli_task_exact(cli_task *t, cg_model *m, int64_t n, int64_t *tried);

/* ---- tokenizers and text ---- */

/* Tokenizer for training: kind "char" (built from text), "bpe" (trained to vocab_size when > 0,
 * else loaded from path, default data/gpt2) or "wordpiece" (path, default data/bert/vocab.txt). */
cg_tokenizer *cli_tokenizer_make(const char *kind, const char *path, int64_t vocab_size, const char *text, size_t len);
/* Encodes text; a char tokenizer drops code points it lacks (counted in *dropped, may be NULL). */
cg_status cli_encode(const cg_tokenizer *tok, const char *text, int32_t **ids, int64_t *n, int64_t *dropped);
/* Number of UTF-8 code points in s. */
int64_t cli_utf8_count(const char *s, size_t len);
/* Writes n tokens of a decoder's (gpt2, llama) text after the prompt to f as they are made, in
 * chunks that fit the context (each later chunk is prompted with the last half context). */
cg_status cli_lm_write(FILE *f, const cg_model *m, const cg_tokenizer *tok, const int32_t *prompt, int64_t n_prompt,
                       int64_t n, const cg_sampling *s, uint64_t seed, bool cache);
/* Default one-token prompt for a GPT tokenizer: newline, <|endoftext|>, or id 0. */
int32_t cli_gpt_default_prompt(const cg_tokenizer *tok);
/* Class probabilities of one text (ids without [CLS]; cls_id < 0: none) into probs[num_classes];
 * the text is cut to max_t tokens ([CLS] included; <= 0: the model's max_len). */
cg_status cli_classify(cg_model *m, const int32_t *ids, int64_t n, int32_t cls_id, int64_t max_t, double *probs);
/* Prints up to n worked examples of the model on held-out data (samples, fill-mask, translations
 * or predictions) to f. */
void cli_task_show(FILE *f, cli_task *t, cg_model *m, int n, uint64_t seed);

/* ---- checkpoints ---- */

typedef struct {
    cg_st *st;          /* the open checkpoint */
    cg_arch arch;
    cg_params *ps;
    cg_model *model;
    cg_tokenizer *tok;
    cJSON *train;       /* training options as saved (never NULL after a load) */
    cJSON *state;       /* training position as saved (never NULL after a load) */
    char **labels;      /* classifier label names, n_labels of them */
    int n_labels;
    long long file_bytes;
} cli_ckpt;

/* Opens a checkpoint and builds its model (dropout as given; < 0: as trained) and tokenizer.
 * Messages name path. */
cg_status cli_ckpt_load(const char *path, double dropout, cli_ckpt *ck);
/* cli_ckpt_load for a model that only runs (sample, eval, info): a Hugging Face directory's weights
 * are frozen and read in place (bf16 or float32) instead of copied. */
cg_status cli_ckpt_load_frozen(const char *path, double dropout, cli_ckpt *ck);
/* Frees everything the load made. */
void cli_ckpt_free(cli_ckpt *ck);
/* Frees what a failed load made and returns st, keeping the message that explains it. */
cg_status cli_ckpt_fail(cli_ckpt *ck, cg_status st);
/* True if path is a directory or a file that is not gzip: a Hugging Face layout, not a checkpoint. */
bool cli_hf_layout(const char *path);
/* Opens a Hugging Face-layout model as a checkpoint (cli_ckpt_load does this for such a path): a
 * directory holding model.safetensors + config.json + tokenizer files, or the .safetensors file with
 * them beside it. partial: parameters the file lacks stay initialised and unknown tensors are
 * skipped, both listed on stdout (a fine-tune's new head); otherwise every name must match. */
cg_status cli_hf_load(const char *path, double dropout, bool partial, cli_ckpt *ck);
/* LoRA adapters to add to a model before its weights load (cli_hf_load_adapted). */
typedef struct {
    const char *targets; /* comma-separated parts of weight names (NULL: default_targets's) */
    void (*default_targets)(cg_arch arch, char *buf, size_t n); /* the arch's default targets */
    int rank;            /* 0: no adapters, every weight frozen (inference) */
    double alpha;
    uint64_t seed;       /* of the adapters' initialisation */
    int added;           /* out: adapters added */
} cli_lora;
/* cli_hf_load with adapters added before the weights load (lora may be NULL): the weights they
 * freeze are then read in place from the file (bf16 or float32) instead of copied. */
cg_status cli_hf_load_adapted(const char *path, double dropout, bool partial, cli_lora *lora, cli_ckpt *ck);
/* Fails (naming tok_file, config and both sizes) unless tok's vocabulary is the one model m
 * embeds: a smaller tokenizer leaves ids without a token, a larger one ids without an embedding.
 * A tokenizer.json may be smaller (Qwen pads its embedding past its last id). */
cg_status cli_check_vocab(const cg_model *m, const cg_tokenizer *tok, const char *tok_file, const char *config);
/* Reads a Hugging Face-layout model's weights into m (every name must match). */
cg_status cli_hf_read_weights(const char *path, cg_model *m);
/* Integer field of a saved JSON object (numbers or decimal strings); dflt if absent or a number
 * outside int64. */
int64_t cli_json_i64(const cJSON *o, const char *key, int64_t dflt);
/* uint64 field saved as a decimal string; dflt if absent or a number outside uint64. */
uint64_t cli_json_u64(const cJSON *o, const char *key, uint64_t dflt);
/* Number field; dflt if absent. */
double cli_json_num(const cJSON *o, const char *key, double dflt);
/* String field (owned by o); dflt if absent. */
const char *cli_json_str(const cJSON *o, const char *key, const char *dflt);

/* ---- output ---- */

/* Prints "cgrad CMD: what: <last error>" to stderr; returns 1. */
int cli_fail(const char *cmd, const char *what);
/* Draws the metrics CSV (step, lr, train_loss, val_loss, ...) as an SVG line chart at svg_path;
 * ylabel NULL says "loss (nats per token)". */
cg_status cli_plot_metrics(const char *csv_path, const char *svg_path, const char *title, const char *ylabel);
/* Draws n_runs metrics files (CSV or JSON lines) over one step axis: loss, learning-rate and
 * throughput panels (the last two when the files have those columns), one colour a run, named by
 * labels[i] (labels NULL: the paths). */
cg_status cli_plot_runs(const char *const *paths, const char *const *labels, int n_runs, const char *svg_path,
                        const char *title, const char *ylabel);

/* ---- progress: throughput and ETA over the last steps ---- */

#define CLI_RATE_WINDOW 20 /* steps; the metrics column tok_per_s_last20 is named after it */

/* The seconds and tokens of the last CLI_RATE_WINDOW training steps (a ring; zero it to start). */
typedef struct {
    double s[CLI_RATE_WINDOW], sum_s;
    int64_t tokens[CLI_RATE_WINDOW], sum_tokens, n;
} cli_rate;

/* Records one training step: its seconds (no evaluation or saving in them) and tokens. */
void cli_rate_add(cli_rate *r, double seconds, int64_t tokens);
/* Tokens per second over the window: its tokens over its seconds (0 before the first step). */
double cli_rate_tokens_per_s(const cli_rate *r);
/* Seconds left: the window's mean step time for each step left, plus eval_s for each evaluation
 * left; -1 before the first step. */
double cli_rate_eta(const cli_rate *r, int64_t steps_left, int64_t evals_left, double eval_s);

#endif
