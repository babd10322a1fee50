/* SPDX-License-Identifier: MIT */
/* The fused linear + cross-entropy (ops/loss_head.c: the op, its sizing, forward and backward) and
 * its slab kernels over the vocabulary (ops/loss_head_kernels.c) share this layout and state. */
#ifndef CGRAD_LOSS_HEAD_H
#define CGRAD_LOSS_HEAD_H

#include "graph/internal.h"

enum {
    LCE_SLAB = 256,   /* columns per slab at most: the gradients' slab of dlogits and its two packs stay in L2 */
    LCE_GROUPS = 8    /* dX partial sums: work units two threads share without waiting */
};

/* The fused path's layout, fixed at construction (absent in a graph built bf16). Offsets are reals
 * from the start of the fused part of aux, 64-byte aligned. */
typedef struct {
    int slots;                 /* per-thread scratch: the thread count at construction */
    int64_t sw, ns;            /* slab width and count */
    int64_t groups;            /* dX partial sums */
    size_t xa, st, zt, pw, pw_one; /* xs packed as A, slab stats [cap][ns][2], target logits, W packs */
    size_t xb, dxp, slot, slot_one; /* xs packed as B, dX partials of groups 1.., per-slot scratch */
    size_t pa_n, pb_n, pt_n;   /* a slot's parts (lce_grads) */
    size_t dxu, dbu;           /* dX of every counted row [rows, D] and the bias's gradient [V] */
    size_t reals;
    bool ahead;                /* run state: the last forward computed the gradients (upstream 1) */
    int pgrad;                 /* the plan's buffer for w's gradient, live from this op's forward: its
                                * index in the graph's pgrad, or -1 (cgi_lce_set_planned_grad) */
} lce_params;

/* One run's view of the op: its operands, aux's parts, the fused path's layout and the micro-kernel. */
typedef struct {
    cg_tensor *t;
    const cg_real *X, *W, *B;
    const void *Wv; /* what the products read for W: its floats, or a frozen half-precision W's elements in place */
    int wel;        /* Wv's element type (CGI_EL_*) */
    int64_t d, v, n, wr, wc, bs; /* n: counted rows */
    cg_real *lse, *xs, *logits, *dxs, *colsum;
    const int32_t *tg;
    const cg_real *index; /* row positions of the counted targets, stored as reals */
    const lce_params *p;  /* the fused path, NULL when the graph does not take it */
    cg_real *fused;       /* aux's fused part, 64-byte aligned */
    cg_real *wgrad;       /* where dW goes: w's gradient, or forward's ahead the plan's buffer for it */
    cgi_ukr u;
} lce;

/* p rounded up to a 64-byte boundary */
static inline cg_real *align64(void *p) { return (cg_real *)(((uintptr_t)p + 63) / 64 * 64); }

/* Gathers rows [r0, r0+m) of the counted list into c->xs; the fused path also packs them as A. */
void cgi_lce_gather(const lce *c, int64_t r0, int64_t m);
/* Computes rows [r0, r0+m) of the counted list's logits into c->logits; fused: with each row's
 * log-sum-exp into c->lse (bwd: recomputed in backward). */
void cgi_lce_logits(const lce *c, int64_t r0, int64_t m, bool bwd);
/* The fused path's gradients over one chunk of m rows from r0 (see ops/loss_head_kernels.c). */
void cgi_lce_grads(const lce *c, int64_t r0, int64_t m, bool recompute, cg_real gscale, bool w_assign, bool ahead);
/* dX of the chunk's m rows from r0 (dxu) times scale, added to their rows of x's gradient. */
void cgi_lce_scatter_dx(const lce *c, int64_t r0, int64_t m, cg_real scale);

#endif
