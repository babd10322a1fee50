/* SPDX-License-Identifier: MIT */
/* cgrad train's options: one table (TRAIN_OPTS in cli/train.h) gives each flag its kind, range,
 * help, field and whether a resumed run may change it; from it come the command line's parsing,
 * --config's JSON, the per-arch defaults and the checkpoint's "train" object. */
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cli/train.h"
#include "io/file_internal.h"

#define OPT(f, k, field, fixed, lo, hi, help) {f, k, lo, hi, help},
const cli_opt cli_train_opts[] = {TRAIN_OPTS(OPT){"--resume", CLI_IN, 0, 0, "continue from CKPT (the value is optional)"},
                                  {"--config", CLI_IN, 0, 0, "JSON object of options (run.json); flags given here win"},
                                  {NULL, CLI_BARE, 0, 0, NULL}};
#undef OPT
#define OPT(f, k, field, fixed, lo, hi, help) {offsetof(topts, field), fixed},
static const struct {
    size_t off;
    bool fixed;
} layout[] = {TRAIN_OPTS(OPT)};
#undef OPT
#define defs cli_train_opts
#define CONFIG_OPT (&defs[N_DEFS + 1]) /* --config: read before the defaults, never saved */

/* How option i is stored in topts. */
static otype type_of(int i) {
    return defs[i].kind == CLI_INT || defs[i].kind == CLI_BARE ? T_INT : defs[i].kind == CLI_NUM ? T_NUM : defs[i].kind == CLI_U64 ? T_U64 : T_STR;
}

static void *field(topts *o, int i) { return (char *)o + layout[i].off; }

/* Stores a checked value as option k. */
static void put_value(topts *o, int k, const cli_value *v) {
    switch (type_of(k)) {
    case T_STR: *(const char **)field(o, k) = v->s; break;
    case T_INT: *(int64_t *)field(o, k) = v->i; break;
    case T_NUM: *(double *)field(o, k) = v->d; break;
    case T_U64: *(uint64_t *)field(o, k) = v->u; break;
    }
}

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
void train_defaults(topts *o, const bool *set) {
    cg_arch a = CG_ARCH_GPT2;
    cg_arch_parse(o->arch, &a);
    const bool llama = a == CG_ARCH_LLAMA, gpt = a == CG_ARCH_GPT2 || llama; /* llama: gpt2's run, its own model */
    const bool bert = a == CG_ARCH_BERT, ed = a == CG_ARCH_ENCDEC, cls = a == CG_ARCH_CLASSIFIER;
    const bool vit = a == CG_ARCH_VIT, cnn = a == CG_ARCH_CNN;
#define D(field, value) \
    if (!set[idx_##field]) o->field = (value)
    D(patch, 7);
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
    D(out, "");
    D(checkpoint, "");
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
    D(moe_capacity, 0);
    if (vit || cnn) { /* the image models' own defaults (docs/vision.md); the rest as for any run */
        D(data, "fashion-mnist");
        D(layers, vit ? 4 : 2);
        D(dim, vit ? 64 : 32);
        D(heads, 4);
        D(ffn, vit ? 2 * o->dim : 128);
        D(batch, 128);
        D(steps, vit ? 4690 : 1407);
        D(lr, 2e-3);
        D(decay_steps, o->steps);
        D(min_lr, o->lr / 100);
        D(warmup, vit ? 200 : 100);
        D(weight_decay, vit ? 0.05 : 0.01);
        D(eval_every, 469); /* an epoch of 60,000 images */
        D(eval_batches, 1000);
        D(save_every, 0);
        D(log_every, 100);
    }
#undef D
}

void cli_train_default(const char *arch, const char *flag, char *buf, size_t n) {
    topts o;
    memset(&o, 0, sizeof o);
    bool set[N_DEFS] = {0};
    o.arch = arch ? arch : "gpt2";
    set[idx_arch] = true;
    train_defaults(&o, set);
    *buf = 0;
    for (int i = 0; i < N_DEFS; i++)
        if (!strcmp(defs[i].flag, flag) && defs[i].kind != CLI_BARE) { /* a bare flag is off unless given */
            train_value_str(&o, i, buf, n);
            if (type_of(i) == T_STR) { /* without value_str's quotes; "" has no default */
                size_t len = strlen(buf);
                memmove(buf, buf + 1, len);
                if (len >= 2) buf[len - 2] = 0;
            }
        }
}

static bool bert_arch(const topts *o) { return o->arch && !strcmp(o->arch, "bert"); }

/* A BERT fine-tuned as a classifier (BertForSequenceClassification) runs the classifier's task. */
bool train_bert_classify(const topts *o) { return bert_arch(o) && o->head && !strcmp(o->head, "classify"); }

/* Checks options a run cannot work with; messages name the flag. */
bool train_check_opts(const topts *o) {
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
cJSON *train_opts_json(topts *o) {
    cJSON *j = cJSON_CreateObject();
    for (int i = 0; i < N_DEFS; i++) {
        void *f = field(o, i);
        char buf[32];
        switch (type_of(i)) {
        case T_STR: cJSON_AddStringToObject(j, key_of(i), *(const char **)f ? *(const char **)f : ""); break;
        case T_INT:
            if (defs[i].kind == CLI_BARE) cJSON_AddBoolToObject(j, key_of(i), *(int64_t *)f != 0); /* a flag: true/false */
            else cJSON_AddNumberToObject(j, key_of(i), (double)*(int64_t *)f);
            break;
        case T_NUM: { /* the shortest digits that read back as the same double (cJSON's own may not) */
            char num[40];
            for (int digits = 15; digits <= 17; digits++) {
                snprintf(num, sizeof num, "%.*g", digits, *(double *)f);
                if (strtod(num, NULL) == *(double *)f) break;
            }
            cJSON_AddRawToObject(j, key_of(i), num);
            break;
        }
        case T_U64:
            snprintf(buf, sizeof buf, "%" PRIu64, *(uint64_t *)f);
            cJSON_AddStringToObject(j, key_of(i), buf);
            break;
        }
    }
    return j;
}

void train_value_str(const topts *o, int i, char *buf, size_t n) {
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
bool train_merge_saved(topts *o, bool *set, const cJSON *saved, const char *path) {
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
        train_value_str(o, i, a, sizeof a);
        train_value_str(&s, i, b, sizeof b);
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
    if (cgi_read_text_bounded(path, CGI_LIMIT_JSON, "config", &text, &len)) {
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
        if (defs[k].kind == CLI_BARE) { /* a flag is on or off: JSON's true or false, nothing else */
            if (!cJSON_IsBool(v)) {
                char *shown = cJSON_PrintUnformatted(v);
                fprintf(stderr, "cgrad train: --config %s: key \"%s\" wants true or false, got %.60s\n", path, v->string,
                        shown ? shown : "another JSON value");
                free(shown);
                return false;
            }
            if (!set[k]) *(int64_t *)field(o, k) = cJSON_IsTrue(v), set[k] = true;
            continue;
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
        put_value(o, k, &cv);
        set[k] = true;
    }
    return true;
}

/* Reads argv, then --config's file, into o and set, and settles which checkpoint a --resume means. */
int train_parse(int argc, char **argv, topts *o, bool *set, const char **resume, cJSON **config) {
    bool want_resume = false;
    const char *config_path = NULL;
    memset(o, 0, sizeof *o);
    *resume = NULL;
    *config = NULL; /* --config's document: its strings are options' values */
    o->arch = "gpt2";
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--resume")) {
            want_resume = true;
            cli_value v;
            if (i + 1 < argc && strncmp(argv[i + 1], "--", 2) && !cli_check_value("train", &defs[N_DEFS], argv[i + 1], &v))
                return 2;
            if (i + 1 < argc && strncmp(argv[i + 1], "--", 2)) *resume = argv[++i];
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
            else cli_unknown_option("train", defs, argv[i]);
            return 2;
        }
        if (defs[k].kind == CLI_BARE) {
            *(int64_t *)field(o, k) = 1;
            set[k] = true;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "cgrad train: %s needs a value\n", argv[i]);
            return 2;
        }
        cli_value v;
        if (!cli_check_value("train", &defs[k], argv[++i], &v)) return 2;
        put_value(o, k, &v);
        set[k] = true;
    }
    if (config_path && !load_config(config_path, o, set, config)) {
        cJSON_Delete(*config);
        *config = NULL;
        return 2;
    }
    if (want_resume && !*resume) {
        static char in_out[4200];
        if (!set[idx_checkpoint] && set[idx_out]) { /* the run directory's own checkpoint */
            snprintf(in_out, sizeof in_out, "%s/model.ckpt", o->out);
            o->checkpoint = in_out, set[idx_checkpoint] = true;
        }
        if (!set[idx_checkpoint]) {
            fprintf(stderr, "cgrad train: --resume needs a checkpoint: --resume CKPT, --checkpoint CKPT or --out DIR\n");
            cJSON_Delete(*config);
            *config = NULL;
            return 2;
        }
        *resume = o->checkpoint;
    }
    return 0;
}
