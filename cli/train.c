/* cgrad train: trains a zoo model from a text or TSV file. One training graph is built once and
 * re-run each step on new batch data; a second, CG_EVAL graph of the same shape measures the
 * held-out loss. Everything a run depends on (parameters, optimizer moments and step, data draws,
 * dropout stream, options) goes into the checkpoint, so stopping and resuming gives the same
 * numbers, bit for bit, as running straight through with the same thread count. */
#define _XOPEN_SOURCE 700 /* realpath */
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "cli/commands.h"
#include "cli/session.h"
#include "graph/internal.h"

/* ---- options ---- */

typedef struct {
    const char *arch, *data, *val_data, *tokenizer, *tokenizer_path, *schedule;
    int64_t vocab_size, layers, heads, kv_heads, dim, ffn, context, batch, grad_accum, decay_steps, warmup;
    double val_fraction, lr, min_lr, beta1, beta2, eps, weight_decay, clip, dropout;
    uint64_t seed;
    /* run options: free to change on --resume */
    int64_t steps, eval_every, eval_batches, eval_exact, save_every, log_every, samples, threads, skip_nonfinite;
    const char *checkpoint, *metrics, *plot, *precision;
    int64_t bucket_kb, overlap, zero; /* data-parallel runs (mpirun) */
    const char *init_from, *lora_targets, *head; /* fine-tuning */
    int64_t lora_rank;
    double lora_alpha;
    int64_t checkpoint_activations; /* a bare flag: 1 when given */
    double dist_timeout;
} topts;

/* Counts that a checkpoint stores as JSON numbers stay below 2^53, where doubles are exact. */
#define COUNT_MAX 1e15
#define POS_MIN DBL_TRUE_MIN /* lo of "greater than 0" */

/* Every option once: flag, kind, field, fixed (part of the run's identity: a resumed run must not
 * change it), range, help. The table, the index enum and the field offsets come from this list. */
#define TRAIN_OPTS(X)                                                                                                      \
    X("--arch", CLI_STR, arch, true, 0, 0, "gpt2|bert|encdec|classifier|llama (gpt2)")                                     \
    X("--data", CLI_IN, data, false, 0, 0, "text (gpt2, llama, bert) or TSV (encdec src\\ttgt, classifier label\\ttext)")   \
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
    X("--context", CLI_INT, context, true, 2, 1 << 20, "tokens per row (encdec, classifier: the cap)")                     \
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
    X("--checkpoint", CLI_OUT, checkpoint, false, 0, 0, "checkpoint path (cgrad.ckpt; --resume: the resumed file)")        \
    X("--save-every", CLI_INT, save_every, false, 0, COUNT_MAX, "steps between checkpoints, 0 for the end only")           \
    X("--log-every", CLI_INT, log_every, false, 0, COUNT_MAX, "steps between log lines when stdout is not a terminal")     \
    X("--metrics", CLI_OUT, metrics, false, 0, 0, "metrics CSV (next to the checkpoint, else ./cgrad_metrics.csv)")        \
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
    X("--checkpoint-activations", CLI_BARE, checkpoint_activations, false, 0, 1, "recompute each block's activations in backward: less memory, one more forward per step, the same gradients")

#define OPT(f, k, field, fixed, lo, hi, help) {f, k, lo, hi, help},
const cli_opt cli_train_opts[] = {TRAIN_OPTS(OPT){"--resume", CLI_IN, 0, 0, "continue from CKPT (the value is optional)"},
                                  {"--config", CLI_IN, 0, 0, "JSON object of options (run.json); flags given here win"},
                                  {NULL, CLI_BARE, 0, 0, NULL}};
#undef OPT
#define OPT(f, k, field, fixed, lo, hi, help) idx_##field,
enum { TRAIN_OPTS(OPT) N_DEFS };
#undef OPT
#define OPT(f, k, field, fixed, lo, hi, help) {offsetof(topts, field), fixed},
static const struct {
    size_t off;
    bool fixed;
} layout[] = {TRAIN_OPTS(OPT)};
#undef OPT
#define defs cli_train_opts
#define CONFIG_OPT (&defs[N_DEFS + 1]) /* --config: read before the defaults, never saved */

typedef enum { T_STR, T_INT, T_NUM, T_U64 } otype;

/* How option i is stored in topts. */
static otype type_of(int i) {
    return defs[i].kind == CLI_INT || defs[i].kind == CLI_BARE ? T_INT : defs[i].kind == CLI_NUM ? T_NUM : defs[i].kind == CLI_U64 ? T_U64 : T_STR;
}

static void *field(topts *o, int i) { return (char *)o + layout[i].off; }

/* "--grad-accum" -> "grad_accum", the key in the checkpoint's "train" object. */
static const char *key_of(int i) {
    static char keys[N_DEFS][32];
    char *k = keys[i];
    snprintf(k, 32, "%s", defs[i].flag + 2);
    for (char *p = k; *p; p++)
        if (*p == '-') *p = '_';
    return k;
}

/* Per-arch defaults for every option the command line left unset. */
static void defaults(topts *o, const bool *set) {
    cg_arch a = CG_ARCH_GPT2;
    cg_arch_parse(o->arch, &a);
    const bool llama = a == CG_ARCH_LLAMA, gpt = a == CG_ARCH_GPT2 || llama; /* llama: gpt2's run, its own model */
    const bool bert = a == CG_ARCH_BERT, ed = a == CG_ARCH_ENCDEC, cls = a == CG_ARCH_CLASSIFIER;
#define D(field, value) \
    if (!set[idx_##field]) o->field = (value)
    D(data, cls ? "data/sentiment/all.tsv" : ed ? "" : "data/moby-dick.txt");
    D(val_data, "");
    D(val_fraction, 0.1);
    D(tokenizer, bert || cls ? "wordpiece" : "char");
    D(tokenizer_path, "");
    D(vocab_size, 0);
    D(layers, gpt ? 4 : 2);
    D(heads, 4);
    D(kv_heads, llama && o->heads % 2 == 0 ? o->heads / 2 : 0);
    D(dim, cls ? 64 : 128);
    D(ffn, llama ? (8 * o->dim / 3 + 31) / 32 * 32 : 4 * o->dim); /* SwiGLU's three matrices: LLaMA's 8/3, to 32 */
    D(context, gpt ? 128 : 64);
    D(batch, gpt || bert ? 16 : 32);
    D(grad_accum, 1);
    D(steps, gpt ? 1500 : bert ? 300 : ed ? 1000 : 500);
    D(decay_steps, o->steps);
    D(lr, gpt ? 1e-3 : 5e-4);
    D(schedule, "cosine");
    if (!set[idx_lr] && !strcmp(o->schedule, "noam")) o->lr = 1.0;
    D(min_lr, o->lr / 10);
    D(warmup, (gpt || ed ? 100 : bert ? 30 : 50) < o->decay_steps / 5 ? (gpt || ed ? 100 : bert ? 30 : 50) : o->decay_steps / 5);
    D(beta1, 0.9);
    D(beta2, 0.99);
    D(eps, 1e-8);
    D(weight_decay, bert ? 0.01 : 0.1);
    D(clip, 1.0);
    D(dropout, 0.0);
    D(seed, 1337);
    D(eval_every, gpt ? 250 : bert ? 50 : 100);
    D(eval_batches, gpt ? 20 : bert ? 10 : 100);
    D(eval_exact, ed ? 200 : 0);
    D(checkpoint, "cgrad.ckpt");
    D(save_every, 500);
    D(log_every, gpt ? 50 : 25);
    D(metrics, "");
    D(plot, "");
    D(samples, 3);
    D(threads, 0);
    D(bucket_kb, 1024);
    D(overlap, 1);
    D(dist_timeout, 300);
    D(skip_nonfinite, 0);
    D(precision, "fp32");
    D(init_from, "");
    D(head, bert ? "pretrain" : "");
    D(lora_rank, 0);
    D(lora_alpha, o->lora_rank > 0 ? (double)o->lora_rank : 1);
    D(lora_targets, llama ? "self_attn,mlp" : gpt ? "attn,mlp" : bert ? "attention,intermediate,output.dense" : "");
    D(zero, 0);
    D(checkpoint_activations, 0);
#undef D
}

static void value_str(const topts *o, int i, char *buf, size_t n);

void cli_train_default(const char *arch, const char *flag, char *buf, size_t n) {
    topts o;
    memset(&o, 0, sizeof o);
    bool set[N_DEFS] = {0};
    o.arch = arch ? arch : "gpt2";
    set[idx_arch] = true;
    defaults(&o, set);
    *buf = 0;
    for (int i = 0; i < N_DEFS; i++)
        if (!strcmp(defs[i].flag, flag) && defs[i].kind != CLI_BARE) { /* a bare flag is off unless given */
            value_str(&o, i, buf, n);
            if (type_of(i) == T_STR) { /* without value_str's quotes; "" has no default */
                size_t len = strlen(buf);
                memmove(buf, buf + 1, len);
                if (len >= 2) buf[len - 2] = 0;
            }
        }
}

static bool bert_arch(const topts *o) { return o->arch && !strcmp(o->arch, "bert"); }

/* A BERT fine-tuned as a classifier (BertForSequenceClassification) runs the classifier's task. */
static bool bert_classify(const topts *o) { return bert_arch(o) && o->head && !strcmp(o->head, "classify"); }

/* Checks options a run cannot work with; messages name the flag. */
static bool check_opts(const topts *o) {
    struct { bool bad; const char *msg; } rules[] = {
        {o->layers < 1, "--layers must be >= 1"},
        {o->heads < 1 || o->dim % o->heads, "--dim must be a positive multiple of --heads"},
        {o->kv_heads < 0 || (o->kv_heads > 0 && o->heads % o->kv_heads), "--kv-heads must divide --heads"},
        {o->kv_heads > 0 && strcmp(o->arch, "llama"), "--kv-heads is for --arch llama"},
        {!strcmp(o->arch, "llama") && (o->dim / o->heads) % 2, "--arch llama needs an even --dim / --heads (rotary pairs)"},
        {o->ffn < 1, "--ffn must be >= 1"},
        {o->context < 2, "--context must be >= 2"},
        {o->batch < 1, "--batch must be >= 1"},
        {o->grad_accum < 1, "--grad-accum must be >= 1"},
        {o->steps < 0, "--steps must be >= 0"},
        {!(o->val_fraction >= 0 && o->val_fraction < 1), "--val-fraction must be in [0, 1)"},
        {!(o->dropout >= 0 && o->dropout < 1), "--dropout must be in [0, 1)"},
        {!(o->clip >= 0), "--clip must be >= 0"},
        {o->eval_every < 0 || o->eval_batches < 0 || o->save_every < 0 || o->log_every < 0, "--eval-every, --eval-batches, --save-every and --log-every must be >= 0"},
        {o->lora_rank > 0 && !*o->init_from, "--lora-rank needs --init-from CKPT, the weights its adapters fine-tune"},
        {*o->head && strcmp(o->head, "pretrain") && strcmp(o->head, "classify"), "--head must be pretrain or classify"},
        {!bert_arch(o) && *o->head, "--head is for --arch bert"},
        {o->lora_rank > 0 && !*o->lora_targets, "--lora-rank needs --lora-targets (parts of the weight names to adapt)"},
        {o->bucket_kb < 1 || (o->overlap != 0 && o->overlap != 1) || !(o->dist_timeout > 0) || (o->zero != 0 && o->zero != 1),
         "--bucket-kb must be >= 1, --overlap and --zero 0 or 1, --dist-timeout > 0"},
    };
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++)
        if (rules[i].bad) {
            fprintf(stderr, "cgrad train: %s\n", rules[i].msg);
            return false;
        }
    /* A lower bound of what the sizes need (the vocabulary is not known yet): each parameter four
     * times (value, gradient, two moments) and a few activations of every layer's width per token. */
    const double real = sizeof(cg_real), d = (double)o->dim, l = (double)o->layers, f = (double)o->ffn,
                 t = (double)o->context, params = t * d + l * (4 * d * d + 2 * d * f),
                 acts = (double)o->batch * t * (o->checkpoint_activations ? l * d + 4 * d + f : l * (4 * d + f));
    char flags[256];
    snprintf(flags, sizeof flags, "--context %lld --dim %lld --ffn %lld --layers %lld --batch %lld", (long long)o->context,
             (long long)o->dim, (long long)o->ffn, (long long)o->layers, (long long)o->batch);
    return !cli_too_big("train", flags, 4 * real * params + real * acts);
}

/* Options as the checkpoint's "train" object. */
static cJSON *opts_json(topts *o) {
    cJSON *j = cJSON_CreateObject();
    for (int i = 0; i < N_DEFS; i++) {
        void *f = field(o, i);
        char buf[32];
        switch (type_of(i)) {
        case T_STR: cJSON_AddStringToObject(j, key_of(i), *(const char **)f ? *(const char **)f : ""); break;
        case T_INT: cJSON_AddNumberToObject(j, key_of(i), (double)*(int64_t *)f); break;
        case T_NUM: cJSON_AddNumberToObject(j, key_of(i), *(double *)f); break;
        case T_U64:
            snprintf(buf, sizeof buf, "%" PRIu64, *(uint64_t *)f);
            cJSON_AddStringToObject(j, key_of(i), buf);
            break;
        }
    }
    return j;
}

static void value_str(const topts *o, int i, char *buf, size_t n) {
    const void *f = (const char *)o + layout[i].off;
    switch (type_of(i)) {
    case T_STR: snprintf(buf, n, "'%s'", *(const char *const *)f); break;
    case T_INT: snprintf(buf, n, "%" PRId64, *(const int64_t *)f); break;
    case T_NUM: { /* the shortest form that reads back as the same double */
        const double v = *(const double *)f;
        for (int digits = 6; digits <= 17; digits++)
            if (snprintf(buf, n, "%.*g", digits, v), strtod(buf, NULL) == v) break;
        break;
    }
    case T_U64: snprintf(buf, n, "%" PRIu64, *(const uint64_t *)f); break;
    }
}

/* Takes every option the command line left unset from the checkpoint, and refuses a changed
 * setting that is part of the run (the message names the flag, both values and the file). */
static bool merge_saved(topts *o, bool *set, const cJSON *saved, const char *path) {
    for (int i = 0; i < N_DEFS; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(saved, key_of(i));
        if (!v || i == idx_checkpoint_activations) continue; /* a memory choice of this run: the command line's */
        topts s = *o;
        void *f = field(&s, i);
        double num = 0; /* a saved number must be in the flag's range too: the file may not be ours */
        switch (type_of(i)) {
        case T_STR: *(const char **)f = cJSON_IsString(v) ? v->valuestring : ""; break;
        case T_INT: num = (double)(*(int64_t *)f = cli_json_i64(saved, key_of(i), 0)); break;
        case T_NUM: num = *(double *)f = cli_json_num(saved, key_of(i), 0); break;
        case T_U64: *(uint64_t *)f = cli_json_u64(saved, key_of(i), 0); break;
        }
        if ((type_of(i) == T_INT || type_of(i) == T_NUM) && !(num >= defs[i].lo && num <= defs[i].hi)) {
            fprintf(stderr, "cgrad train: %s: the saved %s = %.17g is outside %s's range [%.17g, %.17g]\n", path,
                    key_of(i), num, defs[i].flag, defs[i].lo, defs[i].hi);
            return false;
        }
        if (!set[i]) {
            if (i == idx_checkpoint) continue; /* saves go where the run resumed from */
            memcpy(field(o, i), f, type_of(i) == T_STR ? sizeof(char *) : 8);
            set[i] = true;
            continue;
        }
        if (!layout[i].fixed) continue;
        char a[64], b[64];
        value_str(o, i, a, sizeof a);
        value_str(&s, i, b, sizeof b);
        if (strcmp(a, b)) {
            fprintf(stderr,
                    "cgrad train: %s %s does not match the checkpoint's %s = %s (%s); a resumed run keeps its model "
                    "and training settings: drop the flag, or start a new run\n",
                    defs[i].flag, a, key_of(i), b, path);
            return false;
        }
    }
    return true;
}

/* Takes every option the command line left unset from the JSON object in path (--config): keys are
 * the flags without their dashes ("grad_accum" or "grad-accum"), values JSON strings or numbers,
 * each checked as the flag's value would be. An unknown key, a wrong type or a bad value is a usage
 * error naming the file and the key. The strings point into *doc, which the caller frees. */
static bool load_config(const char *path, topts *o, bool *set, cJSON **doc) {
    char *text = NULL;
    size_t len = 0;
    if (cg_read_text_file(path, &text, &len)) {
        fprintf(stderr, "cgrad train: --config %s: %s\n", path, cg_last_error());
        return false;
    }
    const char *end = NULL;
    *doc = cJSON_ParseWithOpts(text, &end, true);
    if (!*doc) fprintf(stderr, "cgrad train: --config %s: not valid JSON at byte %lld\n", path, (long long)(end ? end - text : 0));
    else if (!cJSON_IsObject(*doc)) fprintf(stderr, "cgrad train: --config %s: not a JSON object of options\n", path);
    free(text);
    if (!*doc || !cJSON_IsObject(*doc)) return false;
    for (const cJSON *v = (*doc)->child; v; v = v->next) {
        char flag[64];
        snprintf(flag, sizeof flag, "--%s", v->string);
        for (char *p = flag + 2; *p; p++)
            if (*p == '_') *p = '-';
        int k = 0;
        while (k < N_DEFS && strcmp(flag, defs[k].flag)) k++;
        if (k == N_DEFS) {
            fprintf(stderr, "cgrad train: --config %s: unknown key \"%s\" (the keys are train's flags without the "
                            "dashes: cgrad train --help)\n", path, v->string);
            return false;
        }
        char num[64];
        const char *value = NULL;
        if (cJSON_IsString(v)) value = v->valuestring;
        else if (cJSON_IsNumber(v) && type_of(k) != T_STR) {
            const double d = v->valuedouble; /* integers as integers: "1e+03" is no whole number */
            if (type_of(k) != T_NUM && d == floor(d) && fabs(d) < 9.007199254740992e15) snprintf(num, sizeof num, "%.0f", d);
            else snprintf(num, sizeof num, "%.17g", d);
            value = num;
        }
        if (!value) {
            fprintf(stderr, "cgrad train: --config %s: key \"%s\" wants a %s, not this JSON value\n", path, v->string,
                    type_of(k) == T_STR ? "string" : "number");
            return false;
        }
        if (set[k] || (!*value && type_of(k) == T_STR)) continue; /* the command line wins; "": not given (an unset path) */
        cli_value cv;
        if (!cli_check_value("train", &defs[k], value, &cv)) {
            fprintf(stderr, "cgrad train: (key \"%s\" of --config %s)\n", v->string, path);
            return false;
        }
        switch (type_of(k)) {
        case T_STR: *(const char **)field(o, k) = cv.s; break;
        case T_INT: *(int64_t *)field(o, k) = cv.i; break;
        case T_NUM: *(double *)field(o, k) = cv.d; break;
        case T_U64: *(uint64_t *)field(o, k) = cv.u; break;
        }
        set[k] = true;
    }
    return true;
}

/* ---- the run ---- */

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
    signal(SIGINT, SIG_DFL); /* a second Ctrl-C ends the process at once */
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* crc32 and size of a file, so a resumed run can tell its data changed. */
static bool file_crc(const char *path, uint32_t *crc, int64_t *bytes) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    unsigned char buf[1 << 15];
    uLong c = crc32(0L, Z_NULL, 0);
    int64_t n = 0;
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0) c = crc32(c, buf, (uInt)k), n += (int64_t)k;
    fclose(f);
    *crc = (uint32_t)c;
    *bytes = n;
    return true;
}

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
} run;


static char *model_config(run *r) {
    const topts *o = &r->o;
    char buf[1024];
    const int64_t v = cg_tokenizer_vocab_size(r->tok);
    switch (r->arch) {
    case CG_ARCH_GPT2:
        snprintf(buf, sizeof buf,
                 "{\"vocab_size\": %" PRId64 ", \"n_positions\": %" PRId64 ", \"n_embd\": %" PRId64 ", \"n_layer\": %" PRId64
                 ", \"n_head\": %" PRId64 ", \"n_inner\": %" PRId64 "}",
                 (int64_t)v, o->context, o->dim, o->layers, o->heads, o->ffn);
        break;
    case CG_ARCH_BERT:
        snprintf(buf, sizeof buf,
                 "{\"vocab_size\": %" PRId64 ", \"hidden_size\": %" PRId64 ", \"num_hidden_layers\": %" PRId64
                 ", \"num_attention_heads\": %" PRId64 ", \"intermediate_size\": %" PRId64
                 ", \"max_position_embeddings\": %" PRId64 ", \"type_vocab_size\": 2, \"num_labels\": %d}",
                 (int64_t)v, o->dim, o->layers, o->heads, o->ffn, o->context,
                 r->task.cls ? (int)cg_textcls_num_labels(r->task.cls) : 0);
        break;
    case CG_ARCH_ENCDEC:
        snprintf(buf, sizeof buf,
                 "{\"src_vocab_size\": %" PRId64 ", \"tgt_vocab_size\": %" PRId64 ", \"d_model\": %" PRId64
                 ", \"n_head\": %" PRId64 ", \"num_encoder_layers\": %" PRId64 ", \"num_decoder_layers\": %" PRId64
                 ", \"dim_feedforward\": %" PRId64 ", \"max_len\": %" PRId64 ", \"pad_id\": %d, \"bos_id\": %d, \"eos_id\": %d}",
                 (int64_t)v + 3, (int64_t)v + 3, o->dim, o->heads, o->layers, o->layers, o->ffn, o->context,
                 r->task.pad_id, r->task.bos_id, r->task.eos_id);
        break;
    case CG_ARCH_CLASSIFIER:
        snprintf(buf, sizeof buf,
                 "{\"vocab_size\": %" PRId64 ", \"d_model\": %" PRId64 ", \"n_head\": %" PRId64 ", \"n_layer\": %" PRId64
                 ", \"dim_feedforward\": %" PRId64 ", \"max_len\": %" PRId64 ", \"num_classes\": %d}",
                 (int64_t)v, o->dim, o->heads, o->layers, o->ffn, o->context, (int)cg_textcls_num_labels(r->task.cls));
        break;
    case CG_ARCH_LLAMA:
        snprintf(buf, sizeof buf,
                 "{\"model_type\": \"llama\", \"vocab_size\": %" PRId64 ", \"hidden_size\": %" PRId64
                 ", \"intermediate_size\": %" PRId64 ", \"num_hidden_layers\": %" PRId64 ", \"num_attention_heads\": %" PRId64
                 ", \"num_key_value_heads\": %" PRId64 ", \"max_position_embeddings\": %" PRId64 ", \"rms_norm_eps\": 1e-6}",
                 (int64_t)v, o->dim, o->ffn, o->layers, o->heads, o->kv_heads ? o->kv_heads : o->heads, o->context);
        break;
    }
    return strdup(buf);
}

/* --head classify on a pretrained BERT: the same encoder with a classification head for the task's
 * labels (BertForSequenceClassification). The encoder's weights come from the --init-from file,
 * the head is initialised; both lists are printed. The new model replaces ck's. */
static bool new_head(cli_ckpt *ck, run *r, uint64_t seed) {
    char *own = cg_model_config_json(ck->model);
    cJSON *c = own ? cJSON_Parse(own) : NULL;
    free(own);
    if (c) cJSON_DeleteItemFromObjectCaseSensitive(c, "num_labels");
    if (c) cJSON_AddNumberToObject(c, "num_labels", cg_textcls_num_labels(r->task.cls));
    char *cfg = c ? cJSON_PrintUnformatted(c) : NULL;
    cJSON_Delete(c);
    cg_params *ps = cg_params_new();
    cg_model *m = cfg && ps ? cg_model_new(CG_ARCH_BERT, cfg, r->o.dropout, ps, seed) : NULL;
    free(cfg);
    char *kept = NULL, *skipped = NULL;
    if (!m || cg_model_load_partial(m, ck->st, &kept, &skipped)) {
        cli_fail("train", "--head classify: cannot start the classifier from --init-from");
        cg_model_free(m);
        cg_params_free(ps);
        return false;
    }
    printf("  --head classify: %d labels; initialised: %s\n  not used (the pretraining heads): %s\n",
           (int)cg_textcls_num_labels(r->task.cls), kept ? kept : "none", skipped ? skipped : "none");
    free(kept);
    free(skipped);
    cg_model_free(ck->model);
    cg_params_free(ck->ps);
    ck->model = m, ck->ps = ps;
    return true;
}

static void add_str(cJSON *j, const char *k, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void add_str(cJSON *j, const char *k, const char *fmt, ...) {
    char buf[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    cJSON_AddStringToObject(j, k, buf);
}

/* The first parameter (registration order) whose values (grads: gradients) hold a value that is
 * not finite, with the flat index and the value; NULL when all are finite. */
static const char *nonfinite_param(cg_params *ps, bool grads, int64_t *at, double *value) {
    for (int i = 0; i < cg_params_count(ps); i++) {
        cg_tensor *p = cg_params_at(ps, i);
        const cg_real *x = grads ? cg_grad(p) : cg_data(p);
        const int64_t n = cg_numel(p);
        for (int64_t k = 0; x && k < n; k++)
            if (!isfinite(x[k])) {
                *at = k, *value = (double)x[k];
                return cg_name(p);
            }
    }
    return NULL;
}

/* Index of the first value of x[0..n) that is not finite, or -1. */
static int64_t first_nonfinite(const cg_real *x, int64_t n) {
    for (int64_t k = 0; x && k < n; k++)
        if (!isfinite(x[k])) return k;
    return -1;
}

static cg_status save_file(run *r, cg_real *m1, cg_real *m2);

/* Every rank holds the same parameters; rank 0 writes them. With --zero the moments are gathered
 * to rank 0 first, so the file is the same as without sharding. */
static cg_status save(run *r) {
    const bool gather = r->o.zero && r->world > 1;
    if (r->rank > 0 && !gather) return CG_OK;
    const int64_t span = cg_params_span(r->ps);
    cg_real *full[2] = {NULL, NULL}, *m[2] = {cg_optim_moment1(r->opt), cg_optim_moment2(r->opt)};
    cg_status st = CG_OK;
    for (int k = 0; gather && k < 2 && !st; k++) {
        if (r->rank == 0 && !(full[k] = malloc((size_t)span * sizeof(cg_real))))
            st = cgi_fail(CG_ERR_NOMEM, "[train] out of memory for the optimizer state"); /* the others then time out */
        if (!st) st = cg_dist_gather(r->d, m[k], full[k], span);
        m[k] = full[k];
    }
    if (!st && r->rank == 0) st = save_file(r, m[0], m[1]);
    free(full[0]), free(full[1]);
    return st;
}

/* Writes the checkpoint with the whole moments m1, m2 (rank 0). */
static cg_status save_file(run *r, cg_real *m1, cg_real *m2) {
    /* Never replace a checkpoint with one that cannot be trained or sampled from. */
    int64_t at;
    double v;
    const char *bad = nonfinite_param(r->ps, false, &at, &v);
    if (bad)
        return cgi_fail(CG_ERR_RANGE, "[train] %s not written: parameter '%s' holds %g at flat index %lld (step %lld); the "
                                      "file keeps its last good state", r->o.checkpoint, bad, v, (long long)at, (long long)r->step);
    const int64_t span_all = cg_params_span(r->ps);
    for (int m = 0; m < 2; m++)
        if ((at = first_nonfinite(m ? m2 : m1, span_all)) >= 0)
            return cgi_fail(CG_ERR_RANGE, "[train] %s not written: optimizer moment %d is not finite at %lld (step %lld); the "
                                          "file keeps its last good state", r->o.checkpoint, m + 1, (long long)at, (long long)r->step);
    cg_st_writer *w = cg_st_writer_new();
    if (!w) return cgi_fail(CG_ERR_NOMEM, "[train] out of memory");
    const int64_t span = cg_params_span(r->ps);
    cg_status st = CG_OK;
    if (r->o.lora_rank > 0) /* a fine-tune saves what it trains: the adapters and their moments */
        for (int i = 0; !st && i < cg_params_count(r->ps); i++) {
            cg_tensor *t = cg_params_at(r->ps, i);
            if (!cg_lora_is_adapter(t)) continue;
            char name[600];
            const int64_t off = cg_data(t) - cg_params_values(r->ps);
            st = cg_st_add_tensor(w, cg_name(t), t);
            snprintf(name, sizeof name, "optim.m1.%s", cg_name(t));
            if (!st) st = cg_st_add(w, name, cg_ndim(t), cg_shape(t), m1 + off);
            snprintf(name, sizeof name, "optim.m2.%s", cg_name(t));
            if (!st) st = cg_st_add(w, name, cg_ndim(t), cg_shape(t), m2 + off);
        }
    else {
        st = cg_st_add_params(w, r->ps);
        if (!st) st = cg_st_add(w, "optim.m1", 1, &span, m1);
        if (!st) st = cg_st_add(w, "optim.m2", 1, &span, m2);
    }
    char *cfg = cg_model_config_json(r->model);
    cJSON *train = opts_json(&r->o), *state = cJSON_CreateObject(), *labels = NULL;
    cJSON_AddNumberToObject(state, "step", (double)r->step);
    cJSON_AddNumberToObject(state, "optim_steps", (double)cg_optim_steps(r->opt));
    add_str(state, "rng", "%" PRIu64, r->task.rng.state);
    add_str(state, "cursor_rng", "%" PRIu64, r->task.cur.rng.state);
    cJSON_AddNumberToObject(state, "cursor_epoch", (double)r->task.cur.epoch);
    cJSON_AddNumberToObject(state, "cursor_pos", (double)r->task.cur.pos);
    add_str(state, "dropout_seed", "%" PRIu64, r->dropout_seed);
    add_str(state, "dropout_step", "%" PRIu64, r->drop_step);
    cJSON_AddNumberToObject(state, "world_size", r->world); /* the data streams below are global: see shard_step */
    add_str(state, "eval_seed", "%" PRIu64, r->task.eval_seed);
    add_str(state, "elapsed_s", "%.17g", r->elapsed0 + (now_s() - r->t_start));
    add_str(state, "window_loss_sum", "%.17g", r->win_sum);
    cJSON_AddNumberToObject(state, "window_steps", (double)r->win_n);
    add_str(state, "train_loss", "%.17g", r->last_train);
    add_str(state, "val_loss", "%.17g", r->last_val);
    cJSON_AddNumberToObject(state, "threads", cg_threads());
    add_str(state, "data_crc32", "%" PRIu32, r->data_crc);
    cJSON_AddNumberToObject(state, "data_bytes", (double)r->data_bytes);
    add_str(state, "val_data_crc32", "%" PRIu32, r->val_crc);
    cJSON_AddNumberToObject(state, "graph_t", (double)r->task.t);
    cJSON_AddNumberToObject(state, "graph_s", (double)r->task.s);
    if (r->task.cls) {
        labels = cJSON_CreateArray();
        for (int32_t i = 0; i < cg_textcls_num_labels(r->task.cls); i++)
            cJSON_AddItemToArray(labels, cJSON_CreateString(cg_textcls_label_name(r->task.cls, i)));
    }
    char *tj = cJSON_PrintUnformatted(train), *sj = cJSON_PrintUnformatted(state),
         *lj = labels ? cJSON_PrintUnformatted(labels) : NULL;
    if (!st) st = cg_st_set_metadata(w, "arch", cg_arch_name(r->arch));
    if (!st) st = cg_st_set_metadata(w, "config", cfg ? cfg : "{}");
    if (!st) st = cg_st_set_metadata(w, "tokenizer", r->tok_json);
    if (!st) st = cg_st_set_metadata(w, "train", tj ? tj : "{}");
    if (!st) st = cg_st_set_metadata(w, "state", sj ? sj : "{}");
    if (!st && lj) st = cg_st_set_metadata(w, "labels", lj);
    if (!st) st = cg_checkpoint_save(w, r->o.checkpoint);
    free(cfg);
    free(tj);
    free(sj);
    free(lj);
    cJSON_Delete(train);
    cJSON_Delete(state);
    cJSON_Delete(labels);
    cg_st_writer_free(w);
    return st;
}

/* Restores the optimizer, data position and dropout stream saved by save(). */
static cg_status restore(run *r, const cli_ckpt *ck, const char *path) {
    const cJSON *s = ck->state;
    const int64_t span = cg_params_span(r->ps);
    cg_status st = CG_OK;
    if (r->o.lora_rank > 0) {
        for (int i = 0; !st && i < cg_params_count(r->ps); i++) {
            cg_tensor *t = cg_params_at(r->ps, i);
            if (!cg_lora_is_adapter(t)) continue;
            char name[600];
            const int64_t off = cg_data(t) - cg_params_values(r->ps);
            snprintf(name, sizeof name, "optim.m1.%s", cg_name(t));
            st = cg_st_read(ck->st, name, cg_optim_moment1(r->opt) + off, cg_ndim(t), cg_shape(t));
            snprintf(name, sizeof name, "optim.m2.%s", cg_name(t));
            if (!st) st = cg_st_read(ck->st, name, cg_optim_moment2(r->opt) + off, cg_ndim(t), cg_shape(t));
        }
        if (st) return st;
    } else if (cg_st_find(ck->st, "optim.m1") < 0 || cg_st_find(ck->st, "optim.m2") < 0)
        return cgi_fail(CG_ERR_FORMAT, "[checkpoint] %s: no optimizer state (optim.m1, optim.m2)", path);
    else if ((st = cg_st_read(ck->st, "optim.m1", cg_optim_moment1(r->opt), 1, &span)) ||
             (st = cg_st_read(ck->st, "optim.m2", cg_optim_moment2(r->opt), 1, &span)))
        return st;
    if ((st = cg_optim_set_steps(r->opt, cli_json_i64(s, "optim_steps", 0)))) return st;
    r->step = cli_json_i64(s, "step", 0);
    r->task.rng.state = cli_json_u64(s, "rng", 0);
    r->task.cur.rng.state = cli_json_u64(s, "cursor_rng", 0);
    r->task.cur.epoch = cli_json_i64(s, "cursor_epoch", 0);
    r->task.cur.pos = cli_json_i64(s, "cursor_pos", 0);
    r->dropout_seed = cli_json_u64(s, "dropout_seed", 0);
    r->task.eval_seed = cli_json_u64(s, "eval_seed", 0);
    r->drop_step = cli_json_u64(s, "dropout_step", 0);
    cg_graph_set_rng(r->g, r->dropout_seed, r->drop_step);
    r->elapsed0 = cli_json_num(s, "elapsed_s", 0);
    r->win_sum = cli_json_num(s, "window_loss_sum", 0);
    r->win_n = cli_json_i64(s, "window_steps", 0);
    r->last_train = cli_json_num(s, "train_loss", NAN);
    r->last_val = cli_json_num(s, "val_loss", NAN);
    int threads = (int)cli_json_i64(s, "threads", 0);
    if (threads && threads != cg_threads())
        fprintf(stderr, "cgrad train: note: the checkpoint ran on %d threads, this run on %d: the numbers will not be "
                        "bit-identical to an uninterrupted run\n", threads, cg_threads());
    return CG_OK;
}

#define STR_(x) #x
#define STR(x) STR_(x)
/* The throughput column, named after its definition: tokens over seconds of the last steps. */
#define TOK_COLUMN "tok_per_s_last" STR(CLI_RATE_WINDOW)

/* The step a metrics row is about: a CSV row's first field, a JSON line's leading "step"; -1 if neither. */
static int64_t row_step(const char *line) {
    if (!strncmp(line, "{\"step\":", 8)) line += 8 + strspn(line + 8, " ");
    return *line >= '0' && *line <= '9' ? strtoll(line, NULL, 10) : -1;
}

/* Rewrites a metrics file (header NULL: JSON lines) keeping the rows up to the resumed step, then
 * appends to it. */
static FILE *open_metrics(const char *path, int64_t keep_upto, const char *header) {
    char *old = NULL;
    size_t len = 0;
    if (keep_upto > 0) {
        FILE *f = fopen(path, "rb");
        if (f) {
            fseek(f, 0, SEEK_END);
            long n = ftell(f);
            fseek(f, 0, SEEK_SET);
            old = n > 0 ? malloc((size_t)n + 1) : NULL;
            len = old ? fread(old, 1, (size_t)n, f) : 0;
            if (old) old[len] = 0;
            fclose(f);
        }
    }
    FILE *f = fopen(path, "w");
    if (!f) {
        free(old);
        return NULL;
    }
    if (header) fputs(header, f);
    for (char *line = old; line && *line;) {
        char *nl = strchr(line, '\n');
        if (!nl) break;
        const int64_t step = row_step(line);
        if (step >= 0 && step <= keep_upto) fwrite(line, 1, (size_t)(nl - line + 1), f);
        line = nl + 1;
    }
    free(old);
    fflush(f);
    return f;
}

/* One metrics row, in the CSV and as a JSON line. NAN lr, val_loss or tok_s: no value (an empty
 * field, an absent key); train NULL: none (a skipped step's non-finite loss is written as it is). */
static void metrics_row(run *r, int64_t step, double lr, const double *train, double val, double tok_s, double elapsed) {
    const struct { const char *key, *fmt; double v; bool any; } col[] = {
        {"lr", "%.6g", lr, false}, {"train_loss", "%.9g", train ? *train : NAN, train != NULL},
        {"val_loss", "%.9g", val, false}, {TOK_COLUMN, "%.1f", tok_s, false}, {"elapsed_s", "%.3f", elapsed, false}};
    fprintf(r->metrics, "%lld", (long long)step);
    if (r->jsonl) fprintf(r->jsonl, "{\"step\": %lld", (long long)step);
    for (size_t i = 0; i < sizeof col / sizeof col[0]; i++) {
        fputc(',', r->metrics);
        if (isnan(col[i].v) && !col[i].any) continue;
        fprintf(r->metrics, col[i].fmt, col[i].v);
        if (r->jsonl && isfinite(col[i].v)) { /* JSON has no infinity: a diverged loss stays in the CSV */
            fprintf(r->jsonl, ", \"%s\": ", col[i].key);
            fprintf(r->jsonl, col[i].fmt, col[i].v);
        }
    }
    fputc('\n', r->metrics);
    if (r->jsonl) fputs("}\n", r->jsonl);
}

/* The run's resolved options as one JSON object (the checkpoint's "train" object, pretty): the file
 * --config reads, so `cgrad train --config X_run.json` sets up the same run. */
static int write_run_json(run *r) {
    cJSON *j = opts_json(&r->o);
    char *text = j ? cJSON_Print(j) : NULL;
    cJSON_Delete(j);
    FILE *f = text ? fopen(r->run_path, "w") : NULL;
    bool ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    if (f && fclose(f)) ok = false;
    free(text);
    return ok ? 0 : -1;
}

static void fmt_time(char *buf, size_t n, double s) {
    if (!(s >= 0) || s > 1e7) snprintf(buf, n, "--:--");
    else if (s >= 3600) snprintf(buf, n, "%d:%02d:%02d", (int)s / 3600, (int)s / 60 % 60, (int)s % 60);
    else snprintf(buf, n, "%d:%02d", (int)s / 60, (int)s % 60);
}

static void clear_bar(run *r) {
    if (r->tty && r->bar_shown) fputs("\r\033[K", stdout);
    r->bar_shown = false;
}

/* Evaluations still to come once step done is trained (its own, if due, runs after the progress
 * line): at each multiple of --eval-every in [done, total], and at the end. */
static int64_t evals_left(const topts *o, int64_t done) {
    const int64_t total = o->steps, every = o->eval_every;
    if (done > total) return 0;
    return every > 0 ? total / every - (done - 1) / every + (total % every != 0) : 1;
}

static void progress(run *r, double loss, double lr) {
    const int64_t total = r->o.steps, done = r->step;
    const double tok_s = cli_rate_tokens_per_s(&r->rate);
    char eta[32];
    fmt_time(eta, sizeof eta, cli_rate_eta(&r->rate, total - done, evals_left(&r->o, done), r->eval_s));
    if (r->tty) {
        char bar[25];
        int fillc = total > 0 ? (int)(24 * done / total) : 24;
        for (int i = 0; i < 24; i++) bar[i] = i < fillc ? '#' : '.';
        bar[24] = 0;
        printf("\r\033[K[%s] %lld/%lld loss %.4f lr %.2e %.0f tok/s ETA %s", bar, (long long)done, (long long)total,
               loss, lr, tok_s, eta);
        r->bar_shown = true;
    } else {
        printf("step %lld/%lld loss %.4f lr %.2e %.0f tok/s ETA %s\n", (long long)done, (long long)total, loss, lr, tok_s,
               eta);
    }
    fflush(stdout);
}

static void log_eval(run *r, const cli_eval *e, double exact, int64_t tried) {
    clear_bar(r);
    printf("eval step %lld:", (long long)r->step);
    if (r->win_n) printf(" train %.4f", r->win_sum / (double)r->win_n);
    printf(" held-out %.4f", e->loss);
    if (!isnan(e->mlm_loss)) printf(" (mlm %.4f nsp %.4f)", e->mlm_loss, e->nsp_loss);
    if (!isnan(e->accuracy)) printf(" accuracy %.4f (%lld held-out)", e->accuracy, (long long)e->items);
    if (tried > 0) printf(" exact-match %.4f (%lld held-out, greedy)", exact, (long long)tried);
    char el[32];
    fmt_time(el, sizeof el, r->elapsed0 + now_s() - r->t_start);
    printf(" [%s]\n", el);
    fflush(stdout);
}

/* Held-out evaluation; closes the training-loss window. */
static void evaluate(run *r, bool final) {
    cli_eval e;
    const double t0 = now_s();
    /* ranks must run the same collectives: a sharded evaluation always completes */
    cg_status st = cli_task_eval(&r->task, true, r->ge, &r->mge, r->o.eval_batches, r->world > 1 ? NULL : &interrupted, &e);
    if (st) {
        clear_bar(r);
        fprintf(stderr, "cgrad train: evaluation failed: %s\n", cg_last_error());
        e.loss = NAN;
    }
    if (interrupted) return; /* a cut-short evaluation is not a result */
    r->eval_s = now_s() - t0;
    double exact = -1;
    int64_t tried = 0;
    if (final && r->o.eval_exact > 0 && r->rank == 0) exact = cli_task_exact(&r->task, r->model, r->o.eval_exact, &tried);
    r->last_val = e.loss;
    if (r->win_n) r->last_train = r->win_sum / (double)r->win_n;
    log_eval(r, &e, exact, tried);
    r->win_sum = 0, r->win_n = 0;
}

static void finish_files(run *r) {
    if (r->metrics) fflush(r->metrics);
    if (r->jsonl) fflush(r->jsonl);
    char title[256];
    snprintf(title, sizeof title, "cgrad train %s: %lld layers, d %lld, context %lld, batch %lld", cg_arch_name(r->arch),
             (long long)r->o.layers, (long long)r->o.dim, (long long)r->task.t, (long long)(r->o.batch * r->o.grad_accum));
    static const char *const ylabel[] = {"loss (nats per token)", "loss (masked-LM + next-sentence, nats)",
                                         "loss (nats per target token)", "loss (nats per example)",
                                         "loss (nats per token)"};
    _Static_assert(sizeof ylabel / sizeof *ylabel == CG_ARCH_LLAMA + 1, "a loss label per arch");
    if (cli_plot_metrics(r->metrics_path, r->plot_path, title, ylabel[r->arch]))
        fprintf(stderr, "cgrad train: cannot draw %s: %s\n", r->plot_path, cg_last_error());
}

/* Derived file names: next to the checkpoint when one was named, else in the working directory. */
static void derive_paths(run *r, bool named_ckpt) {
    if (*r->o.metrics) snprintf(r->metrics_path, sizeof r->metrics_path, "%s", r->o.metrics);
    else if (named_ckpt) {
        const char *c = r->o.checkpoint, *dot = strrchr(c, '.'), *slash = strrchr(c, '/');
        int base = dot && (!slash || dot > slash) ? (int)(dot - c) : (int)strlen(c);
        snprintf(r->metrics_path, sizeof r->metrics_path, "%.*s_metrics.csv", base, c);
    } else snprintf(r->metrics_path, sizeof r->metrics_path, "cgrad_metrics.csv");
    if (*r->o.plot) snprintf(r->plot_path, sizeof r->plot_path, "%s", r->o.plot);
    else {
        size_t n = strlen(r->metrics_path);
        int base = n > 4 && !strcmp(r->metrics_path + n - 4, ".csv") ? (int)n - 4 : (int)n;
        if (base > 8 && !strncmp(r->metrics_path + base - 8, "_metrics", 8)) base -= 8;
        snprintf(r->plot_path, sizeof r->plot_path, "%.*s_loss.svg", base, r->metrics_path);
    }
    { /* the JSON lines beside the CSV; the resolved options beside the checkpoint */
        size_t n = strlen(r->metrics_path);
        int base = n > 4 && !strcmp(r->metrics_path + n - 4, ".csv") ? (int)n - 4 : (int)n;
        snprintf(r->jsonl_path, sizeof r->jsonl_path, "%.*s.jsonl", base, r->metrics_path);
        const char *c = r->o.checkpoint, *dot = strrchr(c, '.'), *slash = strrchr(c, '/');
        base = dot && (!slash || dot > slash) ? (int)(dot - c) : (int)strlen(c);
        snprintf(r->run_path, sizeof r->run_path, "%.*s_run.json", base, c);
        if (!named_ckpt) snprintf(r->run_path, sizeof r->run_path, "cgrad_run.json");
    }
}

/* Threads per rank under mpirun when neither --threads nor CGRAD_THREADS says: the cores of this
 * machine shared by the ranks on it, so 2 ranks on 2 cores run 1 thread each, not 2. */
static void dist_threads(const run *r, const bool *set) {
    if (r->world == 1 || set[idx_threads] || getenv("CGRAD_THREADS")) return;
    const char *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const long local = ls && atoi(ls) > 0 ? atoi(ls) : 1, cores = sysconf(_SC_NPROCESSORS_ONLN);
    int n = (int)(cores / local);
    if (n < 1) n = 1;
    if (n < cg_threads()) cg_set_threads(n);
}

/* Every rank must train the same model on the same data: compares each setting, the data
 * checksums, the parameter count and values and the resumed position with rank 0's. */
static cg_status dist_check(run *r) {
    char v[96];
    cg_status st = CG_OK;
    for (int i = 0; i < N_DEFS && !st; i++) {
        if (i == idx_threads || i == idx_metrics || i == idx_plot) continue; /* free per rank */
        value_str(&r->o, i, v, sizeof v);
        st = cg_dist_check(r->d, defs[i].flag, v);
    }
    const int64_t np = cg_params_numel(r->ps);
    const uint32_t pcrc = (uint32_t)crc32(0L, (const Bytef *)cg_params_values(r->ps),
                                          (uInt)(cg_params_span(r->ps) * (int64_t)sizeof(cg_real)));
    struct { const char *what, *fmt; uint64_t a, b; } facts[] = {
        {"--data checksum", "crc32 %08" PRIx64 ", %" PRIu64 " bytes", r->data_crc, (uint64_t)r->data_bytes},
        {"--val-data checksum", "crc32 %08" PRIx64 "%.0" PRIu64, r->val_crc, 0},
        {"parameter count", "%" PRIu64 "%.0" PRIu64, (uint64_t)np, 0},
        {"parameter values", "crc32 %08" PRIx64 "%.0" PRIu64, pcrc, 0},
        {"resumed step", "%" PRIu64 " (data rng %" PRIu64 ")", (uint64_t)r->step, r->task.rng.state ^ r->task.cur.rng.state},
    };
    for (size_t i = 0; i < sizeof facts / sizeof facts[0] && !st; i++) {
        snprintf(v, sizeof v, facts[i].fmt, facts[i].a, facts[i].b);
        st = cg_dist_check(r->d, facts[i].what, v);
    }
    return st;
}

/* One micro-batch on this rank. The data stream and the dropout stream are global: rank k of N
 * takes draw m*N + k of the step, so N ranks x B rows see exactly the batches one process with
 * --grad-accum N sees, and the saved positions are one position for all ranks. */
static cg_status shard_step(run *r, int64_t m, double *loss) {
    cg_status st = cg_dist_reducer_begin(r->red, m);
    for (int k = 0; k < r->world && !st; k++) {
        st = cli_task_train_batch(&r->task, &r->mg); /* other ranks' draws only advance the stream */
        if (st || k != r->rank) continue;
        cg_graph_set_rng(r->g, r->dropout_seed, r->drop_step + (uint64_t)(m * r->world + k));
        if (!(st = cg_graph_forward(r->g))) st = cg_graph_backward(r->g, r->mg.loss);
        *loss += cg_item(r->mg.loss);
    }
    return st;
}

int cmd_train(int argc, char **argv) {
    topts o;
    memset(&o, 0, sizeof o);
    bool set[N_DEFS] = {0};
    const char *resume = NULL;
    bool want_resume = false;
    const char *config_path = NULL;
    cJSON *config = NULL; /* --config's document: its strings are options' values */
    o.arch = "gpt2";
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--resume")) {
            want_resume = true;
            cli_value v;
            if (i + 1 < argc && strncmp(argv[i + 1], "--", 2) && !cli_check_value("train", &defs[N_DEFS], argv[i + 1], &v))
                return 2;
            if (i + 1 < argc && strncmp(argv[i + 1], "--", 2)) resume = argv[++i];
            continue;
        }
        if (!strcmp(argv[i], "--config")) {
            cli_value v;
            if (i + 1 >= argc) {
                fprintf(stderr, "cgrad train: --config needs a value (cgrad train --help)\n");
                return 2;
            }
            if (config_path) {
                fprintf(stderr, "cgrad train: --config is given twice\n");
                return 2;
            }
            if (!cli_check_value("train", CONFIG_OPT, argv[++i], &v)) return 2;
            config_path = v.s;
            continue;
        }
        int k = 0;
        while (k < N_DEFS && strcmp(argv[i], defs[k].flag)) k++;
        if (k == N_DEFS) {
            if (strncmp(argv[i], "--", 2))
                fprintf(stderr, "cgrad train: unexpected argument '%s' (train takes no positional arguments; cgrad train "
                                "--help lists the options)\n", argv[i]);
            else fprintf(stderr, "cgrad train: unknown option %s (cgrad train --help lists the options)\n", argv[i]);
            return 2;
        }
        if (defs[k].kind == CLI_BARE) {
            *(int64_t *)field(&o, k) = 1;
            set[k] = true;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "cgrad train: %s needs a value\n", argv[i]);
            return 2;
        }
        cli_value v;
        if (!cli_check_value("train", &defs[k], argv[++i], &v)) return 2;
        switch (type_of(k)) {
        case T_STR: *(const char **)field(&o, k) = v.s; break;
        case T_INT: *(int64_t *)field(&o, k) = v.i; break;
        case T_NUM: *(double *)field(&o, k) = v.d; break;
        case T_U64: *(uint64_t *)field(&o, k) = v.u; break;
        }
        set[k] = true;
    }
    if (config_path && !load_config(config_path, &o, set, &config)) {
        cJSON_Delete(config);
        return 2;
    }
    const bool named_ckpt = set[idx_checkpoint];
    if (want_resume && !resume) {
        if (!set[idx_checkpoint]) {
            fprintf(stderr, "cgrad train: --resume needs a checkpoint: --resume CKPT or --checkpoint CKPT\n");
            return 2;
        }
        resume = o.checkpoint;
    }
    run r;
    memset(&r, 0, sizeof r);
    r.last_train = r.last_val = NAN;
    cli_ckpt ck;
    memset(&ck, 0, sizeof ck);
    int rc = 1;
    bool all_failed = false; /* an error every rank saw, so none waits for another */
    if (!(r.d = cg_dist_init(set[idx_dist_timeout] ? o.dist_timeout : 300))) return cli_fail("train", "cannot join the MPI job");
    r.rank = cg_dist_rank(r.d), r.world = cg_dist_size(r.d);
    if (r.rank > 0 && !freopen("/dev/null", "w", stdout)) { /* rank 0 reports for all; errors still reach stderr */
        cg_dist_free(r.d);
        return 1;
    }
    if (resume) {
        if (cli_ckpt_load(resume, -1, &ck)) {
            fprintf(stderr, "cgrad train: cannot resume: %s\n", cg_last_error());
            goto done;
        }
        if (!merge_saved(&o, set, ck.train, resume)) goto done;
        const int64_t saved_world = cli_json_i64(ck.state, "world_size", 1);
        if (saved_world != r.world) {
            /* the global batch and the data shards follow N: another N would be another run */
            fprintf(stderr, "cgrad train: cannot resume: %s was trained on %lld rank%s (global batch %lld x %lld x %lld), "
                            "this run has %d: start it with mpirun -n %lld\n", resume, (long long)saved_world,
                    saved_world == 1 ? "" : "s", (long long)saved_world, (long long)cli_json_i64(ck.train, "batch", 0),
                    (long long)cli_json_i64(ck.train, "grad_accum", 1), r.world, (long long)saved_world);
            all_failed = true;
            goto done;
        }
        if (!named_ckpt) o.checkpoint = resume, set[idx_checkpoint] = true;
    }
    const bool init = !resume && set[idx_init_from] && *o.init_from;
    static char init_abs[4096];
    if (init) { /* a new run on a trained model: its shape and tokenizer come with it */
        /* the model takes this run's dropout (0 unless given), not the one its base trained with */
        const double d0 = set[idx_dropout] ? o.dropout : 0; /* Hugging Face layout: a new head may initialise */
        if (!realpath(o.init_from, init_abs) ||
            (cli_hf_layout(init_abs) ? cli_hf_load(init_abs, d0, true, &ck) : cli_ckpt_load(init_abs, d0, &ck))) {
            fprintf(stderr, "cgrad train: --init-from %s: %s\n", o.init_from, cg_last_error());
            goto done;
        }
        if (cli_json_i64(ck.train, "lora_rank", 0) > 0) {
            fprintf(stderr, "cgrad train: --init-from %s is a LoRA fine-tune: merge it first (cgrad export), or resume it\n",
                    o.init_from);
            goto done;
        }
        o.init_from = init_abs;
        static const char *const shape_keys[] = {"arch", "tokenizer", "tokenizer_path", "vocab_size", "layers",
                                                 "heads", "kv_heads", "dim", "ffn", "context"};
        for (cJSON *v = ck.train ? ck.train->child : NULL, *next; v; v = next) { /* the rest is this run's */
            next = v->next;
            bool keep = false;
            for (size_t i = 0; i < sizeof shape_keys / sizeof *shape_keys; i++) keep |= !strcmp(v->string, shape_keys[i]);
            if (!keep) cJSON_DeleteItemFromObjectCaseSensitive(ck.train, v->string);
        }
        if (!merge_saved(&o, set, ck.train, init_abs)) goto done; /* its strings live as long as ck */
        if (cg_model_num_classes(ck.model) > 0 && cg_model_arch(ck.model) == CG_ARCH_BERT && !set[idx_head])
            o.head = "classify", set[idx_head] = true; /* a BERT classifier goes on classifying */
    }
    rc = 2;
    if (cg_arch_parse(o.arch, &r.arch)) {
        fprintf(stderr, "cgrad train: --arch %s: expected gpt2, bert, encdec, classifier or llama\n", o.arch);
        goto done;
    }
    defaults(&o, set);
    if (!check_opts(&o)) goto done;
    cg_precision prec;
    if (cg_precision_parse(o.precision, &prec) != CG_OK) {
        fprintf(stderr, "cgrad train: --precision takes fp32 or bf16, got '%s'\n", o.precision);
        goto done;
    }
    if (cg_set_precision(prec) != CG_OK) { /* bf16 where it cannot run: say why before any work */
        fprintf(stderr, "cgrad train: --precision %s: %s\n", o.precision, cg_last_error());
        rc = 1;
        goto done;
    }
    if (*o.val_data && (r.arch == CG_ARCH_GPT2 || r.arch == CG_ARCH_LLAMA || (r.arch == CG_ARCH_BERT && !bert_classify(&o)))) {
        fprintf(stderr, "cgrad train: --val-data is for encdec and classifier; %s holds out --val-fraction of --data\n", o.arch);
        goto done;
    }
    if (!*o.data) {
        fprintf(stderr, "cgrad train: --arch %s needs --data FILE.tsv (one \"source<TAB>target\" pair a line)\n", o.arch);
        goto done;
    }
    if (!set[idx_data] && !strncmp(o.data, "data/", 5) && !(o.data = cli_default_data(o.data + 5, "--data FILE"))) {
        fprintf(stderr, "cgrad train: %s\n", cg_last_error());
        goto done;
    }
    rc = 1;
    r.o = o;
    if (o.threads > 0) cg_set_threads((int)o.threads);
    dist_threads(&r, set);
    derive_paths(&r, named_ckpt || resume);
    r.tty = isatty(STDOUT_FILENO);

    /* Tokenizer: restored, or made from the data. */
    if (!file_crc(o.data, &r.data_crc, &r.data_bytes)) {
        fprintf(stderr, "cgrad train: cannot read --data %s: %s\n", o.data, strerror(errno));
        goto done;
    }
    int64_t vb = 0;
    if (*o.val_data && !file_crc(o.val_data, &r.val_crc, &vb)) {
        fprintf(stderr, "cgrad train: cannot read --val-data %s: %s\n", o.val_data, strerror(errno));
        goto done;
    }
    if (resume) { /* resuming exactly needs the very same data */
        const uint32_t crc = (uint32_t)cli_json_u64(ck.state, "data_crc32", 0),
                       vcrc = (uint32_t)cli_json_u64(ck.state, "val_data_crc32", 0);
        if (crc != r.data_crc || vcrc != r.val_crc) {
            fprintf(stderr,
                    "cgrad train: cannot resume: the %s file %s differs from the one %s was trained on (crc32 %08x, "
                    "checkpoint %08x)\n",
                    crc != r.data_crc ? "--data" : "--val-data", crc != r.data_crc ? o.data : o.val_data, resume,
                    crc != r.data_crc ? r.data_crc : r.val_crc, crc != r.data_crc ? crc : vcrc);
            goto done;
        }
        r.tok = ck.tok;
        ck.tok = NULL;
    } else if (init) {
        r.tok = ck.tok;
        ck.tok = NULL;
    } else {
        char *text = NULL;
        size_t len = 0;
        if (cg_read_text_file(o.data, &text, &len)) {
            cli_fail("train", "cannot read the data");
            goto done;
        }
        /* A named tokenizer file decides the kind unless --tokenizer says otherwise. */
        const bool path_decides = *o.tokenizer_path && !set[idx_tokenizer];
        r.tok = cli_tokenizer_make(path_decides ? NULL : o.tokenizer, o.tokenizer_path, o.vocab_size, text, len);
        free(text);
        if (!r.tok) {
            cli_fail("train", "cannot make the tokenizer");
            goto done;
        }
        static const char *const kinds[] = {"char", "bpe", "wordpiece"};
        r.o.tokenizer = kinds[cg_tokenizer_kind(r.tok)];
    }
    if (cg_tokenizer_serialize(r.tok, &r.tok_json)) {
        cli_fail("train", "cannot serialize the tokenizer");
        goto done;
    }
    if (cli_task_open(&r.task, bert_classify(&o) ? CG_ARCH_CLASSIFIER : r.arch, r.tok, o.data, o.val_data, o.val_fraction, o.batch, o.context)) {
        cli_fail("train", "cannot load the data");
        goto done;
    }
    {
        const int64_t n = r.task.s2s ? cg_seq2seq_data_count(r.task.s2s, false)
                          : r.task.cls ? cg_textcls_data_count(r.task.cls, false) : o.batch;
        if (n < o.batch) {
            fprintf(stderr, "cgrad train: %s: %lld training examples cannot fill a --batch of %lld\n", o.data, (long long)n,
                    (long long)o.batch);
            goto done;
        }
    }
    /* Independent streams for initialisation, data, dropout and held-out draws. */
    cg_rng seeds;
    cg_rng_seed(&seeds, o.seed);
    const uint64_t init_seed = cg_rng_next(&seeds), data_seed = cg_rng_next(&seeds);
    r.dropout_seed = cg_rng_next(&seeds);
    r.task.eval_seed = cg_rng_next(&seeds);
    cg_rng_seed(&r.task.rng, data_seed);
    cg_data_cursor_init(&r.task.cur, data_seed);

    if (init && bert_classify(&o) && cg_model_num_classes(ck.model) == 0 && !new_head(&ck, &r, init_seed)) goto done;
    if (resume || init) {
        r.ps = ck.ps, r.model = ck.model;
        ck.ps = NULL, ck.model = NULL;
    } else {
        char *cfg = model_config(&r);
        r.ps = cg_params_new();
        r.model = cfg && r.ps ? cg_model_new(r.arch, cfg, o.dropout, r.ps, init_seed) : NULL;
        free(cfg);
        if (!r.model) {
            cli_fail("train", "cannot build the model");
            goto done;
        }
    }
    if (init && o.lora_rank > 0) { /* a resumed fine-tune has its adapters from the checkpoint */
        cg_rng lr;
        cg_rng_seed(&lr, init_seed);
        const int n = cg_lora_apply(r.ps, o.lora_targets, (int)o.lora_rank, o.lora_alpha, &lr);
        if (n < 0) {
            cli_fail("train", "--lora-rank/--lora-targets");
            goto done;
        }
        int64_t trainable = 0;
        for (int i = 0; i < cg_params_count(r.ps); i++)
            if (cg_param_trainable(cg_params_at(r.ps, i))) trainable += cg_numel(cg_params_at(r.ps, i));
        printf("  LoRA: %d adapters of rank %lld (alpha %g) on '%s': %lld trainable parameters\n", n,
               (long long)o.lora_rank, o.lora_alpha, o.lora_targets, (long long)trainable);
    }
    cg_optim_config oc = cg_optim_defaults(CG_OPT_ADAMW);
    oc.lr = o.lr, oc.beta1 = o.beta1, oc.beta2 = o.beta2, oc.eps = o.eps, oc.weight_decay = o.weight_decay;
    r.opt = cg_optim_new(r.ps, &oc);
    if (!r.opt) {
        cli_fail("train", "bad optimizer settings");
        goto done;
    }
    cg_optim_decay_matrices_only(r.opt, true); /* as nanoGPT: every >= 2-D parameter, embeddings too */
    if (cg_schedule_parse(o.schedule, &r.sched.kind)) {
        cli_fail("train", "--schedule");
        goto done;
    }
    r.sched.lr = o.lr, r.sched.min_lr = o.min_lr, r.sched.warmup = o.warmup, r.sched.total = o.decay_steps;
    r.sched.d_model = o.dim, r.sched.noam_factor = o.lr;
    if (cg_schedule_check(&r.sched)) {
        cli_fail("train", "bad schedule (--lr, --min-lr, --warmup, --decay-steps)");
        goto done;
    }
    r.g = cg_graph_new(CG_TRAIN);
    r.ge = cg_graph_new(CG_EVAL);
    if (!r.g || !r.ge || cg_model_build(r.g, r.model, o.batch, r.task.t, r.task.s, &r.mg) ||
        cg_model_build(r.ge, r.model, o.batch, r.task.t, r.task.s, &r.mge)) {
        cli_fail("train", "cannot build the training graph");
        goto done;
    }
    cg_graph_set_rng(r.g, r.dropout_seed, 0);
    cg_graph_set_checkpointing(r.g, o.checkpoint_activations);
    if (resume && restore(&r, &ck, resume)) {
        fprintf(stderr, "cgrad train: cannot resume: %s\n", cg_last_error());
        goto done;
    }
    if (!(r.red = cg_dist_reducer_new(r.d, r.ps, o.grad_accum, (size_t)o.bucket_kb << 10, o.overlap))) {
        cli_fail("train", "cannot make the gradient reducer");
        goto done;
    }
    cg_dist_reducer_attach(r.red, r.g);
    r.task.dist = r.d;
    if (o.zero && r.world > 1) { /* after restore: the optimizer keeps its own slice of the full moments */
        int64_t lo, hi;
        cg_dist_shard(r.d, r.rank, cg_params_span(r.ps), &lo, &hi);
        if (cg_optim_shard(r.opt, lo, hi)) {
            cli_fail("train", "cannot shard the optimizer");
            goto done;
        }
    }
    if (r.world > 1 && dist_check(&r)) {
        if (r.rank == 0) fprintf(stderr, "cgrad train: the ranks disagree: %s\n", cg_last_error());
        all_failed = true;
        goto done;
    }
    if (r.rank > 0) {
        snprintf(r.metrics_path, sizeof r.metrics_path, "/dev/null");
        snprintf(r.jsonl_path, sizeof r.jsonl_path, "/dev/null");
    }
    if (!(r.metrics = open_metrics(r.metrics_path, resume ? r.step : 0, "step,lr,train_loss,val_loss," TOK_COLUMN ",elapsed_s\n"))) {
        fprintf(stderr, "cgrad train: cannot write %s: %s\n", r.metrics_path, strerror(errno));
        goto done;
    }
    if (!(r.jsonl = open_metrics(r.jsonl_path, resume ? r.step : 0, NULL))) {
        fprintf(stderr, "cgrad train: cannot write %s: %s\n", r.jsonl_path, strerror(errno));
        goto done;
    }
    if (r.rank == 0 && write_run_json(&r)) {
        fprintf(stderr, "cgrad train: cannot write %s: %s\n", r.run_path, strerror(errno));
        goto done;
    }

    const int64_t tokens_per_step = r.world * o.batch * o.grad_accum * (r.task.arch == CG_ARCH_CLASSIFIER ? r.task.t : r.task.t + r.task.s);
    {
        int64_t ntr = r.task.lm ? cg_lm_data_count(r.task.lm, false) : r.task.mlm ? cg_mlm_data_count(r.task.mlm, false)
                      : r.task.s2s ? cg_seq2seq_data_count(r.task.s2s, false) : cg_textcls_data_count(r.task.cls, false);
        int64_t nva = r.task.lm ? cg_lm_data_count(r.task.lm, true) : r.task.mlm ? cg_mlm_data_count(r.task.mlm, true)
                      : r.task.s2s ? cg_seq2seq_data_count(r.task.s2s, true) : cg_textcls_data_count(r.task.cls, true);
        const char *unit = r.task.lm ? "tokens" : r.task.mlm ? "sentences" : r.task.s2s ? "pairs" : "examples";
        const char *kinds[] = {"char", "bpe", "wordpiece"};
        printf("cgrad train: %s, %lld layers, %lld heads, d %lld, context %lld: %.2fM parameters\n", cg_arch_name(r.arch),
               (long long)o.layers, (long long)o.heads, (long long)o.dim, (long long)r.task.t,
               (double)cg_params_numel(r.ps) / 1e6);
        printf("  data %s: %lld training / %lld held-out %s; %s tokenizer, %d ids\n", o.data, (long long)ntr,
               (long long)nva, unit, kinds[cg_tokenizer_kind(r.tok)], (int)cg_tokenizer_vocab_size(r.tok));
        if (resume) printf("  resuming at step %lld of %lld\n", (long long)r.step, (long long)o.steps);
        printf("  %lld steps of %lld x %lld rows, AdamW lr %g (%s, warmup %lld, min %g), wd %g, clip %g, dropout %g, "
               "%d threads%s\n",
               (long long)o.steps, (long long)o.batch, (long long)o.grad_accum, o.lr, o.schedule, (long long)o.warmup,
               o.min_lr, o.weight_decay, o.clip, o.dropout, cg_threads(),
               o.checkpoint_activations ? ", activations checkpointed (each block recomputed in backward)" : "");
        if (r.world > 1) {
            int64_t lo, hi;
            cg_optim_shard_range(r.opt, &lo, &hi);
            printf("  AdamW moments on each rank: %.2f MB%s (%.2f MB unsharded); parameters + gradients %.2f MB%s\n",
                   2e-6 * (double)(hi - lo) * (double)sizeof(cg_real), o.zero ? ", ZeRO-1 shard" : "",
                   2e-6 * (double)cg_params_span(r.ps) * (double)sizeof(cg_real),
                   2e-6 * (double)cg_params_span(r.ps) * (double)sizeof(cg_real),
                   o.grad_accum > 1 ? " + accumulator" : "");
        }
        if (r.world > 1)
            printf("  %d ranks (MPI): global batch %d x %lld x %lld = %lld rows a step, %lld KiB buckets, overlap %s\n",
                   r.world, r.world, (long long)o.batch, (long long)o.grad_accum, (long long)(r.world * o.batch * o.grad_accum),
                   (long long)o.bucket_kb, o.overlap ? "on" : "off");
        printf("  checkpoint %s, metrics %s, plot %s\n", o.checkpoint, r.metrics_path, r.plot_path);
        fflush(stdout);
    }

    struct sigaction sa, old_sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    interrupted = 0;
    sigaction(SIGINT, &sa, &old_sa);

    r.t_start = now_s();
    const int64_t first = r.step;
    int64_t last_eval = -1;
    if (r.step == 0 && o.eval_every > 0 && o.eval_batches > 0) { /* where a fresh model starts */
        evaluate(&r, false);
        if (!interrupted) {
            metrics_row(&r, 0, 0, NULL, r.last_val, NAN, now_s() - r.t_start);
            last_eval = 0;
        }
    }
    cg_status st = CG_OK;
    bool diverged = false;
    /* The loop allocates nothing: batches go into the graphs' inputs, the optimizer works in place. */
    while (r.step < o.steps && !interrupted) {
        const double t0 = now_s(), lr = cg_schedule_lr(&r.sched, cg_optim_steps(r.opt));
        double loss = 0;
        for (int64_t a = 0; a < o.grad_accum && !st; a++) st = shard_step(&r, a, &loss);
        /* the mean over every micro-batch of every rank; ranks stop together on a signal */
        double agree[2] = {loss, interrupted ? 1 : 0};
        if (!st) st = cg_dist_reducer_finish(r.red);
        if (!st) st = cg_dist_sum(r.d, agree, 2);
        if (st) break;
        r.drop_step += (uint64_t)(r.world * o.grad_accum);
        cg_graph_set_rng(r.g, r.dropout_seed, r.drop_step);
        loss = agree[0] / (double)(r.world * o.grad_accum);
        if (agree[1] > 0) interrupted = 1;
        /* After the reduction every rank holds the same gradients, so the same norm, clip and verdict.
         * The norm is measured even without clipping: one pass over the gradients finds a NaN or an
         * infinity before the optimizer spreads it into every parameter and moment. */
        const double gnorm = cg_clip_grad_norm(r.ps, o.clip > 0 ? o.clip : INFINITY);
        if (!isfinite(loss) || !isfinite(gnorm)) {
            int64_t at = -1;
            double v = 0;
            const char *where = nonfinite_param(r.ps, false, &at, &v);
            const bool in_values = where != NULL;
            if (!where) where = nonfinite_param(r.ps, true, &at, &v);
            char what[400];
            if (where) snprintf(what, sizeof what, "first non-finite %s: %s[%lld] = %g", in_values ? "parameter" : "gradient",
                                where, (long long)at, v);
            else snprintf(what, sizeof what, "the gradients are finite, the loss is not");
            clear_bar(&r);
            if (r.skipped < o.skip_nonfinite) {
                r.skipped++;
                r.step++; /* the batch is used up; the optimizer and its schedule do not move */
                fprintf(stderr, "cgrad train: step %lld: loss %g, gradient norm %g (%s): skipped (%lld of --skip-nonfinite %lld)\n",
                        (long long)r.step, loss, gnorm, what, (long long)r.skipped, (long long)o.skip_nonfinite);
                metrics_row(&r, r.step, lr, &loss, NAN, NAN, r.elapsed0 + now_s() - r.t_start);
                continue;
            }
            fprintf(stderr, "cgrad train: step %lld: loss %g, gradient norm %g: not finite (%s); stopping before the update, "
                            "nothing saved (try a lower --lr, a --clip, or --skip-nonfinite N)\n",
                    (long long)r.step + 1, loss, gnorm, what);
            st = CG_ERR_RANGE;
            diverged = true;
            break;
        }
        if ((st = cg_optim_step(r.opt, lr))) break;
        /* ZeRO-1: each rank updated its shard; the new values go to every rank */
        if (o.zero && (st = cg_dist_allgather(r.d, cg_params_values(r.ps), cg_params_span(r.ps)))) break;
        r.step++;
        const double dt = now_s() - t0;
        r.train_s += dt;
        r.tokens_run += tokens_per_step;
        cli_rate_add(&r.rate, dt, tokens_per_step);
        const double tok_s = cli_rate_tokens_per_s(&r.rate);
        r.win_sum += loss, r.win_n++;
        r.last_train = loss;
        bool eval_now = (o.eval_every > 0 && r.step % o.eval_every == 0) || r.step == o.steps;
        if (r.tty ? now_s() - r.bar_drawn > 0.1 || r.step == o.steps : o.log_every > 0 && r.step % o.log_every == 0) {
            progress(&r, loss, lr);
            r.bar_drawn = now_s();
        }
        double val = NAN;
        if (eval_now && !interrupted) {
            evaluate(&r, r.step == o.steps);
            if (!interrupted) val = r.last_val, last_eval = r.step;
        }
        metrics_row(&r, r.step, lr, &loss, val, tok_s, r.elapsed0 + now_s() - r.t_start);
        if (r.world > 1 && o.log_every > 0 && r.step % o.log_every == 0) {
            const cg_dist_stats ds = cg_dist_reducer_stats(r.red);
            printf("  all-reduce: %lld buckets, %.2f MB a step; per step %.1f ms from first start to last end, %.1f ms of "
                   "it after backward (%.0f%% behind backward); %lld of %lld buckets started during backward; "
                   "final before an earlier one: %lld in step 1 (memory order), %lld since (backward's order)\n",
                   (long long)ds.buckets, (double)ds.bytes / 1e6, 1e3 * ds.comm_s / (double)ds.steps,
                   1e3 * ds.wait_s / (double)ds.steps, ds.comm_s > ds.wait_s ? 100 * (1 - ds.wait_s / ds.comm_s) : 0.0,
                   (long long)ds.early, (long long)(ds.steps * ds.buckets), (long long)ds.held_first,
                   (long long)ds.held);
        }
        if (o.save_every > 0 && r.step % o.save_every == 0 && r.step < o.steps) {
            if (save(&r)) {
                clear_bar(&r);
                fprintf(stderr, "cgrad train: cannot save: %s\n", cg_last_error());
            }
            if (r.rank == 0) finish_files(&r);
        }
    }
    sigaction(SIGINT, &old_sa, NULL);
    clear_bar(&r);
    if (st && r.world > 1 && strstr(cg_last_error(), "[dist]")) {
        /* a peer is gone or stuck: the last checkpoint on disk is the state to resume from */
        fprintf(stderr, "cgrad train: rank %d of %d: %s; stopping at step %lld without saving (resume from %s)\n", r.rank,
                r.world, cg_last_error(), (long long)r.step, o.checkpoint);
        cg_dist_abort(r.d, 1);
        goto done;
    }
    if (st && !diverged) {
        cli_fail("train", "training step failed");
        /* keep what was learned: the last good state is still worth a checkpoint */
    }
    if (!st && !interrupted && last_eval != r.step && r.step > 0 && o.eval_batches > 0 && first == r.step)
        evaluate(&r, true); /* resumed at the end: report where it stands */
    if (r.skipped) fprintf(stderr, "cgrad train: %lld steps skipped for a non-finite loss or gradient\n", (long long)r.skipped);
    /* A diverged run's parameters are finite (the bad update was never applied) but the very next
     * step would repeat the failure: the checkpoint on disk, if any, stays as it was. */
    const cg_status saved = diverged ? CG_ERR_RANGE : save(&r);
    if (saved && !diverged) {
        fprintf(stderr, "cgrad train: cannot save the checkpoint: %s\n", cg_last_error());
        if (!st) st = CG_ERR_IO;
    } else if (!saved) printf("saved %s (step %lld)\n", o.checkpoint, (long long)r.step);
    fclose(r.metrics);
    fclose(r.jsonl);
    r.metrics = r.jsonl = NULL;
    if (r.rank == 0) finish_files(&r);
    if (interrupted) printf("interrupted at step %lld; continue with: cgrad train --resume %s\n", (long long)r.step,
                            o.checkpoint);
    else if (!st && r.rank == 0) cli_task_show(stdout, &r.task, r.model, (int)o.samples, o.seed);
    const double train_loss = r.win_n ? r.win_sum / (double)r.win_n : r.last_train;
    printf("final step=%lld train_loss=%.4f val_loss=%.4f tokens_per_s=%.1f\n", (long long)r.step, train_loss, r.last_val,
           r.train_s > 0 ? (double)r.tokens_run / r.train_s : 0.0);
    fflush(stdout);
    rc = interrupted ? 130 : st ? 1 : 0;
done:
    if (rc && r.world > 1 && !all_failed) cg_dist_abort(r.d, rc); /* the others would wait for this rank */
    cg_dist_reducer_free(r.red);
    if (r.metrics) fclose(r.metrics);
    if (r.jsonl) fclose(r.jsonl);
    cJSON_Delete(config);
    cg_graph_free(r.g);
    cg_graph_free(r.ge);
    cg_optim_free(r.opt);
    cli_task_free(&r.task);
    cg_model_free(r.model);
    cg_params_free(r.ps);
    cg_tokenizer_free(r.tok);
    free(r.tok_json);
    cli_ckpt_free(&ck);
    cg_dist_free(r.d);
    return rc;
}
