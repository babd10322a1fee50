/* SPDX-License-Identifier: MIT */
/* Graphs, tensors and parameters; forward runs nodes in build order, backward sweeps them in
 * reverse, skipping every node that does not lead from a trainable leaf to the loss. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* fills the op table: refers to the kernels, whose clones live in their own files */
#define CGI_OP_TABLE_FILE
#include "graph/gradcheck.h" /* declares cg_op_name, which this file defines: the declaration exports it */
#include "graph/internal.h"
#include "ops/bf16_internal.h"

#include <omp.h>
#include <time.h>

/* CGRAD_PROFILE=1 prints, when a graph is freed, the time spent in each op's kernels;
 * CGRAD_PROFILE=2 also prints every node's time as it runs. */
static int profile = -1;
/* Kernel seconds and calls per op and pass; custom ops by their own names after the table's
 * (rows past CGI_OP_COUNT; a name past the last row is counted under "custom"). */
enum { PROF_CUSTOM = 16 };
static double prof_time[CGI_OP_COUNT + PROF_CUSTOM][2];
/* Of prof_time, inside a team span on two or more threads: the time the calling thread spent in
 * pieces it shared with the helpers, and of that waiting for their last piece (graph/team.c). The
 * rest of an op's time the helpers had nothing to do. */
static double prof_shared[CGI_OP_COUNT + PROF_CUSTOM], prof_wait[CGI_OP_COUNT + PROF_CUSTOM];
static int64_t prof_calls[CGI_OP_COUNT + PROF_CUSTOM][2];
static const char *prof_custom[PROF_CUSTOM];

/* CGRAD_PROFILE_CLOCK=cpu times the kernels by the calling thread's CPU clock: on a shared machine a
 * one-thread profile then leaves out the time other processes held the core. */
double cgi_profile_now(void) {
    static int cpu = -1;
    if (cpu < 0) cpu = getenv("CGRAD_PROFILE_CLOCK") && !strcmp(getenv("CGRAD_PROFILE_CLOCK"), "cpu");
    if (!cpu) return omp_get_wtime();
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return 1.0 + (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec; /* > 0: callers read 0 as "not profiling" */
}

static _Thread_local double prof_team_mark[2]; /* the team's counters at the node's start */

double cgi_profile_clock(void) {
    cgi_team_profile(&prof_team_mark[0], &prof_team_mark[1]);
    return cgi_profile_now();
}

bool cgi_profiling(void) {
    if (profile < 0) profile = getenv("CGRAD_PROFILE") ? atoi(getenv("CGRAD_PROFILE")) : 0;
    return profile > 0;
}

/* t's row of the profile table. */
static int prof_row(const cg_tensor *t) {
    if (t->op != CGI_OP_CUSTOM) return t->op;
    const char *name = cgi_op_name_of(t);
    for (int k = 0; k < PROF_CUSTOM; k++) {
        if (!prof_custom[k]) prof_custom[k] = name;
        if (!strcmp(prof_custom[k], name)) return CGI_OP_COUNT + k;
    }
    return t->op;
}

void cgi_profile_node(cg_tensor *t, int pass, double t0) {
    const double dt = cgi_profile_now() - t0;
    const int row = prof_row(t);
    t->prof_ms[pass] = (float)(dt * 1e3);
    prof_time[row][pass] += dt, prof_calls[row][pass]++;
    double shared, wait;
    cgi_team_profile(&shared, &wait);
    shared -= prof_team_mark[0], wait -= prof_team_mark[1];
    prof_shared[row] += shared, prof_wait[row] += wait;
    if (profile > 1)
        fprintf(stderr, "[profile] %s node %d %s%s: %.3f ms (%.3f alone, %.3f waiting)\n", pass ? "bwd" : "fwd", t->id,
                cgi_op_name_of(t), cgi_shp(t), dt * 1e3, (dt - shared) * 1e3, wait * 1e3);
}

static void profile_report(void) {
    enum { ROWS = CGI_OP_COUNT + PROF_CUSTOM };
    double total = 0;
    for (int i = 0; i < ROWS; i++) total += prof_time[i][0] + prof_time[i][1];
    if (total <= 0) return;
    double shared = 0, wait = 0;
    for (int i = 0; i < ROWS; i++) shared += prof_shared[i], wait += prof_wait[i];
    /* in a team: the time alone (helpers idle) and thread 0's wait for the helpers' last pieces */
    const bool team = shared > 0;
    fprintf(stderr, "%-16s %10s %10s %8s %8s%s\n", "op", "fwd ms", "bwd ms", "calls", "share",
            team ? "   alone ms    wait ms" : "");
    for (int i = 0; i < ROWS; i++) {
        double t = prof_time[i][0] + prof_time[i][1];
        if (t <= 0) continue;
        fprintf(stderr, "%-16s %10.1f %10.1f %8lld %7.1f%%", i < CGI_OP_COUNT ? cgi_ops[i].name : prof_custom[i - CGI_OP_COUNT],
                prof_time[i][0] * 1e3, prof_time[i][1] * 1e3, (long long)(prof_calls[i][0] + prof_calls[i][1]), 100 * t / total);
        if (team) fprintf(stderr, " %10.1f %10.1f", (t - prof_shared[i]) * 1e3, prof_wait[i] * 1e3);
        fputc('\n', stderr);
    }
    if (team)
        fprintf(stderr, "team: of %.1f ms, %.1f ms shared with helpers (%.1f ms of it waiting for them), %.1f ms alone\n",
                total * 1e3, shared * 1e3, wait * 1e3, (total - shared) * 1e3);
    memset(prof_time, 0, sizeof prof_time);
    memset(prof_shared, 0, sizeof prof_shared);
    memset(prof_wait, 0, sizeof prof_wait);
    memset(prof_calls, 0, sizeof prof_calls);
    memset(prof_custom, 0, sizeof prof_custom);
}

const int CGRAD_ABI = (int)sizeof(cg_real); /* see graph.h: the link-time guard against mixing builds */

const cgi_op_desc cgi_ops[CGI_OP_COUNT] = {
#define CG_LEAF(ID, nm) [CGI_OP_##ID] = {#nm, CGI_KIND_LEAF, NULL, NULL},
#define CG_VIEW(ID, nm) [CGI_OP_##ID] = {#nm, CGI_KIND_VIEW, NULL, NULL},
#define CG_OP(ID, nm, family, reads, reads_out, grad) [CGI_OP_##ID] = {#nm, CGI_KIND_COMPUTE, cgi_fwd_##nm, cgi_bwd_##nm, reads, reads_out, grad},
#include "ops/ops.def"
#undef CG_LEAF
#undef CG_VIEW
#undef CG_OP
};

const char *cg_op_name(int i) { return i >= 0 && i < CGI_OP_COUNT ? cgi_ops[i].name : NULL; }

static size_t elsize(cg_dtype dt) { return dt == CG_INT32 ? sizeof(int32_t) : sizeof(cg_real); }

/* ---- shapes ---- */

int64_t cgi_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

void cgi_contig_strides(int ndim, const int64_t *shape, int64_t *stride) {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        stride[i] = s;
        s *= shape[i];
    }
}

bool cgi_contiguous(const cg_tensor *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != s) return false;
        s *= t->shape[i];
    }
    return true;
}

bool cgi_broadcast_shape(const cg_tensor *a, const cg_tensor *b, int *ndim, int64_t *out) {
    int n = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (int i = 0; i < n; i++) {
        int ia = a->ndim - n + i, ib = b->ndim - n + i;
        int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
        if (da != db && da != 1 && db != 1) return false;
        out[i] = da == 1 ? db : da;
    }
    *ndim = n;
    return true;
}

void cgi_broadcast_strides(const cg_tensor *t, int ndim, const int64_t *shape, int64_t *stride) {
    for (int i = 0; i < ndim; i++) {
        int it = t->ndim - ndim + i;
        stride[i] = (it < 0 || (t->shape[it] == 1 && shape[i] != 1)) ? 0 : t->stride[it];
    }
}

int cgi_axis(const char *op, const cg_tensor *t, int axis) {
    int a = axis < 0 ? axis + t->ndim : axis;
    if (a < 0 || a >= t->ndim) {
        cgi_fail(CG_ERR_SHAPE, "[%s] axis %d out of range for x%s", op, axis, cgi_shp(t));
        return -1;
    }
    return a;
}

bool cgi_expect_real(const char *op, const cg_tensor *t, const char *role) {
    if (t->dtype != CG_REAL) {
        cgi_fail(CG_ERR_ARG, "[%s] %s%s must be real, got int32", op, role, cgi_shp(t));
        return false;
    }
    return true;
}

/* ---- graphs ---- */

cg_graph *cg_graph_new(cg_mode mode) {
    cg_graph *g = calloc(1, sizeof *g);
    if (!g) {
        cgi_fail(CG_ERR_NOMEM, "[graph] out of memory");
        return NULL;
    }
    g->mode = mode;
    g->seed = 0x5eed;
    g->precision = cgi_default_precision();
    return g;
}

/* One thing a graph frees with itself or its reset. */
struct cgi_owned {
    void (*free_fn)(void *);
    void *p;
    struct cgi_owned *next;
};

cg_status cgi_graph_own(cg_graph *g, void (*free_fn)(void *), void *p) {
    struct cgi_owned *o = malloc(sizeof *o);
    if (!o) return cgi_fail(CG_ERR_NOMEM, "[graph] out of memory");
    *o = (struct cgi_owned){free_fn, p, g->owned};
    g->owned = o;
    return CG_OK;
}

static void free_owned(cg_graph *g) {
    for (struct cgi_owned *o = g->owned, *next; o; o = next) {
        next = o->next;
        o->free_fn(o->p);
        free(o);
    }
    g->owned = NULL;
}

void cg_graph_free(cg_graph *g) {
    if (!g) return;
    free_owned(g);
    if (cgi_profiling()) profile_report();
    cgi_arena_free(&g->meta);
    cgi_arena_free(&g->bufs);
    cgi_lp_free(g->lp);
    free(g->nodes);
    free(g);
}

void cg_graph_reset(cg_graph *g) {
    if (!g) return;
    free_owned(g);
    cgi_arena_reset(&g->meta);
    cgi_arena_reset(&g->bufs);
    g->n = 0;
    g->planned = g->ran_forward = false;
    g->block = NULL;
    g->block_bytes = g->plan_bytes = 0;
    g->nseg = g->seg_open = 0;
    g->npgrad = 0, g->pgrad = NULL;
}

cg_mode cg_graph_mode(const cg_graph *g) { return g ? g->mode : CG_EVAL; }
void cg_graph_set_rng(cg_graph *g, uint64_t seed, uint64_t step) {
    if (!g) return;
    g->seed = seed;
    g->step = step;
}
uint64_t cg_graph_rng_step(const cg_graph *g) { return g ? g->step : 0; }
void cg_graph_on_grad_ready(cg_graph *g, cg_grad_ready_fn fn, void *ctx) {
    if (!g) return;
    g->ready_fn = fn;
    g->ready_ctx = ctx;
}
int cg_graph_size(const cg_graph *g) { return g ? g->n : 0; }
size_t cg_graph_plan_bytes(const cg_graph *g) { return g && g->planned ? g->plan_bytes : 0; }
size_t cg_graph_bytes(const cg_graph *g) { return g ? g->meta.total + g->bufs.total : 0; }

static bool push_node(cg_graph *g, cg_tensor *t) {
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 256;
        cg_tensor **nodes = realloc(g->nodes, (size_t)cap * sizeof *nodes);
        if (!nodes) {
            cgi_fail(CG_ERR_NOMEM, "[graph] out of memory for %d nodes", cap);
            return false;
        }
        g->nodes = nodes;
        g->cap = cap;
    }
    t->id = g->n;
    g->nodes[g->n++] = t;
    return true;
}

bool cg_graph_check_inputs(cg_graph *g, const char *op, int n, cg_tensor *const *xs) {
    if (!g) {
        cgi_fail(CG_ERR_ARG, "[%s] graph is NULL", op);
        return false;
    }
    for (int i = 0; i < n; i++) {
        if (!xs[i]) return false; /* keep the message of the op that failed first */
        if (xs[i]->graph && xs[i]->graph != g) {
            cgi_fail(CG_ERR_ARG, "[%s] input %d%s belongs to another graph", op, i, cgi_shp(xs[i]));
            return false;
        }
    }
    return true;
}

bool cgi_op_reads_broadcast(int op) {
    switch (op) {
    case CGI_OP_COPY: /* cgi_copy reads any strides; its backward reduces (ops/movement.c) */
    case CGI_OP_ADD:  /* the binary elementwise ops broadcast already: a zero-stride operand's */
    case CGI_OP_SUB:  /* gradient goes through cgi_unbroadcast_add like a size-1 axis's */
    case CGI_OP_MUL:
    case CGI_OP_DIV:
    case CGI_OP_MINIMUM:
    case CGI_OP_MAXIMUM:
    case CGI_OP_WHERE: return true; /* reads cond, a and b broadcast, and reduces like them */
    default: return false;
    }
}

static cg_tensor *alloc_node(cg_graph *g, int op, cg_dtype dt, int ndim, const int64_t *shape,
                             int nsrc, cg_tensor *const *src);

/* The sources of a compute node of op, each cgi_broadcast_view one that op cannot read in place
 * replaced by a contiguous copy (a COPY node, built first so it runs first): src itself when none is,
 * so graphs without expanded views are built exactly as before. NULL (message set) on failure. */
static cg_tensor *const *dense_sources(cg_graph *g, int op, int nsrc, cg_tensor *const *src) {
    if (cgi_ops[op].kind != CGI_KIND_COMPUTE || cgi_op_reads_broadcast(op)) return src;
    bool any = false;
    for (int i = 0; i < nsrc; i++) any |= cgi_broadcast_view(src[i]);
    if (!any) return src;
    cg_tensor **dense = cgi_arena_alloc(&g->meta, (size_t)nsrc * sizeof *dense);
    if (!dense) {
        cgi_fail(CG_ERR_NOMEM, "[%s] out of memory", cgi_ops[op].name);
        return NULL;
    }
    for (int i = 0; i < nsrc; i++) {
        dense[i] = src[i];
        for (int j = 0; j < i && cgi_broadcast_view(src[i]); j++) /* the same view read twice: one copy */
            if (src[j] == src[i]) dense[i] = dense[j];
        if (dense[i] == src[i] && cgi_broadcast_view(src[i]) &&
            !(dense[i] = alloc_node(g, CGI_OP_COPY, src[i]->dtype, src[i]->ndim, src[i]->shape, 1, &src[i])))
            return NULL;
    }
    return dense;
}

static cg_tensor *alloc_node(cg_graph *g, int op, cg_dtype dt, int ndim, const int64_t *shape,
                             int nsrc, cg_tensor *const *src) {
    if (nsrc > 0 && !(src = dense_sources(g, op, nsrc, src))) return NULL;
    if (ndim < 0 || ndim > CG_MAX_DIMS) {
        cgi_fail(CG_ERR_SHAPE, "[%s] %d dims: at most %d supported", cgi_ops[op].name, ndim, CG_MAX_DIMS);
        return NULL;
    }
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0) {
            cgi_fail(CG_ERR_SHAPE, "[%s] negative size in %s", cgi_ops[op].name, cgi_dims(ndim, shape));
            return NULL;
        }
    cg_tensor *t = cgi_arena_alloc(&g->meta, sizeof *t + (size_t)nsrc * sizeof(cg_tensor *));
    if (!t) return NULL;
    memset(t, 0, sizeof *t);
    t->op = op;
    t->dtype = dt;
    t->ndim = ndim;
    if (ndim > 0) memcpy(t->shape, shape, (size_t)ndim * sizeof *shape); /* scalars may pass NULL */
    cgi_contig_strides(ndim, shape, t->stride);
    t->root = t;
    t->graph = g;
    t->name = "";
    t->seg = g->seg_open;
    t->nsrc = nsrc;
    t->src = (cg_tensor **)(t + 1);
    bool rg = false;
    for (int i = 0; i < nsrc; i++) {
        t->src[i] = src[i];
        src[i]->used = true;
        rg |= src[i]->requires_grad;
    }
    t->requires_grad = rg && g->mode == CG_TRAIN;
    if (!push_node(g, t)) return NULL;
    g->planned = g->ran_forward = false; /* a new node changes every lifetime */
    return t;
}

cg_tensor *cgi_node(cg_graph *g, int op, cg_dtype dt, int ndim, const int64_t *shape, int nsrc,
                    cg_tensor *const *src) {
    return alloc_node(g, op, dt, ndim, shape, nsrc, src);
}

void *cgi_node_params(cg_graph *g, const char *op, size_t bytes) {
    void *p = cgi_arena_alloc(&g->meta, bytes);
    if (!p) {
        cgi_fail(CG_ERR_NOMEM, "[%s] out of memory for %zu bytes of settings", op, bytes);
        return NULL;
    }
    return memset(p, 0, bytes);
}

cg_tensor *cgi_view(cg_graph *g, int op, cg_tensor *x, int ndim, const int64_t *shape,
                    const int64_t *stride, int64_t offset) {
    cg_tensor *t = alloc_node(g, op, x->dtype, ndim, shape, 1, &x);
    if (!t) return NULL;
    memcpy(t->stride, stride, (size_t)ndim * sizeof *stride);
    t->offset = offset;
    t->root = x->root;
    if (t->root->data && cgi_ops[t->root->op].kind == CGI_KIND_LEAF) /* readable before any run */
        t->data = (char *)t->root->data + offset * elsize(t->dtype);
    return t;
}

/* A leaf node of the graph: data is the caller's memory, or NULL for zeroed graph storage. */
static cg_tensor *leaf(cg_graph *g, const char *op, const char *name, cg_dtype dtype, int ndim, const int64_t *shape,
                       const int64_t *strides, void *data) {
    if (!cgi_inputs_ok(g, op, 0, NULL)) return NULL;
    if (ndim > 0 && !shape) {
        cgi_fail(CG_ERR_ARG, "[%s] shape is NULL for %d dims", op, ndim);
        return NULL;
    }
    if (dtype != CG_REAL && dtype != CG_INT32) {
        cgi_fail(CG_ERR_ARG, "[%s] unknown dtype %d", op, (int)dtype);
        return NULL;
    }
    cg_tensor *t = alloc_node(g, CGI_OP_INPUT, dtype, ndim, shape, 0, NULL);
    if (!t) return NULL;
    if (data) {
        if (strides) memcpy(t->stride, strides, (size_t)ndim * sizeof *strides);
        t->data = data;
    } else {
        size_t bytes = (size_t)cgi_numel(ndim, shape) * elsize(dtype);
        if (!(t->data = cgi_arena_alloc(&g->bufs, bytes))) return NULL;
        memset(t->data, 0, bytes);
    }
    if (name) {
        size_t len = strlen(name) + 1;
        char *copy = cgi_arena_alloc(&g->meta, len);
        if (!copy) return NULL;
        memcpy(copy, name, len);
        t->name = copy;
    }
    return t;
}

cg_tensor *cg_input(cg_graph *g, const char *name, cg_dtype dtype, int ndim, const int64_t *shape) {
    return leaf(g, "input", name, dtype, ndim, shape, NULL, NULL);
}

cg_tensor *cg_wrap(cg_graph *g, const char *name, cg_dtype dtype, int ndim, const int64_t *shape,
                   const int64_t *strides, void *data) {
    if (!data) {
        cgi_fail(CG_ERR_ARG, "[wrap] data is NULL");
        return NULL;
    }
    return leaf(g, "wrap", name, dtype, ndim, shape, strides, data);
}

cg_tensor *cg_requires_grad(cg_tensor *t) {
    if (!t) return NULL;
    if (t->op != CGI_OP_INPUT || t->dtype != CG_REAL || !cgi_contiguous(t)) {
        cgi_fail(CG_ERR_ARG, "[requires_grad] only contiguous real input leaves can require a gradient, not %s%s",
                 cgi_op_name_of(t), cgi_shp(t));
        return NULL;
    }
    if (t->used && !t->requires_grad && t->graph->mode == CG_TRAIN) {
        /* the ops built on it decided then that no gradient flows through them */
        cgi_fail(CG_ERR_STATE, "[requires_grad] input '%s'%s is already used by an op: call cg_requires_grad before using it",
                 cg_name(t), cgi_shp(t));
        return NULL;
    }
    t->requires_grad = t->graph->mode == CG_TRAIN;
    return t;
}

void cgi_resolve_views(cg_graph *g) {
    /* Parameter storage may have moved since the build, so views are re-pointed every run. */
    for (int i = 0; i < g->n; i++) {
        cg_tensor *t = g->nodes[i];
        if (cgi_ops[t->op].kind != CGI_KIND_VIEW) continue;
        cg_tensor *r = t->root;
        t->data = r->data ? (char *)r->data + t->offset * elsize(t->dtype) : NULL;
        t->grad = r->grad && t->requires_grad ? r->grad + t->offset : NULL; /* detach has none */
    }
}

cg_status cgi_run_forward(cg_graph *g, cg_tensor *t) {
    double t0 = cgi_profiling() ? cgi_profile_clock() : 0;
    cgi_team_note(t, 0, false);
    cg_status s = cgi_ops[t->op].forward(t);
    cgi_team_note(t, 0, true);
    if (t0 > 0) cgi_profile_node(t, 0, t0);
    if (s) return s;
    if (t == g->nudge) {
        int64_t off = 0, k = g->nudge_at;
        for (int d = t->ndim - 1; d >= 0; d--) off += (k % t->shape[d]) * t->stride[d], k /= t->shape[d];
        cg_real *e = (cg_real *)t->data + off, was = *e;
        *e = (cg_real)(was + g->nudge_by);
        g->nudge_took = (double)*e - (double)was;
    }
    if (t->lp_shadow) cgi_lp_shadow_fill(t);
    return CG_OK;
}

double cgi_graph_work(const cg_graph *g) {
    double work = 0;
    for (int i = 0; i < g->n; i++) {
        const cg_tensor *t = g->nodes[i];
        if (cgi_ops[t->op].kind != CGI_KIND_COMPUTE) continue;
        double w = (double)cgi_numel(t->ndim, t->shape);
        for (int k = 0; k < t->nsrc; k++) {
            const double in = (double)cgi_numel(t->src[k]->ndim, t->src[k]->shape);
            w = in > w ? in : w;
        }
        const cg_tensor *a = t->nsrc ? t->src[0] : NULL, *b = t->nsrc > 1 ? t->src[1] : NULL;
        if (t->op == CGI_OP_MATMUL) w = (double)cgi_numel(t->ndim, t->shape) * (double)a->shape[a->ndim - 1];
        else if (cgi_is_linear(t) || t->op == CGI_OP_LINEAR_ACT || t->op == CGI_OP_LINEAR_ADD) w = (double)cgi_numel(t->ndim, t->shape) * (double)b->shape[1];
        else if (t->op == CGI_OP_LINEAR_CROSS_ENTROPY) w = (double)cgi_numel(a->ndim, a->shape) * (double)b->shape[0];
        else if (t->op == CGI_OP_ATTENTION) w = 2 * (double)cgi_numel(t->ndim, t->shape) * (double)b->shape[2];
        work += w;
    }
    return work;
}

/* The forward sweep. Inside a team (cg_run_with_team) only the products are shared, through the team's pieces. */
static cg_status forward_nodes(void *ctx) {
    cg_graph *g = ctx;
    cg_status s = CG_OK;
    const bool team = cgi_team_on();
    const cgi_run run = cgi_run_open(g->work, team);
    if (team) cgi_team_run_begin();
    for (int i = 0; i < g->n && !s; i++) {
        cg_tensor *t = g->nodes[i];
        if (cgi_ops[t->op].kind == CGI_KIND_COMPUTE) s = cgi_run_forward(g, t);
    }
    if (team) cgi_team_run_end(g->work);
    cgi_run_close(&run);
    return s;
}

cg_status cg_graph_forward(cg_graph *g) {
    if (!g) return cgi_fail(CG_ERR_ARG, "[forward] graph is NULL");
    if (g->seg_open)
        return cgi_fail(CG_ERR_STATE, "[forward] checkpoint segment %d, begun at node %d, is not ended: call "
                        "cg_checkpoint_end", g->seg_open, g->seg_open_at);
    cg_status s = CG_OK;
    if (!g->planned) {
        if ((s = cgi_plan(g))) return s;
    }
    cgi_resolve_views(g);
    g->fwd_step = g->step;
    s = cgi_run_graph(g->work, g->precision != CG_BF16, forward_nodes, g);
    if (s) return s;
    if (g->mode == CG_TRAIN) g->step++;
    g->ran_forward = true;
    return CG_OK;
}

/* ---- tensor accessors ---- */

int cg_ndim(const cg_tensor *t) { return t ? t->ndim : -1; }
int64_t cg_dim(const cg_tensor *t, int axis) {
    if (!t) return -1;
    int a = axis < 0 ? axis + t->ndim : axis;
    return a >= 0 && a < t->ndim ? t->shape[a] : -1;
}
const int64_t *cg_shape(const cg_tensor *t) { return t ? t->shape : NULL; }
const int64_t *cg_strides(const cg_tensor *t) { return t ? t->stride : NULL; }
int64_t cg_numel(const cg_tensor *t) { return t ? cgi_numel(t->ndim, t->shape) : 0; }
cg_dtype cg_tensor_dtype(const cg_tensor *t) { return t ? t->dtype : CG_REAL; }
bool cg_is_contiguous(const cg_tensor *t) { return t && cgi_contiguous(t); }
const char *cg_name(const cg_tensor *t) { return t && t->name ? t->name : ""; }
/* Values and gradients of intermediate nodes share memory once their last reader has run; only
 * leaves, outputs and retained nodes can be read after a run. */
static bool value_readable(const cg_tensor *t) {
    const cg_tensor *r = t->root;
    return r->op == CGI_OP_INPUT || r->op == CGI_OP_PARAM || (t->graph && t->graph->planned && r->kept);
}
static bool grad_readable(const cg_tensor *t) {
    const cg_tensor *r = t->root;
    return r->op == CGI_OP_INPUT || r->op == CGI_OP_PARAM || (r->retain && t->graph && t->graph->planned);
}

/* A parameter's storage handed out may be written: its bf16 copy is remade before the next use. */
static void touch(cg_tensor *t) {
    if (t && t->root && t->root->pversion) cgi_param_changed(t->root);
}

cg_real *cg_data(cg_tensor *t) {
    if (!(t && t->dtype == CG_REAL && value_readable(t))) return NULL;
    if (t->root->op == CGI_OP_PARAM) { /* the caller may write: a mapped value gets a copy of its own */
        cgi_param_run_fill(t->root);
        if (cgi_param_writable(t->root)) return NULL;
        if (t != t->root) t->data = (char *)t->root->data + t->offset * sizeof(cg_real);
    }
    touch(t);
    return t->data;
}
int32_t *cg_idata(cg_tensor *t) { return t && t->dtype == CG_INT32 && value_readable(t) ? t->data : NULL; }
cg_real *cg_grad(cg_tensor *t) {
    if (!(t && grad_readable(t))) return NULL;
    if (t->root->op == CGI_OP_PARAM) { /* the caller may keep the pointer: zero_grad must clear it at once */
        cgi_param_settle(t->root);
        t->root->grad_exposed = true;
    }
    return t->grad;
}

cg_tensor *cg_retain(cg_tensor *t) {
    if (!t) return NULL;
    cg_tensor *r = t->root;
    if (r->id >= 0 && !r->retain) {
        r->retain = true;
        r->graph->planned = r->graph->ran_forward = false;
    }
    return t;
}

static cg_status read_strided(cg_tensor *t, const cg_real *base, cg_real *dst, const char *what) {
    if (!t || !dst) return cgi_fail(CG_ERR_ARG, "[%s] NULL argument", what);
    if (t->dtype != CG_REAL) return cgi_fail(CG_ERR_ARG, "[%s] tensor%s is int32", what, cgi_shp(t));
    if (!base) return cgi_fail(CG_ERR_STATE, "[%s] tensor%s has no %s yet", what, cgi_shp(t),
                               strcmp(what, "read") ? "gradient" : "value");
    int64_t cs[CG_MAX_DIMS];
    cgi_contig_strides(t->ndim, t->shape, cs);
    cgi_copy(dst, cs, base, t->stride, t->ndim, t->shape, 1.0, false);
    return CG_OK;
}

cg_status cg_read(cg_tensor *t, cg_real *dst) {
    if (t && !value_readable(t))
        return cgi_fail(CG_ERR_STATE, "[read] %s%s is an intermediate value: cg_retain it before running", cgi_op_name_of(t),
                        cgi_shp(t));
    if (t && t->op == CGI_OP_PARAM) {
        cgi_param_run_fill(t);
        cg_status fs = cgi_param_float(t);
        if (fs) return fs;
    }
    return read_strided(t, t ? t->data : NULL, dst, "read");
}
cg_status cg_read_grad(cg_tensor *t, cg_real *dst) {
    if (t && (!t->grad || !grad_readable(t)))
        return cgi_fail(CG_ERR_STATE, "[read_grad] tensor%s has no gradient kept (cg_retain intermediate nodes)", cgi_shp(t));
    if (t && t->root->op == CGI_OP_PARAM) cgi_param_settle(t->root);
    return read_strided(t, t ? t->grad : NULL, dst, "read_grad");
}

cg_status cg_write(cg_tensor *t, const cg_real *src) {
    if (!t || !src) return cgi_fail(CG_ERR_ARG, "[write] NULL argument");
    if (t->dtype != CG_REAL) return cgi_fail(CG_ERR_ARG, "[write] tensor%s is int32: use cg_write_ids", cgi_shp(t));
    if (cgi_broadcast_view(t)) /* several of its elements are one element of storage (torch refuses too) */
        return cgi_fail(CG_ERR_ARG, "[write] tensor%s strides%s is an expanded view: several elements share one "
                        "memory location; write its source", cgi_shp(t), cgi_dims(t->ndim, t->stride));
    if (!t->data) return cgi_fail(CG_ERR_STATE, "[write] tensor%s has no storage yet", cgi_shp(t));
    cg_status ws = cgi_param_writable(t);
    if (ws) return ws;
    t->init_kind = CGI_INIT_NONE; /* a deferred fill would overwrite it */
    int64_t cs[CG_MAX_DIMS];
    cgi_contig_strides(t->ndim, t->shape, cs);
    cgi_copy(t->data, t->stride, src, cs, t->ndim, t->shape, 1.0, false);
    touch(t);
    return CG_OK;
}

cg_status cg_write_ids(cg_tensor *t, const int32_t *src) {
    if (!t || !src) return cgi_fail(CG_ERR_ARG, "[write_ids] NULL argument");
    if (t->dtype != CG_INT32 || !cgi_contiguous(t) || !t->data)
        return cgi_fail(CG_ERR_ARG, "[write_ids] tensor%s is not a contiguous int32 input", cgi_shp(t));
    memcpy(t->data, src, (size_t)cgi_numel(t->ndim, t->shape) * sizeof(int32_t));
    return CG_OK;
}

double cg_item(cg_tensor *t) {
    if (!t) return NAN; /* keeps the message of the op that failed to build it */
    if (cgi_numel(t->ndim, t->shape) != 1) {
        cgi_fail(CG_ERR_SHAPE, "[item] %s%s has %lld elements, not one", cgi_op_name_of(t), cgi_shp(t),
                 (long long)cgi_numel(t->ndim, t->shape));
        return NAN;
    }
    const bool leaf = t->root->op == CGI_OP_INPUT || t->root->op == CGI_OP_PARAM;
    if (!leaf && !t->graph->planned && t->root->retain) {
        cgi_fail(CG_ERR_STATE, "[item] %s%s has no value yet: run cg_graph_forward", cgi_op_name_of(t), cgi_shp(t));
        return NAN;
    }
    if (!value_readable(t)) {
        cgi_fail(CG_ERR_STATE, "[item] %s%s is an intermediate value, gone after the run: cg_retain it before running",
                 cgi_op_name_of(t), cgi_shp(t));
        return NAN;
    }
    if (!t->data) {
        cgi_fail(CG_ERR_STATE, "[item] %s%s has no value yet: run cg_graph_forward", cgi_op_name_of(t), cgi_shp(t));
        return NAN;
    }
    return t->dtype == CG_INT32 ? *(int32_t *)t->data : *(cg_real *)t->data;
}

void cg_print(cg_tensor *t) {
    if (!t) {
        fprintf(stderr, "tensor (null)\n");
        return;
    }
    fprintf(stderr, "%s %s%s strides%s:", cgi_op_name_of(t), cg_name(t), cgi_shp(t),
            cgi_dims(t->ndim, t->stride));
    int64_t n = cgi_numel(t->ndim, t->shape);
    if (t->data && t->dtype == CG_REAL && n <= (1 << 20)) {
        cg_real *buf = malloc((size_t)n * sizeof *buf);
        if (buf && cg_read(t, buf) == CG_OK)
            for (int64_t i = 0; i < n && i < 16; i++) fprintf(stderr, " %.6g", (double)buf[i]);
        free(buf);
    }
    fprintf(stderr, "\n");
}

/* ---- initialisation ---- */

void cg_fill(cg_tensor *t, double value) {
    if (!t || !t->data || t->dtype != CG_REAL) return;
    if (cgi_broadcast_view(t)) { /* as cg_write: refused, storage unchanged */
        cgi_fail(CG_ERR_ARG, "[fill] tensor%s is an expanded view: several elements share one memory location; fill "
                 "its source", cgi_shp(t));
        return;
    }
    if (cgi_param_defer_fill(t, NULL, CGI_INIT_CONST, value, 0)) return;
    if (cgi_param_writable(t)) return;
    t->init_kind = CGI_INIT_NONE;
    cg_real v = (cg_real)value;
    int64_t zero[CG_MAX_DIMS] = {0};
    cgi_copy(t->data, t->stride, &v, zero, t->ndim, t->shape, 1.0, false);
    touch(t);
}

static void fill_random(cg_tensor *t, cg_rng *r, double a, double b, bool normal) {
    if (!t || !r || !t->data || t->dtype != CG_REAL) return;
    if (cgi_broadcast_view(t)) { /* as cg_write: refused, storage and generator unchanged */
        cgi_fail(CG_ERR_ARG, "[fill] tensor%s is an expanded view: several elements share one memory location; fill "
                 "its source", cgi_shp(t));
        return;
    }
    if (cgi_param_defer_fill(t, r, normal ? CGI_INIT_NORMAL : CGI_INIT_UNIFORM, a, b) || cgi_param_writable(t)) return;
    t->init_kind = CGI_INIT_NONE;
    int64_t n = cgi_numel(t->ndim, t->shape);
    cg_real *buf = cgi_contiguous(t) ? t->data : malloc((size_t)n * sizeof *buf);
    if (!buf) return;
    for (int64_t i = 0; i < n; i++)
        buf[i] = (cg_real)(normal ? a + b * cg_rng_normal(r) : a + (b - a) * cg_rng_uniform(r));
    touch(t);
    if (buf != t->data) {
        cg_write(t, buf);
        free(buf);
    }
}

void cg_fill_normal(cg_tensor *t, cg_rng *r, double mean, double std) { fill_random(t, r, mean, std, true); }
void cg_fill_uniform(cg_tensor *t, cg_rng *r, double lo, double hi) { fill_random(t, r, lo, hi, false); }
