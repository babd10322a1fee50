/* SPDX-License-Identifier: MIT */
/* Parameters: named leaves whose values and gradients sit in two contiguous blocks, so an
 * optimizer or a checkpoint walks one array. Each tensor starts on a 64-byte boundary. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "graph/internal.h"
#include "ops/bf16_internal.h"

struct cg_params {
    cg_tensor **list;
    int n, cap;
    cg_real *values, *grads;
    int64_t used, capacity; /* elements */
    uint64_t version;       /* bumped whenever values may have changed (bf16 copies follow it) */
    bool exposed;           /* cg_params_grads handed out the block: zero_grad clears it at once */
};

#define PAD (CGI_ALIGN / (int64_t)sizeof(cg_real))

cg_params *cg_params_new(void) {
    cg_params *ps = calloc(1, sizeof *ps);
    if (!ps) cgi_fail(CG_ERR_NOMEM, "[params] out of memory");
    return ps;
}

void cg_params_free(cg_params *ps) {
    if (!ps) return;
    for (int i = 0; i < ps->n; i++) {
        free((char *)ps->list[i]->name);
        cgi_lp_param_free(ps->list[i]);
        free(ps->list[i]);
    }
    free(ps->list);
    free(ps->values);
    free(ps->grads);
    free(ps);
}

/* Elements the value and gradient blocks may hold together: their byte sizes fit a ptrdiff_t. */
#define MAX_ELEMS ((int64_t)(PTRDIFF_MAX / (ptrdiff_t)sizeof(cg_real)) / 2)

static bool grow(cg_params *ps, int64_t need) {
    if (ps->used + need <= ps->capacity) return true;
    int64_t cap = ps->capacity ? ps->capacity : 1 << 14;
    while (cap < ps->used + need) cap = cap > MAX_ELEMS / 2 ? MAX_ELEMS : cap * 2; /* need <= MAX_ELEMS - used */
    size_t bytes = (size_t)cap * sizeof(cg_real);
    cg_real *v = cgi_alloc_large(bytes), *gr = cgi_alloc_large(bytes);
    if (!v || !gr) {
        free(v);
        free(gr);
        cgi_fail(CG_ERR_NOMEM, "[params] cannot allocate %lld parameters", (long long)cap);
        return false;
    }
    /* no memset: the capacity doubles, and zeroing it all made the untouched half resident
     * (encdec-base: 250 MB of its 1050 MB peak); cg_params_add zeroes each tensor's own slice */
    if (ps->used) {
        memcpy(v, ps->values, (size_t)ps->used * sizeof(cg_real));
        memcpy(gr, ps->grads, (size_t)ps->used * sizeof(cg_real));
    }
    for (int i = 0; i < ps->n; i++) { /* re-point every tensor into the new blocks */
        cg_tensor *t = ps->list[i];
        int64_t off = (cg_real *)t->data - ps->values;
        t->data = v + off;
        t->grad = gr + off;
    }
    free(ps->values);
    free(ps->grads);
    ps->values = v;
    ps->grads = gr;
    ps->capacity = cap;
    return true;
}

cg_tensor *cg_params_add(cg_params *ps, const char *name, int ndim, const int64_t *shape) {
    if (!ps || !name || (ndim > 0 && !shape)) {
        cgi_fail(CG_ERR_ARG, "[params_add] NULL argument");
        return NULL;
    }
    if (ndim < 0 || ndim > CG_MAX_DIMS) {
        cgi_fail(CG_ERR_SHAPE, "[params_add] '%s': %d dims, at most %d", name, ndim, CG_MAX_DIMS);
        return NULL;
    }
    for (int i = 0; i < ndim; i++)
        if (shape[i] <= 0) {
            cgi_fail(CG_ERR_SHAPE, "[params_add] '%s': bad shape %s", name, cgi_dims(ndim, shape));
            return NULL;
        }
    if (cg_params_find(ps, name)) {
        cgi_fail(CG_ERR_ARG, "[params_add] name '%s' is already taken", name);
        return NULL;
    }
    int64_t n = 1;
    bool over = false;
    for (int i = 0; i < ndim; i++) over |= __builtin_mul_overflow(n, shape[i], &n);
    if (over || n > MAX_ELEMS - PAD - ps->used) { /* a count that wraps would loop or under-allocate */
        cgi_fail(CG_ERR_SHAPE, "[params_add] '%s': shape %s needs %s elements, beyond the %lld a parameter set can hold",
                 name, cgi_dims(ndim, shape), over ? "more than 2^63" : "too many", (long long)MAX_ELEMS);
        return NULL;
    }
    int64_t padded = (n + PAD - 1) / PAD * PAD;
    if (!grow(ps, padded)) return NULL;
    if (ps->n == ps->cap) {
        int cap = ps->cap ? 2 * ps->cap : 64;
        cg_tensor **l = realloc(ps->list, (size_t)cap * sizeof *l);
        if (!l) {
            cgi_fail(CG_ERR_NOMEM, "[params_add] out of memory");
            return NULL;
        }
        ps->list = l;
        ps->cap = cap;
    }
    cg_tensor *t = calloc(1, sizeof *t);
    char *nm = malloc(strlen(name) + 1);
    if (!t || !nm) {
        free(t);
        free(nm);
        cgi_fail(CG_ERR_NOMEM, "[params_add] out of memory");
        return NULL;
    }
    strcpy(nm, name);
    t->op = CGI_OP_PARAM;
    t->dtype = CG_REAL;
    t->ndim = ndim;
    t->id = -1;
    if (ndim > 0) memcpy(t->shape, shape, (size_t)ndim * sizeof *shape); /* scalars may pass NULL */
    cgi_contig_strides(ndim, shape, t->stride);
    t->root = t;
    t->data = ps->values + ps->used;
    t->grad = ps->grads + ps->used;
    memset(t->data, 0, (size_t)padded * sizeof(cg_real)); /* the padding too: optimizers sweep it */
    memset(t->grad, 0, (size_t)padded * sizeof(cg_real));
    t->requires_grad = t->trainable = true;
    t->name = nm;
    t->pversion = &ps->version;
    ps->version++;
    ps->used += padded;
    ps->list[ps->n++] = t;
    return t;
}

cg_tensor *cg_params_find(const cg_params *ps, const char *name) {
    if (!ps || !name) return NULL;
    for (int i = 0; i < ps->n; i++)
        if (strcmp(ps->list[i]->name, name) == 0) return ps->list[i];
    return NULL;
}

int cg_params_count(const cg_params *ps) { return ps ? ps->n : 0; }
cg_tensor *cg_params_at(const cg_params *ps, int i) { return ps && i >= 0 && i < ps->n ? ps->list[i] : NULL; }

int64_t cg_params_numel(const cg_params *ps) {
    int64_t n = 0;
    for (int i = 0; ps && i < ps->n; i++) n += cgi_numel(ps->list[i]->ndim, ps->list[i]->shape);
    return n;
}

cg_real *cg_params_values(cg_params *ps) { return ps ? ps->values : NULL; }
cg_real *cg_params_grads(cg_params *ps) {
    if (!ps) return NULL;
    cgi_params_settle(ps, 0, -1);
    ps->exposed = true;
    return ps->grads;
}
cg_real *cgi_params_grads(cg_params *ps) { return ps->grads; }

void cgi_params_settle(cg_params *ps, int first, int n) {
    const int end = n < 0 || first + n > ps->n ? ps->n : first + n;
    for (int i = first < 0 ? 0 : first; i < end; i++) cgi_param_settle(ps->list[i]);
}
cg_real *cg_params_grads_settled(cg_params *ps, int first, int n) {
    if (!ps) return NULL;
    cgi_params_settle(ps, first, n);
    return ps->grads;
}
int64_t cg_params_span(const cg_params *ps) { return ps ? ps->used : 0; } /* optimizers size their moment blocks by it */

void cg_params_touch(cg_params *ps) {
    if (ps) ps->version++;
}

/* Lazy: a gradient is marked stale, and its first writer in the next backward assigns it (a dW
 * product with beta 0) instead of adding into a cleared buffer; readers settle it to zero first.
 * Buffers handed out as pointers are cleared here, as their holders may read them at any time. */
void cg_params_zero_grad(cg_params *ps) {
    if (!ps || !ps->used) return;
    if (ps->exposed) cgi_zero(ps->grads, (size_t)ps->used * sizeof(cg_real));
    for (int i = 0; i < ps->n; i++) {
        cg_tensor *t = ps->list[i];
        if (!ps->exposed && t->grad_exposed) cgi_zero(t->grad, (size_t)cgi_numel(t->ndim, t->shape) * sizeof(cg_real));
        t->grad_stale = !ps->exposed && !t->grad_exposed;
    }
}

void cg_param_set_trainable(cg_tensor *p, bool trainable) {
    if (!p || p->op != CGI_OP_PARAM) return;
    p->trainable = p->requires_grad = trainable;
}

bool cg_param_trainable(const cg_tensor *p) { return p && p->op == CGI_OP_PARAM && p->trainable; }
