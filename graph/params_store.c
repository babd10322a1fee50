/* SPDX-License-Identifier: MIT */
/* Where a parameter's value lives when it is not in its set's blocks: frozen parameters read in
 * place from a file mapping (float32, or bf16 / fp16 that the products widen as they pack it), or moved out of
 * the blocks by cg_params_compact. Such a parameter has no gradient and no optimizer state: a
 * LoRA fine-tune of a 1.1B model then holds its base weights once, at their file's size. Also
 * deferred initialisation, so a model about to be loaded does not draw values it overwrites. */
#define _GNU_SOURCE /* MAP_ANONYMOUS, MAP_NORESERVE */
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "graph/internal.h"
#include "ops/bf16_internal.h"
#include "ops/half.h"

#define PAGE 4096u
static size_t pages(size_t bytes) { return (bytes + PAGE - 1) / PAGE * PAGE; }

void cgi_param_store_free(cg_tensor *p) {
    if ((p->store == CGI_STORE_OWN || p->store == CGI_STORE_HALF) && p->own_bytes) munmap(p->data, p->own_bytes);
    p->own_bytes = 0;
}

/* ---- deferred initialisation ---- */

void cg_params_defer_init(cg_params *ps, bool on) {
    if (!ps) return;
    cgi_params_set_deferring(ps, on);
    if (on) return;
    for (int i = 0; i < cg_params_count(ps); i++) cgi_param_run_fill(cg_params_at(ps, i));
}

bool cgi_param_defer_fill(cg_tensor *t, cg_rng *r, int kind, double a, double b) {
    if (!t || t->op != CGI_OP_PARAM || !cgi_params_deferring(t->pset)) return false;
    t->init_kind = (uint8_t)kind;
    t->init_a = a, t->init_b = b;
    if (r) { /* a uniform draws one word, a normal two (cg_rng_normal): jump the counter past them */
        t->init_state = r->state;
        const uint64_t draws = (uint64_t)cgi_numel(t->ndim, t->shape) * (kind == CGI_INIT_NORMAL ? 2u : 1u);
        r->state += draws * 0x9e3779b97f4a7c15ULL;
    }
    return true;
}

void cgi_param_run_fill(cg_tensor *t) {
    const int kind = t->init_kind;
    if (kind == CGI_INIT_NONE) return;
    t->init_kind = CGI_INIT_NONE;
    cg_params *ps = t->pset;
    const bool was = cgi_params_deferring(ps);
    cgi_params_set_deferring(ps, false);
    cg_rng r = {t->init_state};
    if (kind == CGI_INIT_CONST) cg_fill(t, t->init_a);
    else if (kind == CGI_INIT_UNIFORM) cg_fill_uniform(t, &r, t->init_a, t->init_b);
    else cg_fill_normal(t, &r, t->init_a, t->init_b);
    cgi_params_set_deferring(ps, was);
}

/* ---- mapped values ---- */

cg_status cg_param_map(cg_tensor *p, const void *data, cg_map_dtype dtype) {
    if (!p || !data || p->op != CGI_OP_PARAM) return cgi_fail(CG_ERR_ARG, "[param_map] NULL argument or not a parameter");
    if (p->trainable) return cgi_fail(CG_ERR_STATE, "[param_map] %s is trainable: only a frozen parameter reads its value in place", p->name);
    if (p->store != CGI_STORE_BLOCK) return cgi_fail(CG_ERR_STATE, "[param_map] %s is mapped or moved already", p->name);
    if (dtype != CG_MAP_F32 && dtype != CG_MAP_BF16 && dtype != CG_MAP_F16)
        return cgi_fail(CG_ERR_ARG, "[param_map] %s: dtype %d is not F32, BF16 or F16", p->name, (int)dtype);
    const bool half = dtype != CG_MAP_F32;
    const uintptr_t align = half ? 2 : sizeof(cg_real);
    if ((uintptr_t)data % align)
        return cgi_fail(CG_ERR_ARG, "[param_map] %s: the data is not aligned to its %u-byte elements", p->name, (unsigned)align);
    if (dtype == CG_MAP_F32 && sizeof(cg_real) != 4)
        return cgi_fail(CG_ERR_ARG, "[param_map] %s: float32 data in a float64 build", p->name);
    const size_t n = (size_t)cgi_numel(p->ndim, p->shape);
    cg_real *reserved = NULL;
    if (half) { /* address space for the float, inaccessible until cgi_param_float widens into it */
        void *q = mmap(NULL, pages(n * sizeof(cg_real)), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (q == MAP_FAILED) return cgi_fail(CG_ERR_NOMEM, "[param_map] %s: cannot reserve %zu bytes", p->name, n * sizeof(cg_real));
        reserved = q;
    }
    cgi_lp_param_free(p); /* a bf16 copy of the old value */
    p->init_kind = CGI_INIT_NONE;
    p->grad = NULL;
    p->grad_stale = false; /* nothing left to settle */
    p->requires_grad = false;
    if (dtype == CG_MAP_F32) {
        p->store = CGI_STORE_F32MAP;
        p->data = (void *)data;
    } else {
        p->store = CGI_STORE_HALF;
        p->half = dtype == CG_MAP_BF16 ? CGI_EL_BF16 : CGI_EL_F16;
        p->mapped = data;
        p->data = reserved;
        p->own_bytes = pages(n * sizeof(cg_real));
        p->widened = false;
    }
    cgi_param_changed(p);
    return CG_OK;
}

cg_map_dtype cg_param_storage(const cg_tensor *p) {
    if (!p || p->store != CGI_STORE_HALF || p->widened) return CG_MAP_F32;
    return p->half == CGI_EL_F16 ? CG_MAP_F16 : CG_MAP_BF16;
}

cg_status cgi_param_float(cg_tensor *p) {
    if (p->store != CGI_STORE_HALF || p->widened) return CG_OK;
    if (mprotect(p->data, p->own_bytes, PROT_READ | PROT_WRITE))
        return cgi_fail(CG_ERR_NOMEM, "[param] %s%s: cannot make room for its float value", p->name, cgi_shp(p));
    cgi_widen_half(p->data, p->mapped, cgi_numel(p->ndim, p->shape), p->half);
    p->widened = true;
    return CG_OK;
}

cg_status cgi_param_writable(cg_tensor *p) {
    if (p->op != CGI_OP_PARAM || p->store == CGI_STORE_BLOCK || p->store == CGI_STORE_OWN) return CG_OK;
    const size_t n = (size_t)cgi_numel(p->ndim, p->shape);
    if (p->store == CGI_STORE_HALF) {
        cg_status st = cgi_param_float(p);
        if (st) return st;
        p->mapped = NULL; /* the float is the value from now on; products convert it as any other's */
    } else {
        void *q = mmap(NULL, pages(n * sizeof(cg_real)), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (q == MAP_FAILED) return cgi_fail(CG_ERR_NOMEM, "[param] %s: cannot copy its mapped value", p->name);
        memcpy(q, p->data, n * sizeof(cg_real));
        p->data = q;
        p->own_bytes = pages(n * sizeof(cg_real));
    }
    p->store = CGI_STORE_OWN;
    return CG_OK;
}

/* ---- compaction: frozen parameters leave the blocks ---- */

#define PAD (CGI_ALIGN / (int64_t)sizeof(cg_real))

cg_status cg_params_compact(cg_params *ps) {
    if (!ps) return cgi_fail(CG_ERR_ARG, "[params_compact] NULL argument");
    const int n = cg_params_count(ps);
    int64_t need = 0;
    for (int i = 0; i < n; i++) {
        cg_tensor *p = cg_params_at(ps, i);
        cgi_param_run_fill(p);
        if (p->store == CGI_STORE_BLOCK && p->trainable) need += (cgi_numel(p->ndim, p->shape) + PAD - 1) / PAD * PAD;
    }
    /* frozen block parameters move to buffers of their own, without gradient */
    for (int i = 0; i < n; i++) {
        cg_tensor *p = cg_params_at(ps, i);
        if (p->store != CGI_STORE_BLOCK || p->trainable) continue;
        const size_t bytes = (size_t)cgi_numel(p->ndim, p->shape) * sizeof(cg_real);
        void *q = mmap(NULL, pages(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (q == MAP_FAILED) return cgi_fail(CG_ERR_NOMEM, "[params_compact] %s: cannot allocate %zu bytes", p->name, bytes);
        memcpy(q, p->data, bytes);
        p->data = q;
        p->grad = NULL;
        p->grad_stale = false;
        p->requires_grad = false;
        p->own_bytes = pages(bytes);
        p->store = CGI_STORE_OWN;
    }
    /* the trainable ones, packed into new blocks */
    const int64_t cap = need ? need : PAD;
    cg_real *v = cgi_params_block_new(cap), *g = v ? cgi_params_block_new(cap) : NULL;
    if (!v || !g) {
        cgi_params_block_free(v, cap);
        return cgi_fail(CG_ERR_NOMEM, "[params_compact] cannot allocate %lld parameters", (long long)cap);
    }
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        cg_tensor *p = cg_params_at(ps, i);
        if (p->store != CGI_STORE_BLOCK) { /* no elements here, but its offset keeps the set's order for block walks */
            p->block_off = at;
            continue;
        }
        const int64_t k = cgi_numel(p->ndim, p->shape);
        cgi_param_settle(p);
        memcpy(v + at, p->data, (size_t)k * sizeof(cg_real));
        memcpy(g + at, p->grad, (size_t)k * sizeof(cg_real));
        p->data = v + at;
        p->grad = g + at;
        p->block_off = at;
        at += (k + PAD - 1) / PAD * PAD;
    }
    cgi_params_adopt_blocks(ps, v, g, at, cap);
    cg_params_touch(ps);
    return CG_OK;
}

int64_t cg_params_grad_bytes(const cg_params *ps) {
    int64_t bytes = 0;
    for (int i = 0; ps && i < cg_params_count(ps); i++) {
        const cg_tensor *p = cg_params_at(ps, i);
        if (p->store == CGI_STORE_BLOCK) bytes += cgi_numel(p->ndim, p->shape) * (int64_t)sizeof(cg_real);
    }
    return bytes;
}

int64_t cg_params_value_bytes(const cg_params *ps, int64_t *mapped) {
    int64_t own = 0, file = 0;
    for (int i = 0; ps && i < cg_params_count(ps); i++) {
        const cg_tensor *p = cg_params_at(ps, i);
        const int64_t n = cgi_numel(p->ndim, p->shape);
        if (p->store == CGI_STORE_F32MAP) file += n * (int64_t)sizeof(cg_real);
        else if (p->store == CGI_STORE_HALF) file += n * 2, own += p->widened ? n * (int64_t)sizeof(cg_real) : 0;
        else own += n * (int64_t)sizeof(cg_real);
    }
    if (mapped) *mapped = file;
    return own;
}
