/* SPDX-License-Identifier: MIT */
/* BERT pre-training rows: sentence pairs for next-sentence prediction, masked-LM corruption. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/data_internal.h"

struct cg_mlm_data {
    cg_mlm_options o;
    cgi_seqs sent;               /* every sentence, in text order */
    int64_t *doc;                /* document of each sentence; documents are runs of sentences */
    int64_t *doc_start, *doc_end;
    int64_t n_train;             /* sentences [0, n_train) train, the rest are held out */
    int64_t *pairs[2], n_pairs[2]; /* per split: sentences whose successor is in their document */
    int32_t *pool;               /* ids a random replacement may take */
    int64_t n_pool;
};

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v' || c == '\n'; }

/* Bytes of a closing quote or bracket at p (end at e), 0 if none: " ' ) ] and ” ’ ». */
static size_t closer_len(const char *p, const char *e) {
    if (p >= e) return 0;
    if (*p == '"' || *p == '\'' || *p == ')' || *p == ']') return 1;
    if (e - p >= 3 && !memcmp(p, "\xE2\x80\x9D", 3)) return 3;
    if (e - p >= 3 && !memcmp(p, "\xE2\x80\x99", 3)) return 3;
    if (e - p >= 2 && !memcmp(p, "\xC2\xBB", 2)) return 2;
    return 0;
}

/* "[word]" tokens ([UNK], [unused7]) are BERT's reserved ones: never a random replacement. */
static bool bracket_word(const char *s) {
    size_t n = s ? strlen(s) : 0;
    if (n < 3 || s[0] != '[' || s[n - 1] != ']') return false;
    for (size_t i = 1; i + 1 < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_')) return false;
    }
    return true;
}

cg_status cg_mlm_options_default(const cg_tokenizer *tok, cg_mlm_options *o) {
    if (!tok || !o) return cgi_fail(CG_ERR_ARG, "[data] mlm_options_default: NULL argument");
    const char *names[4] = {"[CLS]", "[SEP]", "[MASK]", "[PAD]"};
    int32_t ids[4];
    for (int i = 0; i < 4; i++)
        if ((ids[i] = cg_tokenizer_token_id(tok, names[i])) < 0)
            return cgi_fail(CG_ERR_ARG, "[data] mlm_options_default: the tokenizer has no %s token", names[i]);
    *o = (cg_mlm_options){.cls_id = ids[0], .sep_id = ids[1], .mask_id = ids[2], .pad_id = ids[3],
                          .vocab_size = cg_tokenizer_vocab_size(tok), .mask_prob = 0.15, .val_fraction = 0.0};
    return CG_OK;
}

static cg_status check_options(const cg_mlm_options *o) {
    int32_t sp[4] = {o->cls_id, o->sep_id, o->mask_id, o->pad_id};
    for (int i = 0; i < 4; i++) {
        if (sp[i] < 0) return cgi_fail(CG_ERR_ARG, "[data] mlm_data_new: special id %d is negative", (int)sp[i]);
        for (int j = 0; j < i; j++)
            if (sp[i] == sp[j])
                return cgi_fail(CG_ERR_ARG, "[data] mlm_data_new: cls/sep/mask/pad ids must differ (two are %d)",
                                (int)sp[i]);
    }
    if (o->vocab_size < 1) return cgi_fail(CG_ERR_ARG, "[data] mlm_data_new: vocab_size %d", (int)o->vocab_size);
    if (!(o->mask_prob > 0.0 && o->mask_prob <= 1.0))
        return cgi_fail(CG_ERR_ARG, "[data] mlm_data_new: mask_prob %g is not in (0, 1]", o->mask_prob);
    return CG_OK;
}

/* Sentence splitter state: the sentence being gathered (whitespace collapsed) and the document. */
typedef struct {
    cg_mlm_data *d;
    const cg_tokenizer *tok;
    const char *text;
    char *buf;
    size_t n, start; /* bytes gathered; offset in text where the sentence began */
    int64_t doc, n_doc_alloc;
    bool doc_used;
} splitter;

static void put(splitter *sp, const char *p, size_t n) {
    if (sp->n == 0) sp->start = (size_t)(p - sp->text);
    memcpy(sp->buf + sp->n, p, n);
    sp->n += n;
}

static cg_status flush(splitter *sp) {
    while (sp->n && sp->buf[sp->n - 1] == ' ') sp->n--;
    if (!sp->n) return CG_OK;
    int32_t *ids;
    int64_t n;
    cg_status s = cg_tokenizer_encode(sp->tok, sp->buf, sp->n, &ids, &n);
    sp->n = 0;
    if (s) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", cg_last_error());
        return cgi_fail(s, "[data] mlm_data_new: sentence at byte %zu: %s", sp->start, msg);
    }
    cg_mlm_data *d = sp->d;
    if (n > 0) {
        if (d->sent.n + 1 > sp->n_doc_alloc) {
            int64_t cap = sp->n_doc_alloc ? 2 * sp->n_doc_alloc : 256;
            int64_t *doc = realloc(d->doc, (size_t)cap * sizeof *doc);
            if (!doc) {
                free(ids);
                return cgi_fail(CG_ERR_NOMEM, "[data] mlm_data_new: out of memory");
            }
            d->doc = doc;
            sp->n_doc_alloc = cap;
        }
        if (!cgi_seqs_push(&d->sent, ids, n)) {
            free(ids);
            return CG_ERR_NOMEM;
        }
        d->doc[d->sent.n - 1] = sp->doc;
        sp->doc_used = true;
    }
    free(ids);
    return CG_OK;
}

static cg_status split_text(splitter *sp, const char *text, size_t len) {
    cg_status s = CG_OK;
    for (size_t i = 0; i < len && !s;) {
        const char *p = text + i, *nl = memchr(p, '\n', len - i);
        size_t n = nl ? (size_t)(nl - p) : len - i;
        i += n + 1;
        size_t k = 0;
        while (k < n && is_ws(p[k])) k++;
        if (k == n) { /* a blank line ends the document */
            s = flush(sp);
            if (sp->doc_used) sp->doc++, sp->doc_used = false;
            continue;
        }
        if (sp->n && sp->buf[sp->n - 1] != ' ') sp->buf[sp->n++] = ' '; /* the line break */
        for (k = 0; k < n && !s; k++) {
            if (is_ws(p[k])) {
                if (sp->n && sp->buf[sp->n - 1] != ' ') sp->buf[sp->n++] = ' ';
                continue;
            }
            put(sp, p + k, 1);
            if (p[k] != '.' && p[k] != '!' && p[k] != '?') continue;
            size_t e = k + 1, c;
            while ((c = closer_len(p + e, p + n)) > 0) e += c;
            if (e < n && !is_ws(p[e])) continue; /* "3.14", "e.g.x": not an end */
            put(sp, p + k + 1, e - k - 1);
            k = e - 1;
            s = flush(sp);
        }
    }
    return s ? s : flush(sp);
}

/* The split's sentence range and its number of documents. */
static int64_t split_range(const cg_mlm_data *d, bool val, int64_t *s0, int64_t *s1) {
    *s0 = val ? d->n_train : 0;
    *s1 = val ? d->sent.n : d->n_train;
    return *s1 > *s0 ? d->doc[*s1 - 1] - d->doc[*s0] + 1 : 0;
}

/* NULL unless a NotNext partner exists for every A of the split (another document, or a third
 * sentence), and an IsNext one for some A. */
static cg_status split_usable(const cg_mlm_data *d, bool val, const char *who) {
    int64_t s0, s1, docs = split_range(d, val, &s0, &s1);
    const char *name = val ? "held-out" : "training";
    if (d->n_pairs[val] == 0)
        return cgi_fail(CG_ERR_ARG, "[data] %s: the %s split (%lld sentences) has no two consecutive sentences "
                        "in one document", who, name, (long long)(s1 - s0));
    if (docs < 2 && s1 - s0 < 3)
        return cgi_fail(CG_ERR_ARG, "[data] %s: the %s split has one document of %lld sentences; a random "
                        "NotNext sentence needs a third sentence or another document", who, name, (long long)(s1 - s0));
    return CG_OK;
}

void cg_mlm_data_free(cg_mlm_data *d) {
    if (!d) return;
    cgi_seqs_free(&d->sent);
    free(d->doc);
    free(d->doc_start);
    free(d->doc_end);
    free(d->pairs[0]);
    free(d->pairs[1]);
    free(d->pool);
    free(d);
}

cg_mlm_data *cg_mlm_data_new(const char *text, size_t len, const cg_tokenizer *tok, const cg_mlm_options *o) {
    if (!text || !tok || !o) {
        cgi_fail(CG_ERR_ARG, "[data] mlm_data_new: NULL argument");
        return NULL;
    }
    if (len == 0) {
        cgi_fail(CG_ERR_ARG, "[data] mlm_data_new: empty text");
        return NULL;
    }
    size_t bad = cgi_data_utf8_check(text, len);
    if (bad < len) {
        cgi_fail(CG_ERR_FORMAT, "[data] mlm_data_new: invalid UTF-8 at byte offset %zu (byte 0x%02X)", bad,
                 (unsigned char)text[bad]);
        return NULL;
    }
    if (check_options(o)) return NULL;
    cg_mlm_data *d = calloc(1, sizeof *d);
    splitter sp = {.d = d, .tok = tok, .text = text, .buf = malloc(len + 2)};
    cg_status s = (!d || !sp.buf) ? cgi_fail(CG_ERR_NOMEM, "[data] mlm_data_new: out of memory") : CG_OK;
    if (!s) {
        d->o = *o;
        s = split_text(&sp, text, len);
    }
    free(sp.buf);
    int64_t N = d ? d->sent.n : 0, n_val = 0;
    if (!s && N == 0) s = cgi_fail(CG_ERR_ARG, "[data] mlm_data_new: the text holds no sentence with tokens");
    if (!s) s = cgi_val_count("mlm_data_new", N, o->val_fraction, &n_val);
    if (!s) {
        d->n_train = N - n_val;
        if (n_val > 0 && d->n_train > 0 && d->doc[d->n_train - 1] == d->doc[d->n_train])
            for (int64_t i = d->n_train; i < N; i++) d->doc[i]++; /* the cut starts a new document */
        int64_t D = d->doc[N - 1] + 1;
        d->doc_start = malloc((size_t)D * sizeof(int64_t));
        d->doc_end = malloc((size_t)D * sizeof(int64_t));
        d->pairs[0] = malloc((size_t)N * sizeof(int64_t));
        d->pairs[1] = malloc((size_t)N * sizeof(int64_t));
        d->pool = malloc((size_t)o->vocab_size * sizeof(int32_t));
        if (!d->doc_start || !d->doc_end || !d->pairs[0] || !d->pairs[1] || !d->pool)
            s = cgi_fail(CG_ERR_NOMEM, "[data] mlm_data_new: out of memory");
    }
    if (!s) {
        for (int64_t i = N - 1; i >= 0; i--) d->doc_start[d->doc[i]] = i;
        for (int64_t i = 0; i < N; i++) d->doc_end[d->doc[i]] = i + 1;
        for (int64_t i = 0; i + 1 < N; i++)
            if (d->doc[i + 1] == d->doc[i]) {
                int v = i >= d->n_train;
                d->pairs[v][d->n_pairs[v]++] = i;
            }
        for (int32_t id = 0; id < o->vocab_size; id++)
            if (id != o->cls_id && id != o->sep_id && id != o->mask_id && id != o->pad_id &&
                !bracket_word(cg_tokenizer_token_str(tok, id)))
                d->pool[d->n_pool++] = id;
        if (d->n_pool == 0)
            s = cgi_fail(CG_ERR_ARG, "[data] mlm_data_new: vocab_size %d leaves no non-special id for random "
                         "replacements", (int)o->vocab_size);
    }
    if (!s) s = split_usable(d, false, "mlm_data_new");
    if (s) {
        cg_mlm_data_free(d);
        return NULL;
    }
    return d;
}

int64_t cg_mlm_data_count(const cg_mlm_data *d, bool val) {
    if (!d) return 0;
    return val ? d->sent.n - d->n_train : d->n_train;
}

cg_status cg_mlm_sentence(const cg_mlm_data *d, int64_t i, const int32_t **ids, int64_t *n, int64_t *doc) {
    if (!d || !ids || !n) return cgi_fail(CG_ERR_ARG, "[data] mlm_sentence: NULL argument");
    if (i < 0 || i >= d->sent.n)
        return cgi_fail(CG_ERR_ARG, "[data] mlm_sentence: index %lld outside [0, %lld)", (long long)i,
                        (long long)d->sent.n);
    *ids = cgi_seqs_at(&d->sent, i);
    *n = cgi_seqs_len(&d->sent, i);
    if (doc) *doc = d->doc[i];
    return CG_OK;
}

/* A random sentence of the split other than a's successor: from another document when there is
 * one, else from a's own document minus a and a + 1. */
static int64_t not_next(const cg_mlm_data *d, bool val, int64_t a, cg_rng *r) {
    int64_t s0, s1, docs = split_range(d, val, &s0, &s1);
    int64_t ds = d->doc_start[d->doc[a]], de = d->doc_end[d->doc[a]];
    if (docs >= 2) {
        int64_t k = s0 + (int64_t)cgi_rng_below(r, (uint64_t)(s1 - s0 - (de - ds)));
        return k >= ds ? k + (de - ds) : k;
    }
    int64_t k = s0 + (int64_t)cgi_rng_below(r, (uint64_t)(s1 - s0 - 2));
    return k >= a ? k + 2 : k;
}

cg_status cg_mlm_batch(const cg_mlm_data *d, bool val, cg_rng *r, int64_t batch, int64_t seq_len,
                       int32_t *input_ids, int32_t *token_type_ids, int32_t *attention_mask, int32_t *labels,
                       int32_t *next_sentence_label) {
    if (!d || !r || !input_ids || !token_type_ids || !attention_mask || !labels || !next_sentence_label)
        return cgi_fail(CG_ERR_ARG, "[data] mlm_batch: NULL argument");
    if (batch < 1 || seq_len < 5)
        return cgi_fail(CG_ERR_ARG, "[data] mlm_batch: batch %lld must be positive and seq_len %lld at least 5 "
                        "([CLS] a [SEP] b [SEP])", (long long)batch, (long long)seq_len);
    cg_status s = split_usable(d, val, "mlm_batch");
    if (s) return s;
    /* Scratch on the stack for any usual length, so a training loop's batches allocate nothing. */
    int64_t local[2048], *pos = seq_len <= 2048 ? local : malloc((size_t)seq_len * sizeof *pos);
    if (!pos) return cgi_fail(CG_ERR_NOMEM, "[data] mlm_batch: out of memory");
    const cg_mlm_options *o = &d->o;
    for (int64_t b = 0; b < batch; b++) {
        int32_t *ids = input_ids + b * seq_len, *tt = token_type_ids + b * seq_len;
        int32_t *am = attention_mask + b * seq_len, *lab = labels + b * seq_len;
        int64_t a = d->pairs[val][cgi_rng_below(r, (uint64_t)d->n_pairs[val])];
        bool is_next = cgi_rng_below(r, 2) == 0;
        int64_t bs = is_next ? a + 1 : not_next(d, val, a, r);
        next_sentence_label[b] = is_next ? 0 : 1;
        int64_t la = cgi_seqs_len(&d->sent, a), lb = cgi_seqs_len(&d->sent, bs);
        while (la + lb + 3 > seq_len) { /* longest first, from the end; ties cut B as BERT does */
            if (la > lb) la--;
            else lb--;
        }
        int64_t t = 0, np = 0;
        ids[t] = o->cls_id, tt[t++] = 0;
        for (int64_t i = 0; i < la; i++) pos[np++] = t, ids[t] = cgi_seqs_at(&d->sent, a)[i], tt[t++] = 0;
        ids[t] = o->sep_id, tt[t++] = 0;
        for (int64_t i = 0; i < lb; i++) pos[np++] = t, ids[t] = cgi_seqs_at(&d->sent, bs)[i], tt[t++] = 1;
        ids[t] = o->sep_id, tt[t++] = 1;
        for (int64_t i = 0; i < seq_len; i++) am[i] = i < t, lab[i] = CG_IGNORE_INDEX;
        for (int64_t i = t; i < seq_len; i++) ids[i] = o->pad_id, tt[i] = 0;
        int64_t k = (int64_t)llround(o->mask_prob * (double)np);
        k = k < 1 ? 1 : k > np ? np : k;
        for (int64_t j = 0; j < k; j++) { /* partial Fisher-Yates: k distinct positions */
            int64_t q = j + (int64_t)cgi_rng_below(r, (uint64_t)(np - j)), p = pos[q];
            pos[q] = pos[j], pos[j] = p;
            lab[p] = ids[p];
            uint64_t u = cgi_rng_below(r, 10);
            if (u < 8) ids[p] = o->mask_id;
            else if (u == 8) ids[p] = d->pool[cgi_rng_below(r, (uint64_t)d->n_pool)];
        }
    }
    if (pos != local) free(pos);
    return CG_OK;
}
