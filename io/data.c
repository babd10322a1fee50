/* SPDX-License-Identifier: MIT */
/* Data loaders, shared part: text files, id checks, draws, splits, epoch orders, TSV lines. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/data_internal.h"
#include "io/file_internal.h"

size_t cgi_data_utf8_check(const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        unsigned c = u[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int extra;
        uint32_t cp, min;
        if (c >= 0xC2 && c <= 0xDF) extra = 1, cp = c & 0x1F, min = 0x80;
        else if (c >= 0xE0 && c <= 0xEF) extra = 2, cp = c & 0x0F, min = 0x800;
        else if (c >= 0xF0 && c <= 0xF4) extra = 3, cp = c & 0x07, min = 0x10000;
        else return i; /* stray continuation byte, C0/C1 overlong lead or F5..FF */
        if (len - i <= (size_t)extra) return i;
        for (int k = 1; k <= extra; k++) {
            if ((u[i + k] & 0xC0) != 0x80) return i;
            cp = cp << 6 | (u[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += (size_t)extra + 1;
    }
    return len;
}

cg_status cgi_read_text_bounded(const char *path, uint64_t limit, const char *what, char **text, size_t *len) {
    if (!path || !text || !len) return cgi_fail(CG_ERR_ARG, "[%s] read_text_file: NULL argument", what);
    *text = NULL;
    *len = 0;
    size_t n = 0;
    char *buf = cgi_read_bounded(path, limit, what, &n);
    if (!buf) return cg_last_status();
    size_t start = (n >= 3 && memcmp(buf, "\xEF\xBB\xBF", 3) == 0) ? 3 : 0; /* byte-order mark */
    cg_status s = CG_OK;
    if (n == start) s = cgi_fail(CG_ERR_FORMAT, "[%s] %s: empty file", what, path);
    size_t bad = s ? 0 : cgi_data_utf8_check(buf, n);
    if (!s && bad < n)
        s = cgi_fail(CG_ERR_FORMAT, "[%s] %s: invalid UTF-8 at byte offset %zu (byte 0x%02X)", what, path, bad,
                     (unsigned char)buf[bad]);
    const char *nul = s ? NULL : memchr(buf, 0, n);
    if (nul) s = cgi_fail(CG_ERR_FORMAT, "[%s] %s: NUL byte at offset %zu (binary file?)", what, path, (size_t)(nul - buf));
    if (s) {
        free(buf);
        return s;
    }
    memmove(buf, buf + start, n - start);
    buf[n - start] = '\0';
    *text = buf;
    *len = n - start;
    return CG_OK;
}

cg_status cg_read_text_file(const char *path, char **text, size_t *len) {
    return cgi_read_text_bounded(path, CGI_LIMIT_DATA, "data", text, len);
}

cg_status cg_check_ids(const char *what, const int32_t *ids, int64_t n, int32_t vocab_size, int64_t row_len,
                       bool allow_ignore) {
    if (!what) what = "ids";
    if ((!ids && n > 0) || n < 0) return cgi_fail(CG_ERR_ARG, "[data] check_ids %s: NULL ids or negative count", what);
    for (int64_t i = 0; i < n; i++) {
        int32_t v = ids[i];
        if ((v >= 0 && v < vocab_size) || (allow_ignore && v == CG_IGNORE_INDEX)) continue;
        if (row_len > 0)
            return cgi_fail(CG_ERR_RANGE, "[data] %s[%lld,%lld] = %d is outside the vocabulary [0, %d)%s", what,
                            (long long)(i / row_len), (long long)(i % row_len), (int)v, (int)vocab_size,
                            allow_ignore ? " and is not -100" : "");
        return cgi_fail(CG_ERR_RANGE, "[data] %s[%lld] = %d is outside the vocabulary [0, %d)%s", what, (long long)i,
                        (int)v, (int)vocab_size, allow_ignore ? " and is not -100" : "");
    }
    return CG_OK;
}

/* ---- internals ---- */

bool cgi_seqs_push(cgi_seqs *s, const int32_t *ids, int64_t n) {
    if (s->n + 2 > s->cap) {
        int64_t cap = s->cap ? 2 * s->cap : 64;
        int64_t *off = realloc(s->off, (size_t)cap * sizeof *off);
        if (!off) return cgi_fail(CG_ERR_NOMEM, "[data] out of memory for %lld sequences", (long long)cap), false;
        s->off = off;
        s->cap = cap;
    }
    if (s->n_ids + n > s->cap_ids || !s->ids) { /* storage even for empty sequences: ids + off[i] */
        int64_t cap = s->cap_ids ? 2 * s->cap_ids : 1024;
        while (cap < s->n_ids + n) cap *= 2;
        int32_t *ids2 = realloc(s->ids, (size_t)cap * sizeof *ids2);
        if (!ids2) return cgi_fail(CG_ERR_NOMEM, "[data] out of memory for %lld token ids", (long long)cap), false;
        s->ids = ids2;
        s->cap_ids = cap;
    }
    if (s->n == 0) s->off[0] = 0;
    if (n) memcpy(s->ids + s->n_ids, ids, (size_t)n * sizeof *ids);
    s->n_ids += n;
    s->off[++s->n] = s->n_ids;
    return true;
}

void cgi_seqs_free(cgi_seqs *s) {
    free(s->ids);
    free(s->off);
    memset(s, 0, sizeof *s);
}

uint64_t cgi_rng_below(cg_rng *r, uint64_t n) {
    uint64_t limit = (UINT64_MAX / n) * n; /* draws at or above limit would favour small values */
    uint64_t x;
    do x = cg_rng_next(r);
    while (x >= limit);
    return x % n;
}

cg_status cgi_val_count(const char *who, int64_t n, double frac, int64_t *n_val) {
    if (!(frac >= 0.0 && frac < 1.0))
        return cgi_fail(CG_ERR_ARG, "[data] %s: val_fraction %g is not in [0, 1)", who, frac);
    *n_val = (int64_t)llround(frac * (double)n);
    return CG_OK;
}

void cg_data_cursor_init(cg_data_cursor *c, uint64_t seed) {
    if (!c) return;
    cg_rng_seed(&c->rng, seed);
    c->epoch = 0;
    c->pos = 0;
}

/* Makes o hold the order drawn from state for n examples. */
static cg_status order_at(cgi_order *o, uint64_t state, int64_t n) {
    if (o->perm && o->n == n && o->key == state) return CG_OK;
    if (o->n != n || !o->perm) {
        int64_t *p = realloc(o->perm, (size_t)n * sizeof *p);
        if (!p) return cgi_fail(CG_ERR_NOMEM, "[data] out of memory for an order of %lld examples", (long long)n);
        o->perm = p;
        o->n = n;
    }
    cg_rng r = {state};
    for (int64_t i = 0; i < n; i++) o->perm[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)cgi_rng_below(&r, (uint64_t)i + 1);
        int64_t t = o->perm[i];
        o->perm[i] = o->perm[j];
        o->perm[j] = t;
    }
    o->key = state;
    o->next = r.state;
    return CG_OK;
}

cg_status cgi_order_take(cgi_order *o, cg_data_cursor *c, int64_t n, int64_t batch, int64_t *rows, const char *who) {
    if (!c) return cgi_fail(CG_ERR_ARG, "[data] %s: NULL cursor", who);
    if (batch < 1 || batch > n)
        return cgi_fail(CG_ERR_ARG, "[data] %s: batch %lld does not fit a split of %lld examples", who,
                        (long long)batch, (long long)n);
    if (c->pos < 0 || c->pos >= n || c->epoch < 0)
        return cgi_fail(CG_ERR_STATE,
                        "[data] %s: cursor at epoch %lld position %lld does not fit a split of %lld examples "
                        "(restored from other data?)",
                        who, (long long)c->epoch, (long long)c->pos, (long long)n);
    cg_data_cursor k = *c;
    for (int64_t b = 0; b < batch; b++) {
        cg_status s = order_at(o, k.rng.state, n);
        if (s) return s;
        rows[b] = o->perm[k.pos++];
        if (k.pos == n) {
            k.rng.state = o->next;
            k.epoch++;
            k.pos = 0;
        }
    }
    *c = k;
    return CG_OK;
}

void cgi_order_free(cgi_order *o) {
    free(o->perm);
    memset(o, 0, sizeof *o);
}

cg_status cgi_tsv_read(const char *path, const char *what, cgi_tsv_fn fn, void *ctx) {
    char *text;
    size_t len;
    cg_status s = cg_read_text_file(path, &text, &len);
    if (s) return s;
    int64_t line = 0;
    for (size_t i = 0; i < len && !s;) {
        line++;
        const char *p = text + i, *nl = memchr(p, '\n', len - i);
        size_t n = nl ? (size_t)(nl - p) : len - i;
        i += n + 1;
        if (n && p[n - 1] == '\r') n--;
        size_t blank = 0, tabs = 0;
        const char *tab = NULL;
        for (size_t k = 0; k < n; k++) {
            if (p[k] == ' ') blank++;
            if (p[k] == '\t' && !tabs++) tab = p + k;
        }
        if (blank == n) continue;
        if (tabs != 1) {
            s = cgi_fail(CG_ERR_FORMAT, "[data] %s:%lld: expected one tab (%s), found %zu", path, (long long)line, what,
                         tabs);
            break;
        }
        s = fn(ctx, path, line, p, (size_t)(tab - p), tab + 1, n - (size_t)(tab - p) - 1);
    }
    free(text);
    return s;
}

cg_status cgi_tsv_encode(const cg_tokenizer *tok, const char *path, int64_t line, const char *field, const char *s,
                         size_t n, int32_t **ids, int64_t *n_ids) {
    cg_status st = cg_tokenizer_encode(tok, s, n, ids, n_ids);
    if (!st) return CG_OK;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", cg_last_error()); /* cgi_fail rewrites the buffer it points into */
    return cgi_fail(st, "[data] %s:%lld: %s: %s", path, (long long)line, field, msg);
}
