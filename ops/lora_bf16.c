/* SPDX-License-Identifier: MIT */
/* LoRA's fused linear in bf16 (ops/lora.c calls it): its forward products, and its backward on a
 * frozen weight as one parallel region of one-thread pieces (lora_bwd_overlap), on the product
 * engine of ops/bf16.c (ops/bf16_engine.h). */
#include <omp.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "graph/internal.h"
#include "ops/bf16_internal.h"

#if defined(CGRAD_DNNL) && !defined(CGRAD_DOUBLE)
#include "ops/bf16_engine.h"

/* ---- LoRA's fused linear: y = x W^T + s (x A^T) B^T ---- */

/* The adapter's smallest products (at 256 tokens and rank 16 on a 2048-wide weight, 8.4M
 * multiply-adds, ~40 us on one core) run on the calling thread: split over two, the halves cost
 * about a wake of the other thread each, and on a shared machine they wait on a partner thread that
 * lost its core. Below 2^24 multiply-adds; the larger ones (23M on a 5632-wide weight) split.
 * CGRAD_LORA_SERIAL=0 splits them all, for comparisons. */
static double lora_serial_below(void) {
    const char *e = getenv("CGRAD_LORA_SERIAL");
    return e && !atoi(e) ? 0 : (double)(1 << 24);
}

/* The rank-r products run at half the large ones' rate or less per core (bench_bf16_gemm llama:
 * 120-325 against ~450 GFLOP/s): thread 0's share of the big product's columns is cut by this many
 * times their multiply-adds. */
#define LORA_RANK_COST 2.5

/* Thread 0 publishes the rank-r product the others add to their blocks (low, or dlow in backward)
 * once it is in bf16; each of the others waits for it only when it reaches its add, after its own
 * block of the big product (by then it is almost always there), in place of a barrier where the
 * first thread done waited for the last. */
static void publish(atomic_int *ready) { atomic_store_explicit(ready, 1, memory_order_release); }
static void await_published(atomic_int *ready) {
    while (!atomic_load_explicit(ready, memory_order_acquire)) sched_yield();
}

/* The pieces of a one-region product: the configured thread count (cg_threads, at most SPLIT_MAX),
 * not the run's: the cores guard may hold a run on one thread under load (graph/cores.c), and the
 * blocks, so the bits, must not follow it. The region then runs every piece on the threads it has. */
static int region_pieces(void) {
    const int nt = cg_threads();
    return nt < SPLIT_MAX ? nt : SPLIT_MAX;
}

/* Column blocks j0[0..pieces] of a product of `cols` columns, `col_macs` multiply-adds each, split
 * over `pieces` one-thread primitives in whole multiples of SPLIT_COLS: thread 0's narrower by the
 * estimated time of `rank_macs` multiply-adds of rank-r products it runs first. */
static void column_blocks(int64_t cols, double col_macs, int pieces, double rank_macs, int64_t *j0) {
    const double cols_off = LORA_RANK_COST * rank_macs / col_macs;
    const double fair = ((double)cols + cols_off) / pieces;
    j0[0] = 0;
    j0[1] = (int64_t)((fair - cols_off) / SPLIT_COLS + 0.5) * SPLIT_COLS;
    if (j0[1] < SPLIT_COLS) j0[1] = SPLIT_COLS;
    for (int p = 2; p <= pieces; p++) j0[p] = j0[1] + (cols - j0[1]) / SPLIT_COLS * (p - 1) / (pieces - 1) * SPLIT_COLS;
    j0[pieces] = cols;
}

/* LoRA's forward as one parallel region, where it ran as x A^T on one thread (the other asleep), the
 * base product (two threads, a wake), then low B^T (one thread, or two and another wake): thread 0
 * runs low = s x A^T and rounds it to bf16, then its block of y = x W^T's columns, the others wider
 * blocks; then each adds low B^T to its own block (once thread 0 has published low). One-thread
 * primitives in blocks that depend on the thread count only: the same bits every run. False
 * (nothing written) where it does not apply: another kernel or element type, products too small to
 * split, or a primitive oneDNN refuses. CGRAD_LORA_FWD_OVERLAP=0 turns it off, for comparisons. */
static bool lora_fwd_overlap(cgi_lp *lp, cg_tensor *t, const cgi_bf16 *xb, int64_t rx, int64_t cx, const cgi_bf16 *wb,
                             int64_t rw, int64_t cw, const cgi_bf16 *ab, int64_t ra, int64_t ca, const cgi_bf16 *bb,
                             int64_t rb, int64_t cb, cgi_bf16 *lb, int ty) {
    const cg_tensor *x = t->src[0], *w = t->src[1], *a = t->src[2];
    const int64_t m = cgi_lp_rows(x), n = w->shape[0], k = w->shape[1], r = a->shape[0];
    const char *env = getenv("CGRAD_LORA_FWD_OVERLAP");
    const int pieces = region_pieces();
    if ((env && !atoi(env)) || pieces < 2 || cgi_lp_force_ref || cgi_lp_kernel_for(lp, m, n) != K_ONEDNN ||
        ty != TY_BF16 || m < 2 || (double)m * (double)n * (double)k < SPLIT_MIN_MACS || n < 2 * SPLIT_COLS * pieces)
        return false;
    int64_t j0[SPLIT_MAX + 1];
    column_blocks(n, (double)m * (double)k, pieces, (double)m * (double)r * (double)k, j0);
    const float s = (float)t->farg[0];
    int e_low, e_y[SPLIT_MAX], e_yl[SPLIT_MAX];
    bool ok = cgi_lp_piece_streams(pieces) && (e_low = cgi_lp_piece_prim(lp, m, r, k, rx, cx, ra, ca, r, s, 0, 0, 0)) >= 0;
    for (int p = 0; ok && p < pieces; p++) {
        const int64_t c = j0[p + 1] - j0[p];
        ok = (e_y[p] = cgi_lp_piece_prim(lp, m, c, k, rx, cx, rw, cw, n, 1, 0, 0, p)) >= 0 &&
             (e_yl[p] = cgi_lp_piece_prim(lp, m, c, r, r, 1, rb, cb, n, 1, 1, 0, p)) >= 0;
    }
    if (!ok) return false;
    const int team = cgi_nthreads() < pieces ? cgi_nthreads() : pieces;
    cgi_lp_exec_threads = team;
    cg_real *y = t->data, *low = t->aux;
    atomic_int low_ready = 0;
#pragma omp parallel num_threads(team)
    {
        const int p = omp_get_thread_num(), np = omp_get_num_threads();
        if (p == 0) { /* low = s x A^T [m, r], float (kept for dB), then bf16 */
            cgi_lp_piece_mm(lp, e_low, 0, m, r, k, xb, rx, cx, ab, ra, ca, s, 0, low, r);
            cgi_lp_round(lb, low, m * r, 1);
            publish(&low_ready);
        }
        for (int q = p; q < pieces; q += np) /* y's block = x W^T[:, block] */
            cgi_lp_piece_mm(lp, e_y[q], q, m, j0[q + 1] - j0[q], k, xb, rx, cx, wb + j0[q] * cw, rw, cw, 1, 0, y + j0[q], n);
        await_published(&low_ready);
        for (int q = p; q < pieces; q += np) /* ... += low B^T[:, block] */
            cgi_lp_piece_mm(lp, e_yl[q], q, m, j0[q + 1] - j0[q], r, lb, r, 1, bb + j0[q] * cb, rb, cb, 1, 1, y + j0[q], n);
    }
    return true;
}

bool cgi_lp_lora_fwd(cg_tensor *t) {
    cg_tensor *x = t->src[0], *w = t->src[1], *a = t->src[2], *b = t->src[3];
    cgi_lp *lp = cgi_lp_ctx(t->graph);
    if (!lp || !cgi_lp_lora_backed(t)) return false;
    const int64_t m = cgi_lp_rows(x), n = w->shape[0], k = w->shape[1], r = a->shape[0];
    int64_t rx = cgi_lp_row_stride(x), cx = x->stride[x->ndim - 1], rw = w->stride[1], cw = w->stride[0];
    int64_t ra = a->stride[1], ca = a->stride[0], rb = b->stride[1], cb = b->stride[0], rl, cl;
    int ex = CGI_EL_BF16, ew = CGI_EL_BF16, ea = CGI_EL_BF16, eb = CGI_EL_BF16; /* the operands' element types */
    /* area 0 holds x's conversion, then the low-rank product's in bf16 */
    const int64_t xn = cgi_lp_no_conversion(t, x) ? 0 : m * k;
    cgi_bf16 *area = cgi_lp_scratch(lp, t, false, 0, xn + m * r);
    const cgi_bf16 *xb = area ? cgi_lp_operand(lp, t, false, 0, x->data, m, k, &rx, &cx, x, &ex) : NULL;
    const cgi_bf16 *wb = xb ? cgi_lp_operand(lp, t, false, 1, w->data, k, n, &rw, &cw, w, &ew) : NULL;
    const cgi_bf16 *ab = wb ? cgi_lp_operand(lp, t, false, 1, a->data, k, r, &ra, &ca, a, &ea) : NULL;
    const cgi_bf16 *bb = ab ? cgi_lp_operand(lp, t, false, 1, b->data, r, n, &rb, &cb, b, &eb) : NULL;
    if (!bb) return false; /* nothing written: the float products */
    if (m == 0 || n == 0) return true;
    cgi_bf16 *lb = area + xn;
    const int all_bf16 = ex == CGI_EL_BF16 && ew == CGI_EL_BF16 && ea == CGI_EL_BF16 && eb == CGI_EL_BF16 ? TY_BF16 : -1;
    if (lora_fwd_overlap(lp, t, xb, rx, cx, wb, rw, cw, ab, ra, ca, bb, rb, cb, lb, all_bf16)) return true;
    cg_real *low = t->aux;
    lp->serial_below = lora_serial_below();
    cgi_lp_mm(lp, m, r, k, xb, rx, cx, ab, ra, ca, (float)t->farg[0], 0, low, r, 1, TY(ex, ea)); /* low = s x A^T */
    cgi_lp_mm(lp, m, n, k, xb, rx, cx, wb, rw, cw, 1, 0, t->data, n, 1, TY(ex, ew)); /* y = x W^T */
    cgi_lp_convert(low, m, r, r, 1, lb, &rl, &cl);
    cgi_lp_mm(lp, m, n, r, lb, rl, cl, bb, rb, cb, 1, 1, t->data, n, 1, TY(CGI_EL_BF16, eb)); /* y += low B^T */
    lp->serial_below = 0;
    return true;
}

/* LoRA's backward operands in bf16, as cgi_lp_lora_bwd found them (x A^T and dY B land in lb, dlb) */
typedef struct {
    const cgi_bf16 *xb, *wb, *ab, *bb;
    int64_t rx, cx, rw, cw, ra, ca, rb, cb;
    cgi_bf16 *lb, *dlb;
} lora_operands;

/* LoRA's backward on a frozen weight in one parallel region, where it ran as dY's conversion
 * (two threads), the adapter's rank-r products on one thread with the other asleep, dX's product
 * (two threads, waking it again), then dlow A on one: each region start costs a wake of the idle
 * vCPU here, and the rank-r products left a core idle. Now every thread converts its rows of dY;
 * thread 0 runs dlow = s dY B, dA and dB, then its block of dX's columns, the others wider blocks
 * (by the rank-r products' estimated time); each adds dlow A to its own block once thread 0 has
 * published dlow. Each product is a one-thread primitive and the blocks depend on the configured
 * thread count only, so the bits are the same every run, on however many threads the run gets. False (nothing written) where it does not apply: a weight that trains, dY not
 * converted in place, another kernel or element type, products too small to split, aliased
 * gradients, or a primitive oneDNN refuses. CGRAD_LORA_OVERLAP=0 turns it off, for comparisons. */
static bool lora_bwd_overlap(cgi_lp *lp, cg_tensor *t, const lora_operands *o, int ty, bool x_assign, bool a_assign,
                             bool b_assign) {
    cg_tensor *x = t->src[0], *w = t->src[1], *a = t->src[2], *b = t->src[3];
    const bool da = a->requires_grad, db = b->requires_grad;
    const int64_t m = cgi_lp_rows(x), n = w->shape[0], k = w->shape[1], r = a->shape[0];
    const char *env = getenv("CGRAD_LORA_OVERLAP");
    const int pieces = region_pieces();
    if ((env && !atoi(env)) || pieces < 2 || cgi_lp_force_ref || cgi_lp_kernel_for(lp, m, k) != K_ONEDNN || ty != TY_BF16 ||
        !x->requires_grad || w->requires_grad || !cgi_lp_dy_in_place(t) || m < 2 || r < 2 ||
        (double)m * (double)n * (double)k < SPLIT_MIN_MACS || k < 2 * SPLIT_COLS * pieces || x->stride[x->ndim - 1] != 1 ||
        (da && a->stride[1] != 1) || (db && b->stride[1] != 1) || cgi_grads_alias(x, a) || cgi_grads_alias(x, b) ||
        cgi_grads_alias(a, b))
        return false;
    /* dX's column blocks: thread 0's narrower by the rank-r products' estimated cost */
    const double rank_macs = (double)m * (double)r * ((double)n + (da ? (double)k : 0) + (db ? (double)n : 0));
    int64_t j0[SPLIT_MAX + 1];
    column_blocks(k, (double)m * (double)n, pieces, rank_macs, j0);
    const int64_t rd = 2 * n, rg = cgi_lp_row_stride(x); /* dY in place: bf16 rows in the first half of each float row */
    const float s = (float)t->farg[0], bx = x_assign ? 0 : 1, ba = a_assign ? 0 : 1, bbeta = b_assign ? 0 : 1;
    int e_dlow = -1, e_da = -1, e_db = -1, e_dx[SPLIT_MAX], e_dxa[SPLIT_MAX];
    bool ok = cgi_lp_piece_streams(pieces) && (e_dlow = cgi_lp_piece_prim(lp, m, r, n, rd, 1, o->rb, o->cb, r, s, 0, 0, 0)) >= 0 &&
              (!da || (e_da = cgi_lp_piece_prim(lp, r, k, m, 1, r, o->rx, o->cx, a->stride[0], 1, ba, 0, 0)) >= 0) &&
              (!db || (e_db = cgi_lp_piece_prim(lp, n, r, m, 1, rd, r, 1, b->stride[0], 1, bbeta, 0, 0)) >= 0);
    for (int p = 0; ok && p < pieces; p++) {
        const int64_t c = j0[p + 1] - j0[p];
        ok = (e_dx[p] = cgi_lp_piece_prim(lp, m, c, n, rd, 1, o->rw, o->cw, rg, 1, bx, 0, p)) >= 0 &&
             (e_dxa[p] = cgi_lp_piece_prim(lp, m, c, r, r, 1, o->ra, o->ca, rg, 1, 1, 0, p)) >= 0;
    }
    if (!ok) return false;
    const int team = cgi_nthreads() < pieces ? cgi_nthreads() : pieces;
    cgi_lp_exec_threads = team;
    cg_real *dyf = t->grad, *dx = x->grad;
    const cgi_bf16 *dy = (const cgi_bf16 *)t->grad;
    atomic_int dlow_ready = 0;
#pragma omp parallel num_threads(team)
    {
        const int p = omp_get_thread_num(), np = omp_get_num_threads();
        for (int64_t i = m * p / np; i < m * (p + 1) / np; i++) cgi_lp_to_bf16_row(dyf, i, n);
#pragma omp barrier
        if (p == 0) {
            cg_real *dlow = t->bwd_aux; /* s dY B [m, r], float, then bf16 */
            cgi_lp_piece_mm(lp, e_dlow, 0, m, r, n, dy, rd, 1, o->bb, o->rb, o->cb, s, 0, dlow, r);
            cgi_lp_round(o->dlb, dlow, m * r, 1);
            publish(&dlow_ready);
            if (da) /* dA [r, k] (+)= dlow^T x */
                cgi_lp_piece_mm(lp, e_da, 0, r, k, m, o->dlb, 1, r, o->xb, o->rx, o->cx, 1, ba, a->grad, a->stride[0]);
            if (db) { /* dB [n, r] (+)= dY^T low */
                cgi_lp_round(o->lb, t->aux, m * r, 1);
                cgi_lp_piece_mm(lp, e_db, 0, n, r, m, dy, 1, rd, o->lb, r, 1, 1, bbeta, b->grad, b->stride[0]);
            }
        }
        for (int q = p; q < pieces; q += np) /* dX's block (+)= dY W[:, block] */
            cgi_lp_piece_mm(lp, e_dx[q], q, m, j0[q + 1] - j0[q], n, dy, rd, 1, o->wb + j0[q] * o->cw, o->rw, o->cw, 1, bx,
                            dx + j0[q], rg);
        await_published(&dlow_ready);
        for (int q = p; q < pieces; q += np) /* ... += dlow A[:, block] */
            cgi_lp_piece_mm(lp, e_dxa[q], q, m, j0[q + 1] - j0[q], r, o->dlb, r, 1, o->ab + j0[q] * o->ca, o->ra, o->ca, 1, 1,
                            dx + j0[q], rg);
    }
    return true;
}

bool cgi_lp_lora_bwd(cg_tensor *t, bool x_assign, bool w_assign, bool a_assign, bool b_assign) {
    cg_tensor *x = t->src[0], *w = t->src[1], *a = t->src[2], *b = t->src[3];
    cgi_lp *lp = cgi_lp_ctx(t->graph);
    if (!lp || !cgi_lp_lora_backed(t)) return false;
    const bool dx = x->requires_grad, dw = w->requires_grad, da = a->requires_grad, db = b->requires_grad;
    const int64_t m = cgi_lp_rows(x), n = w->shape[0], k = w->shape[1], r = a->shape[0];
    int64_t s[2], rd = n, cd = 1, rl, cl;
    cgi_lp_need(t, true, s);
    /* every operand that can fail first, then dY (in place: its floats are gone after) */
    cgi_bf16 *area = cgi_lp_scratch(lp, t, true, 1, s[1]);
    const int64_t xn = s[1] - 2 * m * r; /* x's conversion, then low and dlow in bf16 */
    int64_t rx = cgi_lp_row_stride(x), cx = x->stride[x->ndim - 1], rw = w->stride[0], cw = w->stride[1];
    int64_t ra = a->stride[0], ca = a->stride[1], rb = b->stride[0], cb = b->stride[1];
    int ex = CGI_EL_BF16, ew = CGI_EL_BF16, ea = CGI_EL_BF16, eb = CGI_EL_BF16, ed = CGI_EL_BF16;
    const cgi_bf16 *xb = area && (dw || da) ? cgi_lp_operand(lp, t, true, 1, x->data, m, k, &rx, &cx, x, &ex) : NULL;
    const cgi_bf16 *wb = area && (dx || dw) ? cgi_lp_operand(lp, t, true, 1, w->data, n, k, &rw, &cw, w, &ew) : NULL;
    const cgi_bf16 *ab = area && dx ? cgi_lp_operand(lp, t, true, 1, a->data, r, k, &ra, &ca, a, &ea) : NULL;
    const cgi_bf16 *bb = area && (dx || da) ? cgi_lp_operand(lp, t, true, 1, b->data, n, r, &rb, &cb, b, &eb) : NULL;
    if (!area || ((dw || da) && !xb) || ((dx || dw) && !wb) || (dx && !ab) || ((dx || da) && !bb)) return false;
    cgi_bf16 *lb = area + xn, *dlb = lb + m * r;
    const lora_operands ops = {xb, wb, ab, bb, rx, cx, rw, cw, ra, ca, rb, cb, lb, dlb};
    const int all_bf16 = ex == CGI_EL_BF16 && ew == CGI_EL_BF16 && ea == CGI_EL_BF16 && eb == CGI_EL_BF16 ? TY_BF16 : -1;
    if (lora_bwd_overlap(lp, t, &ops, all_bf16, x_assign, a_assign, b_assign)) return true;
    const cgi_bf16 *dy;
    if (cgi_lp_dy_in_place(t)) {
        cgi_lp_to_bf16_inplace(t->grad, m, n);
        dy = (const cgi_bf16 *)t->grad;
        rd = 2 * n;
    } else if (!(dy = cgi_lp_operand(lp, t, true, 0, t->grad, m, n, &rd, &cd, NULL, &ed)))
        return false;
    lp->serial_below = lora_serial_below();
    if (dx || da) { /* dlow = s dY B [m, r], float, then bf16 */
        cg_real *dlow = t->bwd_aux;
        cgi_lp_mm(lp, m, r, n, dy, rd, cd, bb, rb, cb, (float)t->farg[0], 0, dlow, r, 1, TY(ed, eb));
        cgi_lp_convert(dlow, m, r, r, 1, dlb, &rl, &cl);
    }
    if (dx) { /* dX (+)= dY W + dlow A */
        const int64_t rg = cgi_lp_row_stride(x), cg = x->stride[x->ndim - 1];
        cgi_lp_mm(lp, m, k, n, dy, rd, cd, wb, rw, cw, 1, x_assign ? 0 : 1, x->grad, rg, cg, TY(ed, ew));
        cgi_lp_mm(lp, m, k, r, dlb, r, 1, ab, ra, ca, 1, 1, x->grad, rg, cg, TY(CGI_EL_BF16, ea));
    }
    if (da) /* dA [r, k] (+)= dlow^T x */
        cgi_lp_mm(lp, r, k, m, dlb, 1, r, xb, rx, cx, 1, a_assign ? 0 : 1, a->grad, a->stride[0], a->stride[1], TY(CGI_EL_BF16, ex));
    if (db) { /* dB [n, r] (+)= dY^T low */
        cgi_lp_convert(t->aux, m, r, r, 1, lb, &rl, &cl);
        cgi_lp_mm(lp, n, r, m, dy, cd, rd, lb, r, 1, 1, b_assign ? 0 : 1, b->grad, b->stride[0], b->stride[1], TY(ed, CGI_EL_BF16));
    }
    if (dw) /* dW [n, k] (+)= dY^T x */
        cgi_lp_mm(lp, n, k, m, dy, cd, rd, xb, rx, cx, 1, w_assign ? 0 : 1, w->grad, w->stride[0], w->stride[1], TY(ed, ex));
    lp->serial_below = 0;
    return true;
}

#else
bool cgi_lp_lora_fwd(cg_tensor *t) { return false; }
bool cgi_lp_lora_bwd(cg_tensor *t, bool x_assign, bool w_assign, bool a_assign, bool b_assign) { return false; }
#endif
