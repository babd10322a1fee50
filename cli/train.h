/* SPDX-License-Identifier: MIT */
/* Internal to `cgrad train`, shared by its files: the options (train_opts.c), the checkpoint it
 * writes and resumes from (train_ckpt.c), its metrics and progress lines (train_log.c) and the
 * training loop (train.c). */
#ifndef CGRAD_CLI_TRAIN_H
#define CGRAD_CLI_TRAIN_H

#include <float.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "cli/commands.h"
#include "cli/session.h"

/* ---- options ---- */

typedef struct {
    const char *arch, *data, *val_data, *tokenizer, *tokenizer_path, *schedule;
    int64_t vocab_size, layers, heads, kv_heads, dim, ffn, context, batch, grad_accum, decay_steps, warmup, patch;
    double val_fraction, lr, min_lr, beta1, beta2, eps, weight_decay, clip, dropout;
    uint64_t seed;
    /* run options: free to change on --resume */
    int64_t steps, eval_every, eval_batches, eval_exact, save_every, log_every, samples, threads, skip_nonfinite;
    const char *out, *checkpoint, *metrics, *plot, *precision;
    int64_t bucket_kb, overlap, zero; /* data-parallel runs (mpirun) */
    const char *init_from, *lora_targets, *head; /* fine-tuning */
    int64_t lora_rank;
    double lora_alpha;
    int64_t checkpoint_activations; /* a bare flag: 1 when given */
    double dist_timeout;
    double moe_capacity; /* a mixture of experts' capacity factor; unset: the model's */
} topts;

/* Counts that a checkpoint stores as JSON numbers stay below 2^53, where doubles are exact. */
#define COUNT_MAX 1e15
#define POS_MIN DBL_TRUE_MIN /* lo of "greater than 0" */

/* Every option once: flag, kind, field, fixed (part of the run's identity: a resumed run must not
 * change it), range, help. The table, the index enum and the field offsets come from this list. */
#define TRAIN_OPTS(X)                                                                                                      \
    X("--arch", CLI_STR, arch, true, 0, 0, "gpt2|bert|encdec|classifier|llama|vit|cnn (gpt2)")                             \
    X("--data", CLI_IN, data, false, 0, 0, "text (gpt2, llama, bert), TSV (encdec src\\ttgt, classifier label\\ttext), or images (vit, cnn: fashion-mnist or a directory of IDX files)") \
    X("--val-data", CLI_IN, val_data, false, 0, 0, "held-out TSV for encdec/classifier (default: the last --val-fraction)") \
    X("--val-fraction", CLI_NUM, val_fraction, true, 0, CLI_BELOW_1, "held-out share at the end of the data (0.1)")         \
    X("--tokenizer", CLI_STR, tokenizer, true, 0, 0, "char|bpe|wordpiece (gpt2, llama, encdec: char; bert, classifier: wordpiece)") \
    X("--tokenizer-path", CLI_IN, tokenizer_path, true, 0, 0, "tokenizer file or directory (bpe: data/gpt2, wordpiece: data/bert/vocab.txt)") \
    X("--vocab-size", CLI_INT, vocab_size, true, 0, 1 << 24, "bpe: train a tokenizer of this size on the data instead")     \
    X("--layers", CLI_INT, layers, true, 1, 1024, "transformer layers (encdec: each stack)")                               \
    X("--heads", CLI_INT, heads, true, 1, 1024, "attention heads")                                                         \
    X("--kv-heads", CLI_INT, kv_heads, true, 0, 1024, "llama: key/value heads, dividing --heads (grouped-query; 0: --heads)") \
    X("--dim", CLI_INT, dim, true, 1, 1 << 16, "model width")                                                              \
    X("--ffn", CLI_INT, ffn, true, 1, 1 << 18, "feed-forward width (4 * dim; llama: 8/3 * dim)")                                             \
    X("--context", CLI_INT, context, true, 2, 1 << 20,                                                                     \
      "tokens per row (encdec, classifier: the cap; --init-from: up to the model's positions, which it defaults to)")   \
    X("--batch", CLI_INT, batch, true, 1, 1 << 20, "rows per micro-batch")                                                 \
    X("--grad-accum", CLI_INT, grad_accum, true, 1, 1 << 20, "micro-batches per step (1)")                                 \
    X("--steps", CLI_INT, steps, false, 0, COUNT_MAX, "optimizer steps")                                                   \
    X("--decay-steps", CLI_INT, decay_steps, true, 0, COUNT_MAX, "step where cosine/linear reach --min-lr (--steps)")      \
    X("--lr", CLI_NUM, lr, true, POS_MIN, DBL_MAX, "peak learning rate (noam: the factor)")                                \
    X("--min-lr", CLI_NUM, min_lr, true, 0, DBL_MAX, "final learning rate (lr / 10)")                                      \
    X("--warmup", CLI_INT, warmup, true, 0, COUNT_MAX, "linear warmup steps")                                              \
    X("--schedule", CLI_STR, schedule, true, 0, 0, "constant|cosine|linear|noam (cosine)")                                 \
    X("--beta1", CLI_NUM, beta1, true, 0, CLI_BELOW_1, "AdamW beta1 (0.9)")                                                \
    X("--beta2", CLI_NUM, beta2, true, 0, CLI_BELOW_1, "AdamW beta2 (0.99)")                                               \
    X("--eps", CLI_NUM, eps, true, POS_MIN, DBL_MAX, "AdamW epsilon (1e-8)")                                               \
    X("--weight-decay", CLI_NUM, weight_decay, true, 0, DBL_MAX, "decoupled decay on matrices and embeddings (0.1)")       \
    X("--clip", CLI_NUM, clip, true, 0, DBL_MAX, "global gradient-norm clip, 0 for none (1.0)")                            \
    X("--dropout", CLI_NUM, dropout, true, 0, CLI_BELOW_1, "dropout everywhere (0)")                                       \
    X("--seed", CLI_U64, seed, true, 0, 0, "seed of initialisation, data order and dropout (1337)")                        \
    X("--eval-every", CLI_INT, eval_every, false, 0, COUNT_MAX, "steps between held-out evaluations")                      \
    X("--eval-batches", CLI_INT, eval_batches, false, 0, COUNT_MAX, "held-out batches per evaluation")                     \
    X("--eval-exact", CLI_INT, eval_exact, false, 0, COUNT_MAX, "encdec: greedy exact match over this many held-out pairs at the end") \
    X("--out", CLI_STR, out, false, 0, 0, "run directory, created if missing: model.ckpt, metrics.csv/.jsonl, loss.svg, run.json (runs/ARCH)") \
    X("--checkpoint", CLI_OUT, checkpoint, false, 0, 0, "checkpoint path (--out's model.ckpt; --resume: the resumed file)") \
    X("--save-every", CLI_INT, save_every, false, 0, COUNT_MAX, "steps between checkpoints, 0 for the end only")           \
    X("--log-every", CLI_INT, log_every, false, 0, COUNT_MAX, "steps between log lines when stdout is not a terminal")     \
    X("--metrics", CLI_OUT, metrics, false, 0, 0, "metrics CSV (in the run directory, or next to --checkpoint)")           \
    X("--plot", CLI_OUT, plot, false, 0, 0, "loss-curve SVG (next to the metrics)")                                        \
    X("--samples", CLI_INT, samples, false, 0, 1 << 20, "worked examples printed at the end (3)")                           \
    X("--threads", CLI_INT, threads, false, 0, 1024, "threads (0: CGRAD_THREADS or all cores; mpirun: cores / ranks here)") \
    X("--bucket-kb", CLI_INT, bucket_kb, false, 1, 1 << 22, "mpirun: KiB of gradients per all-reduce bucket (1024)")      \
    X("--overlap", CLI_INT, overlap, false, 0, 1, "mpirun: 1 starts buckets while backward runs, 0 after it (1)")          \
    X("--dist-timeout", CLI_NUM, dist_timeout, false, POS_MIN, 1e9, "mpirun: seconds a rank waits for the others, then fails (300)") \
    X("--zero", CLI_INT, zero, false, 0, 1, "mpirun: 1 shards the AdamW moments over the ranks (ZeRO stage 1), 0 not (0)") \
    X("--init-from", CLI_IN, init_from, true, 0, 0, "start a new run from a checkpoint's (or a Hugging Face directory's) weights, model and tokenizer")   \
    X("--head", CLI_STR, head, true, 0, 0, "bert: pretrain (masked LM + next sentence) or classify (--data label<TAB>text; a new head on --init-from's encoder)") \
    X("--lora-rank", CLI_INT, lora_rank, true, 0, 1 << 16, "LoRA: train rank-N adapters on --lora-targets, all else frozen (0: off)") \
    X("--lora-alpha", CLI_NUM, lora_alpha, true, POS_MIN, 1e9, "LoRA: adapters add (alpha / rank) B A (alpha = rank)")   \
    X("--lora-targets", CLI_STR, lora_targets, true, 0, 0, "LoRA: comma-separated parts of weight names (gpt2: attn,mlp; llama: self_attn,mlp)") \
    X("--precision", CLI_STR, precision, false, 0, 0, "fp32|bf16: bf16 multiplies bfloat16 operands, accumulates in float (--resume: the checkpoint's)") \
    X("--skip-nonfinite", CLI_INT, skip_nonfinite, false, 0, COUNT_MAX, "skip up to N steps whose loss or gradient is not finite (0: stop at the first)") \
    X("--checkpoint-activations", CLI_BARE, checkpoint_activations, false, 0, 1, "recompute each block's activations in backward: less memory, one more forward per step, the same gradients") \
    X("--patch", CLI_INT, patch, true, 1, 1 << 12, "vit: side of the square patches, dividing the image side (7)")      \
    X("--moe-capacity", CLI_NUM, moe_capacity, false, 0, 1e6, "mixtral: expert capacity factor, 0 dropless (the model's capacity_factor, which a checkpoint keeps)")

#define OPT(f, k, field, fixed, lo, hi, help) idx_##field,
enum { TRAIN_OPTS(OPT) N_DEFS }; /* idx_<field>: the option's row in cli_train_opts */
#undef OPT

/* How an option's value is stored in topts. */
typedef enum { T_STR, T_INT, T_NUM, T_U64 } otype;

/* ---- the run ---- */

typedef struct {
    topts o;
    cg_arch arch;
    cg_tokenizer *tok;
    char *tok_json;
    cli_task task;
    cg_params *ps;
    cg_model *model;
    cg_optim *opt;
    cg_schedule sched;
    cg_graph *g, *ge;
    cg_model_graph mg, mge;
    uint64_t dropout_seed;
    int64_t step;
    double elapsed0, train_s, t_start; /* elapsed0: seconds of earlier runs */
    int64_t tokens_run;                 /* tokens trained in this process */
    double win_sum;                     /* training losses since the last evaluation */
    int64_t win_n;
    double last_train, last_val;
    uint32_t data_crc, val_crc;
    int64_t data_bytes;
    FILE *metrics, *jsonl; /* the metrics as CSV and as JSON lines */
    char metrics_path[4096], plot_path[4096], jsonl_path[4096], run_path[4096];
    bool tty, bar_shown;
    int64_t skipped; /* steps skipped for a non-finite loss or gradient (--skip-nonfinite) */
    double bar_drawn; /* when the progress bar was last redrawn */
    cg_dist *d;       /* the ranks of an mpirun job (a world of one otherwise) */
    int rank, world;
    cg_dist_reducer *red;
    uint64_t drop_step; /* dropout stream position at the start of the step, the same on every rank */
    cli_rate rate;      /* the last steps' seconds and tokens: tok/s and ETA */
    double eval_s;      /* seconds the last evaluation took (for the ETA) */
    bool write_failed;  /* a metrics, JSON lines or plot write failed: every rank stops, exit 1 */
    char write_error[600]; /* "[write] path: reason" of the first failed write */
} run;

#define STR_(x) #x
#define STR(x) STR_(x)
/* The throughput column, named after its definition: tokens over seconds of the last steps. */
#define TOK_COLUMN "tok_per_s_last" STR(CLI_RATE_WINDOW)

/* Seconds on the monotonic clock. */
double train_now_s(void);

/* train_opts.c */
/* Reads argv (and --config's file) into o and set; *resume: the checkpoint to resume (NULL: a new
 * run); *config: --config's document, whose strings o points into (the caller frees it). 0, or 2
 * after a usage message. */
int train_parse(int argc, char **argv, topts *o, bool *set, const char **resume, cJSON **config);
/* Per-arch defaults for every option the command line left unset. */
void train_defaults(topts *o, const bool *set);
/* Checks options a run cannot work with; messages name the flag. */
bool train_check_opts(const topts *o);
/* A BERT fine-tuned as a classifier (BertForSequenceClassification) runs the classifier's task. */
bool train_bert_classify(const topts *o);
/* Options as the checkpoint's "train" object. */
cJSON *train_opts_json(topts *o);
/* Option i's value as text: strings quoted, numbers in the shortest form that reads back the same. */
void train_value_str(const topts *o, int i, char *buf, size_t n);
/* Takes every option the command line left unset from the checkpoint, and refuses a changed
 * setting that is part of the run (the message names the flag, both values and the file). */
bool train_merge_saved(topts *o, bool *set, const cJSON *saved, const char *path);

/* train_ckpt.c */
/* A new model's config JSON from the options and the data (the caller frees it). */
char *train_model_config(run *r);
/* --head classify on a pretrained BERT: a classification head on ck's encoder (see train_ckpt.c). */
bool train_new_head(cli_ckpt *ck, run *r, uint64_t seed);
/* The first parameter (registration order) whose values (grads: gradients) hold a value that is
 * not finite, with the flat index and the value; NULL when all are finite. */
const char *train_nonfinite_param(cg_params *ps, bool grads, int64_t *at, double *value);
/* Writes the checkpoint (rank 0; with --zero every rank takes part). */
cg_status train_save(run *r);
/* Restores the optimizer, data position and dropout stream saved by train_save(). */
cg_status train_restore(run *r, const cli_ckpt *ck, const char *path);

/* train_log.c */
/* Rewrites a metrics file (header NULL: JSON lines) keeping the rows up to the resumed step, then
 * appends to it. */
FILE *train_open_metrics(const char *path, int64_t keep_upto, const char *header);
/* One metrics row, in the CSV and as a JSON line (see train_log.c for the empty values); false
 * (cg_last_error: "[write] path: reason", r->write_failed set) when a write failed. */
bool train_metrics_row(run *r, int64_t step, double lr, const double *train, double val, double tok_s, double elapsed);
/* Writes the run's resolved options to r->run_path (whole, or not at all); 0 or -1 (cg_last_error says why). */
int train_write_run_json(run *r);
/* Clears the progress bar from the terminal line, if one is shown. */
void train_clear_bar(run *r);
/* The progress bar (terminal) or a progress line. */
void train_progress(run *r, double loss, double lr);
/* The evaluation line. */
void train_log_eval(run *r, const cli_eval *e, double exact, int64_t tried);
/* Flushes the metrics and draws the loss plot; false (said on stderr, r->write_failed set) on a failed write. */
bool train_finish_files(run *r);
/* Flushes and closes the metrics files; false (cg_last_error: "[write] path: reason") if a write failed. */
bool train_close_metrics(run *r);
/* Derived file names: next to the checkpoint when one was named, else in the working directory. */
void train_derive_paths(run *r, const char *run_dir);

#endif
