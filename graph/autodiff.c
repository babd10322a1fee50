/* SPDX-License-Identifier: MIT */
/* Reverse mode: the backward sweep over a built graph, and the bookkeeping of who writes a gradient
 * first (assigns it) and who adds into it, including which views of one buffer can alias. */
#include "graph/internal.h"

#include <omp.h>

void cgi_param_settle(cg_tensor *p) {
    if (!p->grad_stale) return;
    cgi_zero(p->grad, (size_t)cgi_numel(p->ndim, p->shape) * sizeof(cg_real));
    p->grad_stale = false;
}

/* Gradients share memory with other buffers, so each is zeroed just before its first write; a
 * parameter's, only when cg_params_zero_grad left it stale (later passes add to it). */
static void zero_once(cg_tensor *t) {
    cg_tensor *r = t->root;
    if (r->op == CGI_OP_PARAM) {
        cgi_param_settle(r);
        return;
    }
    if (r->grad_epoch == r->graph->epoch || r->grad_in_value) return;
    cgi_zero(r->grad, (size_t)cgi_numel(r->ndim, r->shape) * sizeof(cg_real));
    r->grad_epoch = r->graph->epoch;
}

/* No element of x reached twice: dims by increasing stride, each stride past the span of those before. */
static bool one_to_one(const cg_tensor *x) {
    int64_t span = 1; /* elements the smaller-stride dims reach: the next stride must be at least this */
    bool used[CG_MAX_DIMS] = {false};
    for (int n = 0; n < x->ndim; n++) {
        int d = -1;
        for (int e = 0; e < x->ndim; e++)
            if (!used[e] && x->shape[e] > 1 && (d < 0 || x->stride[e] < x->stride[d])) d = e;
        if (d < 0) break;
        used[d] = true;
        if (x->stride[d] < span) return false;
        span = x->stride[d] * x->shape[d];
    }
    return true;
}

/* Whether view x holds every element of its root exactly once (the root itself, or a transpose:
 * GPT-2's Conv1D weights are read as one), so a rule writing all of x writes all of the root: as
 * many elements as the root, none reached twice (a view lies inside its root's storage). */
static bool covers_root(const cg_tensor *x) {
    return cgi_numel(x->ndim, x->shape) == cgi_numel(x->root->ndim, x->root->shape) && one_to_one(x);
}

bool cgi_grad_begin(cg_tensor *x) {
    cg_tensor *r = x->root;
    if (r->op == CGI_OP_PARAM && r->grad_stale && covers_root(x)) { /* its first writer since cg_params_zero_grad */
        r->grad_stale = false;
        return true;
    }
    if (x->root == x && x->op != CGI_OP_PARAM && !x->grad_in_value && x->grad_epoch != x->graph->epoch) {
        x->grad_epoch = x->graph->epoch;
        return true;
    }
    zero_once(x);
    return false;
}

/* cgi_grad_begin, and also true for a view holding all of a node's gradient once (a reshape or a
 * transpose of it) that nothing has written this pass: the out-projection reads attention's output
 * through a reshape, and assigning there saves zeroing it (a parallel region, a wake of the second
 * thread). Only for a rule that writes x's gradient before any other input's that may alias it
 * (linear's dX): another view of the same node holds other inputs' terms, which an assignment
 * after them would overwrite. */
bool cgi_grad_begin_whole(cg_tensor *x) {
    cg_tensor *r = x->root;
    if (x != r && r->op != CGI_OP_PARAM && !r->grad_in_value && r->grad_epoch != r->graph->epoch && covers_root(x)) {
        r->grad_epoch = r->graph->epoch;
        return true;
    }
    return cgi_grad_begin(x);
}

bool cgi_grad_begin_views(cg_tensor *const *v, int n) {
    cg_tensor *r = v[0]->root;
    if (r->op == CGI_OP_PARAM || r->grad_in_value || r->grad_epoch == r->graph->epoch) return false;
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        if (v[i]->root != r || !one_to_one(v[i])) return false;
        for (int j = 0; j < i; j++)
            if (cgi_grads_alias(v[i], v[j])) return false;
        total += cgi_numel(v[i]->ndim, v[i]->shape);
    }
    if (total != cgi_numel(r->ndim, r->shape)) return false; /* within the root, disjoint: they tile it */
    r->grad_epoch = r->graph->epoch;
    return true;
}

void cgi_grad_prepare(cg_tensor *x) {
    if (cgi_grad_begin(x)) cgi_zero(x->grad, (size_t)cgi_numel(x->ndim, x->shape) * sizeof(cg_real));
}

bool cgi_grad_claim(cg_tensor *x, bool can_assign) {
    if (can_assign) return cgi_grad_begin(x);
    cgi_grad_prepare(x);
    return false;
}

/* ---- gradient aliasing ---- */

/* Whether delta = sum_d k_d * st[d] for integers lo[d] <= k_d <= hi[d], strides in decreasing order
 * and positive; reach_lo/hi[d] bound what dims d.. can still add. Tries the few k_d that leave a
 * remainder the smaller strides can reach; *budget caps the search (out of budget: true). */
static bool offset_reachable(int64_t delta, int d, int nd, const int64_t *st, const int64_t *lo, const int64_t *hi,
                             const int64_t *reach_lo, const int64_t *reach_hi, int *budget) {
    if (d == nd) return delta == 0;
    if (--*budget < 0) return true;
    const int64_t rlo = d + 1 < nd ? reach_lo[d + 1] : 0, rhi = d + 1 < nd ? reach_hi[d + 1] : 0;
    /* delta - k st in [rlo, rhi]  <=>  k in [ceil((delta - rhi) / st), floor((delta - rlo) / st)] */
    int64_t a = delta - rhi, b = delta - rlo;
    int64_t kmin = a >= 0 ? (a + st[d] - 1) / st[d] : -((-a) / st[d]);
    int64_t kmax = b >= 0 ? b / st[d] : -((-b + st[d] - 1) / st[d]);
    if (kmin < lo[d]) kmin = lo[d];
    if (kmax > hi[d]) kmax = hi[d];
    for (int64_t k = kmin; k <= kmax; k++)
        if (offset_reachable(delta - k * st[d], d + 1, nd, st, lo, hi, reach_lo, reach_hi, budget)) return true;
    return false;
}

/* Lowest and highest element of t's root storage that t covers (strides are never negative). */
static void extent(const cg_tensor *t, int64_t *lo, int64_t *hi) {
    *lo = *hi = t->offset;
    for (int d = 0; d < t->ndim; d++) *hi += (t->shape[d] - 1) * t->stride[d];
}

bool cgi_same_view(const cg_tensor *a, const cg_tensor *b) {
    if (a->root != b->root || a->offset != b->offset || a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d] || (a->shape[d] > 1 && a->stride[d] != b->stride[d])) return false;
    return true;
}

bool cgi_grads_alias(const cg_tensor *a, const cg_tensor *b) {
    if (!a || !b || !a->requires_grad || !b->requires_grad || a->root != b->root) return false;
    if (cgi_numel(a->ndim, a->shape) == 0 || cgi_numel(b->ndim, b->shape) == 0) return false;
    int64_t alo, ahi, blo, bhi;
    extent(a, &alo, &ahi);
    extent(b, &blo, &bhi);
    if (ahi < blo || bhi < alo) return false;
    /* Overlapping spans may still interleave without touching (q, k and v heads cut from one
     * projection): with the same strides, an element is shared iff b's offset minus a's is a sum of
     * strides times index differences within both shapes. Other layouts: assume they touch. */
    if (a->ndim != b->ndim) return true;
    int nd = 0, order[CG_MAX_DIMS];
    for (int d = 0; d < a->ndim; d++) {
        if (a->shape[d] == 1 && b->shape[d] == 1) continue;
        if (a->stride[d] != b->stride[d] || a->stride[d] <= 0) return true;
        order[nd++] = d;
    }
    for (int i = 1; i < nd; i++) /* decreasing stride */
        for (int j = i; j > 0 && a->stride[order[j]] > a->stride[order[j - 1]]; j--) {
            int tmp = order[j];
            order[j] = order[j - 1], order[j - 1] = tmp;
        }
    int64_t st[CG_MAX_DIMS], lo[CG_MAX_DIMS], hi[CG_MAX_DIMS], rlo[CG_MAX_DIMS], rhi[CG_MAX_DIMS];
    for (int i = 0; i < nd; i++) { /* a's index minus b's: from -(b's size - 1) to a's size - 1 */
        st[i] = a->stride[order[i]];
        lo[i] = -(b->shape[order[i]] - 1);
        hi[i] = a->shape[order[i]] - 1;
    }
    for (int i = nd - 1; i >= 0; i--) {
        rlo[i] = lo[i] * st[i] + (i + 1 < nd ? rlo[i + 1] : 0);
        rhi[i] = hi[i] * st[i] + (i + 1 < nd ? rhi[i + 1] : 0);
    }
    int budget = 4096;
    return offset_reachable(b->offset - a->offset, 0, nd, st, lo, hi, rlo, rhi, &budget);
}

/* Remakes the values node i's backward reads that forward let die (cgi_plan's regen): each
 * before its first backward reader, swapped into data until the pass ends. */
static void regen_for(cg_tensor *t, int i) {
    for (int k = -1; k < t->nsrc; k++) {
        cg_tensor *r = k < 0 ? t : t->src[k]->root;
        if (!r->regen || r->regen_live || (k < 0 ? !cgi_bwd_reads_out(t) : i > r->regen_at)) continue;
        void *p = r->data;
        r->data = r->alt_data, r->alt_data = p;
        r->regen_live = true;
        const double t0 = cgi_profiling() ? cgi_profile_clock() : 0;
        cgi_regen(r);
        if (t0 > 0) { /* a remake is its op's forward once more; the node keeps forward's own time */
            const float fwd_ms = r->prof_ms[0];
            cgi_profile_node(r, 0, t0);
            r->prof_ms[0] = fwd_ms;
        }
    }
}

/* Puts forward's buffers back in place of the remade values. */
static void regen_restore(cg_graph *g) {
    for (int i = 0; i < g->n; i++) {
        cg_tensor *r = g->nodes[i];
        if (!r->regen_live) continue;
        void *p = r->data;
        r->data = r->alt_data, r->alt_data = p;
        r->regen_live = false;
    }
}

static bool runs_backward(const cg_tensor *t) { return t->mark && t->requires_grad && cgi_ops[t->op].backward; }

/* For each parameter, the smallest id among the nodes whose rules add to its gradient: the sweep
 * runs in reverse, so that rule is the last, and the gradient is final once it has run. */
static void ready_plan(cg_graph *g, cg_tensor *loss) {
    for (int pass = 0; pass < 2; pass++)
        for (int i = pass ? loss->id : 0; pass ? i >= 0 : i <= loss->id; pass ? i-- : i++) {
            cg_tensor *t = g->nodes[i];
            if (!runs_backward(t)) continue;
            for (int k = 0; k < t->nsrc; k++) {
                cg_tensor *p = t->src[k]->root;
                if (p->op == CGI_OP_PARAM && t->src[k]->requires_grad) p->ready_at = pass ? i : -1;
            }
        }
}

/* Runs node i's backward rule and reports parameters whose gradient it made final. */
static void backward_node(cg_graph *g, cg_tensor *t, int i) {
    cgi_team_note(t, 1, false);
    const unsigned claims = cgi_ops[t->op].bwd_grad; /* a rule that claims an input zeroes it itself if it must */
    for (int k = 0; k < t->nsrc; k++)
        if (t->src[k]->requires_grad && !(claims & CGI_GRAD_CLAIMS_ALL) && !(k == 0 && (claims & CGI_GRAD_CLAIMS_SRC0)))
            zero_once(t->src[k]);
    double t0 = cgi_profiling() ? cgi_profile_clock() : 0;
    cgi_ops[t->op].backward(t);
    cgi_team_note(t, 1, true);
    if (t0 > 0) cgi_profile_node(t, 1, t0);
    if (g->ready_fn)
        for (int k = 0; k < t->nsrc; k++) {
            cg_tensor *p = t->src[k]->root;
            if (p->op == CGI_OP_PARAM && t->src[k]->requires_grad && p->ready_at == i) {
                p->ready_at = -1; /* once, even if this node reads it twice */
                g->ready_fn(p, g->ready_ctx);
            }
        }
}

/* The backward sweep from loss, and the zeroing of gradients it does not reach. */
typedef struct {
    cg_graph *g;
    cg_tensor *loss;
} sweep_args;

static cg_status backward_sweep(void *ctx) {
    const sweep_args *sw = ctx;
    cg_graph *g = sw->g;
    cg_tensor *loss = sw->loss;
    /* inside a team only the products are shared, as in forward (graph/graph.c) */
    const bool team = cgi_team_on();
    const cgi_run run = cgi_run_open(g->work, team);
    if (team) cgi_team_run_begin();
    int seg_lo = -1, seg_hi = -1; /* the checkpoint segment whose recomputed values are swapped in */
    const int seed_at = loss->root->id >= 0 ? loss->root->id : loss->id;
    for (int i = loss->id; i >= 0; i--) {
        cg_tensor *t = g->nodes[i];
        if (t->seg && (i == loss->id || g->nodes[i + 1]->seg != t->seg)) { /* entering a segment */
            int lo = i;
            while (lo > 0 && g->nodes[lo - 1]->seg == t->seg) lo--;
            bool needed = false, runs = false;
            for (int j = lo; j <= i; j++) needed |= g->nodes[j]->recompute, runs |= runs_backward(g->nodes[j]);
            if (needed && runs) {
                cg_status s = cgi_ckpt_recompute(g, lo, i);
                if (s) {
                    cgi_ckpt_restore(g, lo, i);
                    g->ran_forward = false;
                    if (team) cgi_team_run_end(2 * g->work);
                    cgi_run_close(&run);
                    return s;
                }
                seg_lo = lo, seg_hi = i;
            }
        }
        /* The loss's gradient is born at its node's backward (its root's, for a view), after the
         * recompute of the segment holding that node (the plan's timeline, graph/checkpoint.c):
         * seeded earlier, it could share memory with a recomputed value that dies before it, which
         * would overwrite the 1. */
        if (i == seed_at) {
            zero_once(loss);
            loss->grad[0] += 1;
        }
        if (runs_backward(t)) {
            regen_for(t, i);
            backward_node(g, t, i);
        }
        if (g->bwd_status) { /* a custom rule failed: its message is the error; the gradients are partial */
            regen_restore(g);
            if (seg_lo >= 0) cgi_ckpt_restore(g, seg_lo, seg_hi);
            g->ran_forward = false;
            if (team) cgi_team_run_end(2 * g->work);
            cgi_run_close(&run);
            return g->bwd_status;
        }
        if (i == seg_lo) {
            cgi_ckpt_restore(g, seg_lo, seg_hi);
            seg_lo = -1;
        }
    }
    /* Gradients the caller can read but that this loss does not reach (inputs it ignores, retained
     * nodes off its path, nodes built after it) hold the last pass's values or recycled memory
     * otherwise: they are zero, as the derivative is. */
    for (int i = 0; i < g->n; i++) {
        cg_tensor *t = g->nodes[i];
        if (t->root == t && t->requires_grad && t->grad && (t->op == CGI_OP_INPUT || t->retain) &&
            !t->grad_in_value && t->grad_epoch != g->epoch) {
            cgi_zero(t->grad, (size_t)cgi_numel(t->ndim, t->shape) * sizeof(cg_real));
            t->grad_epoch = g->epoch;
        }
    }
    regen_restore(g);
    if (team) cgi_team_run_end(2 * g->work); /* backward does about twice forward's work */
    cgi_run_close(&run);
    return CG_OK;
}

/* Points the parameters whose gradients the plan holds (cg_optim_attach) at those buffers, each read
 * as zero until its first write, and back at the set's own after the pass: the set's gradient
 * block is never written, so its pages take no memory. */
static void swap_param_grads(cg_graph *g, bool in) {
    if (!g->param_grads_planned) return;
    for (int j = 0; j < g->npgrad; j++) {
        struct cgi_pgrad *e = &g->pgrad[j];
        if (in) e->block_grad = e->p->grad, e->p->grad = e->grad;
        else e->p->grad = e->block_grad;
        e->p->grad_stale = true;
    }
}

cg_status cg_graph_backward(cg_graph *g, cg_tensor *loss) {
    if (!g) return cgi_fail(CG_ERR_ARG, "[backward] graph is NULL");
    if (!loss) /* keep the message of the op that failed to build it, if there is one */
        return cg_last_error()[0] ? CG_ERR_ARG : cgi_fail(CG_ERR_ARG, "[backward] loss is NULL");
    if (g->mode != CG_TRAIN) return cgi_fail(CG_ERR_STATE, "[backward] graph was built in eval mode");
    if (loss->graph != g) return cgi_fail(CG_ERR_ARG, "[backward] loss belongs to another graph");
    if (cgi_numel(loss->ndim, loss->shape) != 1 || loss->dtype != CG_REAL)
        return cgi_fail(CG_ERR_SHAPE, "[backward] loss must be a real scalar, got %s", cgi_shp(loss));
    for (int i = 0; i <= loss->id; i++) { /* whether a gradient flows was fixed when each op was built */
        const cg_tensor *t = g->nodes[i];
        for (int k = 0; k < t->nsrc; k++)
            if (t->src[k]->op == CGI_OP_PARAM && t->src[k]->requires_grad && !t->requires_grad)
                return cgi_fail(CG_ERR_STATE, "[backward] parameter '%s'%s was made trainable after %s%s was built on it: "
                                "rebuild the graph", cg_name(t->src[k]), cgi_shp(t->src[k]), cgi_op_name_of(t), cgi_shp(t));
    }
    if (!loss->requires_grad)
        return cgi_fail(CG_ERR_STATE, "[backward] loss depends on no trainable parameter or input");
    if (!g->planned || !g->ran_forward) return cgi_fail(CG_ERR_STATE, "[backward] run cg_graph_forward first");
    if (g->param_grads_planned && !g->fused_backward)
        return cgi_fail(CG_ERR_STATE, "[backward] the graph's parameter gradients live only inside a backward that "
                        "updates the parameters (cg_optim_attach): run cg_optim_backward_step, or detach the optimizer");
    swap_param_grads(g, true); /* before the views of the parameters take their gradients' addresses */
    cgi_resolve_views(g);
    g->epoch++;

    for (int i = 0; i <= loss->id; i++) g->nodes[i]->mark = false;
    loss->mark = true;
    for (int i = loss->id; i >= 0; i--) {
        cg_tensor *t = g->nodes[i];
        if (!t->mark) continue;
        for (int k = 0; k < t->nsrc; k++)
            if (t->src[k]->requires_grad) t->src[k]->mark = true;
    }
    for (int i = loss->id; i >= 0; i--) { /* a gradient must not vanish into an op that has none */
        const cg_tensor *t = g->nodes[i];
        if (t->mark && t->requires_grad && t->op == CGI_OP_CUSTOM && !cgi_custom_differentiable(t)) {
            swap_param_grads(g, false);
            return cgi_fail(CG_ERR_STATE, "[backward] custom op '%s'%s has no backward and no composite, so no gradient "
                            "can flow through it: give it one, or detach its inputs", cgi_op_name_of(t), cgi_shp(t));
        }
    }
    if (g->ready_fn) ready_plan(g, loss);
    g->bwd_status = CG_OK;
    const sweep_args sw = {g, loss};
    const cg_status s = cgi_run_graph(g->work, g->precision != CG_BF16, backward_sweep, (void *)&sw);
    swap_param_grads(g, false);
    /* Gradients took the memory of values that backward had finished reading, so another
     * backward needs a fresh forward. */
    g->ran_forward = false;
    return s;
}
