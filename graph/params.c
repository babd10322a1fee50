/* SPDX-License-Identifier: MIT */
/* Parameters: named leaves whose values and gradients sit in two contiguous blocks, so an
 * optimizer or a checkpoint walks one array. Each tensor starts on a 64-byte boundary. The blocks
 * are anonymous mappings, grown with mremap: pages nothing has written are zero and take no memory,
 * so a parameter whose value is loaded elsewhere (a file mapping) or never trained costs nothing in
 * them. Frozen parameters can leave the blocks for good (graph/params_store.c). */
#define _GNU_SOURCE /* mremap, MAP_ANONYMOUS */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "graph/internal.h"
#include "ops/bf16_internal.h"

struct cg_params {
    cg_tensor **list;
    int n, cap;
    int *index, index_cap; /* names hashed: list positions + 1 (0 = empty slot), index_cap a power of 2 */
    cg_real *values, *grads;
    int64_t used, capacity; /* elements */
    /* Value versions that bf16 copies follow: a trainable parameter's is `version`, a frozen one's
     * `frozen_version`, so an optimizer step remakes no frozen copy. Both take their numbers from one
     * clock, so a parameter that changes side never meets a number its copy was made at. */
    uint64_t version, frozen_version, clock;
    bool exposed;           /* cg_params_grads handed out the block: zero_grad clears it at once */
    bool defer_init;        /* cg_params_defer_init: fills record themselves instead of writing */
    struct keep { void (*release)(void *); void *obj; } *keeps; /* cg_params_keep */
    int nkeeps;
};

bool cgi_params_deferring(const cg_params *ps) { return ps && ps->defer_init; }
void cgi_params_set_deferring(cg_params *ps, bool on) { ps->defer_init = on; }

cg_status cg_params_keep(cg_params *ps, void (*release)(void *), void *obj) {
    if (!ps || !release) return cgi_fail(CG_ERR_ARG, "[params_keep] NULL argument");
    struct keep *k = realloc(ps->keeps, (size_t)(ps->nkeeps + 1) * sizeof *k);
    if (!k) return cgi_fail(CG_ERR_NOMEM, "[params_keep] out of memory");
    ps->keeps = k;
    k[ps->nkeeps++] = (struct keep){release, obj};
    return CG_OK;
}

/* Bytes of a block of cap elements, whole pages. */
static size_t block_bytes(int64_t cap) {
    const size_t page = 4096, b = (size_t)cap * sizeof(cg_real);
    return (b + page - 1) / page * page;
}
static cg_real *block_new(int64_t cap) {
    void *p = mmap(NULL, block_bytes(cap), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    if (block_bytes(cap) >= (2u << 20)) madvise(p, block_bytes(cap), MADV_HUGEPAGE);
#endif
    return p;
}
static void block_free(cg_real *b, int64_t cap) {
    if (b) munmap(b, block_bytes(cap));
}
/* The block moved to cap elements, its contents kept without touching its pages; NULL on failure
 * (b is then unchanged). */
static cg_real *block_grow(cg_real *b, int64_t old, int64_t cap) {
    if (!b) return block_new(cap);
    void *p = mremap(b, block_bytes(old), block_bytes(cap), MREMAP_MAYMOVE);
    return p == MAP_FAILED ? NULL : p;
}

int64_t cgi_params_capacity(const cg_params *ps) { return ps->capacity; }
void cgi_params_adopt_blocks(cg_params *ps, cg_real *values, cg_real *grads, int64_t used, int64_t cap) {
    block_free(ps->values, ps->capacity);
    block_free(ps->grads, ps->capacity);
    ps->values = values, ps->grads = grads, ps->used = used, ps->capacity = cap;
}
cg_real *cgi_params_block_new(int64_t cap) { return block_new(cap); }
void cgi_params_block_free(cg_real *b, int64_t cap) { block_free(b, cap); }

#define PAD (CGI_ALIGN / (int64_t)sizeof(cg_real))

cg_params *cg_params_new(void) {
    cg_params *ps = calloc(1, sizeof *ps);
    if (!ps) cgi_fail(CG_ERR_NOMEM, "[params] out of memory");
    else ps->frozen_version = ++ps->clock; /* 0 would mean "no copy yet" to every bf16 copy */
    return ps;
}

void cg_params_free(cg_params *ps) {
    if (!ps) return;
    for (int i = 0; i < ps->n; i++) {
        free((char *)ps->list[i]->name);
        cgi_lp_param_free(ps->list[i]);
        cgi_param_store_free(ps->list[i]);
        free(ps->list[i]);
    }
    free(ps->list);
    free(ps->index);
    block_free(ps->values, ps->capacity);
    block_free(ps->grads, ps->capacity);
    for (int i = ps->nkeeps - 1; i >= 0; i--) ps->keeps[i].release(ps->keeps[i].obj);
    free(ps->keeps);
    free(ps);
}

/* Elements the value and gradient blocks may hold together: their byte sizes fit a ptrdiff_t. */
#define MAX_ELEMS ((int64_t)(PTRDIFF_MAX / (ptrdiff_t)sizeof(cg_real)) / 2)
/* Tensors a set holds: about three times the largest published model (DeepSeek-V3, about 92,000), and a
 * bound on the work a config of absurd depth (n_layer 300000) can ask of a build (docs/limits.md) */
#define MAX_TENSORS (1 << 18)

static bool grow(cg_params *ps, int64_t need) {
    if (ps->used + need <= ps->capacity) return true;
    int64_t cap = ps->capacity ? ps->capacity : 1 << 14;
    while (cap < ps->used + need) cap = cap > MAX_ELEMS / 2 ? MAX_ELEMS : cap * 2; /* need <= MAX_ELEMS - used */
    /* mremap keeps the contents and the untouched pages untouched: no copy, no memset */
    cg_real *v = block_grow(ps->values, ps->capacity, cap);
    if (v) ps->values = v;
    cg_real *gr = v ? block_grow(ps->grads, ps->capacity, cap) : NULL;
    if (!v || !gr) {
        if (v && ps->capacity) { /* shrink the values back, so both blocks keep one capacity */
            cg_real *back = block_grow(v, cap, ps->capacity);
            ps->values = back ? back : v;
            if (!back) ps->capacity = cap, block_free(ps->grads, 0); /* unreachable in practice */
        } else if (v) {
            block_free(v, cap);
            ps->values = NULL;
        }
        cgi_fail(CG_ERR_NOMEM, "[params] cannot allocate %lld parameters", (long long)cap);
        return false;
    }
    ps->grads = gr;
    for (int i = 0; i < ps->n; i++) { /* re-point every block tensor into the moved blocks */
        cg_tensor *t = ps->list[i];
        if (t->store != CGI_STORE_BLOCK) continue;
        int64_t off = t->block_off;
        t->data = v + off;
        t->grad = gr + off;
    }
    ps->capacity = cap;
    return true;
}

/* FNV-1a: lookups by name stay O(1), where a scan made building a model of n parameters O(n^2)
 * (a 10,000-layer config took minutes). */
static uint64_t name_hash(const char *s) {
    uint64_t h = 14695981039346656037u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211u;
    return h;
}
/* The index slot holding name, or the empty slot where it would go. */
static int index_slot(const cg_params *ps, const char *name) {
    const int mask = ps->index_cap - 1;
    int i = (int)(name_hash(name) & (uint64_t)mask);
    while (ps->index[i] && strcmp(ps->list[ps->index[i] - 1]->name, name)) i = (i + 1) & mask;
    return i;
}
/* Room in the index for one more name (kept at most half full); false when out of memory. */
static bool index_reserve(cg_params *ps) {
    if (2 * (ps->n + 1) <= ps->index_cap) return true;
    const int cap = ps->index_cap ? 2 * ps->index_cap : 128;
    int *idx = calloc((size_t)cap, sizeof *idx);
    if (!idx) return false;
    free(ps->index);
    ps->index = idx;
    ps->index_cap = cap;
    for (int k = 0; k < ps->n; k++) ps->index[index_slot(ps, ps->list[k]->name)] = k + 1;
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
    if (ps->n >= MAX_TENSORS) {
        cgi_fail(CG_ERR_SHAPE, "[params_add] '%s': a parameter set holds at most %d tensors", name, MAX_TENSORS);
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
    if (!index_reserve(ps)) {
        cgi_fail(CG_ERR_NOMEM, "[params_add] out of memory");
        return NULL;
    }
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
    /* no memset: the blocks' pages past `used` have never been written, so they read as zero */
    t->block_off = ps->used;
    t->data = ps->values + ps->used;
    t->grad = ps->grads + ps->used;
    t->pset = ps;
    t->requires_grad = t->trainable = true;
    t->name = nm;
    t->pversion = &ps->version;
    ps->version = ++ps->clock;
    ps->used += padded;
    ps->index[index_slot(ps, nm)] = ps->n + 1;
    ps->list[ps->n++] = t;
    return t;
}

cg_tensor *cg_params_find(const cg_params *ps, const char *name) {
    if (!ps || !name || !ps->index_cap) return NULL;
    const int i = ps->index[index_slot(ps, name)];
    return i ? ps->list[i - 1] : NULL;
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
    if (!ps) return;
    ps->version = ++ps->clock;
    ps->frozen_version = ++ps->clock;
}
void cgi_params_stepped(cg_params *ps) { ps->version = ++ps->clock; }
void cgi_param_changed(cg_tensor *p) { *p->pversion = ++p->pset->clock; }

/* Lazy: a gradient is marked stale, and its first writer in the next backward assigns it (a dW
 * product with beta 0) instead of adding into a cleared buffer; readers settle it to zero first.
 * Buffers handed out as pointers are cleared here, as their holders may read them at any time. */
void cg_params_zero_grad(cg_params *ps) {
    if (!ps || !ps->used) return;
    if (ps->exposed) cgi_zero(ps->grads, (size_t)ps->used * sizeof(cg_real));
    for (int i = 0; i < ps->n; i++) {
        cg_tensor *t = ps->list[i];
        if (!t->grad) continue; /* out of the blocks: frozen, no gradient */
        if (!ps->exposed && t->grad_exposed) cgi_zero(t->grad, (size_t)cgi_numel(t->ndim, t->shape) * sizeof(cg_real));
        t->grad_stale = !ps->exposed && !t->grad_exposed;
        t->grad_ahead = NULL; /* whatever a forward wrote ahead may have been settled or zeroed since */
    }
}

void cg_param_set_trainable(cg_tensor *p, bool trainable) {
    if (!p || p->op != CGI_OP_PARAM || (trainable && p->store != CGI_STORE_BLOCK)) return;
    p->trainable = p->requires_grad = trainable;
    p->pversion = trainable ? &p->pset->version : &p->pset->frozen_version;
}

bool cg_param_trainable(const cg_tensor *p) { return p && p->op == CGI_OP_PARAM && p->trainable; }
