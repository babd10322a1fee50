/* SPDX-License-Identifier: MIT */
/* Elementwise ops: binary with NumPy broadcasting (arithmetic, minimum, maximum), unary maps and
 * activations, the fused SwiGLU gate, where, masked_fill, dropout. */
#include <math.h>
#include <tgmath.h>

#include "graph/internal.h"
#include "ops/bf16_internal.h"
#include "ops/gelu_math.h"
#include "ops/ops.h"

/* x is read broadcast into out: smaller, or an expanded view (zero strides), so its gradient is
 * formed in out's shape and reduced (cgi_unbroadcast_add), never added through the repeats */
static bool broadcast_in(const cg_tensor *x, const cg_tensor *out) {
    return cgi_numel(x->ndim, x->shape) != cgi_numel(out->ndim, out->shape) || cgi_broadcast_view(x);
}

/* Iterator over out's shape with operands (out-like, x-like, y-like, z-like) read broadcast. */
static void iter4(cgi_iter *it, const cg_tensor *shape_of, const int64_t *s0, const int64_t *s1,
                  const int64_t *s2, const int64_t *s3) {
    const int64_t *st[4] = {s0, s1, s2, s3};
    cgi_iter_init(it, shape_of->ndim, shape_of->shape, 4, st);
}

/* ---- binary ---- */

cg_tensor *cgi_broadcast_node(cg_graph *g, int op, cg_dtype dt, cg_tensor *a, cg_tensor *b) {
    int nd;
    int64_t shape[CG_MAX_DIMS];
    if (!cgi_broadcast_shape(a, b, &nd, shape)) {
        cgi_fail(CG_ERR_SHAPE, "[%s] a%s and b%s do not broadcast", cgi_ops[op].name, cgi_shp(a), cgi_shp(b));
        return NULL;
    }
    cg_tensor *in[2] = {a, b};
    return cgi_node(g, op, dt, nd, shape, 2, in);
}

static cg_tensor *binary(cg_graph *g, int op, cg_tensor *a, cg_tensor *b) {
    const char *nm = cgi_ops[op].name;
    cg_tensor *in[2] = {a, b};
    if (!cgi_inputs_ok(g, nm, 2, in)) return NULL;
    if (!cgi_expect_real(nm, a, "a") || !cgi_expect_real(nm, b, "b")) return NULL;
    cg_tensor *t = cgi_broadcast_node(g, op, CG_REAL, a, b);
    if (!t) return NULL;
    /* mul and div form the product in the output's shape before reducing a broadcast operand. */
    if ((op == CGI_OP_MUL || op == CGI_OP_DIV || op == CGI_OP_MINIMUM || op == CGI_OP_MAXIMUM) && t->requires_grad &&
        ((a->requires_grad && broadcast_in(a, t)) || (b->requires_grad && broadcast_in(b, t))))
        t->aux_bytes = (size_t)cgi_numel(t->ndim, t->shape) * sizeof(cg_real);
    return t;
}

cg_tensor *cg_add(cg_graph *g, cg_tensor *a, cg_tensor *b) { return binary(g, CGI_OP_ADD, a, b); }
cg_tensor *cg_sub(cg_graph *g, cg_tensor *a, cg_tensor *b) { return binary(g, CGI_OP_SUB, a, b); }
cg_tensor *cg_mul(cg_graph *g, cg_tensor *a, cg_tensor *b) { return binary(g, CGI_OP_MUL, a, b); }
cg_tensor *cg_div(cg_graph *g, cg_tensor *a, cg_tensor *b) { return binary(g, CGI_OP_DIV, a, b); }
cg_tensor *cg_minimum(cg_graph *g, cg_tensor *a, cg_tensor *b) { return binary(g, CGI_OP_MINIMUM, a, b); }
cg_tensor *cg_maximum(cg_graph *g, cg_tensor *a, cg_tensor *b) { return binary(g, CGI_OP_MAXIMUM, a, b); }

#define BINARY_SETUP(t)                                                 \
    cg_tensor *a = (t)->src[0], *b = (t)->src[1];                       \
    int64_t sa[CG_MAX_DIMS], sb[CG_MAX_DIMS];                           \
    cgi_broadcast_strides(a, (t)->ndim, (t)->shape, sa);                \
    cgi_broadcast_strides(b, (t)->ndim, (t)->shape, sb);                \
    const cg_real *A_ = a->data, *B_ = b->data;                         \
    cgi_iter it;                                                        \
    iter4(&it, (t), (t)->stride, sa, sb, sb)

typedef struct {
    cg_real *y;
    const cg_real *a, *b;
} sum_args;

CGI_CLONES static void sum_range(int64_t lo, int64_t hi, void *ctx) {
    const sum_args *s = ctx;
    for (int64_t i = lo; i < hi; i++) s->y[i] = s->a[i] + s->b[i];
}

/* A binary op's forward over chunks [c0, c1) of its iterator, for cgi_par_ranges: inside a team
 * the chunks are shared (a broadcast sum, GPT's token + position embeddings, ran on thread 0
 * alone: ~2 ms of gpt-tiny's two-thread step). Each element alone: the same bits however cut. */
typedef struct {
    cgi_iter it;
    int op;
    cg_real *y;
    const cg_real *a, *b;
} binary_args;

static void binary_chunks(int64_t c0, int64_t c1, void *ctx) {
    const binary_args *k = ctx;
    const cg_real *A_ = k->a, *B_ = k->b;
    switch (k->op) {
    case CGI_OP_ADD: CGI_EW_CHUNKS(k->it, c0, c1, k->y, A_, B_, B_, =, A + B); break;
    case CGI_OP_SUB: CGI_EW_CHUNKS(k->it, c0, c1, k->y, A_, B_, B_, =, A - B); break;
    case CGI_OP_MUL: CGI_EW_CHUNKS(k->it, c0, c1, k->y, A_, B_, B_, =, A * B); break;
    case CGI_OP_DIV: CGI_EW_CHUNKS(k->it, c0, c1, k->y, A_, B_, B_, =, A / B); break;
    /* NaN in either operand propagates, as torch.minimum and torch.maximum */
    case CGI_OP_MINIMUM: CGI_EW_CHUNKS(k->it, c0, c1, k->y, A_, B_, B_, =, A != A || A < B ? A : B); break;
    default: CGI_EW_CHUNKS(k->it, c0, c1, k->y, A_, B_, B_, =, A != A || A > B ? A : B); break; /* maximum */
    }
}

static cg_status binary_fwd(cg_tensor *t) {
    BINARY_SETUP(t);
    binary_args k = {.it = it, .op = t->op, .y = t->data, .a = A_, .b = B_};
    cgi_par_ranges(it.rows * cgi_chunks(it.inner), it.rows * it.inner, binary_chunks, &k);
    return CG_OK;
}

/* A residual sum (both operands and the output contiguous, one shape) runs as ranges of elements,
 * which a thread team shares (cgi_par_ranges); anything broadcast or strided takes the iterator. */
cg_status cgi_fwd_add(cg_tensor *t) {
    const int64_t n = cgi_numel(t->ndim, t->shape);
    if (n >= CGI_TEAM_PART_MIN && cgi_contiguous(t) && cgi_contiguous(t->src[0]) && cgi_contiguous(t->src[1]) &&
        cgi_numel(t->src[0]->ndim, t->src[0]->shape) == n && cgi_numel(t->src[1]->ndim, t->src[1]->shape) == n &&
        !cgi_broadcast_view(t->src[0]) && !cgi_broadcast_view(t->src[1])) {
        sum_args s = {t->data, t->src[0]->data, t->src[1]->data};
        cgi_par_ranges(n, n, sum_range, &s);
        return CG_OK;
    }
    return binary_fwd(t);
}
cg_status cgi_fwd_sub(cg_tensor *t) { return binary_fwd(t); }
cg_status cgi_fwd_mul(cg_tensor *t) { return binary_fwd(t); }
cg_status cgi_fwd_div(cg_tensor *t) { return binary_fwd(t); }
cg_status cgi_fwd_minimum(cg_tensor *t) { return binary_fwd(t); }
cg_status cgi_fwd_maximum(cg_tensor *t) { return binary_fwd(t); }

/* add and sub claim their inputs (ops.def): a first writer copies the gradient instead of adding
 * it into a buffer the graph zeroed (x + x: the second source adds) */
void cgi_bwd_add(cg_tensor *t) {
    for (int k = 0; k < 2; k++) {
        cg_tensor *s = t->src[k];
        if (!s->requires_grad) continue;
        /* the planner gave s the output's gradient buffer (graph/plan.c), only when this rule is
         * its first writer: claiming it is all there is to do */
        if (s->grad == t->grad && s->root == s) {
            cgi_grad_begin(s);
            continue;
        }
        cgi_unbroadcast_claim(s, t->grad, t->ndim, t->shape, 1.0);
    }
}

void cgi_bwd_sub(cg_tensor *t) {
    for (int k = 0; k < 2; k++)
        if (t->src[k]->requires_grad) cgi_unbroadcast_claim(t->src[k], t->grad, t->ndim, t->shape, k ? -1.0 : 1.0);
}

void cgi_bwd_mul(cg_tensor *t) {
    const cg_real *gy = t->grad;
    for (int k = 0; k < 2; k++) {
        cg_tensor *x = t->src[k], *other = t->src[1 - k];
        if (!x->requires_grad) continue;
        int64_t sx[CG_MAX_DIMS], so[CG_MAX_DIMS];
        cgi_broadcast_strides(x, t->ndim, t->shape, sx);
        cgi_broadcast_strides(other, t->ndim, t->shape, so);
        const cg_real *O_ = other->data;
        cgi_iter it;
        if (!broadcast_in(x, t)) {
            iter4(&it, t, sx, t->stride, so, so);
            CGI_EW_LOOP(it, x->grad, gy, O_, O_, +=, A * B);
        } else {
            cg_real *tmp = t->aux;
            iter4(&it, t, t->stride, t->stride, so, so);
            CGI_EW_LOOP(it, tmp, gy, O_, O_, =, A * B);
            cgi_unbroadcast_add(x, tmp, t->ndim, t->shape, 1.0);
        }
    }
}

void cgi_bwd_div(cg_tensor *t) {
    BINARY_SETUP(t);
    (void)A_;
    const cg_real *gy = t->grad, *y = t->data;
    if (a->requires_grad) { /* d/da (a / b) = 1 / b */
        if (!broadcast_in(a, t)) {
            iter4(&it, t, sa, t->stride, sb, sb);
            CGI_EW_LOOP(it, a->grad, gy, B_, B_, +=, A / B);
        } else {
            iter4(&it, t, t->stride, t->stride, sb, sb);
            CGI_EW_LOOP(it, (cg_real *)t->aux, gy, B_, B_, =, A / B);
            cgi_unbroadcast_add(a, t->aux, t->ndim, t->shape, 1.0);
        }
    }
    if (b->requires_grad) { /* d/db (a / b) = -(a / b) / b = -y / b */
        if (!broadcast_in(b, t)) {
            iter4(&it, t, sb, t->stride, t->stride, sb);
            CGI_EW_LOOP(it, b->grad, gy, y, B_, +=, -A * B / C);
        } else {
            iter4(&it, t, t->stride, t->stride, t->stride, sb);
            CGI_EW_LOOP(it, (cg_real *)t->aux, gy, y, B_, =, A * B / C);
            cgi_unbroadcast_add(b, t->aux, t->ndim, t->shape, -1.0);
        }
    }
}

/* The gradient goes to the operand selected; a tie splits it in halves, as torch does, so that
 * minimum(x, x) has the gradient of x. */
static void select_bwd(cg_tensor *t, bool max) {
    const cg_real *gy = t->grad;
    for (int k = 0; k < 2; k++) {
        cg_tensor *x = t->src[k], *other = t->src[1 - k];
        if (!x->requires_grad) continue;
        int64_t sx[CG_MAX_DIMS], so[CG_MAX_DIMS];
        cgi_broadcast_strides(x, t->ndim, t->shape, sx);
        cgi_broadcast_strides(other, t->ndim, t->shape, so);
        const cg_real *X_ = x->data, *O_ = other->data;
        const bool direct = !broadcast_in(x, t);
        cgi_iter it;
        iter4(&it, t, direct ? sx : t->stride, t->stride, sx, so);
        cg_real *dst = direct ? x->grad : t->aux;
        if (max && direct) CGI_EW_LOOP(it, dst, gy, X_, O_, +=, B > C ? A : B == C ? A / 2 : 0);
        else if (max) CGI_EW_LOOP(it, dst, gy, X_, O_, =, B > C ? A : B == C ? A / 2 : 0);
        else if (direct) CGI_EW_LOOP(it, dst, gy, X_, O_, +=, B < C ? A : B == C ? A / 2 : 0);
        else CGI_EW_LOOP(it, dst, gy, X_, O_, =, B < C ? A : B == C ? A / 2 : 0);
        if (!direct) cgi_unbroadcast_add(x, dst, t->ndim, t->shape, 1.0);
    }
}
void cgi_bwd_minimum(cg_tensor *t) { select_bwd(t, false); }
void cgi_bwd_maximum(cg_tensor *t) { select_bwd(t, true); }

/* ---- unary maps: value f(x, p) and local derivative rule dy * f'(x) with y = f(x) ---- */

static cg_tensor *unary2(cg_graph *g, int op, cg_tensor *x, double p, double q) {
    const char *nm = cgi_ops[op].name;
    if (!cgi_inputs_ok(g, nm, 1, &x) || !cgi_expect_real(nm, x, "x")) return NULL;
    /* a NaN or infinite exponent, scale or slope makes every value and gradient garbage, silently;
     * clamp alone takes +-inf, as "no bound" */
    if (op != CGI_OP_CLAMP && (!isfinite(p) || !isfinite(q))) {
        cgi_fail(CG_ERR_ARG, "[%s] x%s: scalar argument %g must be finite", nm, cgi_shp(x), isfinite(p) ? q : p);
        return NULL;
    }
    cg_tensor *t = cgi_node(g, op, CG_REAL, x->ndim, x->shape, 1, &x);
    if (t) t->farg[0] = p, t->farg[1] = q;
    return t;
}
static cg_tensor *unary(cg_graph *g, int op, cg_tensor *x, double p) { return unary2(g, op, x, p, 0); }


/* bf16 graphs: a GELU or ReLU whose value only linears read stores it in bf16 (below). */
static cg_status lp_unary_fwd(cg_tensor *t);
static void lp_unary_bwd(cg_tensor *t);

/* p and q are the op's scalar arguments farg[0] and farg[1]. Inside a thread team a unary op's
 * chunks run as ranges the team shares (cgi_par_ranges): as an OpenMP loop each ran on thread 0 alone
 * there (encdec-base's embeddings times sqrt(d), [1024, 512] forward and backward: 0.28 ms of a
 * two-thread step alone). Each element alone: the same bits however the chunks are cut. */
typedef struct {
    cgi_iter it;
    cg_real *y;
    const cg_real *a, *b, *c;
    cg_real p, q;
    bool add; /* backward adds into the gradient, else assigns it */
} unary_args;

/* Inside a team its ranges; else an OpenMP loop of the op's own over the chunks, as before (a region
 * body apart from cgi_zero's, which test_regions tells by its body). */
static void unary_run(unary_args *k, void (*chunks)(int64_t c0, int64_t c1, void *ctx)) {
    const int64_t n = k->it.rows * cgi_chunks(k->it.inner), work = k->it.rows * k->it.inner;
    if (cgi_team_sharing()) cgi_par_ranges(n, work, chunks, k);
    else CGI_PAR_FOR(work, for (int64_t c = 0; c < n; c++) chunks(c, c + 1, k););
}

#define UNARY(name, ID, FWD, BWD)                                                              \
    static inline cg_real name##_f(cg_real x, cg_real p, cg_real q) {                         \
        (void)p, (void)q;                                                                     \
        return FWD;                                                                           \
    }                                                                                         \
    static inline cg_real name##_df(cg_real dy, cg_real x, cg_real y, cg_real p, cg_real q) { \
        (void)x, (void)y, (void)p, (void)q;                                                   \
        return BWD;                                                                           \
    }                                                                                         \
    static void name##_fwd_chunks(int64_t c0, int64_t c1, void *ctx) {                        \
        const unary_args *k = ctx;                                                            \
        const cg_real p = k->p, q = k->q;                                                     \
        (void)p, (void)q;                                                                     \
        CGI_EW_CHUNKS(k->it, c0, c1, k->y, k->a, k->a, k->a, =, name##_f(A, p, q));           \
    }                                                                                         \
    static void name##_bwd_chunks(int64_t c0, int64_t c1, void *ctx) {                        \
        const unary_args *k = ctx;                                                            \
        const cg_real p = k->p, q = k->q;                                                     \
        (void)p, (void)q;                                                                     \
        if (k->add) CGI_EW_CHUNKS(k->it, c0, c1, k->y, k->a, k->b, k->c, +=, name##_df(A, B, C, p, q)); \
        else CGI_EW_CHUNKS(k->it, c0, c1, k->y, k->a, k->b, k->c, =, name##_df(A, B, C, p, q));        \
    }                                                                                         \
    cg_status cgi_fwd_##name(cg_tensor *t) {                                                  \
        if (t->lp_value) return lp_unary_fwd(t);                                              \
        cg_tensor *x = t->src[0];                                                             \
        unary_args k = {.y = t->data, .a = x->data, .p = (cg_real)t->farg[0], .q = (cg_real)t->farg[1]}; \
        iter4(&k.it, t, t->stride, x->stride, x->stride, x->stride);                          \
        unary_run(&k, name##_fwd_chunks);                                                     \
        return CG_OK;                                                                         \
    }                                                                                         \
    void cgi_bwd_##name(cg_tensor *t) {                                                       \
        if (t->lp_value) { lp_unary_bwd(t); return; }                                        \
        cg_tensor *x = t->src[0];                                                             \
        unary_args k = {.a = t->grad, .b = x->data, .c = t->data, .p = (cg_real)t->farg[0],   \
                        .q = (cg_real)t->farg[1]};                                            \
        iter4(&k.it, t, x->stride, t->stride, x->stride, t->stride);                          \
        k.add = !cgi_grad_begin(x); /* the first writer of dx assigns, so nothing zeroes it */ \
        k.y = x->grad;                                                                        \
        unary_run(&k, name##_bwd_chunks);                                                     \
    }

UNARY(neg, NEG, -x, -dy)
UNARY(scale, SCALE, p * x, p * dy)
UNARY(add_scalar, ADD_SCALAR, x + p, dy)
UNARY(exp, EXP, exp(x), dy * y)
UNARY(log, LOG, log(x), dy / x)
UNARY(sqrt, SQRT, sqrt(x), dy * (cg_real)0.5 / y)
UNARY(pow, POW, pow(x, p), dy * p * pow(x, p - 1))
UNARY(square, SQUARE, x * x, dy * 2 * x)
UNARY(tanh, TANH, tanh(x), dy * (1 - y * y))
UNARY(sigmoid, SIGMOID, 1 / (1 + exp(-x)), dy * y * (1 - y))
UNARY(relu, RELU, x > 0 ? x : 0, y > 0 ? dy : 0) /* from y, so the input can be freed after forward */
UNARY(gelu, GELU, gelu_erf_value(x), dy * gelu_grad(x, y))
UNARY(gelu_tanh, GELU_TANH, gelu_tanh_value(x), dy * gelu_tanh_grad(x, y))

/* Elements [i0, i0 + len) of x, a value that may be stored in bf16 (a linear's output that only
 * activations read: a GELU's pre-activation, SwiGLU's gate and up; plan_linear_outputs,
 * ops/bf16_plan.c), widened into w, or read in place where it is float. */
enum { LP_BLK = 256 };
static const cg_real *lp_operand_block(const cg_tensor *x, int64_t i0, int64_t len, cg_real *w) {
    if (!x->root->lp_value) return (const cg_real *)x->data + i0;
    const cgi_bf16 *h = (const cgi_bf16 *)x->data + i0;
    for (int64_t j = 0; j < len; j++) w[j] = cgi_from_bf16(h[j]);
    return w;
}

/* A GELU or ReLU value read only by linears in a bf16 graph (t->lp_value, ops/bf16.c; x and t
 * contiguous) is written in bf16: half the memory, and the linear reads it without converting.
 * GELU's backward recomputes y = f(x) in float, so its gradient is fp32's bit for bit. ReLU's reads
 * the sign of its bf16 output; a positive y too small for bf16 is stored as the smallest bf16
 * denormal rather than 0, so bf16(y) > 0 exactly when y > 0. */
static cg_status lp_unary_fwd(cg_tensor *t) {
    const int64_t n = cgi_numel(t->ndim, t->shape), op = t->op;
    cgi_bf16 *Y = t->data;
#pragma omp parallel for schedule(static) if (n > CGI_PAR_MIN) num_threads(cgi_nthreads())
    for (int64_t i0 = 0; i0 < n; i0 += LP_BLK) {
        const int64_t len = n - i0 < LP_BLK ? n - i0 : LP_BLK;
        cg_real y[LP_BLK], xw[LP_BLK];
        const cg_real *x = lp_operand_block(t->src[0], i0, len, xw);
        if (op == CGI_OP_GELU)
            for (int64_t j = 0; j < len; j++) y[j] = gelu_f(x[j], 0, 0);
        else if (op == CGI_OP_GELU_TANH)
            for (int64_t j = 0; j < len; j++) y[j] = gelu_tanh_f(x[j], 0, 0);
        else
            for (int64_t j = 0; j < len; j++) y[j] = relu_f(x[j], 0, 0);
        for (int64_t j = 0; j < len; j++) {
            const cgi_bf16 h = cgi_to_bf16((float)y[j]);
            Y[i0 + j] = h == 0 && y[j] > 0 ? 1 : h;
        }
    }
    return CG_OK;
}

static void lp_unary_bwd(cg_tensor *t) {
    cg_tensor *x = t->src[0];
    const int64_t n = cgi_numel(t->ndim, t->shape), op = t->op;
    const cg_real *X = x->data, *DY = t->grad;
    const cgi_bf16 *Y = t->data;
    const bool assign = cgi_grad_begin(x); /* the first writer of dx assigns: nothing zeroed it */
    cg_real *DX = x->grad;
    /* one loop per op and mode, so each vectorises */
#define LP_BWD(EXPR)                                                                               \
    do {                                                                                           \
        if (assign) {                                                                              \
            _Pragma("omp parallel for schedule(static) if (n > CGI_PAR_MIN) num_threads(cgi_nthreads())") \
            for (int64_t i = 0; i < n; i++) DX[i] = (EXPR);                                        \
        } else {                                                                                   \
            _Pragma("omp parallel for schedule(static) if (n > CGI_PAR_MIN) num_threads(cgi_nthreads())") \
            for (int64_t i = 0; i < n; i++) DX[i] += (EXPR);                                       \
        }                                                                                          \
    } while (0)
    /* a GELU's input stored in bf16 (its linear's value, ops/bf16.c): the derivative at the rounded x */
    const cgi_bf16 *XB = x->root->lp_value ? x->data : NULL;
#define XBF(i) ((cg_real)cgi_from_bf16(XB[i]))
    if (op == CGI_OP_GELU && XB) LP_BWD(gelu_df(DY[i], XBF(i), gelu_f(XBF(i), 0, 0), 0, 0));
    else if (op == CGI_OP_GELU_TANH && XB) LP_BWD(gelu_tanh_df(DY[i], XBF(i), gelu_tanh_f(XBF(i), 0, 0), 0, 0));
    else if (op == CGI_OP_GELU) LP_BWD(gelu_df(DY[i], X[i], gelu_f(X[i], 0, 0), 0, 0));
    else if (op == CGI_OP_GELU_TANH) LP_BWD(gelu_tanh_df(DY[i], X[i], gelu_tanh_f(X[i], 0, 0), 0, 0));
    else LP_BWD(Y[i] != 0 && !(Y[i] & 0x8000) ? DY[i] : 0);
#undef XBF
#undef LP_BWD
}

/* sigmoid through cgi_exp, so the activations below vectorise */
static inline cg_real fast_sigmoid(cg_real x) { return 1 / (1 + cgi_exp(-x)); }

/* SiLU (swish): x * sigmoid(x); d/dx = s (1 + x (1 - s)). */
UNARY(silu, SILU, x * fast_sigmoid(x), dy * fast_sigmoid(x) * (1 + x * (1 - fast_sigmoid(x))))
/* softplus with torch's beta and threshold 20: linear where beta x > 20, else
 * (max(z, 0) + log1p(e^-|z|)) / beta with z = beta x, which never overflows. */
UNARY(softplus, SOFTPLUS,
      p * x > 20 ? x : ((p * x > 0 ? p * x : 0) + log1p(exp(-(p * x > 0 ? p * x : -p * x)))) / p,
      p * x > 20 ? dy : dy * fast_sigmoid(p * x))
UNARY(elu, ELU, x > 0 ? x : p * expm1(x), x > 0 ? dy : dy * p * exp(x))
UNARY(leaky_relu, LEAKY_RELU, x > 0 ? x : p * x, x > 0 ? dy : dy * p)
UNARY(abs, ABS, x < 0 ? -x : x, x > 0 ? dy : x < 0 ? -dy : 0) /* 0 at the kink, as torch */
/* gradient passes where lo <= x <= hi, bounds included, as torch.clamp */
UNARY(clamp, CLAMP, x < p ? p : x > q ? q : x, x < p || x > q ? 0 : dy)

cg_tensor *cg_neg(cg_graph *g, cg_tensor *x) { return unary(g, CGI_OP_NEG, x, 0); }
cg_tensor *cg_scale(cg_graph *g, cg_tensor *x, double s) { return unary(g, CGI_OP_SCALE, x, s); }
cg_tensor *cg_add_scalar(cg_graph *g, cg_tensor *x, double s) { return unary(g, CGI_OP_ADD_SCALAR, x, s); }
cg_tensor *cg_exp(cg_graph *g, cg_tensor *x) { return unary(g, CGI_OP_EXP, x, 0); }
cg_tensor *cg_log(cg_graph *g, cg_tensor *x) { return unary(g, CGI_OP_LOG, x, 0); }
cg_tensor *cg_sqrt(cg_graph *g, cg_tensor *x) { return unary(g, CGI_OP_SQRT, x, 0); }
cg_tensor *cg_pow(cg_graph *g, cg_tensor *x, double p) { return unary(g, CGI_OP_POW, x, p); }
cg_tensor *cg_square(cg_graph *g, cg_tensor *x) { return unary(g, CGI_OP_SQUARE, x, 0); }
cg_tensor *cg_tanh(cg_graph *g, cg_tensor *x) { return unary(g, CGI_OP_TANH, x, 0); }
cg_tensor *cg_sigmoid(cg_graph *g, cg_tensor *x) { return unary(g, CGI_OP_SIGMOID, x, 0); }
cg_tensor *cg_relu(cg_graph *g, cg_tensor *x) { return unary(g, CGI_OP_RELU, x, 0); }
cg_tensor *cg_gelu(cg_graph *g, cg_tensor *x) { return unary(g, CGI_OP_GELU, x, 0); }
cg_tensor *cg_gelu_tanh(cg_graph *g, cg_tensor *x) { return unary(g, CGI_OP_GELU_TANH, x, 0); }
cg_tensor *cg_silu(cg_graph *g, cg_tensor *x) { return unary(g, CGI_OP_SILU, x, 0); }
cg_tensor *cg_softplus(cg_graph *g, cg_tensor *x, double beta) {
    if (x && !(beta > 0)) { /* a NULL x keeps the first failure's message */
        cgi_fail(CG_ERR_ARG, "[softplus] beta = %g must be > 0", beta);
        return NULL;
    }
    return unary(g, CGI_OP_SOFTPLUS, x, beta);
}
cg_tensor *cg_elu(cg_graph *g, cg_tensor *x, double alpha) { return unary(g, CGI_OP_ELU, x, alpha); }
cg_tensor *cg_leaky_relu(cg_graph *g, cg_tensor *x, double slope) { return unary(g, CGI_OP_LEAKY_RELU, x, slope); }
cg_tensor *cg_abs(cg_graph *g, cg_tensor *x) { return unary(g, CGI_OP_ABS, x, 0); }
cg_tensor *cg_clamp(cg_graph *g, cg_tensor *x, double lo, double hi) {
    if (x && (isnan(lo) || isnan(hi) || lo > hi)) {
        cgi_fail(CG_ERR_ARG, "[clamp] x%s: bounds [%g, %g] must be ordered numbers (+-inf for no bound)",
                 cgi_shp(x), lo, hi);
        return NULL;
    }
    return unary2(g, CGI_OP_CLAMP, x, lo, hi);
}

/* ---- swiglu: silu(gate) * up in one pass, the gate of LLaMA's feed-forward; the two halves are
 * often views of one packed projection, read in place through their strides ---- */

cg_tensor *cg_swiglu(cg_graph *g, cg_tensor *gate, cg_tensor *up) {
    cg_tensor *in[2] = {gate, up};
    if (!cgi_inputs_ok(g, "swiglu", 2, in)) return NULL;
    if (!cgi_expect_real("swiglu", gate, "gate") || !cgi_expect_real("swiglu", up, "up")) return NULL;
    bool same = gate->ndim == up->ndim;
    for (int d = 0; same && d < gate->ndim; d++) same = gate->shape[d] == up->shape[d];
    if (!same) {
        cgi_fail(CG_ERR_SHAPE, "[swiglu] gate%s and up%s must have the same shape", cgi_shp(gate), cgi_shp(up));
        return NULL;
    }
    return cgi_node(g, CGI_OP_SWIGLU, CG_REAL, gate->ndim, gate->shape, 2, in);
}

/* SwiGLU's value read only by linears in a bf16 graph (t->lp_value, ops/bf16.c; all three
 * contiguous): the float products rounded to bf16 as they are made, the bits the linear's own
 * conversion gave, without the float value or its pass. Backward reads gate and up only. */
static cg_status lp_swiglu_fwd(cg_tensor *t) {
    const int64_t n = cgi_numel(t->ndim, t->shape);
    cgi_bf16 *Y = t->data;
#pragma omp parallel for schedule(static) if (n > CGI_PAR_MIN) num_threads(cgi_nthreads())
    for (int64_t i0 = 0; i0 < n; i0 += LP_BLK) {
        const int64_t len = n - i0 < LP_BLK ? n - i0 : LP_BLK;
        cg_real y[LP_BLK], gw[LP_BLK], uw[LP_BLK];
        const cg_real *G = lp_operand_block(t->src[0], i0, len, gw), *U = lp_operand_block(t->src[1], i0, len, uw);
        for (int64_t j = 0; j < len; j++) y[j] = G[j] * fast_sigmoid(G[j]) * U[j];
        cgi_lp_round(Y + i0, y, len, 1);
    }
    return CG_OK;
}

/* A swiglu pass over chunks of its iterator, for cgi_par_ranges: 0 forward, 1 the gate's gradient,
 * 2 up's; a gradient is assigned by its first writer, else added. */
typedef struct {
    cgi_iter it;
    cg_real *dst;
    const cg_real *gy, *g, *u;
    int part;
    bool assign;
} swiglu_args;

#define SWIGLU_DGATE(A, B, C) ((A) * (C) * fast_sigmoid(B) * (1 + (B) * (1 - fast_sigmoid(B)))) /* dy * up * silu'(gate) */
#define SWIGLU_DUP(A, B) ((A) * (B) * fast_sigmoid(B))                                         /* dy * silu(gate) */

static void swiglu_chunks(int64_t c0, int64_t c1, void *ctx) {
    const swiglu_args *k = ctx;
    const cg_real *G_ = k->g, *U_ = k->u, *gy = k->gy;
    if (k->part == 0) CGI_EW_CHUNKS(k->it, c0, c1, k->dst, G_, U_, U_, =, A * fast_sigmoid(A) * B);
    else if (k->part == 1 && k->assign) CGI_EW_CHUNKS(k->it, c0, c1, k->dst, gy, G_, U_, =, SWIGLU_DGATE(A, B, C));
    else if (k->part == 1) CGI_EW_CHUNKS(k->it, c0, c1, k->dst, gy, G_, U_, +=, SWIGLU_DGATE(A, B, C));
    else if (k->assign) CGI_EW_CHUNKS(k->it, c0, c1, k->dst, gy, G_, G_, =, SWIGLU_DUP(A, B));
    else CGI_EW_CHUNKS(k->it, c0, c1, k->dst, gy, G_, G_, +=, SWIGLU_DUP(A, B));
}

static void swiglu_pass(swiglu_args *k) {
    cgi_par_ranges(k->it.rows * cgi_chunks(k->it.inner), k->it.rows * k->it.inner, swiglu_chunks, k);
}

cg_status cgi_fwd_swiglu(cg_tensor *t) {
    cg_tensor *ga = t->src[0], *up = t->src[1];
    if (t->lp_value) return lp_swiglu_fwd(t);
    swiglu_args k = {.dst = t->data, .g = ga->data, .u = up->data, .part = 0};
    iter4(&k.it, t, t->stride, ga->stride, up->stride, up->stride);
    swiglu_pass(&k);
    return CG_OK;
}

/* Both gradients of a contiguous swiglu in one pass over [lo, hi): reads dy, gate and up once and
 * takes each sigmoid once, where two passes read dy and gate twice (llama-tiny's swiglu backward,
 * one thread: 9.4 -> 6.3 ms of CPU time a step). The products are the two-pass expressions term for
 * term, so the bits match. */
typedef struct {
    cg_real *dg, *du;
    const cg_real *gy, *g, *u;
    bool assign_g, assign_u;
} swiglu_both_args;

static inline void swiglu_both_range(const swiglu_both_args *k, int64_t lo, int64_t hi, bool ag, bool au) {
    cg_real *restrict dg = k->dg, *restrict du = k->du;
    const cg_real *restrict gy = k->gy, *restrict g = k->g, *restrict u = k->u;
    for (int64_t j = lo; j < hi; j++) {
        const cg_real a = gy[j], b = g[j], s = fast_sigmoid(b);
        const cg_real dgate = a * u[j] * s * (1 + b * (1 - s)), dup = a * b * s;
        if (ag) dg[j] = dgate;
        else dg[j] += dgate;
        if (au) du[j] = dup;
        else du[j] += dup;
    }
}

static void swiglu_both(int64_t lo, int64_t hi, void *ctx) {
    const swiglu_both_args *k = ctx;
    if (k->assign_g && k->assign_u) swiglu_both_range(k, lo, hi, true, true);
    else if (k->assign_g) swiglu_both_range(k, lo, hi, true, false);
    else if (k->assign_u) swiglu_both_range(k, lo, hi, false, true);
    else swiglu_both_range(k, lo, hi, false, false);
}

/* Both gradients of a SwiGLU whose gate or up is stored in bf16 (lp_operand_block), over
 * [lo, hi) in blocks: the gradients are swiglu_both_range's at the rounded operands. */
typedef struct {
    swiglu_both_args b;
    const cg_tensor *ga, *up;
} lp_swiglu_args;

static void lp_swiglu_both(int64_t lo, int64_t hi, void *ctx) {
    const lp_swiglu_args *k = ctx;
    for (int64_t i0 = lo; i0 < hi; i0 += LP_BLK) {
        const int64_t len = hi - i0 < LP_BLK ? hi - i0 : LP_BLK;
        cg_real gw[LP_BLK], uw[LP_BLK], unused_g[LP_BLK], unused_u[LP_BLK]; /* a gradient not asked for */
        swiglu_both_args b = {.gy = k->b.gy + i0, .g = lp_operand_block(k->ga, i0, len, gw),
                              .u = lp_operand_block(k->up, i0, len, uw), .dg = k->b.dg ? k->b.dg + i0 : unused_g,
                              .du = k->b.du ? k->b.du + i0 : unused_u, .assign_g = k->b.assign_g || !k->b.dg,
                              .assign_u = k->b.assign_u || !k->b.du};
        swiglu_both(0, len, &b);
    }
}

/* Each input's gradient is assigned by its first writer (cgi_grad_begin; the graph does not zero it
 * first: LLaMA's gate and up are linear outputs, 2 x [T, intermediate] zeroed and read back per
 * block before), else added; aliased halves of one tensor add into storage zeroed once. */
void cgi_bwd_swiglu(cg_tensor *t) {
    cg_tensor *ga = t->src[0], *up = t->src[1];
    if (ga->root->lp_value || up->root->lp_value) { /* then gate and up are apart, all contiguous */
        lp_swiglu_args k = {.b = {.dg = ga->requires_grad ? ga->grad : NULL, .du = up->requires_grad ? up->grad : NULL,
                                  .gy = t->grad},
                            .ga = ga, .up = up};
        k.b.assign_g = ga->requires_grad && cgi_grad_begin(ga);
        k.b.assign_u = up->requires_grad && cgi_grad_begin(up);
        const int64_t n = cgi_numel(t->ndim, t->shape);
        cgi_par_ranges(n, n, lp_swiglu_both, &k);
        return;
    }
    const bool alias = ga->requires_grad && up->requires_grad && cgi_grads_alias(ga, up);
    if (ga->requires_grad && up->requires_grad && !alias && cgi_contiguous(ga) && cgi_contiguous(up) &&
        cgi_contiguous(t)) {
        const int64_t n = cgi_numel(t->ndim, t->shape);
        swiglu_both_args b = {.dg = ga->grad, .du = up->grad, .gy = t->grad, .g = ga->data, .u = up->data};
        b.assign_g = cgi_grad_begin(ga);
        b.assign_u = cgi_grad_begin(up);
        cgi_par_ranges(n, n, swiglu_both, &b);
        return;
    }
    swiglu_args k = {.gy = t->grad, .g = ga->data, .u = up->data};
    if (ga->requires_grad) {
        iter4(&k.it, t, ga->stride, t->stride, ga->stride, up->stride);
        k.dst = ga->grad, k.part = 1;
        k.assign = alias ? (cgi_grad_prepare(ga), false) : cgi_grad_begin(ga);
        swiglu_pass(&k);
    }
    if (up->requires_grad) {
        iter4(&k.it, t, up->stride, t->stride, ga->stride, ga->stride);
        k.dst = up->grad, k.part = 2;
        k.assign = alias ? (cgi_grad_prepare(up), false) : cgi_grad_begin(up);
        swiglu_pass(&k);
    }
}

/* ---- where: cond (int32) ? a : b, all three broadcast together ---- */

cg_tensor *cg_where(cg_graph *g, cg_tensor *cond, cg_tensor *a, cg_tensor *b) {
    cg_tensor *in[3] = {cond, a, b};
    if (!cgi_inputs_ok(g, "where", 3, in)) return NULL;
    if (!cgi_expect_real("where", a, "a") || !cgi_expect_real("where", b, "b")) return NULL;
    if (cond->dtype != CG_INT32) {
        cgi_fail(CG_ERR_ARG, "[where] cond%s must be int32", cgi_shp(cond));
        return NULL;
    }
    cg_tensor ab = {.ndim = 0}, abc = {.ndim = 0};
    if (!cgi_broadcast_shape(a, b, &ab.ndim, ab.shape) || !cgi_broadcast_shape(cond, &ab, &abc.ndim, abc.shape)) {
        cgi_fail(CG_ERR_SHAPE, "[where] cond%s, a%s and b%s do not broadcast", cgi_shp(cond), cgi_shp(a), cgi_shp(b));
        return NULL;
    }
    cg_tensor *t = cgi_node(g, CGI_OP_WHERE, CG_REAL, abc.ndim, abc.shape, 3, in);
    if (t && ((a->requires_grad && broadcast_in(a, t)) || (b->requires_grad && broadcast_in(b, t))))
        t->aux_bytes = (size_t)cgi_numel(abc.ndim, abc.shape) * sizeof(cg_real);
    return t;
}

/* part 0: dst = cond ? a : b; part 1: dst (+)= cond ? src : 0; part 2: dst (+)= cond ? 0 : src.
 * Operands in t's shape: dst (sd), cond, then x (sx) and y (sy). */
static void where_loop(cg_tensor *t, int part, cg_real *dst, const int64_t *sd, const cg_real *x, const int64_t *sx,
                       const cg_real *y, const int64_t *sy, bool accumulate) {
    cg_tensor *cond = t->src[0];
    int64_t sc[CG_MAX_DIMS];
    cgi_broadcast_strides(cond, t->ndim, t->shape, sc);
    const int64_t *st[4] = {sd, sc, sx, sy};
    cgi_iter it;
    cgi_iter_init(&it, t->ndim, t->shape, 4, st);
    const int32_t *C = cond->data;
    const int64_t s0 = it.st[0][it.ndim - 1], s1 = it.st[1][it.ndim - 1], s2 = it.st[2][it.ndim - 1],
                  s3 = it.st[3][it.ndim - 1], nch = cgi_chunks(it.inner);
#pragma omp parallel for schedule(static) if (it.rows * it.inner > CGI_PAR_MIN) num_threads(cgi_nthreads())
    for (int64_t c = 0; c < it.rows * nch; c++) {
        const int64_t r = c / nch, lo = (c % nch) * CGI_CHUNK, hi = lo + CGI_CHUNK < it.inner ? lo + CGI_CHUNK : it.inner;
        int64_t off[4];
        cgi_iter_row(&it, r, off);
        for (int64_t j = lo; j < hi; j++) {
            const bool pick = C[off[1] + j * s1] != 0;
            const cg_real v = part == 0 ? (pick ? x[off[2] + j * s2] : y[off[3] + j * s3])
                                        : (pick == (part == 1) ? x[off[2] + j * s2] : 0);
            cg_real *d = dst + off[0] + j * s0;
            if (accumulate) *d += v;
            else *d = v;
        }
    }
}

cg_status cgi_fwd_where(cg_tensor *t) {
    cg_tensor *a = t->src[1], *b = t->src[2];
    int64_t sa[CG_MAX_DIMS], sb[CG_MAX_DIMS];
    cgi_broadcast_strides(a, t->ndim, t->shape, sa);
    cgi_broadcast_strides(b, t->ndim, t->shape, sb);
    where_loop(t, 0, t->data, t->stride, a->data, sa, b->data, sb, false);
    return CG_OK;
}

void cgi_bwd_where(cg_tensor *t) {
    for (int k = 1; k <= 2; k++) {
        cg_tensor *x = t->src[k];
        if (!x->requires_grad) continue;
        if (!broadcast_in(x, t)) {
            int64_t sx[CG_MAX_DIMS];
            cgi_broadcast_strides(x, t->ndim, t->shape, sx);
            where_loop(t, k, x->grad, sx, t->grad, t->stride, t->grad, t->stride, true);
        } else {
            where_loop(t, k, t->aux, t->stride, t->grad, t->stride, t->grad, t->stride, false);
            cgi_unbroadcast_add(x, t->aux, t->ndim, t->shape, 1.0);
        }
    }
}

/* ---- masked_fill: mask is int32 and broadcasts to x ---- */

cg_tensor *cg_masked_fill(cg_graph *g, cg_tensor *x, cg_tensor *mask, double value) {
    cg_tensor *in[2] = {x, mask};
    if (!cgi_inputs_ok(g, "masked_fill", 2, in) || !cgi_expect_real("masked_fill", x, "x")) return NULL;
    if (mask->dtype != CG_INT32) {
        cgi_fail(CG_ERR_ARG, "[masked_fill] mask%s must be int32", cgi_shp(mask));
        return NULL;
    }
    int nd;
    int64_t shape[CG_MAX_DIMS];
    if (!cgi_broadcast_shape(x, mask, &nd, shape) || nd != x->ndim ||
        cgi_numel(nd, shape) != cgi_numel(x->ndim, x->shape)) {
        cgi_fail(CG_ERR_SHAPE, "[masked_fill] mask%s does not broadcast to x%s", cgi_shp(mask), cgi_shp(x));
        return NULL;
    }
    cg_tensor *t = cgi_node(g, CGI_OP_MASKED_FILL, CG_REAL, x->ndim, x->shape, 2, in);
    if (t) t->farg[0] = value;
    return t;
}

static void masked_loop(cg_tensor *t, cg_real *dst, const int64_t *sd, const cg_real *src,
                        const int64_t *ss, bool accumulate) {
    cg_tensor *mask = t->src[1];
    int64_t sm[CG_MAX_DIMS];
    cgi_broadcast_strides(mask, t->ndim, t->shape, sm);
    const int64_t *st[3] = {sd, ss, sm};
    cgi_iter it;
    cgi_iter_init(&it, t->ndim, t->shape, 3, st);
    const int32_t *m = mask->data;
    const cg_real v = (cg_real)t->farg[0];
    const int64_t s0 = it.st[0][it.ndim - 1], s1 = it.st[1][it.ndim - 1], s2 = it.st[2][it.ndim - 1];
    const int64_t nch = cgi_chunks(it.inner);
#pragma omp parallel for schedule(static) if (it.rows * it.inner > CGI_PAR_MIN) num_threads(cgi_nthreads())
    for (int64_t c = 0; c < it.rows * nch; c++) {
        const int64_t r = c / nch, lo = (c % nch) * CGI_CHUNK, hi = lo + CGI_CHUNK < it.inner ? lo + CGI_CHUNK : it.inner;
        int64_t off[3];
        cgi_iter_row(&it, r, off);
        for (int64_t j = lo; j < hi; j++) {
            bool hit = m[off[2] + j * s2] != 0;
            cg_real *d = dst + off[0] + j * s0;
            cg_real s = src[off[1] + j * s1];
            if (accumulate) *d += hit ? 0 : s;
            else *d = hit ? v : s;
        }
    }
}

cg_status cgi_fwd_masked_fill(cg_tensor *t) {
    cg_tensor *x = t->src[0];
    masked_loop(t, t->data, t->stride, x->data, x->stride, false);
    return CG_OK;
}

void cgi_bwd_masked_fill(cg_tensor *t) {
    cg_tensor *x = t->src[0];
    if (x->requires_grad) masked_loop(t, x->grad, x->stride, t->grad, t->stride, true);
}

/* ---- dropout: the keep mask is a hash of (seed, node, step, index), so backward recomputes it
 * instead of storing it, and any thread count draws the same mask ---- */

cg_tensor *cg_dropout(cg_graph *g, cg_tensor *x, double p) {
    if (!cgi_inputs_ok(g, "dropout", 1, &x) || !cgi_expect_real("dropout", x, "x")) return NULL;
    if (!(p >= 0 && p < 1)) {
        cgi_fail(CG_ERR_ARG, "[dropout] p = %g must be in [0, 1)", p);
        return NULL;
    }
    if (g->mode == CG_EVAL || p == 0) return x;
    cg_tensor *t = cgi_node(g, CGI_OP_DROPOUT, CG_REAL, x->ndim, x->shape, 1, &x);
    if (t) t->farg[0] = p;
    return t;
}

static void dropout_loop(cg_tensor *t, cg_real *dst, const int64_t *sd, const cg_real *src,
                         const int64_t *ss, bool accumulate) {
    const int64_t *st[3] = {sd, ss, t->stride};
    cgi_iter it;
    cgi_iter_init(&it, t->ndim, t->shape, 3, st);
    const uint64_t key = cgi_dropout_key(t->graph->seed, t->id, (uint64_t)t->iarg[0]);
    const uint64_t threshold = cgi_dropout_threshold(t->farg[0]);
    const cg_real keep_scale = (cg_real)(1.0 / (1.0 - t->farg[0]));
    const int64_t s0 = it.st[0][it.ndim - 1], s1 = it.st[1][it.ndim - 1], s2 = it.st[2][it.ndim - 1];
    const int64_t nch = cgi_chunks(it.inner);
#pragma omp parallel for schedule(static) if (it.rows * it.inner > CGI_PAR_MIN) num_threads(cgi_nthreads())
    for (int64_t c = 0; c < it.rows * nch; c++) {
        const int64_t r = c / nch, lo = (c % nch) * CGI_CHUNK, hi = lo + CGI_CHUNK < it.inner ? lo + CGI_CHUNK : it.inner;
        int64_t off[3];
        cgi_iter_row(&it, r, off);
        for (int64_t j = lo; j < hi; j++) {
            uint64_t index = (uint64_t)(off[2] + j * s2); /* position in the contiguous output */
            bool keep = cgi_dropout_keeps(key, index, threshold);
            cg_real v = keep ? src[off[1] + j * s1] * keep_scale : 0;
            if (accumulate) dst[off[0] + j * s0] += v;
            else dst[off[0] + j * s0] = v;
        }
    }
}

cg_status cgi_fwd_dropout(cg_tensor *t) {
    t->iarg[0] = (int64_t)t->graph->step;
    cg_tensor *x = t->src[0];
    dropout_loop(t, t->data, t->stride, x->data, x->stride, false);
    return CG_OK;
}

void cgi_bwd_dropout(cg_tensor *t) {
    cg_tensor *x = t->src[0];
    if (x->requires_grad) dropout_loop(t, x->grad, x->stride, t->grad, t->stride, true);
}

/* ---- cast: int32 -> real ---- */

cg_tensor *cg_cast(cg_graph *g, cg_tensor *x) {
    if (!cgi_inputs_ok(g, "cast", 1, &x)) return NULL;
    if (x->dtype != CG_INT32) {
        cgi_fail(CG_ERR_ARG, "[cast] x%s must be int32", cgi_shp(x));
        return NULL;
    }
    return cgi_node(g, CGI_OP_CAST, CG_REAL, x->ndim, x->shape, 1, &x);
}

cg_status cgi_fwd_cast(cg_tensor *t) {
    const cg_tensor *x = t->src[0];
    const int32_t *X = x->data;
    cg_real *Y = t->data;
    const int64_t n = cgi_numel(t->ndim, t->shape);
    for (int64_t i = 0; i < n; i++) Y[i] = (cg_real)X[cgi_elem_offset(x, i)];
    return CG_OK;
}

void cgi_bwd_cast(cg_tensor *t) { (void)t; }
