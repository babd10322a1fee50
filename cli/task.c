/* SPDX-License-Identifier: MIT */
/* The cgrad command's tasks: per architecture, the data that feeds a training graph, held-out
 * evaluation, and a few worked examples. Batches are written straight into the graph's named
 * int32 inputs, so a step copies nothing and allocates nothing. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/session.h"

int cli_fail(const char *cmd, const char *what) {
    const char *e = cg_last_error();
    fprintf(stderr, "cgrad %s: %s%s%s\n", cmd, what, *e ? ": " : "", e);
    return 1;
}

/* ---- tokenizers and text ---- */

cg_tokenizer *cli_tokenizer_make(const char *kind, const char *path, int64_t vocab_size, const char *text, size_t len) {
    cg_tokenizer *tok = NULL;
    if (path && *path) {
        tok = cg_tokenizer_load(path);
        if (!tok) return NULL;
        const char *names[] = {"char", "bpe", "wordpiece", "hf"};
        const char *got = names[cg_tokenizer_kind(tok)];
        if (kind && strcmp(kind, got)) {
            cg_set_error(CG_ERR_ARG, "[tokenizer] %s holds a %s tokenizer, --tokenizer says %s", path, got, kind);
            cg_tokenizer_free(tok);
            return NULL;
        }
        return tok;
    }
    if (!kind || !strcmp(kind, "char")) tok = cg_tokenizer_char_new(text, len);
    else if (!strcmp(kind, "bpe"))
        tok = vocab_size > 0 ? cg_tokenizer_bpe_train(text, len, (int32_t)vocab_size)
              : (path = cli_default_data("gpt2", "--tokenizer-path DIR")) ? cg_tokenizer_load(path) : NULL;
    else if (!strcmp(kind, "wordpiece"))
        tok = (path = cli_default_data("bert/vocab.txt", "--tokenizer-path FILE")) ? cg_tokenizer_load(path) : NULL;
    else cg_set_error(CG_ERR_ARG, "[tokenizer] unknown kind '%s' (char, bpe, wordpiece)", kind);
    return tok;
}

int64_t cli_utf8_count(const char *s, size_t len) {
    int64_t n = 0;
    for (size_t i = 0; i < len; i++) n += ((unsigned char)s[i] & 0xC0) != 0x80;
    return n;
}

cg_status cli_encode(const cg_tokenizer *tok, const char *text, int32_t **ids, int64_t *n, int64_t *dropped) {
    if (dropped) *dropped = 0;
    size_t len = strlen(text);
    cg_status st = cg_tokenizer_encode(tok, text, len, ids, n);
    if (st != CG_ERR_RANGE && st != CG_ERR_ARG && st != CG_ERR_FORMAT) return st;
    if (cg_tokenizer_kind(tok) != CG_TOK_CHAR) return st;
    /* A character model cannot spell what it never saw: keep the characters it knows. */
    int32_t *out = malloc((len + 1) * sizeof *out);
    if (!out) return cg_set_error(CG_ERR_NOMEM, "[encode] out of memory");
    int64_t k = 0;
    for (size_t i = 0; i < len;) {
        size_t w = 1;
        while (i + w < len && ((unsigned char)text[i + w] & 0xC0) == 0x80 && w < 4) w++;
        char cp[5] = {0};
        memcpy(cp, text + i, w);
        int32_t id = cg_tokenizer_token_id(tok, cp);
        if (id >= 0) out[k++] = id;
        else if (dropped) (*dropped)++;
        i += w;
    }
    cg_clear_error();
    *ids = out;
    *n = k;
    return CG_OK;
}

int32_t cli_gpt_default_prompt(const cg_tokenizer *tok) {
    const char *tries[] = {"\n", "<|endoftext|>", "[CLS]", " "};
    for (int i = 0; i < 4; i++) {
        int32_t id = cg_tokenizer_token_id(tok, tries[i]);
        if (id >= 0) return id;
    }
    return 0;
}

static void write_ids(FILE *f, const cg_tokenizer *tok, const int32_t *ids, int64_t n) {
    char *text = NULL;
    size_t len = 0;
    if (n > 0 && !cg_tokenizer_decode(tok, ids, n, &text, &len)) fwrite(text, 1, len, f);
    free(text);
}

cg_status cli_lm_write(FILE *f, const cg_model *m, const cg_tokenizer *tok, const int32_t *prompt, int64_t n_prompt,
                       int64_t n, const cg_sampling *s, uint64_t seed, bool cache) {
    const int64_t ctx = cg_model_context(m), keep = ctx / 2 > 0 ? ctx / 2 : 1;
    if (ctx < 2) return cg_set_error(CG_ERR_ARG, "[sample] a context of %lld tokens leaves no room to generate", (long long)ctx);
    if (n < 0 || n_prompt < 1 || n > (int64_t)(SIZE_MAX / sizeof(int32_t) / 2) - n_prompt) /* the buffer's size must not wrap */
        return cg_set_error(CG_ERR_ARG, "[sample] %lld tokens after a %lld-token prompt: out of range", (long long)n,
                        (long long)n_prompt);
    int32_t *buf = malloc((size_t)(n_prompt + n + 1) * sizeof *buf), *out = malloc((size_t)ctx * sizeof *out);
    if (!buf || !out) {
        free(buf);
        free(out);
        return cg_set_error(CG_ERR_NOMEM, "[sample] out of memory");
    }
    memcpy(buf, prompt, (size_t)n_prompt * sizeof *buf);
    write_ids(f, tok, prompt, n_prompt);
    fflush(f);
    int64_t len = n_prompt, done = 0;
    cg_status st = CG_OK;
    for (uint64_t chunk = 0; done < n && !st; chunk++) {
        /* The first chunk sees as much prompt as fits; later ones the last half context. */
        int64_t p = chunk == 0 ? (len < ctx ? len : keep) : (len < keep ? len : keep);
        int64_t k = ctx - p < n - done ? ctx - p : n - done;
        st = cg_model_generate(m, buf + len - p, p, k, s, seed + 0x9E3779B97F4A7C15ull * chunk, cache, out);
        if (st) break;
        memcpy(buf + len, out + p, (size_t)k * sizeof *buf);
        write_ids(f, tok, buf + len, k);
        fflush(f);
        len += k;
        done += k;
    }
    free(buf);
    free(out);
    return st;
}

/* ---- opening data ---- */

void cli_task_free(cli_task *t) {
    cg_lm_data_free(t->lm);
    cg_mlm_data_free(t->mlm);
    cg_seq2seq_data_free(t->s2s);
    cg_textcls_data_free(t->cls);
    cg_image_set_free(&t->img[0]);
    cg_image_set_free(&t->img[1]);
    memset(t, 0, sizeof *t);
}

/* Fashion-MNIST's pixel mean and standard deviation over its training images (bench/vision_torch.py
 * normalises with the same two numbers). */
#define IMAGE_MEAN 0.2860
#define IMAGE_STD 0.3530
#define FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"

const char *cli_image_dir(const char *data) {
    return !data || !*data || !strcmp(data, "fashion-mnist") ? FASHION_MNIST_DIR : data;
}

int64_t cli_task_count(const cli_task *t, bool val) {
    if (t->img[0].n) return t->img[val].n;
    if (t->s2s) return cg_seq2seq_data_count(t->s2s, val);
    if (t->cls) return cg_textcls_data_count(t->cls, val);
    return 0;
}

static cg_status open_images(cli_task *t, const char *data) {
    const char *dir = cli_image_dir(data);
    cg_status st = cg_image_set_load_dir(dir, false, &t->img[0]);
    if (!st) st = cg_image_set_load_dir(dir, true, &t->img[1]);
    if (st && !strcmp(dir, FASHION_MNIST_DIR))
        return cg_set_error(st, "%s (is Debian's dataset-fashion-mnist installed? ./setup.sh installs it)", cg_last_error());
    if (!st && (t->img[1].h != t->img[0].h || t->img[1].w != t->img[0].w))
        st = cg_set_error(CG_ERR_FORMAT, "[data] %s: test images are %lldx%lld, training images %lldx%lld", dir,
                          (long long)t->img[1].h, (long long)t->img[1].w, (long long)t->img[0].h, (long long)t->img[0].w);
    return st;
}

static cg_status open_lm(cli_task *t, const char *path, double val_fraction) {
    char *text;
    size_t len;
    cg_status st = cg_read_text_file(path, &text, &len);
    if (st) return st;
    int32_t *ids = NULL;
    int64_t n = 0, dropped = 0;
    st = cli_encode(t->tok, text, &ids, &n, &dropped);
    free(text);
    if (st) return st;
    if (dropped) fprintf(stderr, "cgrad: note: %lld characters of %s are not in the tokenizer and were skipped\n",
                         (long long)dropped, path);
    t->lm = cg_lm_data_new(ids, n, val_fraction);
    free(ids);
    if (!t->lm) return CG_ERR_ARG;
    if (cg_lm_data_count(t->lm, false) < t->t + 1)
        return cg_set_error(CG_ERR_ARG, "[data] %s: the training split holds %lld tokens, a context of %lld needs %lld", path,
                        (long long)cg_lm_data_count(t->lm, false), (long long)t->t, (long long)t->t + 1);
    return CG_OK;
}

static cg_status open_mlm(cli_task *t, const char *path, double val_fraction) {
    cg_mlm_options o;
    cg_status st = cg_mlm_options_default(t->tok, &o);
    if (st) return st;
    o.val_fraction = val_fraction;
    char *text;
    size_t len;
    if ((st = cg_read_text_file(path, &text, &len))) return st;
    t->mlm = cg_mlm_data_new(text, len, t->tok, &o);
    free(text);
    if (!t->mlm) return CG_ERR_ARG;
    if (t->t < 5) return cg_set_error(CG_ERR_ARG, "[data] bert rows need a context of at least 5, got %lld", (long long)t->t);
    return CG_OK;
}

static cg_status open_s2s(cli_task *t, const char *path, const char *val_path, double val_fraction, int64_t context) {
    const int32_t v = cg_tokenizer_vocab_size(t->tok);
    t->pad_id = v, t->bos_id = v + 1, t->eos_id = v + 2;
    cg_seq2seq_options o = {.pad_id = t->pad_id, .bos_id = t->bos_id, .eos_id = t->eos_id, .pad_to_max = true,
                            .val_fraction = val_path ? 0.0 : val_fraction};
    /* Batches are as long as the longest pair, cut to the context. */
    t->s2s = cg_seq2seq_data_load(path, val_path, t->tok, NULL, &o);
    if (!t->s2s) return CG_ERR_ARG;
    int64_t s, tt;
    cg_seq2seq_data_caps(t->s2s, &s, &tt);
    if (s > context || tt > context) {
        cg_seq2seq_data_free(t->s2s);
        o.max_src = s < context ? s : context;
        o.max_tgt = tt < context ? tt : context;
        if (!(t->s2s = cg_seq2seq_data_load(path, val_path, t->tok, NULL, &o))) return CG_ERR_ARG;
        cg_seq2seq_data_caps(t->s2s, &s, &tt);
    }
    t->s = s, t->t = tt;
    return CG_OK;
}

static cg_status open_cls(cli_task *t, const char *path, const char *val_path, double val_fraction, int64_t context) {
    cg_textcls_options o;
    cg_textcls_options_default(t->tok, &o);
    o.pad_to_max = true;
    o.val_fraction = val_path ? 0.0 : val_fraction;
    t->pad_id = o.pad_id, t->cls_id = o.cls_id;
    t->cls = cg_textcls_data_load(path, val_path, t->tok, &o);
    if (!t->cls) return CG_ERR_ARG;
    if (cg_textcls_data_cap(t->cls) > context) {
        cg_textcls_data_free(t->cls);
        o.max_len = context;
        if (!(t->cls = cg_textcls_data_load(path, val_path, t->tok, &o))) return CG_ERR_ARG;
    }
    t->t = cg_textcls_data_cap(t->cls);
    return CG_OK;
}

cg_status cli_task_open(cli_task *t, cg_arch arch, const cg_tokenizer *tok, const char *data_path,
                        const char *val_path, double val_fraction, int64_t batch, int64_t context) {
    memset(t, 0, sizeof *t);
    t->arch = arch, t->tok = tok, t->batch = batch, t->t = context, t->cls_id = -1;
    if (val_path && !*val_path) val_path = NULL;
    cg_status st = CG_ERR_ARG;
    switch (arch) {
    case CG_ARCH_GPT2:
    case CG_ARCH_LLAMA: st = open_lm(t, data_path, val_fraction); break;
    case CG_ARCH_BERT: st = open_mlm(t, data_path, val_fraction); break;
    case CG_ARCH_ENCDEC: st = open_s2s(t, data_path, val_path, val_fraction, context); break;
    case CG_ARCH_CLASSIFIER: st = open_cls(t, data_path, val_path, val_fraction, context); break;
    case CG_ARCH_VIT:
    case CG_ARCH_CNN: st = open_images(t, data_path); break;
    }
    if (st) cli_task_free(t);
    return st;
}

/* ---- batches ---- */

static int32_t *in(const cg_model_graph *mg, const char *name) { return cg_idata(cg_model_graph_input(mg, name)); }
static cg_real *pixels(const cg_model_graph *mg) { return cg_data(cg_model_graph_input(mg, "pixel_values")); }

/* One batch of a split into the graph's inputs; r/c are the draws to use. */
static cg_status fill(cli_task *t, bool val, cg_rng *r, cg_data_cursor *c, const cg_model_graph *mg) {
    switch (t->arch) {
    case CG_ARCH_GPT2:
    case CG_ARCH_LLAMA: return cg_lm_batch(t->lm, val, r, t->batch, t->t, in(mg, "input_ids"), in(mg, "targets"));
    case CG_ARCH_BERT:
        return cg_mlm_batch(t->mlm, val, r, t->batch, t->t, in(mg, "input_ids"), in(mg, "token_type_ids"),
                            in(mg, "attention_mask"), in(mg, "labels"), in(mg, "next_sentence_label"));
    case CG_ARCH_ENCDEC: {
        int64_t s, tt;
        cg_status st = cg_seq2seq_batch(t->s2s, val, c, t->batch, in(mg, "src"), in(mg, "src_mask"), in(mg, "tgt_in"),
                                        in(mg, "tgt_out"), &s, &tt);
        if (!st && (s != t->s || tt != t->t))
            st = cg_set_error(CG_ERR_STATE, "[data] seq2seq batch [%lld, %lld] does not match the graph's [%lld, %lld]",
                          (long long)s, (long long)tt, (long long)t->s, (long long)t->t);
        return st;
    }
    case CG_ARCH_CLASSIFIER: {
        int64_t tt;
        cg_status st = cg_textcls_batch(t->cls, val, c, t->batch, in(mg, "input_ids"), in(mg, "attention_mask"),
                                        in(mg, "labels"), &tt);
        if (!st && tt != t->t)
            st = cg_set_error(CG_ERR_STATE, "[data] text batch of %lld tokens does not match the graph's %lld", (long long)tt,
                          (long long)t->t);
        return st;
    }
    case CG_ARCH_VIT:
    case CG_ARCH_CNN:
        return cg_image_batch(&t->img[val], c, t->batch, IMAGE_MEAN, IMAGE_STD, pixels(mg), in(mg, "labels"));
    }
    return CG_ERR_ARG;
}

cg_status cli_task_train_batch(cli_task *t, const cg_model_graph *mg) { return fill(t, false, &t->rng, &t->cur, mg); }

/* Row b of a seq2seq batch from one pair, cut as the loader cuts; returns target tokens scored. */
static int64_t s2s_row(cli_task *t, const cg_model_graph *mg, int64_t b, const int32_t *src, int64_t ns,
                       const int32_t *tgt, int64_t nt) {
    int32_t *s = in(mg, "src") + b * t->s, *sm = in(mg, "src_mask") + b * t->s, *ti = in(mg, "tgt_in") + b * t->t,
            *to = in(mg, "tgt_out") + b * t->t;
    if (ns > t->s) ns = t->s;
    if (nt > t->t - 1) nt = t->t - 1;
    for (int64_t i = 0; i < t->s; i++) s[i] = i < ns ? src[i] : t->pad_id, sm[i] = i < ns;
    ti[0] = t->bos_id;
    for (int64_t i = 1; i < t->t; i++) ti[i] = i - 1 < nt ? tgt[i - 1] : t->pad_id;
    for (int64_t i = 0; i < t->t; i++) to[i] = i < nt ? tgt[i] : i == nt ? t->eos_id : CG_IGNORE_INDEX;
    return nt + 1;
}

/* Row b of a classification batch; label -100 scores nothing. */
static void cls_row(cli_task *t, const cg_model_graph *mg, int64_t b, const int32_t *ids, int64_t n, int32_t label) {
    int32_t *x = in(mg, "input_ids") + b * t->t, *am = in(mg, "attention_mask") + b * t->t;
    int64_t k = 0;
    if (t->cls_id >= 0) x[k++] = t->cls_id;
    for (int64_t i = 0; i < n && k < t->t; i++) x[k++] = ids[i];
    for (int64_t i = 0; i < t->t; i++) am[i] = i < k || i == 0;
    for (int64_t i = k; i < t->t; i++) x[i] = t->pad_id;
    in(mg, "labels")[b] = label;
}

/* Held-out examples, each exactly once, in file order (TSV archs). */
static cg_status eval_examples(cli_task *t, bool val, cg_graph *g, const cg_model_graph *mg, int64_t max_batches,
                               volatile sig_atomic_t *stop, cli_eval *o) {
    const bool s2s = t->arch == CG_ARCH_ENCDEC;
    int64_t n = s2s ? cg_seq2seq_data_count(t->s2s, val) : cg_textcls_data_count(t->cls, val);
    double nats = 0;
    int64_t right = 0;
    const int rank = cg_dist_rank(t->dist), ranks = cg_dist_size(t->dist);
    for (int64_t i = 0; i < n && o->batches < max_batches && !(stop && *stop); o->batches++) {
        int64_t scored = 0;
        if (o->batches % ranks != rank) { /* another rank's batch */
            i += t->batch;
            continue;
        }
        for (int64_t b = 0; b < t->batch; b++, i++) {
            const int32_t *src, *tgt;
            int64_t ns = 1, nt = 0;
            int32_t y = 0;
            bool real = i < n;
            if (s2s) {
                if (real) cg_seq2seq_example(t->s2s, val, i, &src, &ns, &tgt, &nt);
                else src = &t->bos_id, tgt = NULL;
                int64_t k = s2s_row(t, mg, b, src, ns, tgt, nt);
                if (real) scored += k;
                else for (int64_t j = 0; j < t->t; j++) in(mg, "tgt_out")[b * t->t + j] = CG_IGNORE_INDEX;
            } else {
                const int32_t *ids = &t->pad_id;
                int64_t m = 1;
                if (real) cg_textcls_example(t->cls, val, i, &ids, &m, &y);
                if (real && t->label_map) y = t->label_map[y];
                cls_row(t, mg, b, ids, m, real ? y : CG_IGNORE_INDEX);
                scored += real;
            }
        }
        cg_status st = cg_graph_forward(g);
        if (st) return st;
        nats += cg_item(mg->loss) * (double)scored;
        o->items += scored;
        if (!s2s) {
            const int64_t c = cg_dim(mg->logits, -1);
            const cg_real *lg = cg_data(mg->logits);
            const int32_t *lb = in(mg, "labels");
            for (int64_t b = 0; b < t->batch; b++) {
                if (lb[b] < 0) continue;
                int64_t best = 0;
                for (int64_t j = 1; j < c; j++)
                    if (lg[b * c + j] > lg[b * c + best]) best = j;
                right += best == lb[b];
            }
        }
    }
    double sums[3] = {nats, (double)o->items, (double)right};
    cg_status st = cg_dist_sum(t->dist, sums, 3);
    if (st) return st;
    nats = sums[0], o->items = (int64_t)sums[1], right = (int64_t)sums[2];
    o->loss = o->items ? nats / (double)o->items : NAN;
    if (!s2s) o->accuracy = o->items ? (double)right / (double)o->items : NAN;
    return CG_OK;
}

/* Row-major argmax of row b of [rows, c] logits. */
static int64_t argmax_row(const cg_real *lg, int64_t b, int64_t c) {
    int64_t best = 0;
    for (int64_t j = 1; j < c; j++)
        if (lg[b * c + j] > lg[b * c + best]) best = j;
    return best;
}

/* Every image of a split once, in file order; the last batch padded with ignored rows. */
static cg_status eval_images(cli_task *t, bool val, cg_graph *g, const cg_model_graph *mg, int64_t max_batches,
                             volatile sig_atomic_t *stop, cli_eval *o) {
    const cg_image_set *s = &t->img[val];
    double nats = 0;
    int64_t right = 0;
    const int rank = cg_dist_rank(t->dist), ranks = cg_dist_size(t->dist);
    for (int64_t i = 0; i < s->n && o->batches < max_batches && !(stop && *stop); o->batches++, i += t->batch) {
        if (o->batches % ranks != rank) continue; /* another rank's batch */
        cg_image_rows(s, i, t->batch, IMAGE_MEAN, IMAGE_STD, pixels(mg), in(mg, "labels"));
        cg_status st = cg_graph_forward(g);
        if (st) return st;
        const int64_t scored = s->n - i < t->batch ? s->n - i : t->batch, c = cg_dim(mg->logits, -1);
        nats += cg_item(mg->loss) * (double)scored;
        o->items += scored;
        for (int64_t b = 0; b < scored; b++) right += argmax_row(cg_data(mg->logits), b, c) == in(mg, "labels")[b];
    }
    double sums[3] = {nats, (double)o->items, (double)right};
    cg_status st = cg_dist_sum(t->dist, sums, 3);
    if (st) return st;
    o->items = (int64_t)sums[1];
    o->loss = o->items ? sums[0] / sums[1] : NAN;
    o->accuracy = o->items ? sums[2] / sums[1] : NAN;
    return CG_OK;
}

cg_status cli_task_eval(cli_task *t, bool val, cg_graph *g, const cg_model_graph *mg, int64_t max_batches,
                        volatile sig_atomic_t *stop, cli_eval *o) {
    memset(o, 0, sizeof *o);
    o->loss = o->mlm_loss = o->nsp_loss = o->accuracy = NAN;
    if (t->arch == CG_ARCH_VIT || t->arch == CG_ARCH_CNN) return eval_images(t, val, g, mg, max_batches, stop, o);
    if (t->arch == CG_ARCH_ENCDEC || t->arch == CG_ARCH_CLASSIFIER) return eval_examples(t, val, g, mg, max_batches, stop, o);
    bool empty = t->lm ? cg_lm_data_count(t->lm, val) < t->t + 1 : cg_mlm_data_count(t->mlm, val) < 2;
    if (empty) return CG_OK;
    /* The same held-out batches every time, drawn apart from the training stream. */
    cg_rng r;
    cg_rng_seed(&r, t->eval_seed + (val ? 0 : 1));
    double sum = 0, mlm = 0, nsp = 0;
    const int rank = cg_dist_rank(t->dist), ranks = cg_dist_size(t->dist);
    for (; o->batches < max_batches && !(stop && *stop); o->batches++) {
        cg_status st = fill(t, val, &r, NULL, mg); /* every rank draws every batch, to stay on one stream */
        if (st) return st;
        if (o->batches % ranks != rank) continue;
        if ((st = cg_graph_forward(g))) return st;
        sum += cg_item(mg->loss);
        if (mg->mlm_loss) mlm += cg_item(mg->mlm_loss), nsp += cg_item(mg->nsp_loss);
    }
    double sums[3] = {sum, mlm, nsp};
    cg_status st = cg_dist_sum(t->dist, sums, 3);
    if (st) return st;
    sum = sums[0], mlm = sums[1], nsp = sums[2];
    if (o->batches) {
        o->loss = sum / (double)o->batches;
        o->items = o->batches * t->batch * t->t;
        if (mg->mlm_loss) o->mlm_loss = mlm / (double)o->batches, o->nsp_loss = nsp / (double)o->batches;
    }
    return CG_OK;
}

double cli_task_exact(cli_task *t, cg_model *m, int64_t n, int64_t *tried) {
    *tried = 0;
    cg_encdec *ed = cg_model_encdec(m);
    if (!ed || !t->s2s) return -1;
    int64_t nv = cg_seq2seq_data_count(t->s2s, true), right = 0;
    if (n > nv) n = nv;
    int32_t *out = malloc(512 * sizeof *out);
    for (int64_t i = 0; out && i < n; i++) {
        const int32_t *src, *tgt;
        int64_t ns, nt, no = 0;
        cg_seq2seq_example(t->s2s, true, i, &src, &ns, &tgt, &nt);
        if (ns > t->s) ns = t->s;
        /* One token past the target is enough to tell an exact answer from a longer one. */
        if (cg_encdec_translate(ed, src, ns, 1, nt + 1 < 511 ? nt + 1 : 511, out, &no)) break;
        right += no == nt && !memcmp(out, tgt, (size_t)nt * sizeof *out);
        (*tried)++;
    }
    free(out);
    return *tried ? (double)right / (double)*tried : -1;
}

/* ---- worked examples ---- */

/* Prints decoded ids with control characters shown as spaces, at most max bytes. */
static void print_text(FILE *f, const cg_tokenizer *tok, const int32_t *ids, int64_t n, size_t max) {
    char *text = NULL;
    size_t len = 0;
    if (n > 0 && !cg_tokenizer_decode(tok, ids, n, &text, &len)) {
        for (size_t i = 0; i < len; i++)
            if ((unsigned char)text[i] < 0x20) text[i] = ' ';
        if (len > max) {
            while (max > 0 && ((unsigned char)text[max] & 0xC0) == 0x80) max--;
            fprintf(f, "%.*s...", (int)max, text);
        } else fputs(text, f);
    }
    free(text);
}

static void show_lm(FILE *f, cli_task *t, cg_model *m, int n, uint64_t seed) {
    cg_sampling s = {.temperature = 0.8, .top_k = 0, .top_p = 0};
    int32_t p = cli_gpt_default_prompt(t->tok);
    int64_t len = cg_tokenizer_kind(t->tok) == CG_TOK_CHAR ? 300 : 100;
    for (int i = 0; i < n; i++) {
        fprintf(f, "--- sample %d (temperature 0.8) ---\n", i + 1);
        if (cli_lm_write(f, m, t->tok, &p, 1, len, &s, seed + (uint64_t)i, true))
            fprintf(f, "(sampling failed: %s)", cg_last_error());
        fputc('\n', f);
    }
}

static void show_bert(FILE *f, cli_task *t, cg_model *m, int n, uint64_t seed) {
    int64_t nv = cg_mlm_data_count(t->mlm, true), nt = cg_mlm_data_count(t->mlm, false);
    const int32_t cls = cg_tokenizer_token_id(t->tok, "[CLS]"), sep = cg_tokenizer_token_id(t->tok, "[SEP]"),
                  mask = cg_tokenizer_token_id(t->tok, "[MASK]");
    int32_t *row = malloc((size_t)t->t * sizeof *row);
    cg_rng r;
    cg_rng_seed(&r, seed);
    for (int shown = 0, tries = 0; row && shown < n && tries < 200; tries++) {
        const int32_t *ids;
        int64_t len, doc;
        int64_t pick = nv > 0 ? nt + (int64_t)(cg_rng_uniform(&r) * (double)nv) : (int64_t)(cg_rng_uniform(&r) * (double)nt);
        if (cg_mlm_sentence(t->mlm, pick, &ids, &len, &doc) || len < 6 || len > t->t - 2) continue;
        /* A whole word: not a ## piece, not followed by one, at least 3 letters. */
        int64_t at = 1 + (int64_t)(cg_rng_uniform(&r) * (double)(len - 2));
        const char *w = cg_tokenizer_token_str(t->tok, ids[at]), *nx = cg_tokenizer_token_str(t->tok, ids[at + 1]);
        if (!w || !nx || strlen(w) < 3 || !strncmp(w, "##", 2) || !strncmp(nx, "##", 2) || w[0] == '[') continue;
        row[0] = cls;
        memcpy(row + 1, ids, (size_t)len * sizeof *row);
        row[len + 1] = sep;
        row[1 + at] = mask;
        int32_t top[5];
        double prob[5];
        if (cg_bert_fill_mask(cg_model_bert(m), row, len + 2, mask, 5, top, prob)) break;
        fprintf(f, "  ");
        print_text(f, t->tok, row + 1, len, 200);
        fprintf(f, "\n    answer %s; model:", w);
        for (int k = 0; k < 5; k++) fprintf(f, " %s (%.3f)", cg_tokenizer_token_str(t->tok, top[k]), prob[k]);
        fputc('\n', f);
        shown++;
    }
    free(row);
}

static void show_encdec(FILE *f, cli_task *t, cg_model *m, int n) {
    int64_t nv = cg_seq2seq_data_count(t->s2s, true);
    int32_t out[512];
    for (int64_t i = 0; i < n && i < nv; i++) {
        const int32_t *src, *tgt;
        int64_t ns, nt, no = 0;
        cg_seq2seq_example(t->s2s, true, i, &src, &ns, &tgt, &nt);
        if (ns > t->s) ns = t->s;
        if (cg_encdec_translate(cg_model_encdec(m), src, ns, 1, t->t, out, &no)) break;
        int64_t k = 0;
        for (int64_t j = 0; j < no; j++)
            if (out[j] < cg_tokenizer_vocab_size(t->tok)) out[k++] = out[j];
        bool ok = no == nt && !memcmp(out, tgt, (size_t)nt * sizeof *out);
        fprintf(f, "  %s ", ok ? "ok  " : "MISS");
        print_text(f, t->tok, src, ns, 80);
        fprintf(f, "  ->  ");
        print_text(f, t->tok, out, k, 80);
        if (!ok) fprintf(f, "   (want "), print_text(f, t->tok, tgt, nt, 80), fputc(')', f);
        fputc('\n', f);
    }
}

static void show_cls(FILE *f, cli_task *t, cg_model *m, int n) {
    int64_t nv = cg_textcls_data_count(t->cls, true);
    const int32_t c = cg_textcls_num_labels(t->cls);
    double *p = malloc((size_t)c * sizeof *p);
    for (int64_t i = 0; p && i < n && i < nv; i++) {
        const int32_t *ids;
        int64_t len;
        int32_t y;
        cg_textcls_example(t->cls, true, i * (nv / n > 0 ? nv / n : 1), &ids, &len, &y);
        if (cli_classify(m, ids, len, t->cls_id, t->t, p)) break;
        int32_t best = 0;
        for (int32_t k = 1; k < c; k++)
            if (p[k] > p[best]) best = k;
        fprintf(f, "  %s %s (p=%.2f, truth %s): ", best == y ? "ok  " : "MISS", cg_textcls_label_name(t->cls, best),
                p[best], cg_textcls_label_name(t->cls, y));
        print_text(f, t->tok, ids, len, 100);
        fputc('\n', f);
    }
    free(p);
}

/* Fashion-MNIST's class names, by label. */
static const char *const fashion_names[10] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                              "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};

static void show_images(FILE *f, cli_task *t, cg_model *m, int n) {
    const cg_image_set *s = &t->img[1];
    const int64_t classes = cg_model_num_classes(m), hw = s->h * s->w;
    cg_graph *g = cg_graph_new(CG_EVAL);
    cg_tensor *x = g ? cg_input(g, "pixel_values", CG_REAL, 4, (int64_t[]){1, 1, s->h, s->w}) : NULL;
    cg_tensor *p = x ? cg_softmax(g, cg_model_class_logits(g, m, x, NULL)) : NULL;
    int32_t label;
    for (int64_t i = 0; p && hw > 0 && i < n && i < s->n; i++) {
        const int64_t at = i * (s->n / n > 0 ? s->n / n : 1);
        cg_image_rows(s, at, 1, IMAGE_MEAN, IMAGE_STD, cg_data(x), &label);
        if (cg_graph_forward(g)) break;
        const int64_t best = argmax_row(cg_data(p), 0, classes);
        char got[32], want[32];
        snprintf(got, sizeof got, "%s", classes == 10 ? fashion_names[best] : "class");
        snprintf(want, sizeof want, "%s", classes == 10 && label >= 0 && label < 10 ? fashion_names[label] : "class");
        fprintf(f, "  %s test image %lld: %s %lld (p=%.2f), truth %s %d\n", best == label ? "ok  " : "MISS", (long long)at,
                got, (long long)best, (double)cg_data(p)[best], want, (int)label);
    }
    cg_graph_free(g);
}

void cli_task_show(FILE *f, cli_task *t, cg_model *m, int n, uint64_t seed) {
    if (n <= 0) return;
    switch (t->arch) {
    case CG_ARCH_GPT2:
    case CG_ARCH_LLAMA: show_lm(f, t, m, n, seed); break;
    case CG_ARCH_BERT: fprintf(f, "fill-mask on held-out sentences:\n"), show_bert(f, t, m, n, seed); break;
    case CG_ARCH_ENCDEC: fprintf(f, "greedy decoding of held-out pairs:\n"), show_encdec(f, t, m, n); break;
    case CG_ARCH_CLASSIFIER: fprintf(f, "held-out predictions:\n"), show_cls(f, t, m, n); break;
    case CG_ARCH_VIT:
    case CG_ARCH_CNN: fprintf(f, "test-set predictions:\n"), show_images(f, t, m, n); break;
    }
    fflush(f);
}

cg_status cli_classify(cg_model *m, const int32_t *ids, int64_t n, int32_t cls_id, int64_t max_t, double *probs) {
    const int64_t max_len = cg_model_max_len(m), classes = cg_model_num_classes(m);
    if (max_t <= 0 || max_t > max_len) max_t = max_len;
    int64_t k = (cls_id >= 0) + n;
    if (k > max_t) k = max_t;
    if (k < 1) k = 1;
    cg_graph *g = cg_graph_new(CG_EVAL);
    cg_tensor *x = g ? cg_input(g, "input_ids", CG_INT32, 2, (int64_t[]){1, k}) : NULL;
    cg_tensor *p = x ? cg_softmax(g, cg_model_class_logits(g, m, x, NULL)) : NULL;
    cg_status st = p ? CG_OK : cg_set_error(CG_ERR_NOMEM, "[classify] cannot build the graph");
    if (!st) {
        int32_t *xi = cg_idata(x);
        int64_t j = 0;
        if (cls_id >= 0) xi[j++] = cls_id;
        for (int64_t i = 0; j < k; i++) xi[j++] = i < n ? ids[i] : 0;
        st = cg_graph_forward(g);
    }
    for (int64_t i = 0; !st && i < classes; i++) probs[i] = cg_data(p)[i];
    cg_graph_free(g);
    return st;
}
