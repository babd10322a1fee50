/* SPDX-License-Identifier: MIT */
/* cgrad sample, translate, fill-mask, classify, eval and info: using what `cgrad train` saved. */
#include <float.h>
#include <inttypes.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "cli/commands.h"
#include "cli/session.h"

#define THREADS {"--threads", CLI_INT, 1, 1024, "threads (CGRAD_THREADS or all cores)"}, CLI_PRECISION
#define CKPT {"--checkpoint", CLI_IN, 0, 0, "checkpoint written by cgrad train, or a Hugging Face directory (cgrad export)"}
#define END {NULL, CLI_BARE, 0, 0, NULL}

/* Opens --checkpoint, wanting arch (or any when want < 0); 0, or the exit code (message printed). */
static int open_ckpt(const cli_args *a, int want, cli_ckpt *ck) {
    const char *path = cli_str(a, "--checkpoint", NULL), *cmd = a->cmd;
    if (!path) {
        fprintf(stderr, "cgrad %s: --checkpoint PATH is required\n", cmd);
        return 2;
    }
    if (cli_has(a, "--threads")) cg_set_threads((int)cli_int(a, "--threads", 0));
    const int prc = cli_set_precision(a, "fp32");
    if (prc) return prc;
    if (cli_ckpt_load_frozen(path, 0.0, ck)) return cli_fail(cmd, "cannot load the checkpoint");
    /* a BERT with a classification head classifies as the classifier does */
    const cg_arch got = cg_model_num_classes(ck->model) > 0 ? CG_ARCH_CLASSIFIER : ck->arch;
    if (want >= 0 && got != (cg_arch)want) {
        fprintf(stderr, "cgrad %s: %s holds a %s model%s; %s needs %s\n", cmd, path, cg_arch_name(ck->arch),
                got != ck->arch ? " with a classification head" : "", cmd, cg_arch_name((cg_arch)want));
        cli_ckpt_free(ck);
        return 1;
    }
    return 0;
}

/* False (message naming the flag and the model's limit) when a size flag exceeds what the model has. */
static bool within(const cli_args *a, const char *flag, int64_t value, int64_t limit, const char *what) {
    if (value <= limit) return true;
    fprintf(stderr, "cgrad %s: %s %lld exceeds %s (%lld) of %s\n", a->cmd, flag, (long long)value, what, (long long)limit,
            cli_str(a, "--checkpoint", "?"));
    return false;
}

/* Words joined by spaces, or NULL when there are none. */
static char *join(const char **words, int n) {
    if (n == 0) return NULL;
    size_t len = 1;
    for (int i = 0; i < n; i++) len += strlen(words[i]) + 1;
    char *s = malloc(len);
    if (!s) return NULL;
    s[0] = 0;
    for (int i = 0; i < n; i++) strcat(strcat(s, i ? " " : ""), words[i]);
    return s;
}

/* Calls fn on each text: the positional words (each one a text when apart, else all as one text),
 * or each line of stdin when there are none. */
static int each_text(const char **words, int n, bool apart, int (*fn)(void *ctx, const char *text), void *ctx) {
    for (int i = 0; apart && i < n; i++) {
        int rc = fn(ctx, words[i]);
        if (rc || i == n - 1) return rc;
    }
    char *joined = join(words, n);
    if (joined) {
        int rc = fn(ctx, joined);
        free(joined);
        return rc;
    }
    char line[1 << 16];
    int rc = 0;
    while (!rc && fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\r\n")] = 0;
        if (*line) rc = fn(ctx, line);
    }
    return rc;
}

/* ---- sample ---- */

const cli_opt cli_sample_opts[] = {
    CKPT,
    {"--prompt", CLI_STR, 0, 0, "text to continue (default: a newline or <|endoftext|>)"},
    {"--length", CLI_INT, 0, 1 << 26, "tokens to generate (500)"},
    {"--temperature", CLI_NUM, 0, DBL_MAX, "0: greedy (0.8)"},
    {"--top-k", CLI_INT, 0, 1 << 24, "keep the k likeliest tokens, at most the vocabulary (0: all)"},
    {"--top-p", CLI_NUM, 0, 1, "nucleus: the smallest set holding this probability (0: off)"},
    {"--seed", CLI_U64, 0, 0, "sampling seed (1337)"},
    {"--count", CLI_INT, 1, 1 << 20, "samples, each with the next seed (1)"},
    {"--no-cache", CLI_BARE, 0, 0, "recompute every step instead of the KV cache"},
    THREADS,
    END};

int cmd_sample(int argc, char **argv) {
    cli_args a;
    if (!cli_parse("sample", cli_sample_opts, argc, argv, &a) || !cli_words(&a, 0, 0, NULL) ||
        !cli_require(&a, "--checkpoint", "CKPT"))
        return 2;
    const int64_t length = cli_int(&a, "--length", 500), count = cli_int(&a, "--count", 1), top_k = cli_int(&a, "--top-k", 0);
    char what[64];
    snprintf(what, sizeof what, "--length %lld", (long long)length);
    if (cli_too_big("sample", what, 8.0 * (double)length)) return 2;
    cli_ckpt ck;
    int rc = open_ckpt(&a, -1, &ck);
    if (rc) return rc;
    if (!cg_model_is_decoder(ck.model)) {
        fprintf(stderr, "cgrad sample: %s holds a %s model; sample needs gpt2 or llama\n", cli_str(&a, "--checkpoint", "?"),
                cg_arch_name(ck.arch));
        cli_ckpt_free(&ck);
        return 1;
    }
    if (!within(&a, "--top-k", top_k, cg_tokenizer_vocab_size(ck.tok), "the vocabulary")) {
        cli_ckpt_free(&ck);
        return 2;
    }
    cg_sampling s = {.temperature = cli_num(&a, "--temperature", 0.8), .top_k = (int)top_k, .top_p = cli_num(&a, "--top-p", 0)};
    const uint64_t seed = cli_u64(&a, "--seed", 1337);
    const char *prompt = cli_str(&a, "--prompt", NULL);
    int32_t *ids = NULL, dflt = cli_gpt_default_prompt(ck.tok);
    int64_t n = 0, dropped = 0;
    if (prompt && *prompt) {
        if (cli_encode(ck.tok, prompt, &ids, &n, &dropped)) rc = cli_fail("sample", "cannot encode the prompt");
        else if (dropped) fprintf(stderr, "cgrad sample: %lld prompt characters are not in the vocabulary; skipped\n",
                                  (long long)dropped);
    }
    if (!rc && n == 0) {
        free(ids);
        ids = malloc(sizeof *ids);
        if (ids) ids[0] = dflt, n = 1;
    }
    for (int64_t c = 0; !rc && c < count; c++) {
        if (count > 1) printf("--- sample %lld ---\n", (long long)c + 1);
        if (cli_lm_write(stdout, ck.model, ck.tok, ids, n, length, &s, seed + (uint64_t)c, !cli_has(&a, "--no-cache")))
            rc = cli_fail("sample", "generation failed");
        printf("\n");
    }
    free(ids);
    cli_ckpt_free(&ck);
    return rc;
}

/* ---- translate ---- */

typedef struct {
    cli_ckpt *ck;
    int beam;
} tr_ctx;

static int translate_one(void *ctx, const char *text) {
    tr_ctx *c = ctx;
    cg_encdec *m = cg_model_encdec(c->ck->model);
    const cg_encdec_config *cfg = cg_encdec_cfg(m);
    int32_t *ids = NULL, out[512];
    int64_t n = 0, no = 0, dropped = 0;
    if (cli_encode(c->ck->tok, text, &ids, &n, &dropped)) return cli_fail("translate", "cannot encode the text");
    if (n > cfg->max_len) n = cfg->max_len;
    cg_status st = n ? cg_encdec_translate(m, ids, n, c->beam, cfg->max_len - 1, out, &no)
                     : cg_set_error(CG_ERR_ARG, "[translate] nothing to translate in '%s'", text);
    free(ids);
    if (st) return cli_fail("translate", "translation failed");
    int64_t k = 0;
    for (int64_t i = 0; i < no; i++) /* pad, bos and eos sit after the tokenizer's ids */
        if (out[i] < cg_tokenizer_vocab_size(c->ck->tok)) out[k++] = out[i];
    char *s = NULL;
    if (k && cg_tokenizer_decode(c->ck->tok, out, k, &s, NULL)) return cli_fail("translate", "cannot decode");
    for (char *p = s; p && *p; p++) /* one line out per text in */
        if (*p == '\n' || *p == '\r') *p = ' ';
    printf("%s\n", s ? s : "");
    fflush(stdout);
    free(s);
    return 0;
}

const cli_opt cli_translate_opts[] = {
    CKPT, {"--beam", CLI_INT, 1, 64, "beam width, at most the target vocabulary (1: greedy)"}, THREADS, END};

int cmd_translate(int argc, char **argv) {
    cli_args a;
    if (!cli_parse("translate", cli_translate_opts, argc, argv, &a) || !cli_require(&a, "--checkpoint", "CKPT")) return 2;
    cli_ckpt ck;
    int rc = open_ckpt(&a, CG_ARCH_ENCDEC, &ck);
    if (rc) return rc;
    tr_ctx c = {&ck, (int)cli_int(&a, "--beam", 1)};
    if (!within(&a, "--beam", c.beam, cg_encdec_cfg(cg_model_encdec(ck.model))->tgt_vocab_size, "the target vocabulary"))
        rc = 2;
    else rc = each_text(a.words, a.n_words, false, translate_one, &c);
    cli_ckpt_free(&ck);
    return rc;
}

/* ---- fill-mask ---- */

const cli_opt cli_fill_mask_opts[] = {
    CKPT, {"--top-k", CLI_INT, 1, 1 << 24, "tokens shown, at most the vocabulary (5)"}, THREADS, END};

int cmd_fill_mask(int argc, char **argv) {
    cli_args a;
    if (!cli_parse("fill-mask", cli_fill_mask_opts, argc, argv, &a) || !cli_require(&a, "--checkpoint", "CKPT") ||
        !cli_words(&a, 1, INT32_MAX, "the text, with [MASK]"))
        return 2;
    cli_ckpt ck;
    int rc = open_ckpt(&a, CG_ARCH_BERT, &ck);
    if (rc) return rc;
    const int top_k = (int)cli_int(&a, "--top-k", 5);
    if (!within(&a, "--top-k", top_k, cg_bert_cfg(cg_model_bert(ck.model))->vocab_size, "the vocabulary")) {
        cli_ckpt_free(&ck);
        return 2;
    }
    char *text = join(a.words, a.n_words);
    if (!text) {
        cli_ckpt_free(&ck);
        return 1;
    }
    const int32_t mask = cg_tokenizer_token_id(ck.tok, "[MASK]"), cls = cg_tokenizer_token_id(ck.tok, "[CLS]"),
                  sep = cg_tokenizer_token_id(ck.tok, "[SEP]");
    /* The tokenizer splits "[MASK]" like any text, so the pieces between masks are encoded apart. */
    int64_t cap = (int64_t)strlen(text) + 3, n = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids), *top = malloc((size_t)top_k * sizeof *top);
    double *prob = malloc((size_t)top_k * sizeof *prob);
    if (!ids || !top || !prob || mask < 0 || cls < 0 || sep < 0) {
        fprintf(stderr, "cgrad fill-mask: the tokenizer has no [MASK], [CLS] or [SEP]\n");
        rc = 1;
    }
    if (!rc) ids[n++] = cls;
    bool any = false;
    for (char *p = text; !rc && p;) {
        char *m = strstr(p, "[MASK]");
        if (m) *m = 0;
        int32_t *piece;
        int64_t k;
        if (cg_tokenizer_encode(ck.tok, p, strlen(p), &piece, &k)) rc = cli_fail("fill-mask", "cannot encode the text");
        else {
            for (int64_t i = 0; i < k && n < cap - 2; i++) ids[n++] = piece[i];
            free(piece);
        }
        if (m) ids[n++] = mask, any = true;
        p = m ? m + 6 : NULL;
    }
    if (!rc && !any) {
        fprintf(stderr, "cgrad fill-mask: the text has no [MASK]\n");
        rc = 1;
    }
    const int64_t max = cg_bert_cfg(cg_model_bert(ck.model))->max_position_embeddings;
    if (!rc && n + 1 > max) {
        fprintf(stderr, "cgrad fill-mask: %lld tokens exceed the model's %lld positions\n", (long long)n + 1, (long long)max);
        rc = 1;
    }
    if (!rc) {
        ids[n++] = sep;
        if (cg_bert_fill_mask(cg_model_bert(ck.model), ids, n, mask, top_k, top, prob)) rc = cli_fail("fill-mask", "failed");
        for (int k = 0; !rc && k < top_k; k++) printf("%-16s %.4f\n", cg_tokenizer_token_str(ck.tok, top[k]), prob[k]);
    }
    free(ids);
    free(top);
    free(prob);
    free(text);
    cli_ckpt_free(&ck);
    return rc;
}

/* ---- classify ---- */

typedef struct {
    cli_ckpt *ck;
    int32_t cls_id;
    int64_t max_t;
    double *probs;
} cls_ctx;

static int classify_one(void *ctx, const char *text) {
    cls_ctx *c = ctx;
    cg_model *m = c->ck->model;
    int32_t *ids = NULL;
    int64_t n = 0;
    if (cli_encode(c->ck->tok, text, &ids, &n, NULL)) return cli_fail("classify", "cannot encode the text");
    cg_status st = cli_classify(m, ids, n, c->cls_id, c->max_t, c->probs);
    free(ids);
    if (st) return cli_fail("classify", "failed");
    const int64_t nc = cg_model_num_classes(m);
    int64_t best = 0;
    for (int64_t k = 1; k < nc; k++)
        if (c->probs[k] > c->probs[best]) best = k;
    printf("%s\t", best < c->ck->n_labels ? c->ck->labels[best] : "?");
    for (int64_t k = 0; k < nc; k++)
        printf("%s%s=%.4f", k ? " " : "", k < c->ck->n_labels ? c->ck->labels[k] : "?", c->probs[k]);
    printf("\t%s\n", text);
    fflush(stdout);
    return 0;
}

const cli_opt cli_classify_opts[] = {CKPT, THREADS, END};

int cmd_classify(int argc, char **argv) {
    cli_args a;
    if (!cli_parse("classify", cli_classify_opts, argc, argv, &a) || !cli_require(&a, "--checkpoint", "CKPT")) return 2;
    cli_ckpt ck;
    int rc = open_ckpt(&a, CG_ARCH_CLASSIFIER, &ck);
    if (rc) return rc;
    cg_textcls_options to;
    cg_textcls_options_default(ck.tok, &to); /* the same [CLS] rule as training */
    const int64_t nc = cg_model_num_classes(ck.model);
    cls_ctx c = {&ck, to.cls_id, cli_json_i64(ck.state, "graph_t", 0), malloc((size_t)nc * sizeof(double))};
    rc = c.probs ? each_text(a.words, a.n_words, true, classify_one, &c) : 1;
    free(c.probs);
    cli_ckpt_free(&ck);
    return rc;
}

/* ---- eval ---- */

/* The batch, at most the rows the data can fill: a larger one only allocates padding (a --batch
 * of 2^20 rows on a small file took 9.6 GB). Says so on stderr when it caps. */
static int64_t cap_batch(int64_t batch, int64_t rows, const char *unit, const char *path) {
    if (rows < 1 || batch <= rows) return batch;
    fprintf(stderr, "cgrad eval: batch of %lld rows capped at %lld, the %s in %s\n", (long long)batch, (long long)rows,
            unit, path);
    return rows;
}

/* Loss over the whole file in consecutive windows of the model's context. */
static int eval_lm(cli_ckpt *ck, const char *path, int64_t batch) {
    const int64_t t = cg_model_context(ck->model);
    char *text;
    size_t len;
    if (cg_read_text_file(path, &text, &len)) return cli_fail("eval", "cannot read the data");
    int32_t *ids = NULL;
    int64_t n = 0, dropped = 0;
    cg_status st = cli_encode(ck->tok, text, &ids, &n, &dropped);
    int64_t chars = cli_utf8_count(text, len);
    free(text);
    if (st) return cli_fail("eval", "cannot encode the data");
    if (dropped) fprintf(stderr, "cgrad eval: %lld characters are not in the vocabulary; skipped\n", (long long)dropped);
    if (n < 2) {
        free(ids);
        fprintf(stderr, "cgrad eval: %s holds fewer than 2 tokens\n", path);
        return 1;
    }
    batch = cap_batch(batch, (n - 1 + t - 1) / t, "windows", path); /* rows past the data would be all padding */
    /* The first token is never predicted: its characters are not scored. */
    char *first = NULL;
    size_t flen = 0;
    if (!cg_tokenizer_decode(ck->tok, ids, 1, &first, &flen)) chars -= cli_utf8_count(first, flen);
    free(first);
    cg_graph *g = cg_graph_new(CG_EVAL);
    cg_model_graph mg;
    const bool built = g && !cg_model_build(g, ck->model, batch, t, 0, &mg);
    cg_tensor *x = built ? cg_model_graph_input(&mg, "input_ids") : NULL, *y = built ? cg_model_graph_input(&mg, "targets") : NULL;
    cg_tensor *loss = built ? mg.loss : NULL;
    double nats = 0;
    int64_t scored = 0;
    if (!loss) st = CG_ERR_SHAPE;
    for (int64_t o = 0; !st && o < n - 1;) {
        int64_t in_batch = 0;
        for (int64_t b = 0; b < batch; b++) {
            int32_t *xr = cg_idata(x) + b * t, *yr = cg_idata(y) + b * t;
            for (int64_t i = 0; i < t; i++, o += o < n - 1) {
                bool ok = o < n - 1;
                xr[i] = ok ? ids[o] : 0;
                yr[i] = ok ? ids[o + 1] : CG_IGNORE_INDEX;
                in_batch += ok;
            }
        }
        if (!(st = cg_graph_forward(g))) nats += cg_item(loss) * (double)in_batch, scored += in_batch;
    }
    cg_graph_free(g);
    free(ids);
    if (st) return cli_fail("eval", "forward failed");
    const double mean = nats / (double)scored;
    printf("%s: %lld tokens scored (windows of %lld), %lld characters\n", path, (long long)scored, (long long)t,
           (long long)chars);
    printf("loss %.4f nats/token  perplexity %.3f  bits_per_char %.4f\n", mean, exp(mean), nats / (double)chars / log(2.0));
    return 0;
}

/* An image model over the test split of an image set: loss and accuracy over every test image. */
static int eval_images(cli_ckpt *ck, const char *data, int64_t batch) {
    cli_task t;
    if (cli_task_open(&t, ck->arch, NULL, data, NULL, 0.0, batch, 0)) return cli_fail("eval", "cannot load the images");
    int64_t chw[3];
    cg_model_image_shape(ck->model, chw);
    int rc = 0;
    if (t.img[1].h != chw[1] || t.img[1].w != chw[2] || t.img[1].num_classes > cg_model_num_classes(ck->model)) {
        fprintf(stderr, "cgrad eval: %s: %lldx%lld images with %d classes; the model takes %lldx%lld and %lld classes\n",
                cli_image_dir(data), (long long)t.img[1].h, (long long)t.img[1].w, (int)t.img[1].num_classes,
                (long long)chw[1], (long long)chw[2], (long long)cg_model_num_classes(ck->model));
        rc = 1;
    }
    if (batch > t.img[1].n) t.batch = batch = t.img[1].n;
    cg_graph *g = rc ? NULL : cg_graph_new(CG_EVAL);
    cg_model_graph mg;
    cli_eval e;
    if (!rc && (!g || cg_model_build(g, ck->model, batch, 0, 0, &mg))) rc = cli_fail("eval", "cannot build the graph");
    if (!rc && cli_task_eval(&t, true, g, &mg, INT64_MAX, NULL, &e)) rc = cli_fail("eval", "evaluation failed");
    if (!rc) {
        printf("%s (test split): %lld batches of %lld\n", cli_image_dir(data), (long long)e.batches, (long long)batch);
        printf("loss %.4f nats/image\naccuracy %.4f over %lld images\n", e.loss, e.accuracy, (long long)e.items);
    }
    cg_graph_free(g);
    cli_task_free(&t);
    return rc;
}

const cli_opt cli_eval_opts[] = {
    CKPT,
    {"--data", CLI_IN, 0, 0, "text (gpt2, llama, bert), TSV (encdec, classifier), or images (vit, cnn: fashion-mnist or an IDX directory; its test split) to score"},
    {"--batch", CLI_INT, 1, 1 << 20, "rows per batch (the training batch)"},
    {"--batches", CLI_INT, 1, 1e15, "batches (bert: 50; others: the whole file)"},
    {"--exact", CLI_INT, 0, 1e15, "encdec: pairs decoded for exact match (all)"},
    THREADS,
    END};

int cmd_eval(int argc, char **argv) {
    cli_args a;
    if (!cli_parse("eval", cli_eval_opts, argc, argv, &a) || !cli_words(&a, 0, 0, NULL) ||
        !cli_require(&a, "--checkpoint", "CKPT") || !cli_require(&a, "--data", "FILE"))
        return 2;
    const char *data = cli_str(&a, "--data", NULL);
    cli_ckpt ck;
    int rc = open_ckpt(&a, -1, &ck);
    if (rc) return rc;
    const int64_t saved = cli_json_i64(ck.train, "batch", 8);
    int64_t batch = cli_int(&a, "--batch", saved >= 1 && saved <= 1 << 20 ? saved : 8);
    if (cg_model_is_decoder(ck.model)) {
        rc = eval_lm(&ck, data, batch);
        cli_ckpt_free(&ck);
        return rc;
    }
    if (cg_model_is_image(ck.model)) {
        rc = eval_images(&ck, data, batch);
        cli_ckpt_free(&ck);
        return rc;
    }
    int64_t context = cli_json_i64(ck.train, "context", 64);
    cli_task t;
    int32_t *map = NULL;
    const cg_arch task = cg_model_num_classes(ck.model) > 0 ? CG_ARCH_CLASSIFIER : ck.arch; /* bert: --head classify */
    if (cli_task_open(&t, task, ck.tok, data, NULL, 0.0, batch, context)) {
        cli_ckpt_free(&ck);
        return cli_fail("eval", "cannot load the data");
    }
    t.batch = batch = t.s2s ? cap_batch(batch, cg_seq2seq_data_count(t.s2s, false), "pairs", data)
                      : t.cls ? cap_batch(batch, cg_textcls_data_count(t.cls, false), "examples", data)
                      : t.mlm ? cap_batch(batch, cg_mlm_data_count(t.mlm, false), "sentences", data) : batch;
    t.eval_seed = 20240601; /* fixed masks and pairs, so two checkpoints see the same batches */
    int64_t majority = 0;
    if (t.cls) { /* the file's labels, in the checkpoint's numbering */
        int32_t nl = cg_textcls_num_labels(t.cls);
        map = malloc((size_t)nl * sizeof *map);
        for (int32_t i = 0; map && i < nl; i++) {
            map[i] = -1;
            for (int k = 0; k < ck.n_labels; k++)
                if (!strcmp(ck.labels[k], cg_textcls_label_name(t.cls, i))) map[i] = k;
            if (map[i] < 0) {
                fprintf(stderr, "cgrad eval: label '%s' of %s is not one the model knows\n", cg_textcls_label_name(t.cls, i), data);
                rc = 1;
            }
        }
        t.label_map = map;
        int64_t n = cg_textcls_data_count(t.cls, false), *count = calloc((size_t)nl, sizeof *count);
        for (int64_t i = 0; count && i < n; i++) {
            const int32_t *ids;
            int64_t len;
            int32_t y;
            cg_textcls_example(t.cls, false, i, &ids, &len, &y);
            count[y]++;
        }
        for (int32_t i = 0; count && i < nl; i++)
            if (count[i] > majority) majority = count[i];
        free(count);
    }
    if (t.s2s) {
        const cg_encdec_config *c = cg_encdec_cfg(cg_model_encdec(ck.model));
        if (c->pad_id != t.pad_id || c->bos_id != t.bos_id || c->eos_id != t.eos_id) {
            fprintf(stderr, "cgrad eval: the checkpoint's special ids do not follow its tokenizer\n");
            rc = 1;
        }
    }
    cg_graph *g = rc ? NULL : cg_graph_new(CG_EVAL);
    cg_model_graph mg;
    if (!rc && (!g || cg_model_build(g, ck.model, batch, t.t, t.s, &mg))) rc = cli_fail("eval", "cannot build the graph");
    cli_eval e;
    const int64_t batches = cli_int(&a, "--batches", task == CG_ARCH_BERT ? 50 : INT64_MAX);
    if (!rc && cli_task_eval(&t, false, g, &mg, batches, NULL, &e)) rc = cli_fail("eval", "evaluation failed");
    if (!rc) {
        printf("%s: %lld batches of %lld\n", data, (long long)e.batches, (long long)batch);
        if (task == CG_ARCH_BERT)
            printf("loss %.4f  mlm_loss %.4f (perplexity %.2f)  nsp_loss %.4f\n", e.loss, e.mlm_loss, exp(e.mlm_loss),
                   e.nsp_loss);
        else printf("loss %.4f nats/%s  perplexity %.3f\n", e.loss, t.cls ? "example" : "token", exp(e.loss));
        if (t.cls) {
            int64_t n = cg_textcls_data_count(t.cls, false);
            printf("accuracy %.4f over %lld examples (majority class %.4f)\n", e.accuracy, (long long)e.items,
                   (double)majority / (double)n);
        }
        if (t.s2s) {
            /* Exact match over the file: the task's "held-out" split is empty here, so use all pairs. */
            int64_t n = cli_int(&a, "--exact", INT64_MAX), nv = cg_seq2seq_data_count(t.s2s, false), right = 0, k = 0;
            int32_t out[512];
            for (int64_t i = 0; i < n && i < nv; i++, k++) {
                const int32_t *src, *tgt;
                int64_t ns, nt, no = 0;
                cg_seq2seq_example(t.s2s, false, i, &src, &ns, &tgt, &nt);
                if (ns > t.s) ns = t.s;
                if (cg_encdec_translate(cg_model_encdec(ck.model), src, ns, 1, nt + 1, out, &no)) {
                    rc = cli_fail("eval", "translation failed");
                    break;
                }
                right += no == nt && !memcmp(out, tgt, (size_t)nt * sizeof *out);
            }
            if (!rc) printf("exact_match %.4f over %lld pairs (greedy)\n", k ? (double)right / (double)k : 0.0, (long long)k);
        }
    }
    cg_graph_free(g);
    free(map);
    cli_task_free(&t);
    cli_ckpt_free(&ck);
    return rc;
}

/* ---- info ---- */

const cli_opt cli_info_opts[] = {CKPT, {"--system", CLI_BARE, 0, 0, "this machine instead: kernels, threads, bf16 products"}, END};

int cmd_info(int argc, char **argv) {
    cli_args a;
    if (!cli_parse("info", cli_info_opts, argc, argv, &a)) return 2;
    if (cli_has(&a, "--system")) {
        if (cli_has(&a, "--checkpoint") || !cli_words(&a, 0, 0, NULL)) {
            if (cli_has(&a, "--checkpoint")) fprintf(stderr, "cgrad info: --system takes no checkpoint\n");
            return 2;
        }
        printf("%s\n%s\n", cg_build_info(), cg_runtime_info());
        cli_print_bf16_kernel("");
        return 0;
    }
    if (
        !cli_words(&a, cli_has(&a, "--checkpoint") ? 0 : 1, cli_has(&a, "--checkpoint") ? 0 : 1, "the checkpoint: CKPT or --checkpoint CKPT"))
        return 2;
    cli_value v;
    if (a.n_words && !cli_check_value("info", &cli_info_opts[0], a.words[0], &v)) return 2;
    const char *path = a.n_words ? a.words[0] : cli_str(&a, "--checkpoint", NULL);
    cli_ckpt ck;
    if (cli_ckpt_load(path, 0.0, &ck)) return cli_fail("info", "cannot load the checkpoint");
    const char *kinds[] = {"char", "bpe", "wordpiece", "hf"};
    char *cfg = cg_model_config_json(ck.model);
    printf("checkpoint  %s (%lld bytes)\n", path, ck.file_bytes);
    printf("arch        %s\n", cg_arch_name(ck.arch));
    printf("config      %s\n", cfg ? cfg : "?");
    printf("parameters  %lld in %d tensors\n", (long long)cg_params_numel(ck.ps), cg_params_count(ck.ps));
    printf("step        %lld of %lld (optimizer step %lld)\n", (long long)cli_json_i64(ck.state, "step", 0),
           (long long)cli_json_i64(ck.train, "steps", 0), (long long)cli_json_i64(ck.state, "optim_steps", 0));
    printf("tokenizer   %s, %d ids\n", kinds[cg_tokenizer_kind(ck.tok)], (int)cg_tokenizer_vocab_size(ck.tok));
    if (ck.n_labels) {
        printf("labels     ");
        for (int i = 0; i < ck.n_labels; i++) printf(" %s", ck.labels[i]);
        printf("\n");
    }
    printf("data        %s (%lld bytes, crc32 %08llx)\n", cli_json_str(ck.train, "data", "?"),
           (long long)cli_json_i64(ck.state, "data_bytes", 0), (unsigned long long)cli_json_u64(ck.state, "data_crc32", 0));
    printf("losses      train %.4f, held-out %.4f\n", cli_json_num(ck.state, "train_loss", NAN),
           cli_json_num(ck.state, "val_loss", NAN));
    printf("elapsed     %.1f s on %lld threads\n", cli_json_num(ck.state, "elapsed_s", 0),
           (long long)cli_json_i64(ck.state, "threads", 0));
    { /* crc32 of the raw bytes: two runs that should match bit for bit are compared by this line */
        const int64_t span = cg_params_span(ck.ps);
        const size_t bytes = (size_t)span * sizeof(cg_real);
        uLong pc = crc32(0L, (const Bytef *)cg_params_values(ck.ps), (uInt)bytes), mc = crc32(0L, Z_NULL, 0);
        cg_real *m = malloc(bytes ? bytes : 1);
        bool moments = m && cg_st_find(ck.st, "optim.m1") >= 0 && cg_st_find(ck.st, "optim.m2") >= 0;
        for (int k = 0; moments && k < 2; k++) {
            moments = !cg_st_read(ck.st, k ? "optim.m2" : "optim.m1", m, 1, &span);
            if (moments) mc = crc32(mc, (const Bytef *)m, (uInt)bytes);
        }
        free(m);
        printf("digest      parameters crc32 %08lx, optimizer moments %s%08lx\n", (unsigned long)pc,
               moments ? "crc32 " : "none ", moments ? (unsigned long)mc : 0UL);
        printf("ranks       %lld (world size that trained it)\n", (long long)cli_json_i64(ck.state, "world_size", 1));
    }
    char *train = cJSON_PrintUnformatted(ck.train);
    printf("training    %s\n", train ? train : "{}");
    free(train);
    free(cfg);
    cli_ckpt_free(&ck);
    return 0;
}
