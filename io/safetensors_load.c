/* SPDX-License-Identifier: MIT */
/* The one validation step every weight load goes through (cg_st_load, declared in
 * io/safetensors.h): entries map a parameter to a stored tensor's descriptor (file, dtype, shape,
 * byte range); the run checks them all, then converts. Nothing is allocated while converting, so
 * once the checks pass the writes cannot fail half-way. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/internal.h"
#include "io/safetensors_internal.h"

typedef struct {
    cg_tensor *param;
    const cg_st *file;
    char *name;
    bool tie;         /* a tied twin: checked against the entry that fills param, never written */
    cgi_st_desc d;    /* filled by the run */
} load_entry;

struct cg_st_load {
    load_entry *e;
    int n, cap;
};

#define CHUNK 1024 /* values decoded at a time when scanning or comparing */

cg_st_load *cg_st_load_new(void) {
    cg_st_load *l = calloc(1, sizeof *l);
    if (!l) cgi_fail(CG_ERR_NOMEM, "[load] out of memory");
    return l;
}

void cg_st_load_free(cg_st_load *l) {
    if (!l) return;
    for (int i = 0; i < l->n; i++) free(l->e[i].name);
    free(l->e);
    free(l);
}

static cg_status push(cg_st_load *l, cg_tensor *p, const cg_st *f, const char *name, bool tie) {
    if (!l || !p || !f || !name) return cgi_fail(CG_ERR_ARG, "[load] NULL argument");
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        load_entry *e = realloc(l->e, (size_t)cap * sizeof *e);
        if (!e) return cgi_fail(CG_ERR_NOMEM, "[load] out of memory");
        l->e = e, l->cap = cap;
    }
    char *nm = strdup(name);
    if (!nm) return cgi_fail(CG_ERR_NOMEM, "[load] out of memory");
    l->e[l->n++] = (load_entry){.param = p, .file = f, .name = nm, .tie = tie};
    return CG_OK;
}

cg_status cg_st_load_add(cg_st_load *l, cg_tensor *p, const cg_st *f, const char *name) { return push(l, p, f, name, false); }

cg_status cg_st_load_tie(cg_st_load *l, cg_tensor *p, const cg_st *f, const char *name) { return push(l, p, f, name, true); }

static uint64_t numel_of(const cgi_st_desc *d) { return (d->end - d->begin) / (uint64_t)cgi_st_dtypes[d->dtype].size; }

/* Fails naming the entry's file and tensor: "[load] <file>: tensor '<name>' <message>". */
static cg_status entry_fail(const load_entry *x, cg_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static cg_status entry_fail(const load_entry *x, cg_status s, const char *fmt, ...) {
    char head[1024];
    snprintf(head, sizeof head, "[load] %s: %stensor '%s' ", x->d.label, x->tie ? "tied " : "", x->name);
    va_list ap;
    va_start(ap, fmt);
    cgi_fail_headed(s, head, fmt, ap);
    va_end(ap);
    return s;
}

/* Index of the first half-precision value (bf16 or fp16: exp, its exponent bits) with its exponent
 * bits all set (inf or NaN), or -1: a scan of the raw bits, as fast as reading them (a 1.1B model's
 * 2.2 GB in about the time cat takes). */
static int64_t first_nonfinite_half(const cgi_st_desc *d, uint16_t exp, double *bad) {
    const uint16_t *h = (const uint16_t *)(d->data + d->begin);
    const uint64_t n = numel_of(d);
    for (uint64_t at = 0; at < n; at += CHUNK) {
        const uint64_t k = n - at < CHUNK ? n - at : CHUNK;
        unsigned any = 0;
        for (uint64_t i = 0; i < k; i++) any |= (h[at + i] & exp) == exp;
        if (!any) continue;
        for (uint64_t i = 0; i < k; i++)
            if ((h[at + i] & exp) == exp) {
                cg_real f;
                cgi_st_decode(d->dtype, (const unsigned char *)(h + at + i), 1, &f);
                *bad = (double)f;
                return (int64_t)(at + i);
            }
    }
    return -1;
}

/* Index of the first value that is not finite once read as cg_real (NaN, inf, or a float64 beyond
 * float32's range in a float32 build), or -1; the value goes to *bad. */
static int64_t first_nonfinite(const cgi_st_desc *d, double *bad) {
    if ((d->dtype == DT_BF16 || d->dtype == DT_F16) && (uintptr_t)(d->data + d->begin) % 2 == 0)
        return first_nonfinite_half(d, d->dtype == DT_BF16 ? 0x7f80u : 0x7c00u, bad);
    cg_real buf[CHUNK];
    const uint64_t n = numel_of(d), size = (uint64_t)cgi_st_dtypes[d->dtype].size;
    for (uint64_t at = 0; at < n; at += CHUNK) {
        const uint64_t k = n - at < CHUNK ? n - at : CHUNK;
        cgi_st_decode(d->dtype, d->data + d->begin + at * size, k, buf);
        for (uint64_t i = 0; i < k; i++)
            if (!isfinite(buf[i])) {
                *bad = (double)buf[i];
                return (int64_t)(at + i);
            }
    }
    return -1;
}

/* Index of the first value where a and b (same element count) differ once read, or -1. */
static int64_t first_difference(const cgi_st_desc *a, const cgi_st_desc *b, double *va, double *vb) {
    cg_real x[CHUNK], y[CHUNK];
    const uint64_t n = numel_of(a), sa = (uint64_t)cgi_st_dtypes[a->dtype].size, sb = (uint64_t)cgi_st_dtypes[b->dtype].size;
    for (uint64_t at = 0; at < n; at += CHUNK) {
        const uint64_t k = n - at < CHUNK ? n - at : CHUNK;
        cgi_st_decode(a->dtype, a->data + a->begin + at * sa, k, x);
        cgi_st_decode(b->dtype, b->data + b->begin + at * sb, k, y);
        for (uint64_t i = 0; i < k; i++)
            if (x[i] != y[i]) {
                *va = (double)x[i], *vb = (double)y[i];
                return (int64_t)(at + i);
            }
    }
    return -1;
}

/* One entry on its own: present, floating, the parameter's shape, in bounds, finite. */
static cg_status check_entry(load_entry *x) {
    cg_tensor *p = x->param;
    if (!cgi_st_describe(x->file, x->name, &x->d))
        return cgi_fail(CG_ERR_ARG, "[load] %s: no tensor '%s' for parameter '%s' %s", cgi_st_label(x->file), x->name,
                        cg_name(p), cgi_shp(p));
    const st_dtype *dt = &cgi_st_dtypes[x->d.dtype];
    if (dt->kind != K_REAL)
        return entry_fail(x, CG_ERR_ARG, "has dtype %s: parameter '%s' needs a floating type (F32, F64, F16, BF16, F8)",
                          dt->name, cg_name(p));
    bool same = x->d.ndim == cg_ndim(p);
    for (int i = 0; same && i < x->d.ndim; i++) same = x->d.shape[i] == cg_shape(p)[i];
    if (!same)
        return entry_fail(x, CG_ERR_SHAPE, "has shape %s, but parameter '%s' is %s", cgi_dims(x->d.ndim, x->d.shape),
                          cg_name(p), cgi_shp(p));
    uint64_t bytes;
    if (x->d.end < x->d.begin || x->d.end > x->d.data_len ||
        __builtin_mul_overflow((uint64_t)cg_numel(p), (uint64_t)dt->size, &bytes) || bytes != x->d.end - x->d.begin)
        return entry_fail(x, CG_ERR_FORMAT, "has byte range [%llu, %llu), not the bytes of %s %s inside the %llu-byte data",
                          (unsigned long long)x->d.begin, (unsigned long long)x->d.end, dt->name, cgi_shp(p),
                          (unsigned long long)x->d.data_len);
    double bad; /* a NaN weight makes every output NaN: refuse it here, naming it */
    const int64_t at = first_nonfinite(&x->d, &bad);
    if (at >= 0)
        return entry_fail(x, CG_ERR_FORMAT, "holds %g at flat index %lld: parameters must be finite", bad, (long long)at);
    return CG_OK;
}

static int by_param(const void *a, const void *b) {
    const load_entry *x = *(load_entry *const *)a, *y = *(load_entry *const *)b;
    if (x->param != y->param) return (uintptr_t)x->param < (uintptr_t)y->param ? -1 : 1;
    return (int)x->tie - (int)y->tie; /* the entry that fills a parameter before its twins */
}

static int by_range(const void *a, const void *b) {
    const load_entry *x = *(load_entry *const *)a, *y = *(load_entry *const *)b;
    if (x->d.data != y->d.data) return (uintptr_t)x->d.data < (uintptr_t)y->d.data ? -1 : 1;
    return x->d.begin < y->d.begin ? -1 : x->d.begin > y->d.begin ? 1 : x->d.end < y->d.end ? -1 : x->d.end > y->d.end;
}

/* Across entries: no parameter filled twice, every twin equal to its parameter's source, no two
 * entries of one file sharing bytes. by holds the n entries (reordered here). */
static cg_status check_across(load_entry **by, int n) {
    qsort(by, (size_t)n, sizeof *by, by_param);
    for (int i = 0; i < n; i++) {
        load_entry *x = by[i];
        load_entry *src = NULL; /* the entry that fills x's parameter (sorted before its twins) */
        for (int k = i - 1; k >= 0 && by[k]->param == x->param; k--)
            if (!by[k]->tie) src = by[k];
        if (!x->tie && src)
            return cgi_fail(CG_ERR_FORMAT, "[load] parameter '%s' is stored twice: '%s' in %s and '%s' in %s",
                            cg_name(x->param), src->name, src->d.label, x->name, x->d.label);
        if (!x->tie) continue;
        if (!src) return entry_fail(x, CG_ERR_FORMAT, "is tied to parameter '%s', which nothing in the load fills",
                                    cg_name(x->param));
        double va, vb;
        const int64_t at = first_difference(&x->d, &src->d, &va, &vb);
        if (at >= 0)
            return entry_fail(x, CG_ERR_FORMAT, "differs from its twin '%s' (parameter '%s') at flat index %lld: %g vs %g",
                              src->name, cg_name(x->param), (long long)at, va, vb);
    }
    int m = 0; /* empty tensors hold no bytes, so they overlap nothing */
    for (int i = 0; i < n; i++)
        if (by[i]->d.end > by[i]->d.begin) by[m++] = by[i];
    qsort(by, (size_t)m, sizeof *by, by_range);
    for (int i = 1; i < m; i++)
        if (by[i]->d.data == by[i - 1]->d.data && by[i]->d.begin < by[i - 1]->d.end)
            return cgi_fail(CG_ERR_FORMAT, "[load] %s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap in the data buffer",
                            by[i]->d.label, by[i - 1]->name, (unsigned long long)by[i - 1]->d.begin,
                            (unsigned long long)by[i - 1]->d.end, by[i]->name, (unsigned long long)by[i]->d.begin,
                            (unsigned long long)by[i]->d.end);
    return CG_OK;
}

/* A frozen contiguous parameter whose tensor is bf16 or fp16, or float32 in a float32 build, aligned
 * to its elements, in a file mapping: its value is read in place (cg_param_map), not copied. */
static bool mappable(const load_entry *x) {
    const cg_tensor *p = x->param;
    const uintptr_t at = (uintptr_t)(x->d.data + x->d.begin);
    const bool half = (x->d.dtype == DT_BF16 || x->d.dtype == DT_F16) && at % 2 == 0;
    const bool f32 = x->d.dtype == DT_F32 && sizeof(cg_real) == 4 && at % 4 == 0;
    return !p->trainable && p->store == CGI_STORE_BLOCK && p->pset && cg_is_contiguous((cg_tensor *)p) && (half || f32);
}

static void close_file(void *f) { cg_st_close(f); }

/* The set of x's parameter keeps x's file open (its pages are the value from now on). */
static cg_status map_entry(const load_entry *x) {
    cg_status s = cg_params_keep(x->param->pset, close_file, (void *)x->file);
    if (s) return s;
    cgi_st_retain((cg_st *)x->file);
    const cg_map_dtype dt = x->d.dtype == DT_BF16 ? CG_MAP_BF16 : x->d.dtype == DT_F16 ? CG_MAP_F16 : CG_MAP_F32;
    return cg_param_map(x->param, x->d.data + x->d.begin, dt);
}

/* Checks every entry; *scratch gets the largest strided parameter's size (converted through one
 * buffer, allocated before anything is written). */
static cg_status check_all(cg_st_load *l, int64_t *scratch) {
    if (!l) return cgi_fail(CG_ERR_ARG, "[load] NULL load");
    load_entry **by = malloc(((size_t)l->n + 1) * sizeof *by);
    if (!by) return cgi_fail(CG_ERR_NOMEM, "[load] out of memory");
    cg_status s = CG_OK;
    *scratch = 0;
    for (int i = 0; !s && i < l->n; i++) {
        by[i] = &l->e[i];
        s = check_entry(&l->e[i]);
        if (!l->e[i].tie && !cg_is_contiguous(l->e[i].param) && cg_numel(l->e[i].param) > *scratch)
            *scratch = cg_numel(l->e[i].param);
    }
    if (!s) s = check_across(by, l->n);
    free(by);
    return s;
}

cg_status cg_st_load_check(cg_st_load *l) {
    int64_t scratch;
    return check_all(l, &scratch);
}

cg_status cg_st_load_run(cg_st_load *l) {
    int64_t scratch;
    cg_status s = check_all(l, &scratch);
    cg_real *tmp = !s && scratch ? malloc((size_t)scratch * sizeof *tmp) : NULL;
    if (!s && scratch && !tmp) s = cgi_fail(CG_ERR_NOMEM, "[load] out of memory for a %lld-value parameter", (long long)scratch);
    /* Everything is checked: only now does a parameter change. */
    for (int i = 0; !s && i < l->n; i++) {
        const load_entry *x = &l->e[i];
        if (x->tie || !numel_of(&x->d)) continue;
        if (mappable(x)) { /* a frozen parameter reads its value in place: no copy */
            s = map_entry(x);
            continue;
        }
        const bool direct = cg_is_contiguous(x->param);
        cgi_st_decode(x->d.dtype, x->d.data + x->d.begin, numel_of(&x->d), direct ? cg_data(x->param) : tmp);
        if (!direct) s = cg_write(x->param, tmp);
    }
    free(tmp);
    return s;
}
