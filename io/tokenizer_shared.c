/* SPDX-License-Identifier: MIT */
/* What the tokenizer files (io/tokenizer*.c, io/tokenizer_hf/) share, declared in
 * io/tokenizer_internal.h: the token table and its hash index, the map of id pairs (BPE's merges),
 * growable id and byte arrays, UTF-8, and reading and writing the tokenizers' files. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/file_internal.h"
#include "io/tokenizer_internal.h"

/* ---------------------------------------------------------------- token table and index */

uint64_t cgi_hash_bytes(const char *s, size_t len) {
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a, then mixed: short keys spread well */
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ULL;
    return cgi_hash64(h);
}

cg_tokenizer *cgi_tok_new(cg_tok_kind kind) {
    cg_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory");
        return NULL;
    }
    t->kind = kind;
    t->unk = -1;
    return t;
}

bool cgi_tok_push(cg_tokenizer *t, const char *s, size_t len) {
    if ((size_t)t->n == t->tok_cap) {
        size_t cap = t->tok_cap ? 2 * t->tok_cap : 64;
        int64_t *off = realloc(t->off, cap * sizeof *off);
        if (off) t->off = off;
        int32_t *ln = realloc(t->len, cap * sizeof *ln);
        if (ln) t->len = ln;
        if (!off || !ln) goto nomem;
        t->tok_cap = cap;
    }
    if (t->pool_len + len + 1 > t->pool_cap) {
        size_t cap = t->pool_cap ? t->pool_cap : 4096;
        while (cap < t->pool_len + len + 1) cap *= 2;
        char *p = realloc(t->pool, cap);
        if (!p) goto nomem;
        t->pool = p;
        t->pool_cap = cap;
    }
    if (len > INT32_MAX || t->n == INT32_MAX) goto nomem;
    memcpy(t->pool + t->pool_len, s, len);
    t->pool[t->pool_len + len] = 0;
    t->off[t->n] = (int64_t)t->pool_len;
    t->len[t->n] = (int32_t)len;
    t->pool_len += len + 1;
    t->n++;
    return true;
nomem:
    cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory at token %d", (int)t->n);
    return false;
}

void cgi_tokmap_put(cg_tokenizer *t, int32_t id) {
    const char *s = cgi_tok_str(t, id);
    size_t len = (size_t)t->len[id];
    for (size_t h = cgi_hash_bytes(s, len) & t->index.mask;; h = (h + 1) & t->index.mask) {
        int32_t j = t->index.slot[h];
        if (j < 0 || ((size_t)t->len[j] == len && memcmp(cgi_tok_str(t, j), s, len) == 0)) {
            t->index.slot[h] = id;
            return;
        }
    }
}

bool cgi_tok_reserve(cg_tokenizer *t, size_t expected) {
    size_t cap = 64;
    while (cap < 2 * expected + 2) cap *= 2;
    free(t->index.slot);
    t->index.slot = malloc(cap * sizeof *t->index.slot);
    if (!t->index.slot) {
        cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory for the index of %d tokens", (int)t->n);
        return false;
    }
    memset(t->index.slot, 0xff, cap * sizeof *t->index.slot);
    t->index.mask = cap - 1;
    return true;
}

bool cgi_tok_index(cg_tokenizer *t) {
    if (!cgi_tok_reserve(t, (size_t)t->n)) return false;
    for (int32_t i = 0; i < t->n; i++) cgi_tokmap_put(t, i);
    return true;
}

int32_t cgi_tokmap_get(const cg_tokenizer *t, const char *s, size_t len) {
    if (!t->index.slot) return -1;
    for (size_t h = cgi_hash_bytes(s, len) & t->index.mask;; h = (h + 1) & t->index.mask) {
        int32_t j = t->index.slot[h];
        if (j < 0) return -1;
        if ((size_t)t->len[j] == len && memcmp(cgi_tok_str(t, j), s, len) == 0) return j;
    }
}

/* ---------------------------------------------------------------- pair map */

bool cgi_pairmap_init(cgi_pairmap *m, size_t expected) {
    size_t cap = 64;
    while (cap < 2 * expected + 2) cap *= 2;
    m->key = malloc(cap * sizeof *m->key);
    m->val = malloc(cap * sizeof *m->val);
    m->mask = cap - 1;
    m->count = 0;
    if (!m->key || !m->val) {
        cgi_pairmap_free(m);
        cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory for a map of %zu pairs", expected);
        return false;
    }
    memset(m->key, 0xff, cap * sizeof *m->key);
    return true;
}

void cgi_pairmap_free(cgi_pairmap *m) {
    free(m->key);
    free(m->val);
    m->key = NULL;
    m->val = NULL;
    m->mask = m->count = 0;
}

static size_t pair_slot(const cgi_pairmap *m, uint64_t k) {
    size_t h = cgi_hash64(k) & m->mask;
    while (m->key[h] != k && m->key[h] != UINT64_MAX) h = (h + 1) & m->mask;
    return h;
}

bool cgi_pairmap_put(cgi_pairmap *m, int32_t a, int32_t b, int64_t val) {
    if (2 * (m->count + 1) > m->mask + 1) { /* keep the load under one half */
        cgi_pairmap big;
        if (!cgi_pairmap_init(&big, m->count + 1)) return false;
        for (size_t i = 0; i <= m->mask; i++) {
            if (m->key[i] == UINT64_MAX) continue;
            size_t h = pair_slot(&big, m->key[i]);
            big.key[h] = m->key[i];
            big.val[h] = m->val[i];
        }
        big.count = m->count;
        cgi_pairmap_free(m);
        *m = big;
    }
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t h = pair_slot(m, k);
    if (m->key[h] == UINT64_MAX) m->count++;
    m->key[h] = k;
    m->val[h] = val;
    return true;
}

int64_t *cgi_pairmap_get(const cgi_pairmap *m, int32_t a, int32_t b) {
    if (!m->key) return NULL;
    size_t h = pair_slot(m, (uint64_t)(uint32_t)a << 32 | (uint32_t)b);
    return m->key[h] == UINT64_MAX ? NULL : &m->val[h];
}

bool cgi_ids_push(cgi_ids *a, int32_t x) {
    if (a->n == a->cap) {
        int64_t cap = a->cap ? 2 * a->cap : 256;
        int32_t *v = realloc(a->v, (size_t)cap * sizeof *v);
        if (!v) {
            cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory for %lld ids", (long long)cap);
            return false;
        }
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return true;
}

bool cgi_buf_add(cgi_buf *b, const void *p, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *s = realloc(b->s, cap);
        if (!s) {
            cgi_fail(CG_ERR_NOMEM, "[tokenizer] out of memory for %zu bytes", cap);
            return false;
        }
        b->s = s;
        b->cap = cap;
    }
    if (n) memcpy(b->s + b->n, p, n);
    b->n += n;
    b->s[b->n] = 0;
    return true;
}

/* ---------------------------------------------------------------- UTF-8 */

size_t cgi_utf8_check(const char *str, size_t len) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t need;
        unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
        if (c >= 0xC2 && c <= 0xDF) need = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            if (c == 0xE0) lo = 0xA0;      /* overlong */
            else if (c == 0xED) hi = 0x9F; /* surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            if (c == 0xF0) lo = 0x90;      /* overlong */
            else if (c == 0xF4) hi = 0x8F; /* past U+10FFFF */
        } else return i;
        if (len - i <= need || s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t k = 2; k <= need; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF) return i;
        i += need + 1;
    }
    return len;
}

int cgi_utf8_next(const unsigned char *s, uint32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) { *cp = c; return 1; }
    if (c < 0xE0) { *cp = (c & 0x1Fu) << 6 | (s[1] & 0x3Fu); return 2; }
    if (c < 0xF0) { *cp = (c & 0x0Fu) << 12 | (s[1] & 0x3Fu) << 6 | (s[2] & 0x3Fu); return 3; }
    *cp = (c & 0x07u) << 18 | (s[1] & 0x3Fu) << 12 | (s[2] & 0x3Fu) << 6 | (s[3] & 0x3Fu);
    return 4;
}

int cgi_utf8_put(uint32_t cp, char *o) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18);
    o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

cg_status cgi_utf8_fail(const char *what, const char *s, size_t len, size_t at) {
    char bytes[24] = "";
    int k = 0;
    for (size_t i = at; i < len && i < at + 4; i++)
        k += snprintf(bytes + k, sizeof bytes - (size_t)k, "%s0x%02x", k ? " " : "", (unsigned char)s[i]);
    return cgi_fail(CG_ERR_FORMAT, "[tokenizer] %s: text is not valid UTF-8 at byte %zu (%s)", what, at,
                    bytes);
}

/* ---------------------------------------------------------------- files */

char *cgi_read_file(const char *path, size_t *len) {
    if (access(path, R_OK)) { /* the message the tokenizer loaders have always given */
        cgi_fail(CG_ERR_IO, "[tokenizer] cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    return cgi_read_bounded(path, CGI_LIMIT_TOKENIZER, "tokenizer", len);
}

cg_status cgi_write_file(const char *path, const char *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return cgi_fail(CG_ERR_IO, "[tokenizer] cannot create %s: %s", path, strerror(errno));
    bool ok = fwrite(data, 1, len, f) == len;
    ok = (fclose(f) == 0) && ok;
    return ok ? CG_OK : cgi_fail(CG_ERR_IO, "[tokenizer] cannot write %s", path);
}

