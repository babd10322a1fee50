/* safetensors reading and writing. A reader validates the whole header once at open (dtypes,
 * shapes, offsets against the buffer, duplicate names), so a read only checks what the caller asks
 * for. Files are memory-mapped; element loads go through memcpy because the format does not promise
 * aligned offsets. The writer streams its image through a sink, so a plain file, a memory image
 * and a gzip checkpoint share one serialiser and none needs a second copy of the data. */
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
#include "io/safetensors_internal.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "io/safetensors.c assumes a little-endian host: safetensors stores little-endian data"
#endif

/* ---- dtypes ---- */

typedef enum { K_REAL, K_INT, K_UINT, K_BOOL } st_kind;

typedef struct {
    const char *name;
    int size;
    st_kind kind;
} st_dtype;

enum { DT_BOOL, DT_U8, DT_I8, DT_F8_E5M2, DT_F8_E4M3, DT_I16, DT_U16, DT_F16, DT_BF16,
       DT_I32, DT_U32, DT_F32, DT_F64, DT_I64, DT_U64, DT_COUNT };

static const st_dtype dtypes[DT_COUNT] = {
    [DT_BOOL] = {"BOOL", 1, K_BOOL},        [DT_U8] = {"U8", 1, K_UINT},
    [DT_I8] = {"I8", 1, K_INT},             [DT_F8_E5M2] = {"F8_E5M2", 1, K_REAL},
    [DT_F8_E4M3] = {"F8_E4M3", 1, K_REAL},  [DT_I16] = {"I16", 2, K_INT},
    [DT_U16] = {"U16", 2, K_UINT},          [DT_F16] = {"F16", 2, K_REAL},
    [DT_BF16] = {"BF16", 2, K_REAL},        [DT_I32] = {"I32", 4, K_INT},
    [DT_U32] = {"U32", 4, K_UINT},          [DT_F32] = {"F32", 4, K_REAL},
    [DT_F64] = {"F64", 8, K_REAL},          [DT_I64] = {"I64", 8, K_INT},
    [DT_U64] = {"U64", 8, K_UINT},
};

#ifdef CGRAD_DOUBLE
#define DT_REAL DT_F64
#else
#define DT_REAL DT_F32
#endif

static int dtype_lookup(const char *s) {
    for (int i = 0; i < DT_COUNT; i++)
        if (strcmp(dtypes[i].name, s) == 0) return i;
    return -1;
}

/* ---- reader ---- */

typedef struct {
    char *name;
    int dtype;
    int ndim;
    int64_t *shape;   /* ndim entries; files may hold more dims than CG_MAX_DIMS */
    uint64_t begin, end;
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
};

/* Fails with "[safetensors] <label>: <message>". */
static cg_status st_fail(const char *label, cg_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static cg_status st_fail(const char *label, cg_status s, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return cgi_fail(s, "[safetensors] %s: %s", label, msg);
}

static char *dupstr(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

void cg_st_close(cg_st *f) {
    if (!f) return;
    for (int i = 0; i < f->n; i++) {
        free(f->e[i].name);
        free(f->e[i].shape);
    }
    free(f->e);
    for (int i = 0; i < f->nmeta; i++) {
        free(f->mkey[i]);
        free(f->mval[i]);
    }
    free(f->mkey);
    free(f->mval);
    if (f->mapped) munmap(f->image, f->len);
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
    if (!cJSON_IsObject(meta)) return st_fail(f->label, CG_ERR_FORMAT, "__metadata__ is not a JSON object");
    int n = cJSON_GetArraySize(meta);
    f->mkey = calloc((size_t)n + 1, sizeof *f->mkey);
    f->mval = calloc((size_t)n + 1, sizeof *f->mval);
    if (!f->mkey || !f->mval) return st_fail(f->label, CG_ERR_NOMEM, "out of memory");
    for (const cJSON *m = meta->child; m; m = m->next) {
        if (!cJSON_IsString(m))
            return st_fail(f->label, CG_ERR_FORMAT, "__metadata__ value of '%s' is not a string", m->string);
        f->mkey[f->nmeta] = dupstr(m->string);
        f->mval[f->nmeta] = dupstr(m->valuestring);
        f->nmeta++;
        if (!f->mkey[f->nmeta - 1] || !f->mval[f->nmeta - 1])
            return st_fail(f->label, CG_ERR_NOMEM, "out of memory");
    }
    return CG_OK;
}

static cg_status parse_entry(cg_st *f, const cJSON *item, st_entry *e) {
    const char *nm = item->string;
    if (!cJSON_IsObject(item)) return st_fail(f->label, CG_ERR_FORMAT, "entry '%s' is not a JSON object", nm);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!dt) return st_fail(f->label, CG_ERR_FORMAT, "tensor '%s' has no dtype", nm);
    if (!sh) return st_fail(f->label, CG_ERR_FORMAT, "tensor '%s' has no shape", nm);
    if (!off) return st_fail(f->label, CG_ERR_FORMAT, "tensor '%s' has no data_offsets", nm);
    if (!cJSON_IsString(dt)) return st_fail(f->label, CG_ERR_FORMAT, "tensor '%s': dtype is not a string", nm);
    e->dtype = dtype_lookup(dt->valuestring);
    if (e->dtype < 0) return st_fail(f->label, CG_ERR_FORMAT, "tensor '%s': unknown dtype '%s'", nm, dt->valuestring);
    if (!cJSON_IsArray(sh)) return st_fail(f->label, CG_ERR_FORMAT, "tensor '%s': shape is not an array", nm);
    e->ndim = cJSON_GetArraySize(sh);
    if (e->ndim > 0 && !(e->shape = malloc((size_t)e->ndim * sizeof *e->shape)))
        return st_fail(f->label, CG_ERR_NOMEM, "out of memory");
    uint64_t numel = 1;
    bool overflow = false;
    int d = 0;
    for (const cJSON *x = sh->child; x; x = x->next, d++) {
        if (!json_int(x, &e->shape[d]))
            return st_fail(f->label, CG_ERR_FORMAT, "tensor '%s': shape entry %d is not an integer", nm, d);
        if (e->shape[d] < 0)
            return st_fail(f->label, CG_ERR_FORMAT, "tensor '%s': negative dim %lld in shape", nm,
                           (long long)e->shape[d]);
        overflow |= __builtin_mul_overflow(numel, (uint64_t)e->shape[d], &numel);
    }
    int64_t b, en;
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || !json_int(off->child, &b) ||
        !json_int(off->child->next, &en) || b < 0 || en < 0)
        return st_fail(f->label, CG_ERR_FORMAT, "tensor '%s': data_offsets is not [begin, end] with whole numbers >= 0", nm);
    e->begin = (uint64_t)b;
    e->end = (uint64_t)en;
    if (e->end < e->begin)
        return st_fail(f->label, CG_ERR_FORMAT, "tensor '%s': data_offsets [%llu, %llu] end before begin", nm,
                       (unsigned long long)e->begin, (unsigned long long)e->end);
    if (e->end > f->data_len)
        return st_fail(f->label, CG_ERR_FORMAT, "tensor '%s': data_offsets [%llu, %llu] go past the end of the %llu-byte data buffer",
                       nm, (unsigned long long)e->begin, (unsigned long long)e->end, (unsigned long long)f->data_len);
    uint64_t bytes;
    overflow |= __builtin_mul_overflow(numel, (uint64_t)dtypes[e->dtype].size, &bytes);
    if (overflow || bytes != e->end - e->begin)
        return st_fail(f->label, CG_ERR_FORMAT, "tensor '%s': data_offsets [%llu, %llu] hold %llu bytes but %s%s needs %s%llu",
                       nm, (unsigned long long)e->begin, (unsigned long long)e->end,
                       (unsigned long long)(e->end - e->begin), dtypes[e->dtype].name, cgi_dims(e->ndim, e->shape),
                       overflow ? "more than " : "", overflow ? (unsigned long long)UINT64_MAX : (unsigned long long)bytes);
    return CG_OK;
}

static int cmp_begin(const void *a, const void *b) {
    const st_entry *x = *(const st_entry *const *)a, *y = *(const st_entry *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : x->end < y->end ? -1 : x->end > y->end;
}

/* Empty tensors hold no bytes, so they overlap nothing. */
cg_status cgi_st_check_disjoint(const cg_st *f) {
    const st_entry **by = malloc(((size_t)f->n + 1) * sizeof *by);
    if (!by) return st_fail(f->label, CG_ERR_NOMEM, "out of memory");
    int m = 0;
    for (int i = 0; i < f->n; i++)
        if (f->e[i].end > f->e[i].begin) by[m++] = &f->e[i];
    qsort(by, (size_t)m, sizeof *by, cmp_begin);
    cg_status s = CG_OK;
    for (int i = 1; i < m && !s; i++)
        if (by[i]->begin < by[i - 1]->end)
            s = st_fail(f->label, CG_ERR_FORMAT, "tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap in the data buffer",
                        by[i - 1]->name, (unsigned long long)by[i - 1]->begin, (unsigned long long)by[i - 1]->end,
                        by[i]->name, (unsigned long long)by[i]->begin, (unsigned long long)by[i]->end);
    free(by);
    return s;
}

static cg_status parse(cg_st *f) {
    if (f->len < 8)
        return st_fail(f->label, CG_ERR_FORMAT, "file is %zu bytes, shorter than the 8-byte header length", f->len);
    uint64_t hlen;
    memcpy(&hlen, f->image, 8);
    if (hlen > f->len - 8)
        return st_fail(f->label, CG_ERR_FORMAT, "header length %llu is larger than the file (%zu bytes after the length)",
                       (unsigned long long)hlen, f->len - 8);
    const char *h = (const char *)f->image + 8, *end = NULL;
    f->data = f->image + 8 + hlen;
    f->data_len = f->len - 8 - hlen;
    cJSON *root = cJSON_ParseWithLengthOpts(h, (size_t)hlen, &end, false);
    if (!root) {
        long at = end ? (long)(end - h) : -1;
        return st_fail(f->label, CG_ERR_FORMAT, "header is not valid JSON (error near byte %ld of %llu)", at,
                       (unsigned long long)hlen);
    }
    cg_status s = CG_OK;
    for (const char *p = end; p < h + hlen; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            s = st_fail(f->label, CG_ERR_FORMAT, "header is not valid JSON: bytes after the object at byte %ld",
                        (long)(p - h));
            goto done;
        }
    if (!cJSON_IsObject(root)) {
        s = st_fail(f->label, CG_ERR_FORMAT, "header is not a JSON object");
        goto done;
    }
    int n = cJSON_GetArraySize(root);
    f->e = calloc((size_t)n + 1, sizeof *f->e);
    if (!f->e) {
        s = st_fail(f->label, CG_ERR_NOMEM, "out of memory for %d header entries", n);
        goto done;
    }
    bool seen_meta = false;
    for (const cJSON *item = root->child; item; item = item->next) {
        if (strcmp(item->string, "__metadata__") == 0) {
            if (seen_meta) {
                s = st_fail(f->label, CG_ERR_FORMAT, "duplicate __metadata__ entry");
                goto done;
            }
            seen_meta = true;
            if ((s = parse_metadata(f, item)) != CG_OK) goto done;
            continue;
        }
        st_entry *e = &f->e[f->n++];
        if (!(e->name = dupstr(item->string))) {
            s = st_fail(f->label, CG_ERR_NOMEM, "out of memory");
            goto done;
        }
        if ((s = parse_entry(f, item, e)) != CG_OK) goto done;
    }
    qsort(f->e, (size_t)f->n, sizeof *f->e, cmp_entry);
    for (int i = 1; i < f->n; i++)
        if (strcmp(f->e[i - 1].name, f->e[i].name) == 0) {
            s = st_fail(f->label, CG_ERR_FORMAT, "duplicate tensor name '%s'", f->e[i].name);
            goto done;
        }
done:
    cJSON_Delete(root);
    return s;
}

cg_st *cgi_st_adopt(void *bytes, size_t len, const char *label) {
    cg_st *f = calloc(1, sizeof *f);
    char *lb = dupstr(label ? label : "<memory>");
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

/* Reads a stream that cannot be mapped (a pipe, /dev/stdin) into malloc'd memory. */
static void *slurp(int fd, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    unsigned char *buf = malloc(cap);
    while (buf) {
        if (n == cap) {
            unsigned char *b = realloc(buf, cap *= 2);
            if (!b) break;
            buf = b;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) break;
        if (r == 0) {
            *len = n;
            return buf;
        }
        n += (size_t)r;
    }
    free(buf);
    return NULL;
}

cg_st *cg_st_open(const char *path) {
    if (!path) {
        cgi_fail(CG_ERR_ARG, "[safetensors] open: NULL path");
        return NULL;
    }
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        st_fail(path, CG_ERR_IO, "cannot open: %s", strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        st_fail(path, CG_ERR_IO, "cannot stat: %s", strerror(errno));
        close(fd);
        return NULL;
    }
    if (S_ISDIR(st.st_mode)) {
        st_fail(path, CG_ERR_IO, "is a directory");
        close(fd);
        return NULL;
    }
    if (S_ISREG(st.st_mode) && st.st_size < 8) {
        close(fd);
        st_fail(path, CG_ERR_FORMAT, "file is %lld bytes, shorter than the 8-byte header length", (long long)st.st_size);
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
        char *lb = dupstr(path);
        if (!f || !lb) {
            free(f);
            free(lb);
            munmap(map, len);
            st_fail(path, CG_ERR_NOMEM, "out of memory");
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
    void *buf = slurp(fd, &len);
    int err = errno;
    close(fd);
    if (!buf) {
        st_fail(path, CG_ERR_IO, "cannot read: %s", strerror(err));
        return NULL;
    }
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
        st_fail(f->label, CG_ERR_ARG, "no tensor '%s'", name);
        return NULL;
    }
    return &f->e[i];
}

cg_status cg_st_info(const cg_st *f, const char *name, const char **dtype, int *ndim, int64_t *shape) {
    const st_entry *e = lookup(f, name, "info");
    if (!e) return CG_ERR_ARG;
    if (e->ndim > CG_MAX_DIMS)
        return st_fail(f->label, CG_ERR_SHAPE, "tensor '%s' has %d dims, cgrad supports at most %d", name, e->ndim,
                       CG_MAX_DIMS);
    if (dtype) *dtype = dtypes[e->dtype].name;
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
        return st_fail(f->label, CG_ERR_SHAPE, "tensor '%s' has shape %s, expected %s", e->name,
                       cgi_dims(e->ndim, e->shape), cgi_dims(ndim, shape));
    return CG_OK;
}

static uint64_t numel_of(const st_entry *e) { return (e->end - e->begin) / (uint64_t)dtypes[e->dtype].size; }

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
static void decode(const st_entry *e, const unsigned char *p, uint64_t n, cg_real *dst) {
    switch (e->dtype) {
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
            dst[i] = e->dtype == DT_F16 ? half_to_float(h) : bf16_to_float(h);
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

/* Index of the first value that is not finite once read as cg_real (NaN, inf, or a float64 beyond
 * float32's range in a float32 build), or -1; decoded in chunks, so nothing is allocated. */
static int64_t first_nonfinite(const cg_st *f, const st_entry *e, double *bad) {
    cg_real buf[1024];
    const uint64_t n = numel_of(e), size = (uint64_t)dtypes[e->dtype].size;
    for (uint64_t at = 0; at < n; at += 1024) {
        const uint64_t k = n - at < 1024 ? n - at : 1024;
        decode(e, f->data + e->begin + at * size, k, buf);
        for (uint64_t i = 0; i < k; i++)
            if (!isfinite(buf[i])) {
                *bad = (double)buf[i];
                return (int64_t)(at + i);
            }
    }
    return -1;
}

cg_status cg_st_read(const cg_st *f, const char *name, cg_real *dst, int ndim, const int64_t *shape) {
    const st_entry *e = lookup(f, name, "read");
    if (!e) return CG_ERR_ARG;
    cg_status s = check_shape(f, e, ndim, shape);
    if (s != CG_OK) return s;
    if (dtypes[e->dtype].kind != K_REAL)
        return st_fail(f->label, CG_ERR_ARG, "tensor '%s' has dtype %s, not a floating type: use cg_st_read_ids", name,
                       dtypes[e->dtype].name);
    uint64_t n = numel_of(e);
    if (n == 0) return CG_OK;
    if (!dst) return cgi_fail(CG_ERR_ARG, "[safetensors] read: NULL destination");
    decode(e, f->data + e->begin, n, dst);
    return CG_OK;
}

cg_status cg_st_read_ids(const cg_st *f, const char *name, int32_t *dst, int ndim, const int64_t *shape) {
    const st_entry *e = lookup(f, name, "read_ids");
    if (!e) return CG_ERR_ARG;
    cg_status s = check_shape(f, e, ndim, shape);
    if (s != CG_OK) return s;
    const st_dtype *dt = &dtypes[e->dtype];
    if (dt->kind == K_REAL)
        return st_fail(f->label, CG_ERR_ARG, "tensor '%s' has dtype %s, not an integer type: use cg_st_read", name,
                       dt->name);
    uint64_t n = numel_of(e);
    if (n && !dst) return cgi_fail(CG_ERR_ARG, "[safetensors] read_ids: NULL destination");
    const unsigned char *p = f->data + e->begin;
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
                return st_fail(f->label, CG_ERR_RANGE, "tensor '%s': element %llu = %llu is outside int32", name,
                               (unsigned long long)i, (unsigned long long)u);
            v = (int64_t)u;
            break;
        }
        if (v < INT32_MIN || v > INT32_MAX)
            return st_fail(f->label, CG_ERR_RANGE, "tensor '%s': element %llu = %lld is outside int32", name,
                           (unsigned long long)i, (long long)v);
        dst[i] = (int32_t)v;
    }
    return CG_OK;
}

cg_status cg_st_read_params(const cg_st *f, cg_params *ps) {
    if (!f || !ps) return cgi_fail(CG_ERR_ARG, "[safetensors] read_params: NULL argument");
    int n = cg_params_count(ps);
    for (int i = 0; i < n; i++) { /* validate everything before touching any value */
        cg_tensor *p = cg_params_at(ps, i);
        int k = cg_st_find(f, cg_name(p));
        if (k < 0) return st_fail(f->label, CG_ERR_ARG, "no tensor '%s' for parameter %s", cg_name(p), cgi_shp(p));
        cg_status s = check_shape(f, &f->e[k], cg_ndim(p), cg_shape(p));
        if (s != CG_OK) return s;
        if (dtypes[f->e[k].dtype].kind != K_REAL)
            return st_fail(f->label, CG_ERR_ARG, "tensor '%s' has dtype %s, parameters need a floating type",
                           cg_name(p), dtypes[f->e[k].dtype].name);
        double bad; /* a NaN weight makes every output NaN: refuse it here, naming it */
        int64_t at = first_nonfinite(f, &f->e[k], &bad);
        if (at >= 0)
            return st_fail(f->label, CG_ERR_FORMAT, "tensor '%s' holds %g at flat index %lld: parameters must be finite",
                           cg_name(p), bad, (long long)at);
    }
    for (int i = 0; i < n; i++) {
        cg_tensor *p = cg_params_at(ps, i);
        if (cg_is_contiguous(p)) {
            cg_status s = cg_st_read(f, cg_name(p), cg_data(p), -1, NULL);
            if (s != CG_OK) return s;
            continue;
        }
        cg_real *tmp = malloc((size_t)cg_numel(p) * sizeof *tmp + 1);
        if (!tmp) return st_fail(f->label, CG_ERR_NOMEM, "out of memory for '%s'", cg_name(p));
        cg_status s = cg_st_read(f, cg_name(p), tmp, -1, NULL);
        if (s == CG_OK) s = cg_write(p, tmp);
        free(tmp);
        if (s != CG_OK) return s;
    }
    return CG_OK;
}

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
    for (int i = 0; i < w->nmeta; i++) {
        free(w->mkey[i]);
        free(w->mval[i]);
    }
    free(w->mkey);
    free(w->mval);
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
    overflow |= __builtin_mul_overflow(numel, (size_t)dtypes[dtype].size, &bytes);
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
    e->name = dupstr(name);
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

cg_status cg_st_add(cg_st_writer *w, const char *name, int ndim, const int64_t *shape, const cg_real *data) {
    w_entry *e = add_entry(w, name, DT_REAL, ndim, shape, "add");
    if (!e) return CG_ERR_ARG;
    if (e->bytes && !data) {
        free(e->name);
        free(e->data);
        w->n--;
        return cgi_fail(CG_ERR_ARG, "[safetensors] add: NULL data for '%s'", name);
    }
    if (e->bytes) memcpy(e->data, data, e->bytes);
    return CG_OK;
}

cg_status cg_st_add_ids(cg_st_writer *w, const char *name, int ndim, const int64_t *shape, const int32_t *data) {
    w_entry *e = add_entry(w, name, DT_I32, ndim, shape, "add_ids");
    if (!e) return CG_ERR_ARG;
    if (e->bytes && !data) {
        free(e->name);
        free(e->data);
        w->n--;
        return cgi_fail(CG_ERR_ARG, "[safetensors] add_ids: NULL data for '%s'", name);
    }
    if (e->bytes) memcpy(e->data, data, e->bytes);
    return CG_OK;
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
    char *v = dupstr(value);
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
    if (!(w->mkey[w->nmeta] = dupstr(key))) {
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
        sb_fmt(&b, ":{\"dtype\":\"%s\",\"shape\":[", dtypes[e->dtype].name);
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
    if (fwrite(p, 1, n, fs->fp) != n) return st_fail(fs->path, CG_ERR_IO, "write failed: %s", strerror(errno));
    return CG_OK;
}

cg_status cg_st_write(cg_st_writer *w, const char *path) {
    if (!w || !path) return cgi_fail(CG_ERR_ARG, "[safetensors] write: NULL argument");
    FILE *fp = fopen(path, "wb");
    if (!fp) return st_fail(path, CG_ERR_IO, "cannot create: %s", strerror(errno));
    file_sink fs = {fp, path};
    cg_status s = cgi_st_emit(w, to_file, &fs, NULL);
    if (fclose(fp) != 0 && s == CG_OK) s = st_fail(path, CG_ERR_IO, "write failed: %s", strerror(errno));
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
