/* SPDX-License-Identifier: MIT */
/* safetensors writing. The writer streams its image through a sink, so a plain file, a memory
 * image and a gzip checkpoint share one serialiser and none needs a second copy of the data. The
 * reader is io/safetensors_read.c. */
#include "io/safetensors.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/internal.h"
#include "io/safetensors_internal.h"

/* ---- writer ---- */

typedef struct {
    char *name;
    int dtype;
    int ndim;
    int64_t shape[CG_MAX_DIMS];
    void *data;
    size_t bytes;
} w_entry;

struct cg_st_writer {
    w_entry *e;
    int n, cap;
    char **mkey, **mval;
    int nmeta, mcap;
};

cg_st_writer *cg_st_writer_new(void) {
    cg_st_writer *w = calloc(1, sizeof *w);
    if (!w) cgi_fail(CG_ERR_NOMEM, "[safetensors] writer: out of memory");
    return w;
}

void cg_st_writer_free(cg_st_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) {
        free(w->e[i].name);
        free(w->e[i].data);
    }
    free(w->e);
    cgi_st_free_metadata(w->mkey, w->mval, w->nmeta);
    free(w);
}

/* Appends an entry with room for its data (to be filled by the caller); NULL + message on failure. */
static w_entry *add_entry(cg_st_writer *w, const char *name, int dtype, int ndim, const int64_t *shape, const char *op) {
    if (!w || !name || (ndim > 0 && !shape)) {
        cgi_fail(CG_ERR_ARG, "[safetensors] %s: NULL argument", op);
        return NULL;
    }
    if (strcmp(name, "__metadata__") == 0) {
        cgi_fail(CG_ERR_ARG, "[safetensors] %s: '__metadata__' is reserved, not a tensor name", op);
        return NULL;
    }
    if (ndim < 0 || ndim > CG_MAX_DIMS) {
        cgi_fail(CG_ERR_SHAPE, "[safetensors] %s: tensor '%s' has %d dims, at most %d", op, name, ndim, CG_MAX_DIMS);
        return NULL;
    }
    size_t numel = 1;
    bool overflow = false;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            cgi_fail(CG_ERR_SHAPE, "[safetensors] %s: tensor '%s' has negative dim in %s", op, name, cgi_dims(ndim, shape));
            return NULL;
        }
        overflow |= __builtin_mul_overflow(numel, (size_t)shape[i], &numel);
    }
    size_t bytes;
    overflow |= __builtin_mul_overflow(numel, (size_t)cgi_st_dtypes[dtype].size, &bytes);
    if (overflow) {
        cgi_fail(CG_ERR_SHAPE, "[safetensors] %s: tensor '%s' of shape %s is too large", op, name, cgi_dims(ndim, shape));
        return NULL;
    }
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->e[i].name, name) == 0) {
            cgi_fail(CG_ERR_ARG, "[safetensors] %s: tensor name '%s' added twice", op, name);
            return NULL;
        }
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 16;
        w_entry *e = realloc(w->e, (size_t)cap * sizeof *e);
        if (!e) {
            cgi_fail(CG_ERR_NOMEM, "[safetensors] %s: out of memory", op);
            return NULL;
        }
        w->e = e;
        w->cap = cap;
    }
    w_entry *e = &w->e[w->n];
    memset(e, 0, sizeof *e);
    e->name = strdup(name);
    e->data = malloc(bytes ? bytes : 1);
    if (!e->name || !e->data) {
        free(e->name);
        free(e->data);
        cgi_fail(CG_ERR_NOMEM, "[safetensors] %s: cannot copy %zu bytes of '%s'", op, bytes, name);
        return NULL;
    }
    e->dtype = dtype;
    e->ndim = ndim;
    if (ndim) memcpy(e->shape, shape, (size_t)ndim * sizeof *shape);
    e->bytes = bytes;
    w->n++;
    return e;
}

/* Appends a tensor of dtype holding a copy of data (NULL only when it has no elements). */
static cg_status add_copy(cg_st_writer *w, const char *name, int dtype, int ndim, const int64_t *shape, const void *data,
                          const char *op) {
    w_entry *e = add_entry(w, name, dtype, ndim, shape, op);
    if (!e) return CG_ERR_ARG;
    if (e->bytes && !data) {
        free(e->name);
        free(e->data);
        w->n--;
        return cgi_fail(CG_ERR_ARG, "[safetensors] %s: NULL data for '%s'", op, name);
    }
    if (e->bytes) memcpy(e->data, data, e->bytes);
    return CG_OK;
}

cg_status cg_st_add(cg_st_writer *w, const char *name, int ndim, const int64_t *shape, const cg_real *data) {
    return add_copy(w, name, DT_REAL, ndim, shape, data, "add");
}

cg_status cg_st_add_ids(cg_st_writer *w, const char *name, int ndim, const int64_t *shape, const int32_t *data) {
    return add_copy(w, name, DT_I32, ndim, shape, data, "add_ids");
}

cg_status cg_st_add_tensor(cg_st_writer *w, const char *name, cg_tensor *t) {
    if (!t) return cgi_fail(CG_ERR_ARG, "[safetensors] add_tensor: NULL tensor for '%s'", name ? name : "(null)");
    bool ids = cg_tensor_dtype(t) == CG_INT32;
    void *base = ids ? (void *)cg_idata(t) : (void *)cg_data(t);
    if (!base) return cgi_fail(CG_ERR_STATE, "[safetensors] add_tensor: '%s'%s has no values yet",
                               name ? name : "(null)", cgi_shp(t));
    w_entry *e = add_entry(w, name, ids ? DT_I32 : DT_REAL, cg_ndim(t), cg_shape(t), "add_tensor");
    if (!e) return CG_ERR_ARG;
    if (!ids) {
        cg_status s = cg_read(t, e->data);
        if (s != CG_OK) {
            free(e->name);
            free(e->data);
            w->n--;
        }
        return s;
    }
    /* int32 tensors: gather row-major through the strides */
    int nd = cg_ndim(t);
    const int64_t *sh = cg_shape(t), *st = cg_strides(t);
    int64_t idx[CG_MAX_DIMS] = {0}, n = cg_numel(t);
    int32_t *out = e->data;
    for (int64_t k = 0; k < n; k++) {
        int64_t off = 0;
        for (int d = 0; d < nd; d++) off += idx[d] * st[d];
        out[k] = ((const int32_t *)base)[off];
        for (int d = nd - 1; d >= 0 && ++idx[d] == sh[d]; d--) idx[d] = 0;
    }
    return CG_OK;
}

cg_status cg_st_add_params(cg_st_writer *w, cg_params *ps) {
    if (!w || !ps) return cgi_fail(CG_ERR_ARG, "[safetensors] add_params: NULL argument");
    for (int i = 0; i < cg_params_count(ps); i++) {
        cg_tensor *p = cg_params_at(ps, i);
        cg_status s = cg_st_add_tensor(w, cg_name(p), p);
        if (s != CG_OK) return s;
    }
    return CG_OK;
}

cg_status cg_st_set_metadata(cg_st_writer *w, const char *key, const char *value) {
    if (!w || !key || !value) return cgi_fail(CG_ERR_ARG, "[safetensors] set_metadata: NULL argument");
    char *v = strdup(value);
    if (!v) return cgi_fail(CG_ERR_NOMEM, "[safetensors] set_metadata: out of memory");
    for (int i = 0; i < w->nmeta; i++)
        if (strcmp(w->mkey[i], key) == 0) {
            free(w->mval[i]);
            w->mval[i] = v;
            return CG_OK;
        }
    if (w->nmeta == w->mcap) {
        int cap = w->mcap ? 2 * w->mcap : 8;
        char **k = realloc(w->mkey, (size_t)cap * sizeof *k);
        if (k) w->mkey = k;
        char **vv = k ? realloc(w->mval, (size_t)cap * sizeof *vv) : NULL;
        if (vv) w->mval = vv;
        if (!k || !vv) {
            free(v);
            return cgi_fail(CG_ERR_NOMEM, "[safetensors] set_metadata: out of memory");
        }
        w->mcap = cap;
    }
    if (!(w->mkey[w->nmeta] = strdup(key))) {
        free(v);
        return cgi_fail(CG_ERR_NOMEM, "[safetensors] set_metadata: out of memory");
    }
    w->mval[w->nmeta++] = v;
    return CG_OK;
}

/* ---- serialisation ---- */

typedef struct {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (b->n + n + 1 > cap) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_fmt(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_fmt(sbuf *b, const char *fmt, ...) {
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    sb_put(b, tmp, (size_t)n);
}

/* A JSON string literal; bytes >= 0x80 pass through, so UTF-8 names stay UTF-8. */
static void sb_json(sbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char esc[2] = {'\\', (char)c};
            sb_put(b, esc, 2);
        } else if (c < 0x20) {
            sb_fmt(b, "\\u%04x", c);
        } else {
            sb_put(b, (const char *)&c, 1);
        }
    }
    sb_put(b, "\"", 1);
}

typedef struct {
    const char *key;
    int idx;
} keyed;

static int cmp_keyed(const void *a, const void *b) { return strcmp(((const keyed *)a)->key, ((const keyed *)b)->key); }

/* Indices of keys in sorted order, so equal writers give byte-identical files; NULL if out of memory. */
static int *sorted_order(const char *const *keys, size_t stride, int n) {
    keyed *k = malloc(((size_t)n + 1) * sizeof *k);
    int *idx = malloc(((size_t)n + 1) * sizeof *idx);
    if (!k || !idx) {
        free(k);
        free(idx);
        return NULL;
    }
    for (int i = 0; i < n; i++) k[i] = (keyed){*(const char *const *)((const char *)keys + (size_t)i * stride), i};
    qsort(k, (size_t)n, sizeof *k, cmp_keyed);
    for (int i = 0; i < n; i++) idx[i] = k[i].idx;
    free(k);
    return idx;
}

cg_status cgi_st_emit(cg_st_writer *w, cgi_st_sink sink, void *ctx, uint64_t *total) {
    if (!w) return cgi_fail(CG_ERR_ARG, "[safetensors] write: NULL writer");
    int *order = sorted_order(w->n ? (const char *const *)&w->e[0].name : NULL, sizeof(w_entry), w->n);
    int *morder = sorted_order((const char *const *)w->mkey, sizeof(char *), w->nmeta);
    sbuf b = {0};
    if (!order || !morder) b.oom = true;
    sb_str(&b, "{");
    if (w->nmeta) {
        sb_str(&b, "\"__metadata__\":{");
        for (int k = 0; k < w->nmeta && !b.oom; k++) {
            int i = morder[k];
            if (k) sb_str(&b, ",");
            sb_json(&b, w->mkey[i]);
            sb_str(&b, ":");
            sb_json(&b, w->mval[i]);
        }
        sb_str(&b, "}");
    }
    uint64_t off = 0;
    for (int k = 0; k < w->n && !b.oom; k++) {
        const w_entry *e = &w->e[order[k]];
        if (k || w->nmeta) sb_str(&b, ",");
        sb_json(&b, e->name);
        sb_fmt(&b, ":{\"dtype\":\"%s\",\"shape\":[", cgi_st_dtypes[e->dtype].name);
        for (int d = 0; d < e->ndim; d++) sb_fmt(&b, d ? ",%lld" : "%lld", (long long)e->shape[d]);
        sb_fmt(&b, "],\"data_offsets\":[%llu,", (unsigned long long)off);
        off += e->bytes;
        sb_fmt(&b, "%llu]}", (unsigned long long)off);
    }
    sb_str(&b, "}");
    while (b.n % 8) sb_str(&b, " "); /* 8 + header keeps the data 8-byte aligned */
    cg_status s = CG_OK;
    if (b.oom) s = cgi_fail(CG_ERR_NOMEM, "[safetensors] write: out of memory for the header");
    if (s == CG_OK) {
        uint64_t hlen = b.n;
        s = sink(ctx, &hlen, 8);
        if (s == CG_OK) s = sink(ctx, b.p, b.n);
        for (int k = 0; k < w->n && s == CG_OK; k++)
            if (w->e[order[k]].bytes) s = sink(ctx, w->e[order[k]].data, w->e[order[k]].bytes);
        if (total) *total = 8 + hlen + off;
    }
    free(b.p);
    free(order);
    free(morder);
    return s;
}

typedef struct {
    FILE *fp;
    const char *path;
} file_sink;

static cg_status to_file(void *ctx, const void *p, size_t n) {
    file_sink *fs = ctx;
    if (fwrite(p, 1, n, fs->fp) != n) return cgi_st_fail(fs->path, CG_ERR_IO, "write failed: %s", strerror(errno));
    return CG_OK;
}

cg_status cg_st_write(cg_st_writer *w, const char *path) {
    if (!w || !path) return cgi_fail(CG_ERR_ARG, "[safetensors] write: NULL argument");
    FILE *fp = fopen(path, "wb");
    if (!fp) return cgi_st_fail(path, CG_ERR_IO, "cannot create: %s", strerror(errno));
    file_sink fs = {fp, path};
    cg_status s = cgi_st_emit(w, to_file, &fs, NULL);
    if (fclose(fp) != 0 && s == CG_OK) s = cgi_st_fail(path, CG_ERR_IO, "write failed: %s", strerror(errno));
    return s;
}

typedef struct {
    unsigned char *p;
    size_t n, cap;
} mem_sink;

static cg_status to_memory(void *ctx, const void *p, size_t n) {
    mem_sink *m = ctx;
    if (m->n + n > m->cap) {
        size_t cap = m->cap ? m->cap : 4096;
        while (m->n + n > cap) cap *= 2;
        unsigned char *q = realloc(m->p, cap);
        if (!q) return cgi_fail(CG_ERR_NOMEM, "[safetensors] serialize: cannot allocate %zu bytes", cap);
        m->p = q;
        m->cap = cap;
    }
    memcpy(m->p + m->n, p, n);
    m->n += n;
    return CG_OK;
}

cg_status cg_st_serialize(cg_st_writer *w, void **bytes, size_t *len) {
    if (!w || !bytes || !len) return cgi_fail(CG_ERR_ARG, "[safetensors] serialize: NULL argument");
    size_t need = 4096;
    for (int i = 0; i < w->n; i++) need += w->e[i].bytes + strlen(w->e[i].name) + 96;
    mem_sink m = {malloc(need), 0, need};
    if (!m.p) return cgi_fail(CG_ERR_NOMEM, "[safetensors] serialize: cannot allocate %zu bytes", need);
    cg_status s = cgi_st_emit(w, to_memory, &m, NULL);
    if (s != CG_OK) {
        free(m.p);
        return s;
    }
    *bytes = m.p;
    *len = m.n;
    return CG_OK;
}
