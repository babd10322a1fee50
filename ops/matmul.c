/* SPDX-License-Identifier: MIT */
/* Matrix-product ops: matmul (batched, broadcast), linear and the fused linear + GELU or ReLU, forward
 * and backward side by side. Operands are passed to the product engine (ops/gemm.c) with their
 * strides; batches run in parallel when there are enough of them, otherwise each product is cut
 * into pieces for the threads. */
#include <stdlib.h>

#include "graph/internal.h"
#include "ops/bf16_internal.h"
#include "ops/ops.h"

static void gemm(int64_t m, int64_t n, int64_t k, const cg_real *a, int64_t rsa, int64_t csa, const cg_real *b,
                 int64_t rsb, int64_t csb, cg_real beta, cg_real *c, int64_t rsc, int64_t csc, int threads) {
    cgi_gemm(m, n, k, a, rsa, csa, b, rsb, csb, 1, beta, c, rsc, csc, threads);
}

/* ---- matmul ---- */

cg_tensor *cg_matmul(cg_graph *g, cg_tensor *a, cg_tensor *b) {
    cg_tensor *in[2] = {a, b};
    if (!cgi_inputs_ok(g, "matmul", 2, in)) return NULL;
    if (!cgi_expect_real("matmul", a, "a") || !cgi_expect_real("matmul", b, "b")) return NULL;
    if (a->ndim < 2 || b->ndim < 2) {
        cgi_fail(CG_ERR_SHAPE, "[matmul] a%s @ b%s: both need at least 2 dims", cgi_shp(a), cgi_shp(b));
        return NULL;
    }
    if (a->shape[a->ndim - 1] != b->shape[b->ndim - 2]) {
        cgi_fail(CG_ERR_SHAPE, "[matmul] a%s @ b%s: inner dims %lld != %lld", cgi_shp(a), cgi_shp(b),
                 (long long)a->shape[a->ndim - 1], (long long)b->shape[b->ndim - 2]);
        return NULL;
    }
    int nb = (a->ndim > b->ndim ? a->ndim : b->ndim) - 2;
    int64_t s[CG_MAX_DIMS];
    for (int i = 0; i < nb; i++) {
        int ia = a->ndim - 2 - nb + i, ib = b->ndim - 2 - nb + i;
        int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
        if (da != db && da != 1 && db != 1) {
            cgi_fail(CG_ERR_SHAPE, "[matmul] a%s @ b%s: batch dims do not broadcast", cgi_shp(a), cgi_shp(b));
            return NULL;
        }
        s[i] = da == 1 ? db : da;
    }
    s[nb] = a->shape[a->ndim - 2];
    s[nb + 1] = b->shape[b->ndim - 1];
    return cgi_node(g, CGI_OP_MATMUL, CG_REAL, nb + 2, s, 2, in);
}

typedef struct {
    int nb;                       /* batch dims */
    int64_t nbatch, m, n, k;
    int64_t bshape[CG_MAX_DIMS];
    int64_t sa[CG_MAX_DIMS], sb[CG_MAX_DIMS], sc[CG_MAX_DIMS]; /* batch strides */
    int64_t rsa, csa, rsb, csb, rsc, csc;
    bool a_bcast, b_bcast;        /* an operand is reused across batches */
    bool fold;                    /* batches of a fold into m: one product */
} mm_plan;

static void plan(const cg_tensor *t, mm_plan *p) {
    const cg_tensor *a = t->src[0], *b = t->src[1];
    p->nb = t->ndim - 2;
    p->m = t->shape[p->nb];
    p->n = t->shape[p->nb + 1];
    p->k = a->shape[a->ndim - 1];
    p->nbatch = 1;
    p->a_bcast = p->b_bcast = false;
    bool b_fixed = true, a_dense = true;
    for (int i = 0; i < p->nb; i++) {
        int ia = a->ndim - 2 - p->nb + i, ib = b->ndim - 2 - p->nb + i;
        p->bshape[i] = t->shape[i];
        p->sa[i] = (ia < 0 || a->shape[ia] == 1) ? 0 : a->stride[ia];
        p->sb[i] = (ib < 0 || b->shape[ib] == 1) ? 0 : b->stride[ib];
        p->sc[i] = t->stride[i];
        p->nbatch *= t->shape[i];
        if (t->shape[i] > 1 && p->sa[i] == 0) p->a_bcast = true;
        if (t->shape[i] > 1 && p->sb[i] == 0) p->b_bcast = true;
        if (t->shape[i] > 1 && p->sb[i] != 0) b_fixed = false;
    }
    for (int i = 0; i < p->nb; i++) { /* after the loop above: batch dim i's density reads sa[i + 1] */
        int64_t next = i + 1 < p->nb ? p->sa[i + 1] * t->shape[i + 1] : a->stride[a->ndim - 2] * p->m;
        if (t->shape[i] > 1 && p->sa[i] != next) a_dense = false;
    }
    p->rsa = a->stride[a->ndim - 2];
    p->csa = a->stride[a->ndim - 1];
    p->rsb = b->stride[b->ndim - 2];
    p->csb = b->stride[b->ndim - 1];
    p->rsc = t->stride[p->nb];
    p->csc = 1;
    /* x[B, T, K] @ w[K, N]: one [B*T, K] @ [K, N] product instead of B small ones. */
    p->fold = p->nbatch > 1 && b_fixed && a_dense && !p->a_bcast;
    if (p->fold) {
        p->m *= p->nbatch;
        p->nbatch = 1;
    }
}

static void batch_offsets(const mm_plan *p, int64_t idx, int64_t *oa, int64_t *ob, int64_t *oc) {
    *oa = *ob = *oc = 0;
    for (int i = p->nb - 1; i >= 0 && !p->fold; i--) {
        int64_t j = idx % p->bshape[i];
        idx /= p->bshape[i];
        *oa += j * p->sa[i];
        *ob += j * p->sb[i];
        *oc += j * p->sc[i];
    }
}

static bool batches_in_parallel(const mm_plan *p, bool writes_shared) {
    int nt = cgi_nthreads();
    return !writes_shared && nt > 1 && p->nbatch > 1 && (p->nbatch % nt == 0 || p->nbatch >= 4 * nt);
}

/* Runs C_i (+)= A_i @ B_i over batches, with operand roles chosen by the caller. */
typedef struct {
    const cg_real *a, *b;
    cg_real *c;
    int64_t m, n, k, rsa, csa, rsb, csb, rsc, csc;
    int which_a, which_b, which_c; /* 0: operand a's batch strides, 1: b's, 2: c's */
    const cg_tensor *lp;           /* the node, when the products run in bf16 (ops/bf16.c), one at a time */
    bool lp_bwd;                   /* in its backward rule (whose conversion scratch they use) */
} mm_call;

static void run_batches(const mm_plan *p, const mm_call *q, cg_real beta, bool writes_shared) {
    bool par = batches_in_parallel(p, writes_shared) && !q->lp;
    int nt = cgi_nthreads();
#pragma omp parallel for schedule(static) if (par) num_threads(nt)
    for (int64_t i = 0; i < p->nbatch; i++) {
        int64_t off[3];
        batch_offsets(p, i, &off[0], &off[1], &off[2]);
        if (q->lp && cgi_lp_gemm(q->lp, q->lp_bwd, q->m, q->n, q->k, q->a + off[q->which_a], q->rsa, q->csa, NULL,
                                 q->b + off[q->which_b], q->rsb, q->csb, NULL, 1, beta, q->c + off[q->which_c], q->rsc,
                                 q->csc))
            continue;
        gemm(q->m, q->n, q->k, q->a + off[q->which_a], q->rsa, q->csa, q->b + off[q->which_b], q->rsb, q->csb,
             beta, q->c + off[q->which_c], q->rsc, q->csc, par ? 1 : nt);
    }
}

cg_status cgi_fwd_matmul(cg_tensor *t) {
    mm_plan p;
    plan(t, &p);
    mm_call q = {t->src[0]->data, t->src[1]->data, t->data, p.m, p.n, p.k, p.rsa, p.csa, p.rsb, p.csb,
                 p.rsc, p.csc, 0, 1, 2, cgi_lp_on(t) ? t : NULL, false};
    run_batches(&p, &q, 0, false);
    return CG_OK;
}

void cgi_bwd_matmul(cg_tensor *t) {
    cg_tensor *a = t->src[0], *b = t->src[1];
    mm_plan p;
    plan(t, &p);
    if (a->requires_grad) { /* dA[m,k] += dC[m,n] @ B^T[n,k] */
        mm_call q = {t->grad, b->data, a->grad, p.m, p.k, p.n, p.rsc, p.csc, p.csb, p.rsb, p.rsa, p.csa, 2, 1, 0, cgi_lp_on(t) ? t : NULL, true};
        run_batches(&p, &q, 1, p.a_bcast);
    }
    if (b->requires_grad) { /* dB[k,n] += A^T[k,m] @ dC[m,n] */
        mm_call q = {a->data, t->grad, b->grad, p.k, p.n, p.m, p.csa, p.rsa, p.rsc, p.csc, p.rsb, p.csb, 0, 2, 1, cgi_lp_on(t) ? t : NULL, true};
        run_batches(&p, &q, 1, p.b_bcast || p.fold);
    }
}

/* ---- linear: x[..., in] @ w[out, in]^T + bias, the leading dims of x folded into one ---- */

static bool leading_dense(const cg_tensor *x) {
    for (int d = 0; d + 2 < x->ndim; d++)
        if (x->shape[d] > 1 && x->stride[d] != x->stride[d + 1] * x->shape[d + 1]) return false;
    return true;
}

static int64_t rows_of(const cg_tensor *x) { return cgi_numel(x->ndim - 1, x->shape); }
/* The bias of a linear, linear_act or linear_add node (linear_add's residual comes after it), or NULL. */
static cg_tensor *bias_of(const cg_tensor *t) { return t->nsrc > (t->op == CGI_OP_LINEAR_ADD ? 3 : 2) ? t->src[2] : NULL; }
static int64_t row_stride(const cg_tensor *x) { return x->ndim >= 2 ? x->stride[x->ndim - 2] : 1; }

/* dW can be computed as dW[n,k] = dY^T X, whose packed operand is X (row stride that of x), or as
 * dW^T[k,n] = X^T dY, whose packed operand is dY (row stride n). Measured on Zen 3, single thread:
 *  - the first is the faster (dW[768,256] over 4096 rows: 74 against 47 GFLOP/s), except
 *  - when X's row stride is a multiple of 1024 floats, whose rows alias in cache (dW[256,1024]
 *    over 4096 rows: 39 against 83 GFLOP/s);
 *  - BLIS wants C stored by rows: a column-major dW (GPT-2's Conv1D weight seen through a
 *    transpose) written in place ran 1.4x slower than through row-major scratch, added back
 *    transposed, which costs one pass over dW.
 * With cgrad's blocked driver (gemm_blocked) neither holds: both forms ran alike, the aliasing
 * one included (dW[512,2048] over 1024 rows: 167 GFLOP/s direct, 150 transposed), so dW is
 * written in whichever form stores it by rows, in place: no scratch, no transposed add. */
static bool w_by_columns(const cg_tensor *w) { return w->stride[0] == 1 && w->stride[1] != 1; }

static bool dw_as_transpose(const cg_tensor *x, const cg_tensor *w) {
    if (cgi_gemm_blocked_on()) return w_by_columns(w);
    return row_stride(x) % 1024 == 0 && w->shape[0] % 1024 != 0;
}

static bool dw_in_scratch(const cg_tensor *x, const cg_tensor *w) {
    return dw_as_transpose(x, w) != w_by_columns(w);
}

/* The shape rule shared by linear, linear_act and linear_add (res: its residual, else NULL): a node
 * y[..., out] of op, or NULL. */
static cg_tensor *linear_node(cg_graph *g, int op, const char *nm, cg_tensor *x, cg_tensor *w, cg_tensor *bias,
                              cg_tensor *res) {
    cg_tensor *in[4] = {x, w, bias, res};
    if (!cgi_inputs_ok(g, nm, bias ? 3 : 2, in) || (res && !cgi_inputs_ok(g, nm, 1, &res))) return NULL;
    if (!cgi_expect_real(nm, x, "x") || !cgi_expect_real(nm, w, "w")) return NULL;
    if (x->ndim < 1 || w->ndim != 2 || x->shape[x->ndim - 1] != w->shape[1]) {
        cgi_fail(CG_ERR_SHAPE, "[%s] x%s with w%s: w must be [out, in] with in = x's last dim", nm, cgi_shp(x),
                 cgi_shp(w));
        return NULL;
    }
    if (bias && (bias->ndim != 1 || bias->shape[0] != w->shape[0] || bias->dtype != CG_REAL)) {
        cgi_fail(CG_ERR_SHAPE, "[%s] bias%s must be real [%lld] for w%s", nm, cgi_shp(bias), (long long)w->shape[0],
                 cgi_shp(w));
        return NULL;
    }
    if (!leading_dense(x)) x = cg_contiguous(g, x);
    if (!x) return NULL;
    in[0] = x;
    int64_t s[CG_MAX_DIMS];
    memcpy(s, x->shape, sizeof s);
    s[x->ndim - 1] = w->shape[0];
    int n_in = bias ? 3 : 2;
    if (res) {
        if (!cgi_expect_real(nm, res, "r")) return NULL;
        if (res->ndim != x->ndim || memcmp(res->shape, s, sizeof(int64_t) * (size_t)x->ndim)) {
            cgi_fail(CG_ERR_SHAPE, "[%s] r%s + x%s @ w%s^T: r must have the product's shape (no broadcasting)", nm,
                     cgi_shp(res), cgi_shp(x), cgi_shp(w));
            return NULL;
        }
        if (!(in[n_in++] = cg_contiguous(g, res))) return NULL; /* the engine reads r's rows with C's layout */
    }
    cg_tensor *t = cgi_node(g, op, CG_REAL, x->ndim, s, n_in, in);
    if (!t) return NULL;
    if (res) t->iarg[1] = n_in - 1;
    /* backward scratch: the bias column sums, then dW^T when dW is computed transposed */
    if (bias && bias->requires_grad)
        t->bwd_aux_bytes = cgi_colsum_scratch(cgi_numel(x->ndim - 1, x->shape), w->shape[0]) * sizeof(cg_real);
    if (w->requires_grad && dw_in_scratch(x, w))
        t->bwd_aux_bytes += (size_t)(w->shape[0] * w->shape[1]) * sizeof(cg_real);
    return t;
}

cg_tensor *cg_linear(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *bias) {
    /* a weight with a LoRA adapter, without a bias: one fused node where its layout allows */
    cg_tensor *f = !bias && w && w->root && w->root->lora_a && cgi_inputs_ok(g, "linear", 2, (cg_tensor *[]){x, w})
                       ? cgi_lora_linear_plain(g, x, w)
                       : NULL;
    if (f) return f;
    cg_tensor *t = linear_node(g, CGI_OP_LINEAR, "linear", x, w, bias, NULL);
    return t && w->root->lora_a ? cgi_lora_linear(g, t->src[0], w, t) : t;
}

/* The weight's elements for a product: a frozen half-precision weight's in place (their type to
 * *el), else its floats, widened first if it has none yet; NULL without memory for them. */
static const void *weight_elems(cg_tensor *w, int *el) {
    const void *v = cgi_operand_elems(w, el);
    return *el == CGI_EL_F32 && cgi_param_float(w->root) ? NULL : v;
}

/* The float product y = x w^T + bias, relu: clamped at 0; the bias goes in with the product, piece
 * by piece (see gemm_blocked). A half-precision weight is widened as it is packed. */
static cg_status linear_fwd_float(cg_tensor *t, bool relu) {
    cg_tensor *x = t->src[0], *w = t->src[1], *bias = bias_of(t);
    const int64_t m = rows_of(x), n = w->shape[0], k = w->shape[1];
    int we;
    const void *wv = weight_elems(w, &we);
    if (!wv) return CG_ERR_NOMEM;
    const cgi_gemm_job j = {.m = m, .n = n, .k = k, .a = x->data, .rsa = row_stride(x), .csa = x->stride[x->ndim - 1],
                            .b = wv, .rsb = w->stride[1], .csb = w->stride[0], .alpha = 1, .beta = 0, .c = t->data,
                            .rsc = n, .csc = 1, .bias = bias ? bias->data : NULL,
                            .bias_stride = bias ? bias->stride[0] : 0, .relu = relu, .tb = (uint8_t)we,
                            .res = t->op == CGI_OP_LINEAR_ADD ? t->src[t->iarg[1]]->data : NULL, .res_rs = n};
    cgi_gemm_many(&j, 1, cgi_nthreads());
    return CG_OK;
}

cg_status cgi_fwd_linear(cg_tensor *t) {
    cg_tensor *x = t->src[0], *w = t->src[1];
    if (cgi_lp_on(t)) {
        if (cgi_lp_linear_fwd(t)) return CG_OK;
        /* the float products below would read an input that exists only in bf16 */
        /* ... or write floats over a value stored in bf16 */
        if (x->root->lp_value || t->lp_value)
            return cgi_fail(CG_ERR_NOMEM, "[linear] bf16: no memory for the bf16 form of weight %s (%s) or its scratch, "
                                          "and %s %s is stored only in bf16",
                            cgi_shp(w), cg_name(w->root), x->root->lp_value ? "input" : "output",
                            cgi_shp(x->root->lp_value ? x : t));
    }
    return linear_fwd_float(t, false);
}

/* The backward scratch for dW (after the bias column sums), or NULL when dW is written in place. */
static cg_real *dw_scratch(const cg_tensor *t) {
    const cg_tensor *x = t->src[0], *w = t->src[1], *bias = bias_of(t);
    if (!dw_in_scratch(x, w)) return NULL;
    return (cg_real *)t->bwd_aux + (bias && bias->requires_grad ? cgi_colsum_scratch(rows_of(x), w->shape[0]) : 0);
}

/* dst[i,j] (+)= src[j,i] for dst [n, k], src [k, n] row-major; in tiles so both stay in cache. */
CGI_CLONES static void add_transposed(cg_real *dst, int64_t rs, int64_t cs, const cg_real *src, int64_t n, int64_t k,
                                      bool assign) {
    enum { TILE = 32 };
#pragma omp parallel for schedule(static) if (n * k > CGI_PAR_MIN) num_threads(cgi_nthreads())
    for (int64_t i0 = 0; i0 < n; i0 += TILE)
        for (int64_t j0 = 0; j0 < k; j0 += TILE)
            for (int64_t i = i0; i < n && i < i0 + TILE; i++)
                for (int64_t j = j0; j < k && j < j0 + TILE; j++)
                    dst[i * rs + j * cs] = (assign ? 0 : dst[i * rs + j * cs]) + src[j * n + i];
}

/* dBias += the column sums of dY[m, n] */
static void bias_grad(cg_tensor *t, cg_tensor *bias, int64_t m, int64_t n) {
    if (bias->stride[0] == 1) cgi_colsum_add(bias->grad, t->grad, m, n, n, t->bwd_aux);
    else { /* a strided bias view: sum into scratch row 0 is not enough, go element by element */
        int64_t cs[2] = {n, 1}, ds[2] = {0, bias->stride[0]}, sh[2] = {m, n};
        cgi_reduce(bias->grad, ds, t->grad, cs, 2, sh, 1u, 1.0, true);
    }
}

static void linear_bwd(cg_tensor *t, const cg_real *dy, bool with_bias);

void cgi_bwd_linear(cg_tensor *t) { linear_bwd(t, t->grad, true); }

/* dX and dW from dy[m, n] (t->grad, or linear_act's pre-activation gradient), and the bias's
 * gradient when with_bias. */
static void linear_bwd(cg_tensor *t, const cg_real *dy, bool with_bias) {
    cg_tensor *x = t->src[0], *w = t->src[1], *bias = with_bias ? bias_of(t) : NULL;
    int64_t m = rows_of(x), n = w->shape[0], k = w->shape[1];
    const int nt = cgi_nthreads();
    /* dX and dW go to the threads as one list of pieces: side by side they beat cutting each
     * product across all threads in turn, and one team serves both. When x's and w's gradients
     * share storage, the two products write the same memory and run one after the other
     * (linear(z, z), a Gram matrix), where side by side they would race. */
    const bool lp_on = cgi_lp_on(t) && t->op == CGI_OP_LINEAR;
    /* dX's first writer: beta 0, no zeroing; also through a view holding all of x's node, as dX is
     * written before the gradients claimed after it that may share its storage (dW follows dX when
     * they alias, the bias's sums are added after the products), except in bf16, whose bias goes first */
    const bool assign = x->requires_grad && (lp_on ? cgi_grad_begin(x) : cgi_grad_begin_whole(x));
    /* the op claims every input (CGI_GRAD_CLAIMS_ALL): dW's first writer since zero_grad assigns too */
    bool w_assign = w->requires_grad && cgi_grad_claim(w, !lp_on); /* bf16's products add into dW */
    if (bias && bias->requires_grad) cgi_grad_prepare(bias);
    /* bf16: the bias first, as the products may turn dY into bf16 in place; then both products */
    if (lp_on && bias && bias->requires_grad) bias_grad(t, bias, m, n);
    const bool lp = lp_on && cgi_lp_linear_bwd(t, assign);
    int we = CGI_EL_F32;
    const void *wv = !lp && x->requires_grad ? weight_elems(w, &we) : w->data;
    if (!wv) return; /* no memory: planning widens such weights first */
    cgi_gemm_job jobs[2];
    int nj = 0;
    if (x->requires_grad && !lp) /* dX[m,k] += dY[m,n] @ W[n,k], a half-precision W widened as it is packed */
        jobs[nj++] = (cgi_gemm_job){.m = m, .n = k, .k = n, .a = dy, .rsa = n, .csa = 1, .b = wv, .rsb = w->stride[0],
                                    .csb = w->stride[1], .alpha = 1, .beta = assign ? 0 : 1, .c = x->grad,
                                    .rsc = row_stride(x), .csc = x->stride[x->ndim - 1], .tb = (uint8_t)we};
    if (w->requires_grad && !lp) {
        const int64_t xr = row_stride(x), xc = x->stride[x->ndim - 1];
        cg_real *s = dw_scratch(t);
        if (dw_as_transpose(x, w)) /* dW^T[k,n] = X^T[k,m] @ dY[m,n] */
            jobs[nj++] = (cgi_gemm_job){.m = k, .n = n, .k = m, .a = x->data, .rsa = xc, .csa = xr, .b = dy, .rsb = n,
                                        .csb = 1, .alpha = 1, .beta = s || w_assign ? 0 : 1, .c = s ? s : w->grad,
                                        .rsc = s ? n : w->stride[1], .csc = s ? 1 : w->stride[0]};
        else /* dW[n,k] = dY^T[n,m] @ X[m,k] */
            jobs[nj++] = (cgi_gemm_job){.m = n, .n = k, .k = m, .a = dy, .rsa = 1, .csa = n, .b = x->data, .rsb = xr,
                                        .csb = xc, .alpha = 1, .beta = s || w_assign ? 0 : 1, .c = s ? s : w->grad,
                                        .rsc = s ? k : w->stride[0], .csc = s ? 1 : w->stride[1]};
    }
    /* a contiguous bias's column sums run as further pieces of the products' parallel region: one
     * region (one wake of a passively waiting thread) fewer per linear, the same sums */
    const bool db = bias && bias->requires_grad && !lp_on, db_here = db && bias->stride[0] == 1;
    const cgi_colsum_ctx cs = {db_here ? bias->grad : NULL, db_here ? t->bwd_aux : NULL, dy, m, n, n};
    const int ntask = db_here ? cgi_colsum_tasks() : 0;
    if (nj == 2 && cgi_grads_alias(x, w)) {
        cgi_gemm_many(&jobs[0], 1, nt);
        cgi_gemm_many_then(&jobs[1], 1, nt, cgi_colsum_task, (void *)&cs, ntask);
    } else cgi_gemm_many_then(jobs, nj, nt, cgi_colsum_task, (void *)&cs, ntask);
    if (db_here) cgi_colsum_tasks_finish(&cs);
    const cg_real *s = w->requires_grad && !lp ? dw_scratch(t) : NULL;
    if (s) { /* after both products, on every thread */
        const bool tr = dw_as_transpose(x, w);
        add_transposed(w->grad, tr ? w->stride[0] : w->stride[1], tr ? w->stride[1] : w->stride[0], s, tr ? n : k,
                       tr ? k : n, w_assign);
    }
    if (db && !db_here) bias_grad(t, bias, m, n); /* a strided bias view */
}

/* ---- linear_act: act(x @ w^T + bias), iarg[0] the activation (cgi_act) ---- */

/* linear_act's iarg slot that is 1 while aux holds GELU's derivative rather than the product */
#define LINEAR_ACT_DERIV 2

/* GELU: the product goes to aux (beta 0: no bias fill before it, C never read) and one pass adds
 * the bias and applies GELU. Backward needs GELU's derivative at the pre-activation. For the tanh
 * form the pass that makes the output last puts it over the product in aux, from the same
 * exponential (forward's when the plan keeps the output; else the remake's, cgi_linear_act_regen,
 * whose product forward keeps for it), so backward's pass is dy times it (iarg[LINEAR_ACT_DERIV]
 * says aux holds it; else that pass computes it from the product first, to the same bits). For erf
 * backward reads the gate back from the output and the product, as cgi_bwd_gelu. Backward writes
 * the pre-activation gradient over aux and sums the bias gradient in the same pass.
 * ReLU: the product engine adds the bias and clamps each strip of C while it is in cache
 * (cgi_gemm_job.relu), straight into the output; backward reads the output's sign, so no
 * pre-activation is kept, and writes the pre-activation gradient into backward-only scratch.
 * The products are float only: a graph already set to bf16 gets linear -> act, whose product runs
 * in bf16 (and whose GELU or ReLU output a following linear reads in bf16, ops/bf16.c). */
static cg_tensor *linear_act(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *bias, cgi_act act) {
    if (bias && bias->ndim == 1 && bias->stride[0] != 1) bias = cg_contiguous(g, bias);
    /* LoRA adds its own path beside the product, and a bf16 graph's products take bf16 operands,
     * which the fused op's do not: the composite in both cases */
    if ((w && w->root->lora_a) || (g && cg_graph_precision(g) == CG_BF16)) {
        cg_tensor *y = cg_linear(g, x, w, bias);
        return act == CGI_ACT_RELU ? cg_relu(g, y) : act == CGI_ACT_GELU_TANH ? cg_gelu_tanh(g, y) : cg_gelu(g, y);
    }
    cg_tensor *t = linear_node(g, CGI_OP_LINEAR_ACT, "linear_act", x, w, bias, NULL);
    if (!t) return NULL;
    t->iarg[0] = act;
    const size_t out_bytes = (size_t)cgi_numel(t->ndim, t->shape) * sizeof(cg_real);
    if (act == CGI_ACT_RELU) t->bwd_aux_bytes += out_bytes; /* after linear_node's (see dpre_scratch) */
    else t->aux_bytes = out_bytes;
    return t;
}

cg_tensor *cg_linear_gelu(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *bias, bool tanh_form) {
    return linear_act(g, x, w, bias, tanh_form ? CGI_ACT_GELU_TANH : CGI_ACT_GELU);
}

cg_tensor *cg_linear_relu(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *bias) {
    return linear_act(g, x, w, bias, CGI_ACT_RELU);
}

cg_status cgi_fwd_linear_act(cg_tensor *t) {
    if (t->iarg[0] == CGI_ACT_RELU) return linear_fwd_float(t, true); /* float even if the graph was set to bf16 after this op was built */
    cg_tensor *x = t->src[0], *w = t->src[1], *bias = t->nsrc > 2 ? t->src[2] : NULL;
    const int64_t m = rows_of(x), n = w->shape[0], k = w->shape[1];
    cg_real *c = t->aux;
    int we;
    const void *wv = weight_elems(w, &we);
    if (!wv) return CG_ERR_NOMEM;
    const cgi_gemm_job j = {.m = m, .n = n, .k = k, .a = x->data, .rsa = row_stride(x), .csa = x->stride[x->ndim - 1],
                            .b = wv, .rsb = w->stride[1], .csb = w->stride[0], .alpha = 1, .beta = 0, .c = c,
                            .rsc = n, .csc = 1, .tb = (uint8_t)we};
    cgi_gemm_many(&j, 1, cgi_nthreads());
    /* the derivative now unless the remake will make it (t->regen) or no backward comes */
    const bool deriv = t->requires_grad && !t->regen && t->iarg[0] == CGI_ACT_GELU_TANH;
    cgi_bias_gelu_fwd(c, bias ? bias->data : NULL, t->data, m, n, t->iarg[0] == CGI_ACT_GELU_TANH, deriv);
    t->iarg[LINEAR_ACT_DERIV] = deriv;
    return CG_OK;
}

/* GELU's output again from the product forward keeps for backward: forward's own pass, so the
 * same bits (cgi_regen), and backward's derivative over the product in the same pass. */
void cgi_linear_act_regen(cg_tensor *t) {
    const cg_tensor *bias = t->nsrc > 2 ? t->src[2] : NULL;
    cgi_bias_gelu_fwd(t->aux, bias ? bias->data : NULL, t->data, rows_of(t->src[0]), t->src[1]->shape[0],
                      t->iarg[0] == CGI_ACT_GELU_TANH, true);
    t->iarg[LINEAR_ACT_DERIV] = t->iarg[0] == CGI_ACT_GELU_TANH;
}

/* ReLU's pre-activation gradient [m, n]: backward scratch after the bias sums and dW's (dw_scratch). */
static cg_real *dpre_scratch(const cg_tensor *t) {
    const cg_tensor *x = t->src[0], *w = t->src[1], *bias = t->nsrc > 2 ? t->src[2] : NULL;
    const int64_t n = w->shape[0], k = w->shape[1];
    return (cg_real *)t->bwd_aux + (bias && bias->requires_grad ? cgi_colsum_scratch(rows_of(x), n) : 0) +
           (w->requires_grad && dw_in_scratch(x, w) ? n * k : 0);
}

void cgi_bwd_linear_act(cg_tensor *t) {
    cg_tensor *x = t->src[0], *w = t->src[1], *bias = t->nsrc > 2 ? t->src[2] : NULL;
    const int64_t m = rows_of(x), n = w->shape[0];
    const bool db = bias && bias->requires_grad, relu = t->iarg[0] == CGI_ACT_RELU;
    if (db) cgi_grad_prepare(bias); /* the op claims every input (CGI_GRAD_CLAIMS_ALL) */
    cg_real *dpre = relu ? dpre_scratch(t) : t->aux; /* GELU: over the product, which backward no longer needs */
    cgi_bias_act_bwd(dpre, bias ? bias->data : NULL, t->data, t->grad, m, n, (cgi_act)t->iarg[0],
                     !relu && t->iarg[LINEAR_ACT_DERIV], db ? bias->grad : NULL, db ? t->bwd_aux : NULL);
    if (!relu) t->iarg[LINEAR_ACT_DERIV] = 0; /* aux holds the pre-activation gradient now */
    linear_bwd(t, dpre, false);
}

/* ---- linear_add: r + (x @ w^T + bias), a residual add folded into the product ---- */

/* The product engine adds r to each strip of C on its last depth pass, after the bias (cgi_gemm_job.res),
 * so the sum has the bits of cg_add(r, cg_linear(...)) without writing the product and reading it
 * back. The sum's gradient is the product's dY and r's gradient: backward reads it in place, and
 * the planner gives r that buffer when this op is r's first gradient writer (graph/plan.c), as it
 * does for cg_add, so no pass copies it. */
cg_tensor *cg_linear_add(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *bias, cg_tensor *r) {
    if ((w && w->root && w->root->lora_a) || (g && cg_graph_precision(g) == CG_BF16))
        return cg_add(g, r, cg_linear(g, x, w, bias));
    return linear_node(g, CGI_OP_LINEAR_ADD, "linear_add", x, w, bias, r);
}

cg_status cgi_fwd_linear_add(cg_tensor *t) { return linear_fwd_float(t, false); }

void cgi_bwd_linear_add(cg_tensor *t) {
    cg_tensor *r = t->src[t->iarg[1]];
    linear_bwd(t, t->grad, true);
    if (!r->requires_grad) return;
    if (r->grad == t->grad && r->root == r) cgi_grad_begin(r); /* given this op's gradient buffer: claimed */
    else cgi_unbroadcast_claim(r, t->grad, t->ndim, t->shape, 1.0);
}

/* ---- batched products composed from matmul (its batched BLIS path and backward) ---- */

cg_tensor *cg_bmm(cg_graph *g, cg_tensor *a, cg_tensor *b) {
    cg_tensor *in[2] = {a, b};
    if (!cgi_inputs_ok(g, "bmm", 2, in)) return NULL;
    if (a->ndim != 3 || b->ndim != 3 || a->shape[0] != b->shape[0] || a->shape[2] != b->shape[1]) {
        cgi_fail(CG_ERR_SHAPE, "[bmm] a%s @ b%s: need a[B, M, K] and b[B, K, N]", cgi_shp(a), cgi_shp(b));
        return NULL;
    }
    return cg_matmul(g, a, b);
}

cg_tensor *cg_grouped_linear(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *bias) {
    cg_tensor *in[3] = {x, w, bias};
    if (!cgi_inputs_ok(g, "grouped_linear", bias ? 3 : 2, in)) return NULL;
    if (x->ndim != 3 || w->ndim != 3 || x->shape[0] != w->shape[0] || x->shape[2] != w->shape[2] ||
        (bias && (bias->ndim != 2 || bias->shape[0] != w->shape[0] || bias->shape[1] != w->shape[1]))) {
        cgi_fail(CG_ERR_SHAPE, "[grouped_linear] x%s, w%s, bias%s: need x[E, T, in], w[E, out, in], bias[E, out] or none",
                 cgi_shp(x), cgi_shp(w), bias ? cgi_shp(bias) : "(none)");
        return NULL;
    }
    cg_tensor *y = cg_matmul(g, x, cg_transpose(g, w, 1, 2)); /* a strided view: BLIS reads w in place */
    return bias ? cg_add(g, y, cg_unsqueeze(g, bias, 1)) : y;
}
