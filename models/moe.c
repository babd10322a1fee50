/* SPDX-License-Identifier: MIT */
/* Mixture-of-experts feed-forward, composed from ops (no backward of its own). Graph shapes are fixed
 * when the graph is built, while routing changes with every batch. Dropless routing sorts the N x top_k
 * (token, choice) assignments by expert (cg_topk over a sort key), gathers their tokens in that order
 * and runs each expert on its own contiguous rows (cg_segment_linear_each, whose segment ends are counted
 * when the graph runs): the products cost N x top_k rows, as Mixtral's loop over experts does. With a
 * capacity factor each expert owns a fixed number of slots, filled at run time with the positions of
 * the tokens routed to it (cg_topk over a priority score); it runs on its slots' tokens
 * (cg_index_select), about factor x top_k x N rows in all, empty slots weighted 0. Either way the
 * results go back to their tokens weighted by their routing weights (cg_index_add). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/internal.h" /* lora_a: whether a weight carries a LoRA adapter */
#include "models/layers.h"
#include "models/moe.h"
#include "ops/ops.h"

struct cg_moe {
    cg_moe_config cfg;
    cg_tensor *gate;            /* router [E, D] */
    cg_tensor **w1, **w2, **w3; /* per expert: gate_proj [F, D], down_proj [D, F], up_proj [F, D] */
};

static bool config_ok(const cg_moe_config *c) {
    if (!c || c->hidden_size <= 0 || c->intermediate_size <= 0 || c->num_experts <= 0 || c->top_k <= 0 ||
        c->top_k > c->num_experts || !(c->capacity_factor >= 0) || !isfinite(c->capacity_factor)) {
        cg_set_error(CG_ERR_ARG, "[moe] bad config: hidden %lld, intermediate %lld, experts %lld, top_k %lld (1..experts), "
                     "capacity_factor %g (>= 0; 0: dropless)", c ? (long long)c->hidden_size : 0LL,
                     c ? (long long)c->intermediate_size : 0LL, c ? (long long)c->num_experts : 0LL,
                     c ? (long long)c->top_k : 0LL, c ? c->capacity_factor : 0.0);
        return false;
    }
    return true;
}

cg_moe *cg_moe_new(const cg_moe_config *cfg, cg_params *ps, cg_rng *r, const char *prefix) {
    if (!ps || !r || !prefix) {
        cg_set_error(CG_ERR_ARG, "[moe] NULL parameter set, generator or prefix");
        return NULL;
    }
    if (!config_ok(cfg)) return NULL;
    const int64_t d = cfg->hidden_size, f = cfg->intermediate_size, e = cfg->num_experts;
    cg_moe *m = calloc(1, sizeof *m);
    cg_tensor **w = calloc((size_t)(3 * e), sizeof *w);
    if (!m || !w) {
        free(m);
        free(w);
        cg_set_error(CG_ERR_NOMEM, "[moe] out of memory");
        return NULL;
    }
    m->cfg = *cfg;
    m->w1 = w, m->w2 = w + e, m->w3 = w + 2 * e;
    const double std = 0.02; /* HF's initializer_range */
    bool ok = (m->gate = cg_param_normal(ps, r, std, 2, (int64_t[]){e, d}, "%s.gate.weight", prefix));
    for (int64_t i = 0; ok && i < e; i++)
        ok = (m->w1[i] = cg_param_normal(ps, r, std, 2, (int64_t[]){f, d}, "%s.experts.%lld.w1.weight", prefix, (long long)i)) &&
             (m->w2[i] = cg_param_normal(ps, r, std, 2, (int64_t[]){d, f}, "%s.experts.%lld.w2.weight", prefix, (long long)i)) &&
             (m->w3[i] = cg_param_normal(ps, r, std, 2, (int64_t[]){f, d}, "%s.experts.%lld.w3.weight", prefix, (long long)i));
    if (!ok) {
        cg_moe_free(m);
        return NULL;
    }
    return m;
}

void cg_moe_free(cg_moe *m) {
    if (!m) return;
    free(m->w1);
    free(m);
}

const cg_moe_config *cg_moe_cfg(const cg_moe *m) { return m ? &m->cfg : NULL; }

cg_status cg_moe_set_capacity_factor(cg_moe *m, double capacity_factor) {
    if (!m) return cg_set_error(CG_ERR_ARG, "[moe] layer is NULL");
    cg_moe_config c = m->cfg;
    c.capacity_factor = capacity_factor;
    if (!config_ok(&c)) return CG_ERR_ARG;
    m->cfg = c;
    return CG_OK;
}

/* Slots per expert for n tokens: ceil(factor * top_k * n / E), within 1..n; dropless: n. */
static int64_t capacity(const cg_moe_config *c, int64_t n) {
    if (c->capacity_factor <= 0) return n;
    const double cap = ceil(c->capacity_factor * (double)c->top_k * (double)n / (double)c->num_experts);
    return cap < 1 ? 1 : cap > (double)n ? n : (int64_t)cap;
}

/* A real input leaf of g filled with f(i) at build time (zero-filled when f is NULL): constants. */
static cg_tensor *constant(cg_graph *g, const char *name, int ndim, const int64_t *shape, double (*f)(int64_t, int64_t),
                           int64_t arg) {
    cg_tensor *t = cg_input(g, name, CG_REAL, ndim, shape);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    for (int64_t i = 0; t && f && i < n; i++) cg_data(t)[i] = (cg_real)f(i, arg);
    return t;
}
static double rank_priority(int64_t r, int64_t k) { return (double)(k - r); }
static double token_priority(int64_t i, int64_t n) { return (double)(n - i); }

/* The routing of x2[N, D], shared by both formulations. */
typedef struct {
    cg_tensor *logits;  /* router logits [N, E] */
    cg_tensor *slots;   /* int32 [E, C]: the token in each expert's slot (an arbitrary one when empty) */
    cg_tensor *weights; /* [E, C]: the slot's routing weight, 0 when empty */
    cg_tensor *kept;    /* scalar: the slots filled, the (token, choice) pairs that were not dropped */
    int64_t cap;        /* C */
} routing;

/* Mixtral's router: p = softmax(x2 @ gate^T), its top_k renormalised to sum 1. The slots: expert e's
 * are the tokens that chose it, ordered by a priority score, first choices before second ones and then
 * by position (Switch's and GShard's order; with capacity N nothing is dropped and the order is moot).
 * The score of token n at its r-th choice e is (top_k - r) * N + (N - n), 0 where e is not chosen: exact
 * in float32 while (top_k + 1) * N <= 2^24. */
static bool route(cg_graph *g, const cg_moe *m, cg_tensor *x2, routing *rt) {
    const cg_moe_config *c = &m->cfg;
    const int64_t n = cg_shape(x2)[0], e = c->num_experts, k = c->top_k;
    if ((double)(k + 1) * (double)n > 16777216.0) {
        cg_set_error(CG_ERR_SHAPE, "[moe] %lld tokens x (top_k %lld + 1) > 2^24: routing priorities would not be exact",
                     (long long)n, (long long)k);
        return false;
    }
    rt->cap = capacity(c, n);
    rt->logits = cg_linear(g, x2, m->gate, NULL);
    cg_tensor *p = cg_softmax(g, rt->logits), *top = NULL, *chosen = NULL;
    if (cg_topk(g, p, k, -1, true, &top, &chosen)) return false;
    cg_tensor *w = cg_div(g, top, cg_sum(g, top, -1, true));                         /* [N, k] */
    cg_tensor *dense = cg_scatter_add(g, constant(g, "moe.zeros_ne", 2, (int64_t[]){n, e}, NULL, 0), 1, chosen, w);
    cg_tensor *onehot = cg_one_hot(g, chosen, e, CG_REAL);                           /* [N, k, E] */
    cg_tensor *by_rank = cg_sum(g, cg_mul(g, onehot, constant(g, "moe.rank_priority", 3, (int64_t[]){1, k, 1},
                                                               rank_priority, k)), 1, false);
    cg_tensor *score = cg_add(g, cg_scale(g, by_rank, (double)n),
                              cg_mul(g, cg_sum(g, onehot, 1, false),
                                     constant(g, "moe.token_priority", 2, (int64_t[]){n, 1}, token_priority, n)));
    cg_tensor *best = NULL;
    if (cg_topk(g, cg_contiguous(g, cg_transpose(g, score, 0, 1)), rt->cap, 1, true, &best, &rt->slots)) return false;
    cg_tensor *filled = cg_to_real(g, cg_gt(g, best, constant(g, "moe.zero", 0, NULL, NULL, 0)));
    rt->weights = cg_mul(g, cg_gather(g, cg_contiguous(g, cg_transpose(g, dense, 0, 1)), 1, rt->slots), filled);
    rt->kept = cg_sum_all(g, filled);
    return rt->weights && rt->kept;
}

/* Whether the segment products can run the experts' matrices of one kind w[E]: true when none carries
 * a LoRA adapter, or every one carries one of the same rank and scale (adapters on "experts"); false
 * for a mix, which the slot path's cg_linear applies one by one. */
static bool segments_ok(cg_tensor *const *w, int64_t e) {
    const cg_tensor *a0 = w[0]->root->lora_a;
    for (int64_t i = 0; i < e; i++) {
        const cg_tensor *p = w[i]->root, *a = p->lora_a;
        if (p != w[i] || !a != !a0 || (a && (a->shape[0] != a0->shape[0] || p->lora_scale != w[0]->lora_scale))) return false;
    }
    return true;
}

/* The sorted rows x through their experts' matrices w[E], with their adapters when they have them:
 * x W^T + s (x A^T) B^T, each product by segments, as cgi_lora_linear does for one matrix. */
static cg_tensor *segments(cg_graph *g, cg_tensor *x, cg_tensor *const *w, int64_t e, cg_tensor *ends) {
    cg_tensor *y = cg_segment_linear_each(g, x, (int)e, w, ends);
    if (!w[0]->lora_a) return y;
    cg_tensor **ab = malloc((size_t)(2 * e) * sizeof *ab); /* build time only */
    if (!ab) {
        cg_set_error(CG_ERR_NOMEM, "[moe] out of memory");
        return NULL;
    }
    for (int64_t i = 0; i < e; i++) ab[i] = w[i]->lora_a, ab[e + i] = w[i]->lora_b;
    cg_tensor *low = cg_segment_linear_each(g, x, (int)e, ab, ends);
    cg_tensor *delta = cg_segment_linear_each(g, cg_scale(g, low, w[0]->lora_scale), (int)e, ab + e, ends);
    free(ab);
    return cg_add(g, y, delta);
}

/* Dropless: the assignments sorted by expert (first choices, then token order, within one), each
 * expert's rows through its matrices by cg_segment_linear. The sort key of assignment j (token n, r-th
 * choice e) is (E - e) * (A + 1) + (top_k - r) * N + (N - n) over A = N x top_k assignments: distinct,
 * and exact in float32 while E * (A + 1) + A <= 2^24. */
static cg_tensor *forward_sorted(cg_graph *g, const cg_moe *m, cg_tensor *x2, cg_tensor **router_logits) {
    const cg_moe_config *c = &m->cfg;
    const int64_t n = cg_shape(x2)[0], e = c->num_experts, k = c->top_k, a = n * k, d = c->hidden_size;
    if ((double)e * (double)(a + 1) + (double)a > 16777216.0) {
        cg_set_error(CG_ERR_SHAPE, "[moe] %lld tokens x top_k %lld over %lld experts: the sort keys would pass 2^24 and "
                     "not be exact", (long long)n, (long long)k, (long long)e);
        return NULL;
    }
    cg_tensor *logits = cg_linear(g, x2, m->gate, NULL), *top = NULL, *chosen = NULL;
    if (router_logits) *router_logits = logits;
    if (cg_topk(g, cg_softmax(g, logits), k, -1, true, &top, &chosen)) return NULL;
    cg_tensor *w = cg_reshape(g, cg_div(g, top, cg_sum(g, top, -1, true)), 1, &a); /* [A] */
    cg_tensor *expert_of = cg_reshape(g, chosen, 1, &a);
    cg_tensor *ends = cg_to_int(g, cg_cumsum(g, cg_sum(g, cg_one_hot(g, expert_of, e, CG_REAL), 0, false), 0, false));
    cg_tensor *prio = cg_input(g, "moe.priority", CG_REAL, 1, &a), *tok = cg_input(g, "moe.token_of", CG_REAL, 1, &a);
    for (int64_t j = 0; prio && tok && j < a; j++)
        cg_data(prio)[j] = (cg_real)((k - j % k) * n + (n - j / k)), cg_data(tok)[j] = (cg_real)(j / k);
    cg_tensor *key = cg_add(g, cg_scale(g, cg_add_scalar(g, cg_neg(g, cg_to_real(g, expert_of)), (double)e), (double)(a + 1)),
                            prio);
    cg_tensor *order = NULL;
    if (cg_topk(g, key, a, 0, true, NULL, &order)) return NULL;
    cg_tensor *rows = cg_to_int(g, cg_index_select(g, tok, 0, order)); /* the token of each sorted row */
    cg_tensor *xs = cg_index_select(g, x2, 0, rows);
    cg_tensor *h = cg_swiglu(g, segments(g, xs, m->w1, e, ends), segments(g, xs, m->w3, e, ends));
    cg_tensor *y = cg_mul(g, segments(g, h, m->w2, e, ends),
                          cg_reshape(g, cg_index_select(g, w, 0, order), 2, (int64_t[]){a, 1}));
    return cg_index_add(g, constant(g, "moe.zeros_nd", 2, (int64_t[]){n, d}, NULL, 0), 0, rows, y);
}

/* Expert i's SwiGLU feed-forward on rows x[M, D]. */
static cg_tensor *expert(cg_graph *g, const cg_moe *m, int64_t i, cg_tensor *x) {
    return cg_linear(g, cg_swiglu(g, cg_linear(g, x, m->w1[i], NULL), cg_linear(g, x, m->w3[i], NULL)), m->w2[i], NULL);
}

/* x as rows [N, D]; NULL with a message when its last axis is not D. */
static cg_tensor *rows_of(cg_graph *g, const cg_moe *m, cg_tensor *x) {
    if (!m) {
        cg_set_error(CG_ERR_ARG, "[moe] layer is NULL");
        return NULL;
    }
    if (!cg_graph_check_inputs(g, "moe", 1, &x)) return NULL;
    if (cg_ndim(x) < 1 || cg_dim(x, -1) != m->cfg.hidden_size || cg_tensor_dtype(x) == CG_INT32) {
        cg_set_error(CG_ERR_SHAPE, "[moe] x%s: need real x[..., %lld]", cg_shape_str(x), (long long)m->cfg.hidden_size);
        return NULL;
    }
    return cg_reshape(g, x, 2, (int64_t[]){-1, m->cfg.hidden_size});
}

/* Runs the expert loop: out2 [N, D] as rows, reshaped back to x's shape. */
static cg_tensor *finish(cg_graph *g, cg_tensor *x, cg_tensor *out2, cg_tensor **router_logits, const routing *rt) {
    if (router_logits) *router_logits = rt->logits;
    return out2 ? cg_reshape(g, out2, cg_ndim(x), cg_shape(x)) : NULL;
}

cg_tensor *cg_moe_forward(cg_graph *g, const cg_moe *m, cg_tensor *x, cg_tensor **router_logits) {
    return cg_moe_forward_counted(g, m, x, router_logits, NULL);
}

cg_tensor *cg_moe_forward_counted(cg_graph *g, const cg_moe *m, cg_tensor *x, cg_tensor **router_logits,
                                  cg_tensor **dropped) {
    if (router_logits) *router_logits = NULL;
    if (dropped) *dropped = NULL;
    cg_tensor *x2 = rows_of(g, m, x);
    /* a mix of experts with and without adapters takes the slot path at capacity N (every token fits:
     * dropless too), whose cg_linear applies each expert's own */
    const int64_t ne = m->cfg.num_experts;
    const bool mixed = x2 && !(segments_ok(m->w1, ne) && segments_ok(m->w2, ne) && segments_ok(m->w3, ne));
    if (x2 && m->cfg.capacity_factor <= 0 && !mixed) {
        cg_tensor *out = forward_sorted(g, m, x2, router_logits);
        if (dropped) *dropped = constant(g, "moe.dropped", 0, NULL, NULL, 0); /* nothing is */
        return out ? cg_reshape(g, out, cg_ndim(x), cg_shape(x)) : NULL;
    }
    routing rt;
    if (!x2 || !route(g, m, x2, &rt)) return NULL;
    const int64_t e = m->cfg.num_experts, cap = rt.cap, n = cg_shape(x2)[0], d = m->cfg.hidden_size;
    cg_tensor **ys = malloc((size_t)e * sizeof *ys); /* build time only */
    if (!ys) {
        cg_set_error(CG_ERR_NOMEM, "[moe] out of memory");
        return NULL;
    }
    for (int64_t i = 0; i < e; i++) {
        cg_tensor *slots = cg_reshape(g, cg_slice(g, rt.slots, 0, i, i + 1), 1, &cap),
                  *w = cg_reshape(g, cg_slice(g, rt.weights, 0, i, i + 1), 2, (int64_t[]){cap, 1});
        ys[i] = cg_mul(g, expert(g, m, i, cg_index_select(g, x2, 0, slots)), w);
    }
    cg_tensor *y = cg_concat(g, (int)e, ys, 0); /* [E * C, D], slot order */
    free(ys);
    cg_tensor *out = cg_index_add(g, constant(g, "moe.zeros_nd", 2, (int64_t[]){n, d}, NULL, 0), 0,
                                  cg_reshape(g, rt.slots, 1, (int64_t[]){e * cap}), y);
    if (dropped) *dropped = cg_add_scalar(g, cg_neg(g, rt.kept), (double)(n * m->cfg.top_k));
    return finish(g, x, out, router_logits, &rt);
}

cg_tensor *cg_moe_forward_dense(cg_graph *g, const cg_moe *m, cg_tensor *x, cg_tensor **router_logits) {
    if (router_logits) *router_logits = NULL;
    cg_tensor *x2 = rows_of(g, m, x);
    routing rt;
    if (!x2 || !route(g, m, x2, &rt)) return NULL;
    const int64_t e = m->cfg.num_experts, n = cg_shape(x2)[0];
    /* the weights as a dense [E, N] mask: 0 where a token was not routed to the expert or was dropped */
    cg_tensor *mask = cg_scatter_add(g, constant(g, "moe.zeros_en", 2, (int64_t[]){e, n}, NULL, 0), 1, rt.slots, rt.weights);
    cg_tensor *out = NULL;
    for (int64_t i = 0; i < e; i++) {
        cg_tensor *w = cg_reshape(g, cg_slice(g, mask, 0, i, i + 1), 2, (int64_t[]){n, 1});
        cg_tensor *y = cg_mul(g, expert(g, m, i, x2), w);
        out = out ? cg_add(g, out, y) : y;
    }
    return finish(g, x, out, router_logits, &rt);
}

cg_tensor *cg_moe_load_balancing_loss(cg_graph *g, int n, cg_tensor *const *router_logits, int64_t top_k) {
    if (n <= 0 || !router_logits) {
        cg_set_error(CG_ERR_ARG, "[moe load balancing] need n >= 1 router logits, got %d", n);
        return NULL;
    }
    if (!cg_graph_check_inputs(g, "moe load balancing", n, router_logits)) return NULL;
    const int64_t e = cg_dim(router_logits[0], -1);
    for (int i = 0; i < n; i++)
        if (cg_ndim(router_logits[i]) != 2 || cg_dim(router_logits[i], -1) != e) {
            cg_set_error(CG_ERR_SHAPE, "[moe load balancing] router logits %d%s: need [N, %lld] like the first", i,
                         cg_shape_str(router_logits[i]), (long long)e);
            return NULL;
        }
    if (top_k < 1 || top_k > e) {
        cg_set_error(CG_ERR_ARG, "[moe load balancing] top_k %lld must be in 1..%lld experts", (long long)top_k, (long long)e);
        return NULL;
    }
    cg_tensor *p = cg_softmax(g, n == 1 ? router_logits[0] : cg_concat(g, n, router_logits, 0)), *chosen = NULL;
    if (cg_topk(g, p, top_k, -1, true, NULL, &chosen)) return NULL;
    cg_tensor *tokens_per_expert = cg_mean(g, cg_one_hot(g, chosen, e, CG_REAL), 0, false); /* [k, E], no gradient */
    cg_tensor *prob_per_expert = cg_mean(g, p, 0, true);                                   /* [1, E] */
    return cg_scale(g, cg_sum_all(g, cg_mul(g, tokens_per_expert, prob_per_expert)), (double)e);
}
