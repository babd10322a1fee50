/* SPDX-License-Identifier: MIT */
/* Example files with one tab-separated pair a line: seq2seq ("source\ttarget") and text
 * classification ("label\ttext"), served in shuffled epochs. */
#include <stdlib.h>
#include <string.h>

#include "io/data_internal.h"

/* ---- sequence-to-sequence ---- */

struct cg_seq2seq_data {
    cg_seq2seq_options o;
    cgi_seqs src, tgt;
    int64_t n_train; /* pairs [0, n_train) train, the rest are held out */
    int64_t src_cap, tgt_cap;
    cgi_order order[2];
};

typedef struct {
    cg_seq2seq_data *d;
    const cg_tokenizer *src_tok, *tgt_tok;
} s2s_ctx;

static cg_status s2s_line(void *ctx, const char *path, int64_t line, const char *a, size_t na, const char *b,
                          size_t nb) {
    s2s_ctx *x = ctx;
    int32_t *src = NULL, *tgt = NULL;
    int64_t ns = 0, nt = 0;
    cg_status s = cgi_tsv_encode(x->src_tok, path, line, "source", a, na, &src, &ns);
    if (!s && ns == 0) s = cgi_fail(CG_ERR_FORMAT, "[data] %s:%lld: empty source", path, (long long)line);
    if (!s) s = cgi_tsv_encode(x->tgt_tok, path, line, "target", b, nb, &tgt, &nt);
    if (!s && (!cgi_seqs_push(&x->d->src, src, ns) || !cgi_seqs_push(&x->d->tgt, tgt, nt))) s = CG_ERR_NOMEM;
    free(src);
    free(tgt);
    return s;
}

void cg_seq2seq_data_free(cg_seq2seq_data *d) {
    if (!d) return;
    cgi_seqs_free(&d->src);
    cgi_seqs_free(&d->tgt);
    cgi_order_free(&d->order[0]);
    cgi_order_free(&d->order[1]);
    free(d);
}

cg_seq2seq_data *cg_seq2seq_data_load(const char *train_tsv, const char *val_tsv, const cg_tokenizer *src_tok,
                                      const cg_tokenizer *tgt_tok, const cg_seq2seq_options *o) {
    if (!train_tsv || !src_tok || !o) {
        cgi_fail(CG_ERR_ARG, "[data] seq2seq_data_load: NULL argument");
        return NULL;
    }
    if (o->pad_id < 0 || o->bos_id < 0 || o->eos_id < 0 || o->max_src < 0 || o->max_tgt < 0) {
        cgi_fail(CG_ERR_ARG,
                 "[data] seq2seq_data_load: negative option (pad %d bos %d eos %d max_src %lld max_tgt %lld)",
                 (int)o->pad_id, (int)o->bos_id, (int)o->eos_id, (long long)o->max_src, (long long)o->max_tgt);
        return NULL;
    }
    int64_t n_val = 0;
    if (!val_tsv && cgi_val_count("seq2seq_data_load", 0, o->val_fraction, &n_val)) return NULL;
    cg_seq2seq_data *d = calloc(1, sizeof *d);
    if (!d) {
        cgi_fail(CG_ERR_NOMEM, "[data] seq2seq_data_load: out of memory");
        return NULL;
    }
    d->o = *o;
    s2s_ctx x = {d, src_tok, tgt_tok ? tgt_tok : src_tok};
    cg_status s = cgi_tsv_read(train_tsv, "source\\ttarget", s2s_line, &x);
    int64_t n_file = d->src.n;
    if (!s && n_file == 0) s = cgi_fail(CG_ERR_FORMAT, "[data] %s: no source\\ttarget lines", train_tsv);
    if (!s && val_tsv) s = cgi_tsv_read(val_tsv, "source\\ttarget", s2s_line, &x);
    if (!s && !val_tsv) s = cgi_val_count("seq2seq_data_load", n_file, o->val_fraction, &n_val);
    d->n_train = n_file - (val_tsv ? 0 : n_val);
    if (!s && d->n_train < 1)
        s = cgi_fail(CG_ERR_ARG, "[data] %s: val_fraction %g leaves no training pair of %lld", train_tsv,
                     o->val_fraction, (long long)n_file);
    if (s) {
        cg_seq2seq_data_free(d);
        return NULL;
    }
    int64_t ls = 0, lt = 0;
    for (int64_t i = 0; i < d->src.n; i++) {
        if (cgi_seqs_len(&d->src, i) > ls) ls = cgi_seqs_len(&d->src, i);
        if (cgi_seqs_len(&d->tgt, i) + 1 > lt) lt = cgi_seqs_len(&d->tgt, i) + 1;
    }
    d->src_cap = o->max_src > 0 ? o->max_src : ls;
    d->tgt_cap = o->max_tgt > 0 ? o->max_tgt : lt;
    return d;
}

int64_t cg_seq2seq_data_count(const cg_seq2seq_data *d, bool val) {
    if (!d) return 0;
    return val ? d->src.n - d->n_train : d->n_train;
}

void cg_seq2seq_data_caps(const cg_seq2seq_data *d, int64_t *src_cap, int64_t *tgt_cap) {
    if (src_cap) *src_cap = d ? d->src_cap : 0;
    if (tgt_cap) *tgt_cap = d ? d->tgt_cap : 0;
}

cg_status cg_seq2seq_example(const cg_seq2seq_data *d, bool val, int64_t i, const int32_t **src, int64_t *n_src,
                             const int32_t **tgt, int64_t *n_tgt) {
    if (!d || !src || !n_src || !tgt || !n_tgt) return cgi_fail(CG_ERR_ARG, "[data] seq2seq_example: NULL argument");
    int64_t n = cg_seq2seq_data_count(d, val);
    if (i < 0 || i >= n)
        return cgi_fail(CG_ERR_ARG, "[data] seq2seq_example: index %lld outside the %s split's %lld pairs",
                        (long long)i, val ? "held-out" : "training", (long long)n);
    i += val ? d->n_train : 0;
    *src = cgi_seqs_at(&d->src, i), *n_src = cgi_seqs_len(&d->src, i);
    *tgt = cgi_seqs_at(&d->tgt, i), *n_tgt = cgi_seqs_len(&d->tgt, i);
    return CG_OK;
}

cg_status cg_seq2seq_batch(cg_seq2seq_data *d, bool val, cg_data_cursor *c, int64_t batch, int32_t *src,
                           int32_t *src_mask, int32_t *tgt_in, int32_t *tgt_out, int64_t *src_len, int64_t *tgt_len) {
    if (!d || !c || !src || !src_mask || !tgt_in || !tgt_out)
        return cgi_fail(CG_ERR_ARG, "[data] seq2seq_batch: NULL argument");
    if (batch < 1) return cgi_fail(CG_ERR_ARG, "[data] seq2seq_batch: batch %lld", (long long)batch);
    /* Scratch on the stack for any usual batch, so a training loop's batches allocate nothing. */
    int64_t local[2048], *rows = batch <= 2048 ? local : malloc((size_t)batch * sizeof *rows);
    if (!rows) return cgi_fail(CG_ERR_NOMEM, "[data] seq2seq_batch: out of memory");
    cg_status s = cgi_order_take(&d->order[val], c, cg_seq2seq_data_count(d, val), batch, rows, "seq2seq_batch");
    if (s) {
        if (rows != local) free(rows);
        return s;
    }
    const cg_seq2seq_options *o = &d->o;
    int64_t S = d->src_cap, T = d->tgt_cap;
    if (!o->pad_to_max) {
        int64_t ls = 0, lt = 0;
        for (int64_t b = 0; b < batch; b++) {
            int64_t i = rows[b] + (val ? d->n_train : 0);
            if (cgi_seqs_len(&d->src, i) > ls) ls = cgi_seqs_len(&d->src, i);
            if (cgi_seqs_len(&d->tgt, i) + 1 > lt) lt = cgi_seqs_len(&d->tgt, i) + 1;
        }
        S = ls < S ? ls : S;
        T = lt < T ? lt : T;
    }
    for (int64_t b = 0; b < batch; b++) {
        int64_t i = rows[b] + (val ? d->n_train : 0);
        const int32_t *ps = cgi_seqs_at(&d->src, i), *pt = cgi_seqs_at(&d->tgt, i);
        int64_t ns = cgi_seqs_len(&d->src, i), nt = cgi_seqs_len(&d->tgt, i);
        if (ns > S) ns = S;
        if (nt > T - 1) nt = T - 1; /* room for bos (tgt_in) and eos (tgt_out) */
        int32_t *rs = src + b * S, *rm = src_mask + b * S, *ri = tgt_in + b * T, *ro = tgt_out + b * T;
        for (int64_t t = 0; t < S; t++) rs[t] = t < ns ? ps[t] : o->pad_id, rm[t] = t < ns;
        ri[0] = o->bos_id;
        for (int64_t t = 0; t < nt; t++) ri[t + 1] = ro[t] = pt[t];
        ro[nt] = o->eos_id;
        for (int64_t t = nt + 1; t < T; t++) ri[t] = o->pad_id, ro[t] = CG_IGNORE_INDEX;
    }
    if (rows != local) free(rows);
    if (src_len) *src_len = S;
    if (tgt_len) *tgt_len = T;
    return CG_OK;
}

/* ---- text classification ---- */

struct cg_textcls_data {
    cg_textcls_options o;
    cgi_seqs text;
    int32_t *label;          /* per example */
    int64_t n_train, cap;
    char **names;            /* label names by id */
    int32_t n_labels;
    cgi_order order[2];
};

typedef struct {
    cg_textcls_data *d;
    const cg_tokenizer *tok;
    char *pool;              /* every example's label, NUL-terminated, back to back */
    size_t n_pool, cap_pool;
    int64_t *at;             /* example -> offset of its label in pool */
    int64_t cap_at;
} cls_ctx;

static cg_status cls_line(void *ctx, const char *path, int64_t line, const char *a, size_t na, const char *b,
                          size_t nb) {
    cls_ctx *x = ctx;
    while (na && a[0] == ' ') a++, na--;
    while (na && a[na - 1] == ' ') na--;
    if (na == 0) return cgi_fail(CG_ERR_FORMAT, "[data] %s:%lld: empty label", path, (long long)line);
    int32_t *ids = NULL;
    int64_t n = 0;
    cg_status s = cgi_tsv_encode(x->tok, path, line, "text", b, nb, &ids, &n);
    if (!s && n == 0) s = cgi_fail(CG_ERR_FORMAT, "[data] %s:%lld: empty text", path, (long long)line);
    if (!s && x->n_pool + na + 1 > x->cap_pool) {
        size_t cap = x->cap_pool ? 2 * x->cap_pool : 4096;
        while (cap < x->n_pool + na + 1) cap *= 2;
        char *p = realloc(x->pool, cap);
        if (!p) s = cgi_fail(CG_ERR_NOMEM, "[data] out of memory");
        else x->pool = p, x->cap_pool = cap;
    }
    int64_t k = x->d->text.n;
    if (!s && k + 1 > x->cap_at) {
        int64_t cap = x->cap_at ? 2 * x->cap_at : 256;
        int64_t *p = realloc(x->at, (size_t)cap * sizeof *p);
        if (!p) s = cgi_fail(CG_ERR_NOMEM, "[data] out of memory");
        else x->at = p, x->cap_at = cap;
    }
    if (!s && !cgi_seqs_push(&x->d->text, ids, n)) s = CG_ERR_NOMEM;
    free(ids);
    if (s) return s;
    memcpy(x->pool + x->n_pool, a, na);
    x->pool[x->n_pool + na] = '\0';
    x->at[k] = (int64_t)x->n_pool;
    x->n_pool += na + 1;
    return CG_OK;
}

typedef struct {
    const char *s;
    long long v;
    int64_t i;
} label_ref;

static int by_value(const void *pa, const void *pb) {
    const label_ref *a = pa, *b = pb;
    if (a->v != b->v) return a->v < b->v ? -1 : 1;
    return strcmp(a->s, b->s); /* "01" and "1": equal values, still two labels */
}

static int by_bytes(const void *pa, const void *pb) {
    return strcmp(((const label_ref *)pa)->s, ((const label_ref *)pb)->s);
}

static bool decimal(const char *s, long long *v) {
    const char *p = s + (*s == '-');
    size_t n = strlen(p);
    if (n == 0 || n > 18 || strspn(p, "0123456789") != n) return false;
    *v = strtoll(s, NULL, 10);
    return true;
}

/* Gives every example its label id, labels numbered in sorted order. */
static cg_status number_labels(cg_textcls_data *d, const cls_ctx *x) {
    int64_t n = d->text.n;
    label_ref *r = malloc((size_t)n * sizeof *r);
    d->label = malloc((size_t)n * sizeof *d->label);
    if (!r || !d->label) {
        free(r);
        return cgi_fail(CG_ERR_NOMEM, "[data] textcls_data_load: out of memory");
    }
    bool numeric = true;
    for (int64_t i = 0; i < n; i++) {
        r[i] = (label_ref){x->pool + x->at[i], 0, i};
        numeric = numeric && decimal(r[i].s, &r[i].v);
    }
    qsort(r, (size_t)n, sizeof *r, numeric ? by_value : by_bytes);
    int32_t id = -1;
    for (int64_t i = 0; i < n; i++) {
        if (i == 0 || strcmp(r[i].s, r[i - 1].s)) id++;
        d->label[r[i].i] = id;
    }
    d->n_labels = id + 1;
    d->names = calloc((size_t)d->n_labels, sizeof *d->names);
    cg_status s = d->names ? CG_OK : cgi_fail(CG_ERR_NOMEM, "[data] textcls_data_load: out of memory");
    for (int64_t i = 0; i < n && !s; i++) {
        int32_t k = d->label[r[i].i];
        if (!d->names[k] && !(d->names[k] = strdup(r[i].s)))
            s = cgi_fail(CG_ERR_NOMEM, "[data] textcls_data_load: out of memory");
    }
    free(r);
    return s;
}

void cg_textcls_options_default(const cg_tokenizer *tok, cg_textcls_options *o) {
    if (!o) return;
    int32_t pad = tok ? cg_tokenizer_token_id(tok, "[PAD]") : -1;
    *o = (cg_textcls_options){.pad_id = pad >= 0 ? pad : 0,
                              .cls_id = tok ? cg_tokenizer_token_id(tok, "[CLS]") : -1,
                              .max_len = 0, .pad_to_max = false, .val_fraction = 0.0};
}

void cg_textcls_data_free(cg_textcls_data *d) {
    if (!d) return;
    cgi_seqs_free(&d->text);
    free(d->label);
    for (int32_t i = 0; d->names && i < d->n_labels; i++) free(d->names[i]);
    free(d->names);
    cgi_order_free(&d->order[0]);
    cgi_order_free(&d->order[1]);
    free(d);
}

cg_textcls_data *cg_textcls_data_load(const char *train_tsv, const char *val_tsv, const cg_tokenizer *tok,
                                      const cg_textcls_options *o) {
    if (!train_tsv || !tok || !o) {
        cgi_fail(CG_ERR_ARG, "[data] textcls_data_load: NULL argument");
        return NULL;
    }
    int has_cls = o->cls_id >= 0;
    if (o->pad_id < 0 || o->max_len < 0 || (o->max_len > 0 && o->max_len < 1 + has_cls)) {
        cgi_fail(CG_ERR_ARG, "[data] textcls_data_load: pad_id %d, max_len %lld (0, or room for %s one token)",
                 (int)o->pad_id, (long long)o->max_len, has_cls ? "[CLS] and" : "");
        return NULL;
    }
    int64_t n_val = 0;
    if (!val_tsv && cgi_val_count("textcls_data_load", 0, o->val_fraction, &n_val)) return NULL;
    cg_textcls_data *d = calloc(1, sizeof *d);
    if (!d) {
        cgi_fail(CG_ERR_NOMEM, "[data] textcls_data_load: out of memory");
        return NULL;
    }
    d->o = *o;
    cls_ctx x = {.d = d, .tok = tok};
    cg_status s = cgi_tsv_read(train_tsv, "label\\ttext", cls_line, &x);
    int64_t n_file = d->text.n;
    if (!s && n_file == 0) s = cgi_fail(CG_ERR_FORMAT, "[data] %s: no label\\ttext lines", train_tsv);
    if (!s && val_tsv) s = cgi_tsv_read(val_tsv, "label\\ttext", cls_line, &x);
    if (!s && !val_tsv) s = cgi_val_count("textcls_data_load", n_file, o->val_fraction, &n_val);
    d->n_train = n_file - (val_tsv ? 0 : n_val);
    if (!s && d->n_train < 1)
        s = cgi_fail(CG_ERR_ARG, "[data] %s: val_fraction %g leaves no training example of %lld", train_tsv,
                     o->val_fraction, (long long)n_file);
    if (!s) s = number_labels(d, &x);
    free(x.pool);
    free(x.at);
    if (s) {
        cg_textcls_data_free(d);
        return NULL;
    }
    int64_t longest = 0;
    for (int64_t i = 0; i < d->text.n; i++)
        if (cgi_seqs_len(&d->text, i) > longest) longest = cgi_seqs_len(&d->text, i);
    d->cap = o->max_len > 0 ? o->max_len : longest + has_cls;
    return d;
}

int64_t cg_textcls_data_count(const cg_textcls_data *d, bool val) {
    if (!d) return 0;
    return val ? d->text.n - d->n_train : d->n_train;
}

int64_t cg_textcls_data_cap(const cg_textcls_data *d) { return d ? d->cap : 0; }

int32_t cg_textcls_num_labels(const cg_textcls_data *d) { return d ? d->n_labels : 0; }

const char *cg_textcls_label_name(const cg_textcls_data *d, int32_t id) {
    return d && id >= 0 && id < d->n_labels ? d->names[id] : NULL;
}

int32_t cg_textcls_label_id(const cg_textcls_data *d, const char *name) {
    for (int32_t i = 0; d && name && i < d->n_labels; i++)
        if (!strcmp(d->names[i], name)) return i;
    return -1;
}

cg_status cg_textcls_example(const cg_textcls_data *d, bool val, int64_t i, const int32_t **ids, int64_t *n,
                             int32_t *label) {
    if (!d || !ids || !n) return cgi_fail(CG_ERR_ARG, "[data] textcls_example: NULL argument");
    int64_t cnt = cg_textcls_data_count(d, val);
    if (i < 0 || i >= cnt)
        return cgi_fail(CG_ERR_ARG, "[data] textcls_example: index %lld outside the %s split's %lld examples",
                        (long long)i, val ? "held-out" : "training", (long long)cnt);
    i += val ? d->n_train : 0;
    *ids = cgi_seqs_at(&d->text, i), *n = cgi_seqs_len(&d->text, i);
    if (label) *label = d->label[i];
    return CG_OK;
}

cg_status cg_textcls_batch(cg_textcls_data *d, bool val, cg_data_cursor *c, int64_t batch, int32_t *input_ids,
                           int32_t *attention_mask, int32_t *labels, int64_t *seq_len) {
    if (!d || !c || !input_ids || !attention_mask || !labels)
        return cgi_fail(CG_ERR_ARG, "[data] textcls_batch: NULL argument");
    if (batch < 1) return cgi_fail(CG_ERR_ARG, "[data] textcls_batch: batch %lld", (long long)batch);
    /* Scratch on the stack for any usual batch, so a training loop's batches allocate nothing. */
    int64_t local[2048], *rows = batch <= 2048 ? local : malloc((size_t)batch * sizeof *rows);
    if (!rows) return cgi_fail(CG_ERR_NOMEM, "[data] textcls_batch: out of memory");
    cg_status s = cgi_order_take(&d->order[val], c, cg_textcls_data_count(d, val), batch, rows, "textcls_batch");
    if (s) {
        if (rows != local) free(rows);
        return s;
    }
    int64_t has_cls = d->o.cls_id >= 0, T = d->cap;
    if (!d->o.pad_to_max) {
        int64_t l = 0;
        for (int64_t b = 0; b < batch; b++) {
            int64_t i = rows[b] + (val ? d->n_train : 0);
            if (cgi_seqs_len(&d->text, i) + has_cls > l) l = cgi_seqs_len(&d->text, i) + has_cls;
        }
        T = l < T ? l : T;
    }
    for (int64_t b = 0; b < batch; b++) {
        int64_t i = rows[b] + (val ? d->n_train : 0);
        const int32_t *p = cgi_seqs_at(&d->text, i);
        int64_t n = cgi_seqs_len(&d->text, i);
        if (n > T - has_cls) n = T - has_cls;
        int32_t *ri = input_ids + b * T, *rm = attention_mask + b * T;
        if (has_cls) ri[0] = d->o.cls_id;
        for (int64_t t = 0; t < n; t++) ri[has_cls + t] = p[t];
        for (int64_t t = has_cls + n; t < T; t++) ri[t] = d->o.pad_id;
        for (int64_t t = 0; t < T; t++) rm[t] = t < has_cls + n;
        labels[b] = d->label[i];
    }
    if (rows != local) free(rows);
    if (seq_len) *seq_len = T;
    return CG_OK;
}
