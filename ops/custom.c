/* SPDX-License-Identifier: MIT */
/* Custom ops (ops/custom.h): one table line, CUSTOM, whose node carries the user's description.
 * The planner asks cgi_bwd_reads / cgi_bwd_reads_out (graph/internal.h) instead of the table for
 * what backward reads, and errors, profiles and dot files ask cgi_node_name for the name. A
 * forward-only op with a composite keeps a private graph of that composite, run in backward on the
 * node's inputs with the node's output gradient as the cotangent: its inputs' gradients are the
 * op's. That graph is planned once, so backward allocates nothing after the first step. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "graph/internal.h"
#include "ops/custom.h"
#include "ops/ops.h"

/* The composite's graph: parameters standing for the real inputs, int inputs copied as they are,
 * the cotangent, and sum(composite * cotangent) as its loss. */
typedef struct {
    cg_graph *g;
    cg_params *ps;
    cg_tensor *in[CG_CUSTOM_MAX_INPUTS];
    cg_tensor *cot, *loss;
} vjp_graph;

typedef struct {
    const cg_custom_op *op;
    void *params;
    size_t saved_bytes;
    vjp_graph *vjp;
} custom_node;

struct cg_custom_ctx {
    cg_tensor *t;
    custom_node *n;
    bool backward;
};

static custom_node *node_of(const cg_tensor *t) { return (custom_node *)t->params; }

unsigned cgi_custom_reads(const cg_tensor *t) {
    const custom_node *n = node_of(t);
    return n->vjp ? (1u << n->op->n_inputs) - 1 : n->op->backward_reads; /* the composite reads every input */
}
bool cgi_custom_reads_out(const cg_tensor *t) { return !node_of(t)->vjp && node_of(t)->op->backward_reads_output; }
const char *cgi_custom_name(const cg_tensor *t) { return node_of(t)->op->name; }
bool cgi_custom_differentiable(const cg_tensor *t) { return node_of(t)->op->backward || node_of(t)->vjp; }

static cg_custom_tensor view_of(const cg_tensor *t, void *data) {
    cg_custom_tensor v = {data, t->dtype, t->ndim, {0}, {0}};
    memcpy(v.shape, t->shape, sizeof v.shape);
    memcpy(v.stride, t->stride, sizeof v.stride);
    return v;
}

cg_custom_tensor cg_custom_input(const cg_custom_ctx *c, int k) {
    if (!c || k < 0 || k >= c->t->nsrc) return (cg_custom_tensor){0};
    return view_of(c->t->src[k], c->t->src[k]->data);
}
cg_custom_tensor cg_custom_output(const cg_custom_ctx *c) { return c ? view_of(c->t, c->t->data) : (cg_custom_tensor){0}; }
cg_custom_tensor cg_custom_input_grad(const cg_custom_ctx *c, int k) {
    if (!c || !c->backward || k < 0 || k >= c->t->nsrc) return (cg_custom_tensor){0};
    const cg_tensor *s = c->t->src[k];
    return view_of(s, s->requires_grad && s->dtype == CG_REAL ? s->grad : NULL);
}
cg_custom_tensor cg_custom_output_grad(const cg_custom_ctx *c) {
    return c && c->backward ? view_of(c->t, c->t->grad) : (cg_custom_tensor){0};
}
void *cg_custom_saved(const cg_custom_ctx *c) { return c && c->n->saved_bytes ? c->t->aux : NULL; }
void *cg_custom_scratch(const cg_custom_ctx *c) {
    if (!c) return NULL;
    if (c->backward) return c->t->bwd_aux_bytes ? c->t->bwd_aux : NULL;
    return c->t->aux_bytes > c->n->saved_bytes ? (char *)c->t->aux + c->n->saved_bytes : NULL;
}
const void *cg_custom_params(const cg_custom_ctx *c) { return c ? c->n->params : NULL; }
void *cg_custom_user(const cg_custom_ctx *c) { return c ? c->n->op->user : NULL; }
const char *cg_custom_name(const cg_custom_ctx *c) { return c ? c->n->op->name : NULL; }

/* Inside a team span (a small model's whole training step runs in one, graph/threads.c) the
 * calling thread runs the ops and the helpers, already awake, share only what is cut into team
 * pieces; a plain loop would leave them idle. Pieces there are even cuts of at least grain, at
 * most TEAM_RANGES, claimed by whichever thread is free. */
enum { TEAM_RANGES = 8 };

void cg_parallel_for(int64_t n, int64_t grain, void (*body)(int64_t lo, int64_t hi, void *ctx), void *ctx) {
    if (n <= 0 || !body) return;
    if (grain < 1) grain = 1;
    const int64_t most = (n + grain - 1) / grain;
    if (cgi_team_on() && most > 1 && cgi_team_sharing()) {
        cgi_team_ranges(n, most < TEAM_RANGES ? (int)most : TEAM_RANGES, body, ctx);
        return;
    }
    const int threads = omp_in_parallel() ? 1 : (int)(cgi_nthreads() < most ? cgi_nthreads() : most);
    if (threads <= 1) {
        body(0, n, ctx);
        return;
    }
#pragma omp parallel num_threads(threads)
    { /* one contiguous piece a thread, in order: a kernel's result cannot depend on scheduling */
        const int64_t k = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t lo = n * k / nt, hi = n * (k + 1) / nt;
        if (hi > lo) body(lo, hi, ctx);
    }
}

/* A kernel's failure as the run's error: "[name] forward: the kernel's message". */
static cg_status kernel_failed(const custom_node *n, const char *pass, cg_status s) {
    const char *why = cg_last_error();
    return cgi_fail(s, "[%s] %s failed: %s", n->op->name, pass, *why ? why : cg_status_name(s));
}

CGI_KERNEL cg_status cgi_fwd_custom(cg_tensor *t) {
    custom_node *n = node_of(t);
    cg_custom_ctx c = {t, n, false};
    cg_clear_error();
    const cg_status s = n->op->forward(&c);
    return s ? kernel_failed(n, "forward", s) : CG_OK;
}

/* dst (strides ds) op= src (strides ss), both of shape [ndim]shape; add: +=, else =. */
static void strided_copy(cg_real *dst, const int64_t *ds, const cg_real *src, const int64_t *ss, int ndim,
                         const int64_t *shape, bool add) {
    if (ndim == 0) {
        *dst = add ? *dst + *src : *src;
        return;
    }
    for (int64_t i = 0; i < shape[0]; i++)
        strided_copy(dst + i * ds[0], ds + 1, src + i * ss[0], ss + 1, ndim - 1, shape + 1, add);
}

static cg_status run_composite(cg_tensor *t, vjp_graph *v) {
    int64_t contig[CG_MAX_DIMS];
    for (int k = 0; k < t->nsrc; k++) {
        const cg_tensor *s = t->src[k];
        cgi_contig_strides(s->ndim, s->shape, contig);
        if (s->dtype == CG_REAL) strided_copy(cg_data(v->in[k]), contig, s->data, s->stride, s->ndim, s->shape, false);
        else memcpy(cg_idata(v->in[k]), s->data, (size_t)cgi_numel(s->ndim, s->shape) * sizeof(int32_t));
    }
    memcpy(cg_data(v->cot), t->grad, (size_t)cgi_numel(t->ndim, t->shape) * sizeof(cg_real));
    cg_params_zero_grad(v->ps);
    cg_status s = cg_graph_forward(v->g);
    if (!s) s = cg_graph_backward(v->g, v->loss);
    if (s) return s;
    for (int k = 0; k < t->nsrc; k++) {
        const cg_tensor *src = t->src[k];
        if (!src->requires_grad || src->dtype != CG_REAL) continue;
        cgi_contig_strides(src->ndim, src->shape, contig);
        strided_copy(src->grad, src->stride, cg_grad(v->in[k]), contig, src->ndim, src->shape, true);
    }
    return CG_OK;
}

CGI_KERNEL void cgi_bwd_custom(cg_tensor *t) {
    custom_node *n = node_of(t);
    cg_custom_ctx c = {t, n, true};
    cg_clear_error();
    cg_status s = n->vjp ? run_composite(t, n->vjp) : n->op->backward(&c);
    if (s && !t->graph->bwd_status) t->graph->bwd_status = kernel_failed(n, n->vjp ? "backward (composite)" : "backward", s);
}

static void vjp_free(void *p) {
    vjp_graph *v = p;
    cg_graph_free(v->g);
    cg_params_free(v->ps);
    free(v);
}

/* The composite's private graph for node inputs src (see vjp_graph); NULL with a message. */
static vjp_graph *vjp_build(const cg_custom_op *op, cg_tensor *const *src, const void *params, const cg_custom_shape *out) {
    vjp_graph *v = calloc(1, sizeof *v);
    if (!v || !(v->g = cg_graph_new(CG_TRAIN)) || !(v->ps = cg_params_new())) {
        if (v) cg_graph_free(v->g), free(v);
        cgi_fail(CG_ERR_NOMEM, "[%s] out of memory for the composite's graph", op->name);
        return NULL;
    }
    for (int k = 0; k < op->n_inputs; k++) {
        char name[32];
        snprintf(name, sizeof name, "input%d", k);
        v->in[k] = src[k]->dtype == CG_REAL ? cg_params_add(v->ps, name, src[k]->ndim, src[k]->shape)
                                            : cg_input(v->g, name, CG_INT32, src[k]->ndim, src[k]->shape);
    }
    v->cot = cg_input(v->g, "cotangent", CG_REAL, out->ndim, out->shape);
    cg_tensor *y = v->cot ? op->composite(v->g, v->in, params, op->user) : NULL;
    if (y && (y->ndim != out->ndim || memcmp(y->shape, out->shape, sizeof(int64_t) * (size_t)out->ndim) ||
              y->dtype != CG_REAL)) {
        cgi_fail(CG_ERR_SHAPE, "[%s] the composite gives %s, the op %s", op->name, cgi_shp(y), cgi_dims(out->ndim, out->shape));
        y = NULL;
    }
    if (!(v->loss = y ? cg_sum_all(v->g, cg_mul(v->g, y, v->cot)) : NULL)) {
        if (y || !strstr(cg_last_error(), op->name)) {
            char why[1024];
            snprintf(why, sizeof why, "%s", cg_last_error());
            cgi_fail(cg_last_status() ? cg_last_status() : CG_ERR_ARG, "[%s] composite: %s", op->name,
                     *why ? why : "returned NULL");
        }
        vjp_free(v);
        return NULL;
    }
    return v;
}

cg_tensor *cg_custom(cg_graph *g, const cg_custom_op *op, cg_tensor *const *inputs, const void *params,
                     size_t params_bytes) {
    const char *name = op && op->name && *op->name ? op->name : "custom";
    if (!op) {
        cgi_fail(CG_ERR_ARG, "[custom] the op description is NULL");
        return NULL;
    }
    if (!op->shape || !op->forward) {
        cgi_fail(CG_ERR_ARG, "[%s] the %s kernel is NULL", name, op->shape ? "forward" : "shape");
        return NULL;
    }
    if (op->n_inputs < 1 || op->n_inputs > CG_CUSTOM_MAX_INPUTS || !inputs) {
        cgi_fail(CG_ERR_ARG, "[%s] %d inputs%s: 1 to %d", name, op->n_inputs, inputs ? "" : " (array NULL)",
                 CG_CUSTOM_MAX_INPUTS);
        return NULL;
    }
    if (params_bytes && !params) {
        cgi_fail(CG_ERR_ARG, "[%s] params is NULL with %zu bytes", name, params_bytes);
        return NULL;
    }
    if (!cgi_inputs_ok(g, name, op->n_inputs, inputs)) return NULL;
    cg_custom_tensor in[CG_CUSTOM_MAX_INPUTS];
    for (int k = 0; k < op->n_inputs; k++) in[k] = view_of(inputs[k], NULL);
    cg_custom_shape out = {0, {0}, CG_REAL, 0, 0, 0};
    cg_clear_error();
    const cg_status s = op->shape(in, op->n_inputs, params, op->user, &out);
    if (s) {
        const char *why = cg_last_error();
        cgi_fail(s, "[%s] shape rule: %s", name, *why ? why : cg_status_name(s));
        return NULL;
    }
    if (out.ndim < 0 || out.ndim > CG_MAX_DIMS || (out.dtype != CG_REAL && out.dtype != CG_INT32)) {
        cgi_fail(CG_ERR_SHAPE, "[%s] the shape rule gave %d dims of dtype %d: 0 to %d dims, real or int32", name, out.ndim,
                 (int)out.dtype, CG_MAX_DIMS);
        return NULL;
    }
    custom_node *n = cgi_node_params(g, name, sizeof *n);
    void *copy = n && params_bytes ? cgi_node_params(g, name, params_bytes) : NULL;
    if (!n || (params_bytes && !copy)) return NULL;
    if (copy) memcpy(copy, params, params_bytes);
    n->op = op, n->params = copy, n->saved_bytes = out.saved_bytes;
    bool wants_grad = cg_graph_mode(g) == CG_TRAIN && out.dtype == CG_REAL;
    bool any = false;
    for (int k = 0; k < op->n_inputs; k++) any |= inputs[k]->requires_grad;
    if (wants_grad && any && !op->backward && op->composite) {
        if (!(n->vjp = vjp_build(op, inputs, copy, &out))) return NULL;
        if (cgi_graph_own(g, vjp_free, n->vjp)) { /* freed with the graph, or by its reset */
            vjp_free(n->vjp);
            return NULL;
        }
    }
    cg_tensor *t = cgi_node(g, CGI_OP_CUSTOM, out.dtype, out.ndim, out.shape, op->n_inputs, inputs);
    if (!t) return NULL;
    if (out.dtype != CG_REAL) t->requires_grad = false; /* ids and masks carry no gradient */
    t->params = n;
    /* forward's scratch rides with the saved space: the plan has one forward buffer per node */
    t->aux_bytes = out.saved_bytes + out.scratch_bytes;
    t->bwd_aux_bytes = out.bwd_scratch_bytes;
    return t;
}
