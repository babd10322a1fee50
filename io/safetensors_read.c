/* SPDX-License-Identifier: MIT */
/* safetensors reading. A reader validates the whole header once at open (dtypes, shapes, offsets
 * against the buffer, duplicate names), so a read only checks what the caller asks for. Files are
 * memory-mapped; element loads go through memcpy because the format does not promise aligned
 * offsets. The writer is io/safetensors_write.c. */
#include "io/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "graph/internal.h"
#include "io/file_internal.h"
#include "io/safetensors_internal.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "io/safetensors_read.c assumes a little-endian host: safetensors stores little-endian data"
#endif

/* ---- dtypes ---- */

const st_dtype cgi_st_dtypes[DT_COUNT] = {
    [DT_BOOL] = {"BOOL", 1, K_BOOL},        [DT_U8] = {"U8", 1, K_UINT},
    [DT_I8] = {"I8", 1, K_INT},             [DT_F8_E5M2] = {"F8_E5M2", 1, K_REAL},
    [DT_F8_E4M3] = {"F8_E4M3", 1, K_REAL},  [DT_I16] = {"I16", 2, K_INT},
    [DT_U16] = {"U16", 2, K_UINT},          [DT_F16] = {"F16", 2, K_REAL},
    [DT_BF16] = {"BF16", 2, K_REAL},        [DT_I32] = {"I32", 4, K_INT},
    [DT_U32] = {"U32", 4, K_UINT},          [DT_F32] = {"F32", 4, K_REAL},
    [DT_F64] = {"F64", 8, K_REAL},          [DT_I64] = {"I64", 8, K_INT},
    [DT_U64] = {"U64", 8, K_UINT},
};

static int dtype_lookup(const char *s) {
    for (int i = 0; i < DT_COUNT; i++)
        if (strcmp(cgi_st_dtypes[i].name, s) == 0) return i;
    return -1;
}

/* ---- reader ---- */

typedef struct {
    char *name;
    int dtype;
    int ndim;
    int64_t *shape;   /* ndim entries; files may hold more dims than CG_MAX_DIMS */
    uint64_t begin, end;
    const unsigned char *base; /* the data buffer begin and end count from (a shard's, in a merged view) */
    uint64_t base_len;         /* its length */
} st_entry;

struct cg_st {
    char *label;
    unsigned char *image; /* whole file or memory image */
    size_t len;
    bool mapped;          /* image is an mmap, else malloc'd */
    const unsigned char *data; /* the byte buffer after the header */
    uint64_t data_len;
    st_entry *e;          /* sorted by name */
    int n;
    char **mkey, **mval;
    int nmeta;
    int refs;             /* cgi_st_retain: extra owners, each closing once */
    cg_st **parts;        /* a merged view (cgi_st_merge): the files it holds */
    int nparts;
};

cg_status cgi_st_fail(const char *label, cg_status s, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return cgi_fail(s, "[safetensors] %s: %s", label, msg);
}

void cg_st_close(cg_st *f) {
    if (!f) return;
    if (f->refs > 0) {
        f->refs--;
        return;
    }
    for (int i = 0; i < f->nparts; i++) cg_st_close(f->parts[i]);
    free(f->parts);
    for (int i = 0; i < f->n; i++) {
        free(f->e[i].name);
        free(f->e[i].shape);
    }
    free(f->e);
    cgi_st_free_metadata(f->mkey, f->mval, f->nmeta);
    if (f->mapped) munmap(f->image, f->len);
    else if (f->nparts) { /* a merged view has no image of its own */ }
    else free(f->image);
    free(f->label);
    free(f);
}

/* A JSON number that is a whole value exactly representable in a double (|x| <= 2^53). */
static bool json_int(const cJSON *x, int64_t *out) {
    if (!cJSON_IsNumber(x)) return false;
    double d = x->valuedouble;
    if (!(fabs(d) <= 9007199254740992.0) || d != floor(d)) return false;
    *out = (int64_t)d;
    return true;
}

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const st_entry *)a)->name, ((const st_entry *)b)->name);
}

static cg_status parse_metadata(cg_st *f, const cJSON *meta) {
    if (!cJSON_IsObject(meta)) return cgi_st_fail(f->label, CG_ERR_FORMAT, "__metadata__ is not a JSON object");
    int n = cJSON_GetArraySize(meta);
    f->mkey = calloc((size_t)n + 1, sizeof *f->mkey);
    f->mval = calloc((size_t)n + 1, sizeof *f->mval);
    if (!f->mkey || !f->mval) return cgi_st_fail(f->label, CG_ERR_NOMEM, "out of memory");
    for (const cJSON *m = meta->child; m; m = m->next) {
        if (!cJSON_IsString(m))
            return cgi_st_fail(f->label, CG_ERR_FORMAT, "__metadata__ value of '%s' is not a string", m->string);
        f->mkey[f->nmeta] = strdup(m->string);
        f->mval[f->nmeta] = strdup(m->valuestring);
        f->nmeta++;
        if (!f->mkey[f->nmeta - 1] || !f->mval[f->nmeta - 1])
            return cgi_st_fail(f->label, CG_ERR_NOMEM, "out of memory");
    }
    return CG_OK;
}

static cg_status parse_entry(cg_st *f, const cJSON *item, st_entry *e) {
    const char *nm = item->string;
    if (!cJSON_IsObject(item)) return cgi_st_fail(f->label, CG_ERR_FORMAT, "entry '%s' is not a JSON object", nm);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!dt) return cgi_st_fail(f->label, CG_ERR_FORMAT, "tensor '%s' has no dtype", nm);
    if (!sh) return cgi_st_fail(f->label, CG_ERR_FORMAT, "tensor '%s' has no shape", nm);
    if (!off) return cgi_st_fail(f->label, CG_ERR_FORMAT, "tensor '%s' has no data_offsets", nm);
    if (!cJSON_IsString(dt)) return cgi_st_fail(f->label, CG_ERR_FORMAT, "tensor '%s': dtype is not a string", nm);
    e->dtype = dtype_lookup(dt->valuestring);
    if (e->dtype < 0) return cgi_st_fail(f->label, CG_ERR_FORMAT, "tensor '%s': unknown dtype '%s'", nm, dt->valuestring);
    if (!cJSON_IsArray(sh)) return cgi_st_fail(f->label, CG_ERR_FORMAT, "tensor '%s': shape is not an array", nm);
    e->ndim = cJSON_GetArraySize(sh);
    if (e->ndim > 0 && !(e->shape = malloc((size_t)e->ndim * sizeof *e->shape)))
        return cgi_st_fail(f->label, CG_ERR_NOMEM, "out of memory");
    uint64_t numel = 1;
    bool overflow = false;
    int d = 0;
    for (const cJSON *x = sh->child; x; x = x->next, d++) {
        if (!json_int(x, &e->shape[d]))
            return cgi_st_fail(f->label, CG_ERR_FORMAT, "tensor '%s': shape entry %d is not an integer", nm, d);
        if (e->shape[d] < 0)
            return cgi_st_fail(f->label, CG_ERR_FORMAT, "tensor '%s': negative dim %lld in shape", nm,
                           (long long)e->shape[d]);
        overflow |= __builtin_mul_overflow(numel, (uint64_t)e->shape[d], &numel);
    }
    int64_t b, en;
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || !json_int(off->child, &b) ||
        !json_int(off->child->next, &en) || b < 0 || en < 0)
        return cgi_st_fail(f->label, CG_ERR_FORMAT, "tensor '%s': data_offsets is not [begin, end] with whole numbers >= 0", nm);
    e->begin = (uint64_t)b;
    e->end = (uint64_t)en;
    if (e->end < e->begin)
        return cgi_st_fail(f->label, CG_ERR_FORMAT, "tensor '%s': data_offsets [%llu, %llu] end before begin", nm,
                       (unsigned long long)e->begin, (unsigned long long)e->end);
    if (e->end > f->data_len)
        return cgi_st_fail(f->label, CG_ERR_FORMAT, "tensor '%s': data_offsets [%llu, %llu] go past the end of the %llu-byte data buffer",
                       nm, (unsigned long long)e->begin, (unsigned long long)e->end, (unsigned long long)f->data_len);
    uint64_t bytes;
    overflow |= __builtin_mul_overflow(numel, (uint64_t)cgi_st_dtypes[e->dtype].size, &bytes);
    if (overflow || bytes != e->end - e->begin)
        return cgi_st_fail(f->label, CG_ERR_FORMAT, "tensor '%s': data_offsets [%llu, %llu] hold %llu bytes but %s%s needs %s%llu",
                       nm, (unsigned long long)e->begin, (unsigned long long)e->end,
                       (unsigned long long)(e->end - e->begin), cgi_st_dtypes[e->dtype].name, cgi_dims(e->ndim, e->shape),
                       overflow ? "more than " : "", overflow ? (unsigned long long)UINT64_MAX : (unsigned long long)bytes);
    return CG_OK;
}

static int cmp_begin(const void *a, const void *b) {
    const st_entry *x = *(const st_entry *const *)a, *y = *(const st_entry *const *)b;
    if (x->base != y->base) return x->base < y->base ? -1 : 1;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : x->end < y->end ? -1 : x->end > y->end;
}

/* Empty tensors hold no bytes, so they overlap nothing. */
cg_status cgi_st_check_disjoint(const cg_st *f) {
    const st_entry **by = malloc(((size_t)f->n + 1) * sizeof *by);
    if (!by) return cgi_st_fail(f->label, CG_ERR_NOMEM, "out of memory");
    int m = 0;
    for (int i = 0; i < f->n; i++)
        if (f->e[i].end > f->e[i].begin) by[m++] = &f->e[i];
    qsort(by, (size_t)m, sizeof *by, cmp_begin);
    cg_status s = CG_OK;
    for (int i = 1; i < m && !s; i++)
        if (by[i]->base == by[i - 1]->base && by[i]->begin < by[i - 1]->end)
            s = cgi_st_fail(f->label, CG_ERR_FORMAT, "tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap in the data buffer",
                        by[i - 1]->name, (unsigned long long)by[i - 1]->begin, (unsigned long long)by[i - 1]->end,
                        by[i]->name, (unsigned long long)by[i]->begin, (unsigned long long)by[i]->end);
    free(by);
    return s;
}

/* cJSON turns a NUL inside a string ("\u0000", or a raw 0 byte) into a C string cut short, so
 * "wte.weight\u0000x" would name tensor "wte.weight" and a metadata value would lose its tail.
 * Refuses the header, quoting the string (up to 120 bytes) and the byte where the NUL is. */
static cg_status check_no_nul(const cg_st *f, const char *h, size_t n) {
    size_t open_at = 0;
    bool in_string = false;
    for (size_t i = 0; i < n; i++) {
        const bool escaped_nul = h[i] == '\\' && n - i >= 6 && !memcmp(h + i + 1, "u0000", 5);
        if (h[i] == '\\' && !escaped_nul) {
            i++; /* an escaped character: never a quote that ends the string */
            continue;
        }
        if (h[i] == '"') {
            in_string = !in_string;
            open_at = i;
            continue;
        }
        if (!escaped_nul && h[i] != 0) continue;
        size_t end = i + 1; /* the closing quote, for the quote in the message */
        while (end < n && h[end] != '"') end += h[end] == '\\' ? 2 : 1;
        char shown[128];
        size_t k = 0;
        for (size_t j = in_string ? open_at + 1 : i; j < end && j < n && k + 1 < sizeof shown - 8; j++)
            shown[k++] = h[j] ? h[j] : '?';
        shown[k] = 0;
        return cgi_st_fail(f->label, CG_ERR_FORMAT, "header string \"%s\" holds a NUL character (%s at header byte %zu): "
                           "tensor names and metadata cannot hold one", shown, escaped_nul ? "\\u0000" : "a 0 byte", i);
    }
    return CG_OK;
}

static cg_status parse(cg_st *f) {
    if (f->len < 8)
        return cgi_st_fail(f->label, CG_ERR_FORMAT, "file is %zu bytes, shorter than the 8-byte header length", f->len);
    uint64_t hlen;
    memcpy(&hlen, f->image, 8);
    if (hlen > f->len - 8)
        return cgi_st_fail(f->label, CG_ERR_FORMAT, "header length %llu is larger than the file (%zu bytes after the length)",
                       (unsigned long long)hlen, f->len - 8);
    const char *h = (const char *)f->image + 8, *end = NULL;
    f->data = f->image + 8 + hlen;
    f->data_len = f->len - 8 - hlen;
    cg_status nul = check_no_nul(f, h, (size_t)hlen);
    if (nul != CG_OK) return nul;
    cJSON *root = cJSON_ParseWithLengthOpts(h, (size_t)hlen, &end, false);
    if (!root) {
        long at = end ? (long)(end - h) : -1;
        return cgi_st_fail(f->label, CG_ERR_FORMAT, "header is not valid JSON (error near byte %ld of %llu)", at,
                       (unsigned long long)hlen);
    }
    cg_status s = CG_OK;
    for (const char *p = end; p < h + hlen; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            s = cgi_st_fail(f->label, CG_ERR_FORMAT, "header is not valid JSON: bytes after the object at byte %ld",
                        (long)(p - h));
            goto done;
        }
    if (!cJSON_IsObject(root)) {
        s = cgi_st_fail(f->label, CG_ERR_FORMAT, "header is not a JSON object");
        goto done;
    }
    int n = cJSON_GetArraySize(root);
    f->e = calloc((size_t)n + 1, sizeof *f->e);
    if (!f->e) {
        s = cgi_st_fail(f->label, CG_ERR_NOMEM, "out of memory for %d header entries", n);
        goto done;
    }
    bool seen_meta = false;
    for (const cJSON *item = root->child; item; item = item->next) {
        if (strcmp(item->string, "__metadata__") == 0) {
            if (seen_meta) {
                s = cgi_st_fail(f->label, CG_ERR_FORMAT, "duplicate __metadata__ entry");
                goto done;
            }
            seen_meta = true;
            if ((s = parse_metadata(f, item)) != CG_OK) goto done;
            continue;
        }
        st_entry *e = &f->e[f->n++];
        if (!(e->name = strdup(item->string))) {
            s = cgi_st_fail(f->label, CG_ERR_NOMEM, "out of memory");
            goto done;
        }
        if ((s = parse_entry(f, item, e)) != CG_OK) goto done;
    }
    for (int i = 0; i < f->n; i++) f->e[i].base = f->data, f->e[i].base_len = f->data_len;
    qsort(f->e, (size_t)f->n, sizeof *f->e, cmp_entry);
    for (int i = 1; i < f->n; i++)
        if (strcmp(f->e[i - 1].name, f->e[i].name) == 0) {
            s = cgi_st_fail(f->label, CG_ERR_FORMAT, "duplicate tensor name '%s'", f->e[i].name);
            goto done;
        }
done:
    cJSON_Delete(root);
    return s;
}

cg_st *cgi_st_adopt(void *bytes, size_t len, const char *label) {
    cg_st *f = calloc(1, sizeof *f);
    char *lb = strdup(label ? label : "<memory>");
    if (!f || !lb) {
        free(f);
        free(lb);
        free(bytes);
        cgi_fail(CG_ERR_NOMEM, "[safetensors] %s: out of memory", label ? label : "<memory>");
        return NULL;
    }
    f->label = lb;
    f->image = bytes;
    f->len = len;
    if (parse(f) != CG_OK) {
        cg_st_close(f);
        return NULL;
    }
    return f;
}

cg_st *cg_st_open_memory(const void *bytes, size_t len, const char *label) {
    if (!bytes && len) {
        cgi_fail(CG_ERR_ARG, "[safetensors] open_memory: NULL bytes");
        return NULL;
    }
    void *copy = malloc(len ? len : 1);
    if (!copy) {
        cgi_fail(CG_ERR_NOMEM, "[safetensors] %s: cannot copy %zu bytes", label ? label : "<memory>", len);
        return NULL;
    }
    if (len) memcpy(copy, bytes, len);
    return cgi_st_adopt(copy, len, label);
}

cg_st *cg_st_open(const char *path) {
    if (!path) {
        cgi_fail(CG_ERR_ARG, "[safetensors] open: NULL path");
        return NULL;
    }
    int fd = open(path, O_RDONLY | O_NONBLOCK); /* a FIFO without a writer must not block here */
    if (fd < 0) {
        cgi_st_fail(path, CG_ERR_IO, "cannot open: %s", strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        cgi_st_fail(path, CG_ERR_IO, "cannot stat: %s", strerror(errno));
        close(fd);
        return NULL;
    }
    if (S_ISDIR(st.st_mode)) {
        cgi_st_fail(path, CG_ERR_IO, "is a directory");
        close(fd);
        return NULL;
    }
    if (S_ISREG(st.st_mode) && st.st_size < 8) {
        close(fd);
        cgi_st_fail(path, CG_ERR_FORMAT, "file is %lld bytes, shorter than the 8-byte header length", (long long)st.st_size);
        return NULL;
    }
    void *map = MAP_FAILED;
    size_t len = 0;
    if (S_ISREG(st.st_mode) && (uint64_t)st.st_size <= SIZE_MAX) {
        len = (size_t)st.st_size;
        map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    }
    if (map != MAP_FAILED) {
        close(fd);
        cg_st *f = calloc(1, sizeof *f);
        char *lb = strdup(path);
        if (!f || !lb) {
            free(f);
            free(lb);
            munmap(map, len);
            cgi_st_fail(path, CG_ERR_NOMEM, "out of memory");
            return NULL;
        }
        f->label = lb;
        f->image = map;
        f->len = len;
        f->mapped = true;
        if (parse(f) != CG_OK) {
            cg_st_close(f);
            return NULL;
        }
        return f;
    }
    /* not mappable: a pipe is read with a bound; a device (/dev/zero) is refused, it never ends */
    close(fd);
    void *buf = cgi_read_bounded(path, CGI_LIMIT_STREAM, "safetensors", &len);
    if (!buf) return NULL;
    return cgi_st_adopt(buf, len, path);
}

int cg_st_count(const cg_st *f) { return f ? f->n : 0; }

const char *cg_st_name(const cg_st *f, int i) { return f && i >= 0 && i < f->n ? f->e[i].name : NULL; }

int cg_st_find(const cg_st *f, const char *name) {
    if (!f || !name) return -1;
    int lo = 0, hi = f->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(f->e[mid].name, name);
        if (c == 0) return mid;
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

const char *cg_st_metadata(const cg_st *f, const char *key) {
    for (int i = 0; f && key && i < f->nmeta; i++)
        if (strcmp(f->mkey[i], key) == 0) return f->mval[i];
    return NULL;
}

static const st_entry *lookup(const cg_st *f, const char *name, const char *op) {
    if (!f || !name) {
        cgi_fail(CG_ERR_ARG, "[safetensors] %s: NULL argument", op);
        return NULL;
    }
    int i = cg_st_find(f, name);
    if (i < 0) {
        cgi_st_fail(f->label, CG_ERR_ARG, "no tensor '%s'", name);
        return NULL;
    }
    return &f->e[i];
}

cg_status cg_st_info(const cg_st *f, const char *name, const char **dtype, int *ndim, int64_t *shape) {
    const st_entry *e = lookup(f, name, "info");
    if (!e) return CG_ERR_ARG;
    if (e->ndim > CG_MAX_DIMS)
        return cgi_st_fail(f->label, CG_ERR_SHAPE, "tensor '%s' has %d dims, cgrad supports at most %d", name, e->ndim,
                       CG_MAX_DIMS);
    if (dtype) *dtype = cgi_st_dtypes[e->dtype].name;
    if (ndim) *ndim = e->ndim;
    if (shape && e->ndim) memcpy(shape, e->shape, (size_t)e->ndim * sizeof *shape);
    return CG_OK;
}

static cg_status check_shape(const cg_st *f, const st_entry *e, int ndim, const int64_t *shape) {
    if (ndim < 0) return CG_OK;
    if (ndim > 0 && !shape) return cgi_fail(CG_ERR_ARG, "[safetensors] read: NULL shape with ndim %d", ndim);
    bool same = ndim == e->ndim;
    for (int i = 0; same && i < ndim; i++) same = shape[i] == e->shape[i];
    if (!same)
        return cgi_st_fail(f->label, CG_ERR_SHAPE, "tensor '%s' has shape %s, expected %s", e->name,
                       cgi_dims(e->ndim, e->shape), cgi_dims(ndim, shape));
    return CG_OK;
}

static uint64_t numel_of(const st_entry *e) { return (e->end - e->begin) / (uint64_t)cgi_st_dtypes[e->dtype].size; }

static float half_to_float(uint16_t h) {
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    float v = e == 0 ? ldexpf((float)m, -24)                 /* zero and subnormals */
              : e == 31 ? (m ? NAN : INFINITY)
                        : ldexpf((float)(m | 0x400), e - 25); /* (1 + m/1024) 2^(e-15) */
    return h & 0x8000 ? -v : v;
}

static float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16; /* bf16 is the top half of a float32, payloads included */
    float v;
    memcpy(&v, &bits, 4);
    return v;
}

static float f8_e4m3_to_float(uint8_t b) { /* "fn" variant: no inf, only S.1111.111 is NaN */
    int e = (b >> 3) & 0xf, m = b & 7;
    float v = e == 15 && m == 7 ? NAN : e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(m | 8), e - 10);
    return b & 0x80 ? -v : v;
}

static float f8_e5m2_to_float(uint8_t b) {
    int e = (b >> 2) & 0x1f, m = b & 3;
    float v = e == 31 ? (m ? NAN : INFINITY) : e == 0 ? ldexpf((float)m, -16) : ldexpf((float)(m | 4), e - 17);
    return b & 0x80 ? -v : v;
}

/* n values of a floating tensor's bytes p, converted to cg_real. */
void cgi_st_decode(int dtype, const unsigned char *p, uint64_t n, cg_real *dst) {
    switch (dtype) {
    case DT_F32:
#ifdef CGRAD_DOUBLE
        for (uint64_t i = 0; i < n; i++) {
            float v;
            memcpy(&v, p + 4 * i, 4);
            dst[i] = v;
        }
#else
        memcpy(dst, p, n * 4);
#endif
        break;
    case DT_F64:
#ifdef CGRAD_DOUBLE
        memcpy(dst, p, n * 8);
#else
        for (uint64_t i = 0; i < n; i++) {
            double v;
            memcpy(&v, p + 8 * i, 8);
            dst[i] = (cg_real)v;
        }
#endif
        break;
    case DT_F16:
    case DT_BF16:
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = dtype == DT_F16 ? half_to_float(h) : bf16_to_float(h);
        }
        break;
    case DT_F8_E4M3:
        for (uint64_t i = 0; i < n; i++) dst[i] = f8_e4m3_to_float(p[i]);
        break;
    case DT_F8_E5M2:
        for (uint64_t i = 0; i < n; i++) dst[i] = f8_e5m2_to_float(p[i]);
        break;
    }
}

cg_status cg_st_read(const cg_st *f, const char *name, cg_real *dst, int ndim, const int64_t *shape) {
    const st_entry *e = lookup(f, name, "read");
    if (!e) return CG_ERR_ARG;
    cg_status s = check_shape(f, e, ndim, shape);
    if (s != CG_OK) return s;
    if (cgi_st_dtypes[e->dtype].kind != K_REAL)
        return cgi_st_fail(f->label, CG_ERR_ARG, "tensor '%s' has dtype %s, not a floating type: use cg_st_read_ids", name,
                       cgi_st_dtypes[e->dtype].name);
    uint64_t n = numel_of(e);
    if (n == 0) return CG_OK;
    if (!dst) return cgi_fail(CG_ERR_ARG, "[safetensors] read: NULL destination");
    cgi_st_decode(e->dtype, e->base + e->begin, n, dst);
    return CG_OK;
}

cg_status cg_st_read_ids(const cg_st *f, const char *name, int32_t *dst, int ndim, const int64_t *shape) {
    const st_entry *e = lookup(f, name, "read_ids");
    if (!e) return CG_ERR_ARG;
    cg_status s = check_shape(f, e, ndim, shape);
    if (s != CG_OK) return s;
    const st_dtype *dt = &cgi_st_dtypes[e->dtype];
    if (dt->kind == K_REAL)
        return cgi_st_fail(f->label, CG_ERR_ARG, "tensor '%s' has dtype %s, not an integer type: use cg_st_read", name,
                       dt->name);
    uint64_t n = numel_of(e);
    if (n && !dst) return cgi_fail(CG_ERR_ARG, "[safetensors] read_ids: NULL destination");
    const unsigned char *p = e->base + e->begin;
    for (uint64_t i = 0; i < n; i++) {
        const unsigned char *q = p + i * (uint64_t)dt->size;
        int64_t v = 0;
        uint64_t u = 0;
        switch (e->dtype) {
        case DT_BOOL: v = q[0] != 0; break;
        case DT_U8: v = q[0]; break;
        case DT_I8: v = (int8_t)q[0]; break;
        case DT_I16: { int16_t x; memcpy(&x, q, 2); v = x; } break;
        case DT_U16: { uint16_t x; memcpy(&x, q, 2); v = x; } break;
        case DT_I32: { int32_t x; memcpy(&x, q, 4); v = x; } break;
        case DT_U32: { uint32_t x; memcpy(&x, q, 4); v = x; } break;
        case DT_I64: memcpy(&v, q, 8); break;
        case DT_U64:
            memcpy(&u, q, 8);
            if (u > INT32_MAX)
                return cgi_st_fail(f->label, CG_ERR_RANGE, "tensor '%s': element %llu = %llu is outside int32", name,
                               (unsigned long long)i, (unsigned long long)u);
            v = (int64_t)u;
            break;
        }
        if (v < INT32_MIN || v > INT32_MAX)
            return cgi_st_fail(f->label, CG_ERR_RANGE, "tensor '%s': element %llu = %lld is outside int32", name,
                           (unsigned long long)i, (long long)v);
        dst[i] = (int32_t)v;
    }
    return CG_OK;
}

const char *cgi_st_label(const cg_st *f) { return f->label; }

bool cgi_st_describe(const cg_st *f, const char *name, cgi_st_desc *d) {
    const int i = cg_st_find(f, name);
    if (i < 0) return false;
    const st_entry *e = &f->e[i];
    *d = (cgi_st_desc){.file = f, .label = f->label, .name = e->name, .dtype = e->dtype, .ndim = e->ndim,
                       .shape = e->shape, .begin = e->begin, .end = e->end, .data = e->base, .data_len = e->base_len};
    return true;
}

cg_status cg_st_read_params(const cg_st *f, cg_params *ps) {
    if (!f || !ps) return cgi_fail(CG_ERR_ARG, "[safetensors] read_params: NULL argument");
    cg_st_load *l = cg_st_load_new();
    cg_status s = l ? CG_OK : CG_ERR_NOMEM;
    for (int i = 0; !s && i < cg_params_count(ps); i++)
        s = cg_st_load_add(l, cg_params_at(ps, i), f, cg_name(cg_params_at(ps, i)));
    if (!s) s = cg_st_load_run(l);
    cg_st_load_free(l);
    return s;
}

/* ---- in place and merged (io/safetensors_mmap.c, io/shards.c) ---- */

void cgi_st_retain(cg_st *f) {
    if (f) f->refs++;
}

const void *cgi_st_bytes(const cg_st *f, int i, const char **dtype, uint64_t *nbytes) {
    if (!f || i < 0 || i >= f->n) return NULL;
    const st_entry *e = &f->e[i];
    if (dtype) *dtype = cgi_st_dtypes[e->dtype].name;
    if (nbytes) *nbytes = e->end - e->begin;
    return e->base + e->begin;
}


cg_st *cgi_st_merge(cg_st **parts, int n, const char *label) {
    cg_st *f = calloc(1, sizeof *f);
    int total = 0;
    for (int k = 0; k < n; k++) total += parts[k]->n;
    if (f) f->e = calloc((size_t)total + 1, sizeof *f->e);
    if (f) f->label = strdup(label);
    if (f) f->parts = malloc((size_t)(n ? n : 1) * sizeof *f->parts);
    if (!f || !f->e || !f->label || !f->parts) {
        if (f) free(f->e), free(f->label), free(f->parts), free(f);
        for (int k = 0; k < n; k++) cg_st_close(parts[k]);
        cgi_st_fail(label, CG_ERR_NOMEM, "out of memory");
        return NULL;
    }
    memcpy(f->parts, parts, (size_t)n * sizeof *parts);
    f->nparts = n;
    cg_status s = CG_OK;
    for (int k = 0; k < n && !s; k++)
        for (int i = 0; i < parts[k]->n && !s; i++) {
            st_entry *e = &f->e[f->n], *src = &parts[k]->e[i];
            *e = *src;
            e->name = strdup(src->name);
            e->shape = src->ndim > 0 ? malloc((size_t)src->ndim * sizeof *e->shape) : NULL;
            if (!e->name || (src->ndim > 0 && !e->shape)) {
                free(e->name), free(e->shape);
                s = cgi_st_fail(label, CG_ERR_NOMEM, "out of memory");
                break;
            }
            if (src->ndim > 0) memcpy(e->shape, src->shape, (size_t)src->ndim * sizeof *e->shape);
            f->n++;
        }
    if (!s) {
        qsort(f->e, (size_t)f->n, sizeof *f->e, cmp_entry);
        for (int i = 1; i < f->n && !s; i++)
            if (!strcmp(f->e[i - 1].name, f->e[i].name)) {
                const char *a = NULL, *b = NULL;
                for (int k = 0; k < n; k++)
                    if (cg_st_find(parts[k], f->e[i].name) >= 0) {
                        if (!a) a = parts[k]->label;
                        else if (!b) b = parts[k]->label;
                    }
                s = cgi_st_fail(label, CG_ERR_FORMAT, "tensor '%s' is stored twice: in %s and in %s", f->e[i].name, a, b);
            }
    }
    if (s) {
        cg_st_close(f);
        return NULL;
    }
    return f;
}
