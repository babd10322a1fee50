/* SPDX-License-Identifier: MIT */
/* The memory plan. On one time axis (forward of node i at time i, its backward at 2n-1-i; with
 * checkpoint segments, recomputes slot in before each segment's backward, graph/checkpoint.c) every
 * value, gradient and op scratch buffer lives from its first write to its last read; buffers whose
 * lives do not overlap share memory. The op table says which values backward reads, so a value
 * that only forward needs dies as soon as its last consumer has run, and a gradient dies once its
 * node's backward has run. The plan is made once per graph and reused by every step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "graph/internal.h"
#include "graph/plan_place.h"
#include "ops/bf16_internal.h"

typedef cgi_plan_buffer buffer;

static size_t round_up(size_t n) { return (n + CGI_ALIGN - 1) / CGI_ALIGN * CGI_ALIGN; }

/* Whether buffer b is the scratch (forward's, or its checkpoint recompute's) of a node of op `op`. */
static bool scratch_of(const buffer *b, int op) {
    cg_tensor *t = (cg_tensor *)b->node;
    return b->kind == 'a' && t->op == op && (b->target == (void **)&t->aux || b->target == (void **)&t->alt_aux);
}

/* Memory for a little time, where it lowers the peak by a share of it (per kind, below) or more:
 * scratch of these ops live at the plan's fullest moment (a training graph's start of backward)
 * shrinks for some recompute.
 *  - Attention with every key in one block keeps its probabilities (Tq x Tk floats a head) from
 *    forward to backward, which then need not make them again; at the peak every layer's are
 *    live, and backward remakes them instead (cgi_sdpa_remake_probs), a block's scores and
 *    softmax again: gpt-small (12 layers, 4 x 12 heads of 256 x 256) 151 MB off its peak.
 *    Measured (whole steps, interleaved): no slower on gpt-small, within noise elsewhere. Where
 *    they are under an eighth of the peak they stay: bert-small's 16 MB (8% of its plan) cost a
 *    fifth of attention's backward to remake (its Q K^T product and softmax per head).
 *  - The fused LM head's chunk of logits: half the rows (cgi_lce_halve_chunks), gpt-small 58 MiB
 *    off its peak, but its step took 1.06x the CPU time (each chunk packs all of W again), so
 *    only when asked: CGRAD_HEAD_CHUNK=auto (at the peak) or =halve (wherever it can).
 * Repeated while the peak moves to another moment where one is live. CGRAD_ATTN_PROBS=keep keeps
 * the probabilities, =remake remakes them all, =auto (the default) at the peak. */
static const struct {
    int op;
    const char *env;
    bool by_default; /* auto without the environment variable; else keep */
    int share;       /* auto shrinks where that frees 1/share of the peak or more */
    size_t (*shrink)(cg_tensor *, bool apply);
} shrinks[] = {{CGI_OP_ATTENTION, "CGRAD_ATTN_PROBS", true, 8, cgi_sdpa_remake_probs},
               {CGI_OP_LINEAR_CROSS_ENTROPY, "CGRAD_HEAD_CHUNK", false, 64, cgi_lce_halve_chunks}};
enum { NS_ALL = sizeof shrinks / sizeof shrinks[0] }; /* every shrink */

static void shrink_at_peak(buffer *bufs, int nb, int64_t end, int nshrink) {
    const int NS = nshrink < NS_ALL ? nshrink : NS_ALL;
    bool off[NS_ALL], all[NS_ALL];
    for (int k = 0; k < NS; k++) {
        const char *env = getenv(shrinks[k].env);
        off[k] = env ? !strcmp(env, "keep") : !shrinks[k].by_default;
        all[k] = env && !off[k] && strcmp(env, "auto"); /* remake, halve: wherever it shrinks */
    }
    for (bool changed = true; changed;) {
        changed = false;
        int64_t peak;
        const int64_t at = cgi_plan_peak_time(bufs, nb, end, &peak);
        if (at < 0) return;
        for (int k = 0; k < NS; k++) {
            size_t saved = 0; /* by every such scratch live at the peak */
            for (int pass = 0; pass < 2 && !off[k]; pass++) {
                for (int i = 0; i < nb; i++)
                    if (scratch_of(&bufs[i], shrinks[k].op) && (all[k] || (bufs[i].birth <= at && at <= bufs[i].death)))
                        saved += shrinks[k].shrink((cg_tensor *)bufs[i].node, pass == 1);
                if (pass == 0 && (saved == 0 || (!all[k] && saved < (size_t)peak / (size_t)shrinks[k].share))) break;
                changed |= pass == 1;
            }
        }
        for (int i = 0; changed && i < nb; i++)
            for (int k = 0; k < NS; k++) {
                const cg_tensor *t = bufs[i].node;
                if (scratch_of(&bufs[i], shrinks[k].op)) bufs[i].bytes = round_up(t->aux_bytes);
                else if (t->op == shrinks[k].op && bufs[i].target == &((cg_tensor *)t)->bwd_aux)
                    bufs[i].bytes = round_up(t->bwd_aux_bytes); /* a remake's own scratch, in backward */
            }
    }
}

/* Parameters whose value is half precision read in place (cg_param_map) get their float before any
 * op that reads them as float runs: every reader but those that read the half as it is
 * (cgi_reads_half, ops/half.c). */
static cg_status widen_params(cg_graph *g) {
    for (int64_t c = 0; c < g->n; c++) {
        const cg_tensor *t = g->nodes[c];
        for (int k = 0; k < t->nsrc; k++) {
            cg_tensor *r = t->src[k]->root;
            if (r->op != CGI_OP_PARAM || r->store != CGI_STORE_HALF || r->widened) continue;
            if (cgi_reads_half(g, t, k)) continue;
            cg_status st = cgi_param_float(r);
            if (st) return st;
        }
    }
    return CG_OK;
}

/* With the optimizer inside backward (cg_optim_attach), each trainable parameter's gradient is a
 * buffer of the plan: born at the backward of its last reader in build order (the first rule to
 * write it) and dead after the backward of its first, where its gradient is final and the update
 * consumes it. Only the parameters of the layers backward is passing through hold a gradient, not
 * all of them from backward's start to the optimizer step. ready_at serves as each parameter's
 * index while the list is made (a backward with a ready callback sets it again).
 * The fused LM head computes its gradients in forward while each chunk's logits are in cache
 * (ops/loss_head.c); a backward that has to make them again recomputes every chunk but the last, an
 * extra [chunk, d] x [d, V] product each: 3 of encdec-base's 4 chunks. So where the head's backward
 * is its weight's first writer, that gradient is born at the head's forward instead, if that does
 * not raise the plan's peak: the head is the last forward node, and the start of backward, where
 * the gradient is live anyway, is the peak of the zoo's LM graphs (gpt-small's 154 MB gradient,
 * a tied head's: 675 MB at the head's backward either way). A peak it would raise wins over the
 * recompute: memory is what the plan is for. */
static void plan_head_ahead(cg_graph *g, const int64_t *bt, buffer *bufs, int nb, buffer *pb, int np, int64_t end) {
    for (int64_t c = 0; c < g->n; c++) {
        cg_tensor *t = g->nodes[c];
        if (t->op != CGI_OP_LINEAR_CROSS_ENTROPY || !cgi_lce_ahead_plannable(t)) continue;
        const cg_tensor *w = t->src[1];
        const int j = w->ready_at;
        if (j < 0 || j >= np || pb[j].node != w || pb[j].birth != bt[c]) continue; /* another rule writes it first */
        int64_t before, after;
        if (cgi_plan_peak_time(bufs, nb, end, &before) < 0) return;
        pb[j].birth = c;
        if (cgi_plan_peak_time(bufs, nb, end, &after) < 0 || after > before) {
            pb[j].birth = bt[c];
            continue;
        }
        cgi_lce_set_planned_grad(t, j);
    }
}

static cg_status plan_param_grads(cg_graph *g, const int64_t *bt, buffer *bufs, int *nb, int64_t end) {
    buffer *pb = bufs + *nb;
    int np = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int64_t c = 0; c < g->n; c++) {
            const cg_tensor *t = g->nodes[c];
            if (!t->requires_grad || cgi_ops[t->op].kind != CGI_KIND_COMPUTE) continue;
            for (int k = 0; k < t->nsrc; k++) {
                cg_tensor *p = t->src[k]->root;
                if (p->op != CGI_OP_PARAM || !t->src[k]->requires_grad || !p->grad) continue;
                if (pass == 0) {
                    p->ready_at = -1;
                } else if (p->ready_at < 0) { /* its first reader: a new buffer */
                    p->ready_at = np;
                    pb[np++] = (buffer){bt[c], bt[c], round_up((size_t)cgi_numel(p->ndim, p->shape) * sizeof(cg_real)),
                                        0, NULL, p, 'g'};
                } else {
                    buffer *b = &pb[p->ready_at];
                    if (bt[c] < b->birth) b->birth = bt[c];
                    if (bt[c] > b->death) b->death = bt[c];
                }
            }
        }
    plan_head_ahead(g, bt, bufs, *nb + np, pb, np, end);
    g->pgrad = np ? cgi_arena_alloc(&g->meta, (size_t)np * sizeof *g->pgrad) : NULL;
    if (np && !g->pgrad) return cgi_fail(CG_ERR_NOMEM, "[plan] out of memory for %d parameter gradients", np);
    for (int j = 0; j < np; j++) {
        cg_tensor *p = (cg_tensor *)pb[j].node;
        g->pgrad[j] = (struct cgi_pgrad){p, NULL, NULL};
        pb[j].target = (void **)&g->pgrad[j].grad;
        p->ready_at = -1;
    }
    g->npgrad = np;
    *nb += np;
    return CG_OK;
}

/* A fused linear + GELU remakes its output from the product it keeps, one elementwise pass; a layer
 * norm from its input and the statistics its own backward keeps, one pass over the input, and a
 * residual add + layer norm from the sum it keeps; so does a GELU (a bf16 graph's, after its
 * linear). A value stored in bf16 (cgi_lp_plan_values) is remade in bf16 by the same forward:
 * gpt-small's bf16 step keeps 113 MB of them otherwise, and without the GELUs' bf16 would sit above
 * fp32 on bert-small (324 MiB against 315). The price: gpt-tiny's bf16 step took 1.05x the CPU time
 * of CGRAD_REGEN=0 (4 interleaved steps each, load 2.3). */
bool cgi_regen_ok(const cg_tensor *t) {
    if (t->dtype != CG_REAL) return false;
    if (t->op == CGI_OP_LINEAR_ACT) return t->iarg[0] != CGI_ACT_RELU && t->graph->precision != CG_BF16 && !t->lp_value;
    if (t->op == CGI_OP_ADD_LAYERNORM) return t->iarg[2]; /* from the residual sum it keeps */
    return t->op == CGI_OP_LAYERNORM || t->op == CGI_OP_GELU || t->op == CGI_OP_GELU_TANH;
}

void cgi_regen(cg_tensor *t) {
    if (t->op == CGI_OP_LINEAR_ACT) cgi_linear_act_regen(t);
    else if (t->op == CGI_OP_ADD_LAYERNORM || t->op == CGI_OP_LAYERNORM) cgi_norm_regen(t); /* from its statistics */
    else cgi_ops[t->op].forward(t);
}

/* a's gradient could hold another's buffer or lend it its own: a node of its own, computed, in float,
 * whose gradient nothing reads after the run and that no other rule writes in place of its value;
 * not in a bf16 graph, whose linears may turn their dY into bf16 in place (ops/matmul.c). */
static bool grad_shareable(const cg_tensor *a, const bool *consumed) {
    return a->root == a && a->id >= 0 && cgi_ops[a->op].kind == CGI_KIND_COMPUTE && a->requires_grad && !a->retain &&
           consumed[a->id] && !a->grad_in_value && a->dtype == CG_REAL &&
           a->graph->precision != CG_BF16;
}

/* Whether node i's summand x can give its gradient buffer to the other summand r: x is a linear's
 * output that only node i reads, and no node other than i reads r from that linear on, so the
 * linear's backward reads x's gradient as its dY before any other rule adds into r's. */
static bool linear_summand(const cg_graph *g, int64_t i, const cg_tensor *x, const cg_tensor *r, const int *consumers) {
    if (x->op != CGI_OP_LINEAR || consumers[x->id] != 1) return false;
    for (int64_t j = x->id; j < g->n; j++)
        for (int k = 0; j != i && k < g->nodes[j]->nsrc; k++)
            if (g->nodes[j]->src[k]->root == r) return false;
    return true;
}

/* A post-LN block's add_layernorm y = LN(r + x) writes one gradient, dS, to both summands. Where
 * one of them, x, is a linear's output that nothing else reads, and every other reader of the other,
 * r (the residual stream: the block's first linears read it), comes before that linear in the graph,
 * r takes x's gradient buffer and the op writes it once (ops/norm.c): the linear's backward reads
 * x's gradient as its dY before any other rule adds into r's, which starts equal to dS, as it must.
 * Both are born at the norm's backward (it is their first writer); neither holds another's buffer or
 * lends its own. bert-small: a pass writing 2 MB fewer per norm. */
static bool share_norm_summand(cg_graph *g, int64_t i, cg_tensor *x, cg_tensor *r, const bool *consumed,
                               const int *consumers, const int64_t *bt, const int64_t *gbirth, int64_t *gown,
                               int64_t *gdeath) {
    if (!grad_shareable(x, consumed) || !grad_shareable(r, consumed) || x == r || gown[x->id] >= 0 ||
        gown[r->id] >= 0 || gbirth[x->id] != bt[i] || gbirth[r->id] != bt[i] || !linear_summand(g, i, x, r, consumers))
        return false;
    for (int64_t j = 0; j < g->n; j++)
        if (gown[j] == x->id || gown[j] == r->id) return false;
    gown[r->id] = x->id;
    if (gdeath[x->id] < gdeath[r->id]) gdeath[x->id] = gdeath[r->id];
    return true;
}

static void share_norm_summands(cg_graph *g, const bool *consumed, const int *consumers, const int64_t *bt,
                                const int64_t *gbirth, int64_t *gown, int64_t *gdeath) {
    for (int64_t i = 0; i < g->n; i++) {
        cg_tensor *y = g->nodes[i];
        if (y->op != CGI_OP_ADD_LAYERNORM || !y->iarg[2] || !y->requires_grad) continue;
        /* the sublayer is the second summand in the zoo's blocks (cg_post_ln_residual) */
        if (!share_norm_summand(g, i, y->src[1], y->src[0], consumed, consumers, bt, gbirth, gown, gdeath))
            share_norm_summand(g, i, y->src[0], y->src[1], consumed, consumers, bt, gbirth, gown, gdeath);
    }
}

/* Values backward can remake from what their own backward keeps (cgi_regen_ok) live only through
 * forward; backward remakes each into a buffer of its own before its first backward reader
 * (graph/autodiff.c): all of them, or those pick marks (by node index). Not under checkpointing
 * (whose recompute has the same buffer), nor for a value read through a view or read after the
 * run. */
static void decide_regen(cg_graph *g, bool on, const bool *pick) {
    for (int64_t i = 0; i < g->n; i++) {
        cg_tensor *t = g->nodes[i];
        t->regen = on && (!pick || pick[i]) && t->root == t && !t->kept && t->requires_grad && cgi_regen_ok(t);
        t->regen_live = false;
        t->regen_at = -1;
    }
    for (int64_t i = 0; i < g->n; i++)
        if (g->nodes[i]->root != g->nodes[i]) g->nodes[i]->root->regen = false;
    /* a remake reads inputs' values as forward did (a fused GELU only its bias, a residual add +
     * layer norm only its gain and bias): not remade ones */
    for (int64_t i = 0; i < g->n; i++) {
        cg_tensor *t = g->nodes[i];
        const int first = t->op == CGI_OP_LINEAR_ACT || t->op == CGI_OP_ADD_LAYERNORM ? 2 : 0;
        for (int k = first; t->regen && k < t->nsrc; k++) t->regen = !t->src[k]->root->regen;
    }
    /* A bf16 graph's shadowed value (a post-LN block's output, cgi_lp_plan_values) that is remade
     * needs no bf16 copy from forward to backward: its linears convert the remade float instead. */
    for (int64_t i = 0; i < g->n; i++)
        if (g->nodes[i]->regen && g->nodes[i]->lp_shadowed) g->nodes[i]->lp_shadowed = false, g->nodes[i]->lp_shadow = NULL;
}

/* Node c, whose backward at time back reads r's remade value: the buffer's life, and the first reader. */
static void regen_reader(cg_tensor *r, int64_t c, int64_t back, int64_t *rbirth, int64_t *rdeath) {
    if (back < rbirth[r->id]) rbirth[r->id] = back, r->regen_at = (int)c;
    if (back > rdeath[r->id]) rdeath[r->id] = back;
}

/* What one plan of g needs: each node's storage decisions (bf16 values, attention's kept
 * probabilities, checkpoint recomputes, remade values if regen_on: all, or those pick marks),
 * every buffer's life, and the first nshrink of the shrinks at the peak. */
typedef struct {
    int64_t *vdeath, *rdeath, *rbirth, *gbirth, *bt, *rt, *sdeath, *gown, *gdeath;
    int *consumers, *sole;
    bool *consumed;
    buffer *bufs;
    int nb;
    int64_t end;
} plan_ctx;

static cg_status plan_buffers(cg_graph *g, plan_ctx *pc, bool regen_on, const bool *pick, int nshrink) {
    const int64_t n = g->n;
    int64_t *vdeath = pc->vdeath, *rdeath = pc->rdeath, *rbirth = pc->rbirth, *gbirth = pc->gbirth, *bt = pc->bt,
            *rt = pc->rt, *sdeath = pc->sdeath, *gown = pc->gown, *gdeath = pc->gdeath;
    const int *consumers = pc->consumers, *sole = pc->sole;
    const bool *consumed = pc->consumed;
    buffer *bufs = pc->bufs;
    int nb = 0;
    cg_status st = CG_OK;
    g->npgrad = 0, g->pgrad = NULL;
    cgi_lp_plan_values(g, consumers); /* bf16 graphs: values stored at half size */
    for (int64_t i = 0; i < n; i++) /* and attention's kept probabilities, the LM head's chunks */
        if (g->nodes[i]->op == CGI_OP_ATTENTION) cgi_sdpa_plan(g->nodes[i]);
        else if (g->nodes[i]->op == CGI_OP_LINEAR_CROSS_ENTROPY) cgi_lce_plan(g->nodes[i]);
    /* Checkpoint segments add a recompute to the time axis; without them node i's backward is at 2n-1-i. */
    cgi_ckpt_decide(g, consumers, sole);
    const int64_t end = cgi_ckpt_timeline(g, bt, rt);
    decide_regen(g, regen_on, pick);
    for (int64_t i = 0; i < n; i++) {
        vdeath[i] = sdeath[i] = i;
        rdeath[i] = rt[i];
        rbirth[i] = gbirth[i] = INT64_MAX;
    }
#define LIVE_TO(arr, i, tm) do { if ((arr)[i] < (tm)) (arr)[i] = (tm); } while (0)
    for (int64_t c = 0; c < n; c++) {
        cg_tensor *t = g->nodes[c];
        const cgi_op_desc *d = &cgi_ops[t->op];
        const int64_t back = bt[c];
        for (int k = 0; k < t->nsrc; k++) {
            cg_tensor *r = t->src[k]->root;
            if (r->id < 0) continue;
            /* a reader in r's own segment reads r's recomputed value, if r has one, after forward */
            int64_t *late = r->recompute && r->seg == t->seg ? rdeath : vdeath;
            LIVE_TO(vdeath, r->id, c);
            if (t->recompute) LIVE_TO(late, r->id, rt[c]);
            /* a linear's backward reads a shadowed input's bf16 copy, not its float value */
            if (t->requires_grad && k < 32 && (cgi_bwd_reads(t) & (1u << k))) {
                if (r->regen) regen_reader(r, c, back, rbirth, rdeath);
                else LIVE_TO(r->lp_shadowed && cgi_is_linear(t) && k == 0 ? sdeath : late, r->id, back);
            }
            if (t->requires_grad && t->src[k]->requires_grad && d->kind == CGI_KIND_COMPUTE && gbirth[r->id] > back)
                gbirth[r->id] = back;
        }
        if (t->requires_grad && cgi_bwd_reads_out(t)) {
            if (t->regen) regen_reader(t, c, back, rbirth, rdeath);
            else LIVE_TO(t->recompute ? rdeath : vdeath, c, back);
        }
    }
#undef LIVE_TO
    for (int64_t i = 0; i < n; i++) /* nothing reads it in backward: forward's value is all there is */
        if (g->nodes[i]->regen && rbirth[i] == INT64_MAX) g->nodes[i]->regen = false;
    for (int64_t i = 0; i < n; i++) {
        cg_tensor *t = g->nodes[i];
        gown[i] = -1;
        gdeath[i] = bt[i];
        if (t->root != t) continue;
        /* Logits read only by a fused loss that writes their gradient in place share one buffer:
         * the value's life ends where the gradient's begins. */
        const cg_tensor *reader = consumers[i] == 1 && sole[i] >= 0 ? g->nodes[sole[i]] : NULL;
        t->grad_in_value = reader && (cgi_ops[reader->op].bwd_grad & CGI_GRAD_OVER_VALUE) && reader->src[0] == t &&
                           reader->requires_grad &&
                           t->requires_grad && !(t->retain || !consumed[i]) && cgi_ops[t->op].kind == CGI_KIND_COMPUTE &&
                           t->dtype == CG_REAL && vdeath[i] == bt[reader->id];
    }
    /* A residual add y = a + b whose backward is the first to write a's gradient (the add is a's
     * last reader) gives a its own gradient's buffer: y's gradient dies as a's is born, and a's
     * gradient starts equal to y's, so the add's copy is gone (cgi_bwd_add sees the same pointer).
     * Chains (x -> x + f(x) -> ...) share one buffer: the members' lives follow one another, so no
     * rule ever sees two of them live at once except the add between them. Later indices first: y's
     * own owner is known when a's is decided. A linear_add y = r + x w^T is such an add for r
     * (cgi_bwd_linear_add reads y's gradient as the product's dY before r's rule adds into it). */
    for (int64_t i = n - 1; i >= 0; i--) {
        cg_tensor *y = g->nodes[i];
        const bool lin = y->op == CGI_OP_LINEAR_ADD;
        if ((y->op != CGI_OP_ADD && !lin) || y->root != y || !y->requires_grad || y->retain || !consumed[i] ||
            y->grad_in_value || (!lin && y->src[0]->root == y->src[1]->root))
            continue;
        bool shared = false; /* r's storage read or written as another source's too */
        for (int k = 0; lin && k < y->nsrc; k++) shared |= k != y->iarg[1] && y->src[k]->root == y->src[y->iarg[1]]->root;
        if (shared) continue;
        for (int k = lin ? (int)y->iarg[1] : 0; k < (lin ? (int)y->iarg[1] + 1 : 2); k++) {
            cg_tensor *a = y->src[k];
            if (a->root != a || a->id < 0 || cgi_ops[a->op].kind != CGI_KIND_COMPUTE || !a->requires_grad || a->retain ||
                !consumed[a->id] || a->grad_in_value || a->dtype != CG_REAL || a->ndim != y->ndim ||
                memcmp(a->shape, y->shape, (size_t)y->ndim * sizeof *y->shape) || gbirth[a->id] != bt[i])
                continue;
            const int64_t own = gown[i] >= 0 ? gown[i] : i;
            gown[a->id] = own;
            if (gdeath[own] < bt[a->id]) gdeath[own] = bt[a->id];
            /* A pre-LN block's residual add y = r + x, x a linear's output read by nothing else: both
             * gradients are y's, so the other summand takes the buffer as well (cgi_bwd_add copies
             * nothing), when no reader of r comes after that linear, whose backward reads x's gradient
             * as its dY before any other rule adds into r's (as for add_layernorm, share_norm_summand). */
            cg_tensor *b = lin ? NULL : y->src[1 - k];
            const cg_tensor *x = b && b->op == CGI_OP_LINEAR ? b : a, *r = x == b ? a : b;
            if (b && grad_shareable(b, consumed) && gown[b->id] < 0 && gbirth[b->id] == bt[i] && b->ndim == y->ndim &&
                !memcmp(b->shape, y->shape, (size_t)y->ndim * sizeof *y->shape) && linear_summand(g, i, x, r, consumers)) {
                gown[b->id] = own;
                if (gdeath[own] < bt[b->id]) gdeath[own] = bt[b->id];
            }
            break;
        }
    }
    share_norm_summands(g, consumed, consumers, bt, gbirth, gown, gdeath);
    for (int64_t i = 0; i < n; i++) {
        cg_tensor *t = g->nodes[i];
        if (t->root != t) continue;
        const int64_t back = bt[i];
        bool outlives = t->retain || !consumed[i];
        /* bf16 products convert their operands into scratch that lives only while they run */
        t->lp_tmp[0] = t->lp_tmp[1] = t->lp_alt = NULL;
        if (g->precision == CG_BF16 && cgi_ops[t->op].kind == CGI_KIND_COMPUTE) {
            const size_t f = cgi_lp_scratch_bytes(t, false), b = t->requires_grad ? cgi_lp_scratch_bytes(t, true) : 0;
            if (f) bufs[nb++] = (buffer){i, i, round_up(f), 0, &t->lp_tmp[0], t, 'a'};
            if (f && t->recompute) bufs[nb++] = (buffer){rt[i], rt[i], round_up(f), 0, &t->lp_alt, t, 'a'};
            if (b) bufs[nb++] = (buffer){back, back, round_up(b), 0, &t->lp_tmp[1], t, 'a'};
        }
        if (t->bwd_aux_bytes && t->requires_grad && cgi_ops[t->op].kind == CGI_KIND_COMPUTE)
            bufs[nb++] = (buffer){back, back, round_up(t->bwd_aux_bytes), 0, &t->bwd_aux, t, 'a'};
        t->fwd_aux = t->fwd_alt = NULL;
        if (t->fwd_aux_bytes && cgi_ops[t->op].kind == CGI_KIND_COMPUTE) {
            bufs[nb++] = (buffer){i, i, round_up(t->fwd_aux_bytes), 0, &t->fwd_aux, t, 'a'};
            if (t->recompute) bufs[nb++] = (buffer){rt[i], rt[i], round_up(t->fwd_aux_bytes), 0, &t->fwd_alt, t, 'a'};
        }
        if (t->grad_in_value) {
            bufs[nb++] = (buffer){i, back, round_up((size_t)cgi_numel(t->ndim, t->shape) * sizeof(cg_real)), 0, &t->data, t, 'v'};
            if (t->aux_bytes) bufs[nb++] = (buffer){i, back, round_up(t->aux_bytes), 0, &t->aux, t, 'a'};
            continue;
        }
        if (cgi_ops[t->op].kind == CGI_KIND_COMPUTE && !(cgi_ops[t->op].bwd_grad & CGI_OUT_IN_SRC0)) {
            size_t es = t->dtype == CG_INT32 ? sizeof(int32_t) : t->lp_value ? sizeof(cgi_bf16) : sizeof(cg_real);
            size_t vbytes = round_up((size_t)cgi_numel(t->ndim, t->shape) * es);
            bufs[nb++] = (buffer){i, outlives ? end : vdeath[i], vbytes, 0, &t->data, t, 'v'};
            if (t->lp_shadowed) /* written right after the value, read until the last linear's backward */
                bufs[nb++] = (buffer){i, sdeath[i], round_up((size_t)cgi_numel(t->ndim, t->shape) * sizeof(cgi_bf16)), 0,
                                      &t->lp_shadow, t, 'a'};
            /* a recomputed node's forward scratch is forward's alone; its recompute's serves backward */
            if (t->aux_bytes)
                bufs[nb++] = (buffer){i, t->requires_grad && !t->recompute ? back : i, round_up(t->aux_bytes), 0, &t->aux, t, 'a'};
            if (t->regen && rbirth[i] != INT64_MAX) /* the remade value, from its first backward reader to its last */
                bufs[nb++] = (buffer){rbirth[i], rdeath[i], vbytes, 0, &t->alt_data, t, 'r'};
            if (t->recompute) {
                bufs[nb++] = (buffer){rt[i], rdeath[i], vbytes, 0, &t->alt_data, t, 'r'};
                if (t->aux_bytes)
                    bufs[nb++] = (buffer){rt[i], t->requires_grad ? back : rt[i], round_up(t->aux_bytes), 0, &t->alt_aux, t, 'a'};
            }
        }

        if (t->requires_grad && t->op != CGI_OP_INPUT && gown[i] < 0) {
            int64_t birth = gbirth[i] == INT64_MAX ? back : gbirth[i];
            bufs[nb++] = (buffer){birth, t->retain ? end : gdeath[i],
                                  round_up((size_t)cgi_numel(t->ndim, t->shape) * sizeof(cg_real)), 0, (void **)&t->grad, t, 'g'};
        }
        if (t->requires_grad && t->op == CGI_OP_INPUT && !t->grad) { /* the caller reads it after backward */
            t->grad = cgi_arena_alloc(&g->bufs, round_up((size_t)cgi_numel(t->ndim, t->shape) * sizeof(cg_real)));
            if (!t->grad) {
                st = CG_ERR_NOMEM;
                goto out;
            }
            memset(t->grad, 0, (size_t)cgi_numel(t->ndim, t->shape) * sizeof(cg_real)); /* read before any backward */
        }
    }
    if (g->param_grads_planned && (st = plan_param_grads(g, bt, bufs, &nb, end))) goto out;
    shrink_at_peak(bufs, nb, end, nshrink);
out:
    pc->nb = nb;
    pc->end = end;
    return st;
}

/* What remaking t costs, in units of a layer norm's pass over one element: measured on bert-small's
 * bf16 step (CGRAD_PROFILE=1, one thread), a layer norm's forward takes 0.2 ns an element and a
 * GELU's (erf) 0.41, so a GELU (erf or tanh) counts 2. */
static double regen_cost(const cg_tensor *t) {
    const double w = t->op == CGI_OP_GELU || t->op == CGI_OP_GELU_TANH || t->op == CGI_OP_LINEAR_ACT ? 2 : 1;
    return w * (double)cgi_numel(t->ndim, t->shape);
}

typedef struct {
    int64_t id;
    size_t saved; /* bytes live at the peak that remaking it frees: its value, and its bf16 shadow */
    double cost;
} regen_choice;

/* Cheapest recompute per byte saved first (a*b products: no division by a zero saving); then by
 * node, so the choice is deterministic. */
static int by_cost_per_byte(const void *a, const void *b) {
    const regen_choice *x = a, *y = b;
    const double l = x->cost * (double)y->saved, r = y->cost * (double)x->saved;
    if (l != r) return l < r ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Adds to pick the values (of cand, not yet picked) cheapest to remake per byte they free at the
 * peak (time at), until they free excess bytes. Returns how many it added. */
static int pick_at_peak(const cg_graph *g, const plan_ctx *pc, int64_t at, size_t excess, const bool *cand, bool *pick,
                        regen_choice *ch, int *slot) {
    int nc = 0;
    for (int i = 0; i < pc->nb; i++) {
        const buffer *b = &pc->bufs[i];
        cg_tensor *t = (cg_tensor *)b->node;
        if (t->id < 0 || t->id >= g->n || g->nodes[t->id] != t || !cand[t->id] || pick[t->id]) continue;
        if (b->birth > at || at > b->death) continue;
        if (!(b->kind == 'v' && b->target == &t->data) && !(b->kind == 'a' && b->target == &t->lp_shadow)) continue;
        if (slot[t->id] < 0) slot[t->id] = nc, ch[nc++] = (regen_choice){t->id, 0, regen_cost(t)};
        ch[slot[t->id]].saved += b->bytes;
    }
    for (int k = 0; k < nc; k++) slot[ch[k].id] = -1;
    qsort(ch, (size_t)nc, sizeof *ch, by_cost_per_byte);
    size_t freed = 0;
    int added = 0;
    for (int k = 0; k < nc && freed < excess; k++) {
        pick[ch[k].id] = true;
        freed += ch[k].saved;
        added++;
    }
    return added;
}

/* Prints which values the bf16 plan remakes and against which line (CGRAD_PLAN=1). */
static void print_regen(const cg_graph *g, int ncand, double ms) {
    int nr = 0;
    for (int64_t i = 0; i < g->n; i++) nr += g->nodes[i]->regen;
    const bool kb = g->regen_line < 10000000; /* a small graph's bytes in kB, where MB would show them equal */
    const double unit = kb ? 1e3 : 1e6;
    fprintf(stderr, "[plan] bf16 remakes %d of %d values: peak %.1f %s with the weight copies, fp32's %.1f %s; %d plans, "
            "%.2f ms%s\n", nr, ncand, (double)g->regen_peak / unit, kb ? "kB" : "MB", (double)g->regen_line / unit,
            kb ? "kB" : "MB", g->regen_plans, ms, g->regen_peak > g->regen_line ? " (above it: every value remade)" : "");
    if (!nr) return;
    fprintf(stderr, "  remade:");
    for (int64_t i = 0, shown = 0; i < g->n; i++) {
        const cg_tensor *t = g->nodes[i];
        if (!t->regen) continue;
        if (shown > 0 && shown % 8 == 0) fprintf(stderr, "\n         ");
        fprintf(stderr, " %s#%lld%s", cgi_ops[t->op].name, (long long)i, cgi_shp(t));
        shown++;
    }
    fprintf(stderr, "\n");
}

/* Plans a bf16 graph that remakes only as many values as keep its peak, the bf16 weight copies
 * outside the plan added, at or below the same graph's fp32 peak (its values in float, remade
 * wherever cgi_regen_ok allows, attention's probabilities remade at the peak). Its values take
 * half a float's bytes, so a remake mostly buys memory below what fp32 needs anyway, at the price
 * of a pass (a layer norm's, a GELU's): gpt-tiny's bf16 plan without any is 198 MB against fp32's
 * 224 and remakes none. Above the line, each round takes the values live at the peak that are
 * cheapest to remake per byte they free there (regen_cost: layer norms before GELUs), just enough
 * of them to close the gap, and plans again, as the peak may move. The plans number at most
 * REGEN_ROUNDS + 3 (fp32's, none remade, a round's each, the fallback), each linear in the buffers
 * but for its sorts: gpt-small (37 values that can be remade, 610 buffers) takes 4 plans, 0.2 ms
 * in all, and remakes 29 (its 25 layer norms, 4 of its 12 GELUs). Still above after them, every
 * value that can be remade is (the fallback, which no zoo config reaches). The plan is left in pc;
 * ncand_out: how many values could be remade. */
enum { REGEN_ROUNDS = 8 };

static cg_status plan_bf16_regen(cg_graph *g, plan_ctx *pc, size_t copies, size_t line, int *ncand_out) {
    const int64_t n1 = g->n ? g->n : 1;
    bool *cand = calloc((size_t)n1, sizeof *cand), *pick = calloc((size_t)n1, sizeof *pick);
    regen_choice *ch = malloc((size_t)n1 * sizeof *ch);
    int *slot = malloc((size_t)n1 * sizeof *slot); /* a node's entry in ch, -1 for none */
    cg_status st = CG_OK;
    if (!cand || !pick || !ch || !slot) {
        st = cgi_fail(CG_ERR_NOMEM, "[plan] out of memory for %lld nodes", (long long)g->n);
        goto done;
    }
    decide_regen(g, true, NULL); /* the candidates; the plans below decide every node's flags again */
    int ncand = 0;
    for (int64_t i = 0; i < g->n; i++) ncand += cand[i] = g->nodes[i]->regen, slot[i] = -1;
    *ncand_out = ncand;
    for (int round = 0;; round++) {
        if ((st = plan_buffers(g, pc, true, pick, NS_ALL))) goto done;
        g->regen_plans++;
        int64_t peak;
        const int64_t at = cgi_plan_peak_time(pc->bufs, pc->nb, pc->end, &peak);
        if (at < 0) break; /* no memory to count: the fallback */
        g->regen_peak = (size_t)peak + copies;
        if (g->regen_peak <= line) goto done;
        if (round == REGEN_ROUNDS || !pick_at_peak(g, pc, at, g->regen_peak - line, cand, pick, ch, slot)) break;
    }
    if ((st = plan_buffers(g, pc, true, NULL, NS_ALL))) goto done;
    g->regen_plans++;
    int64_t peak;
    g->regen_peak = cgi_plan_peak_time(pc->bufs, pc->nb, pc->end, &peak) >= 0 ? (size_t)peak + copies : 0;
done:
    free(cand);
    free(pick);
    free(ch);
    free(slot);
    return st;
}

/* fp32 graphs remake every value they can; bf16 graphs as many as keep them at or below fp32
 * (plan_bf16_regen). CGRAD_REGEN=0 remakes none, =all every one in bf16 too. */
static cg_status plan_with_regen(cg_graph *g, plan_ctx *pc) {
    const char *env = getenv("CGRAD_REGEN");
    const bool on = !g->checkpointing && !(env && !strcmp(env, "0"));
    g->regen_peak = g->regen_line = 0;
    g->regen_plans = 0;
    if (!on || g->precision != CG_BF16 || (env && !strcmp(env, "all"))) {
        cg_status st = plan_buffers(g, pc, on, NULL, NS_ALL);
        int64_t peak;
        if (!st && cgi_plan_peak_time(pc->bufs, pc->nb, pc->end, &peak) >= 0) g->regen_peak = (size_t)peak + cgi_lp_copy_bytes(g);
        return st;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    g->precision = CG_FP32; /* the plan the graph would get in fp32: its peak only */
    cg_status st = plan_buffers(g, pc, true, NULL, 1);
    g->precision = CG_BF16;
    if (st) return st;
    g->regen_plans = 1;
    int64_t fp32_peak;
    if (cgi_plan_peak_time(pc->bufs, pc->nb, pc->end, &fp32_peak) < 0) return plan_buffers(g, pc, true, NULL, NS_ALL);
    g->regen_line = (size_t)fp32_peak;
    int ncand = 0;
    if ((st = plan_bf16_regen(g, pc, cgi_lp_copy_bytes(g), g->regen_line, &ncand))) return st;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (getenv("CGRAD_PLAN"))
        print_regen(g, ncand, (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
    return CG_OK;
}
cg_status cgi_plan(cg_graph *g) {
    cg_status wst = widen_params(g);
    if (wst) return wst;
    g->npgrad = 0, g->pgrad = NULL;
    const int64_t n = g->n, n1 = n ? n : 1;
    int64_t *vdeath = malloc((size_t)n1 * sizeof *vdeath);
    int64_t *rdeath = malloc((size_t)n1 * sizeof *rdeath), *rbirth = malloc((size_t)n1 * sizeof *rbirth);
    int64_t *gbirth = malloc((size_t)n1 * sizeof *gbirth);
    int64_t *bt = malloc((size_t)n1 * sizeof *bt), *rt = malloc((size_t)n1 * sizeof *rt);
    int64_t *sdeath = malloc((size_t)n1 * sizeof *sdeath);
    int64_t *gown = malloc((size_t)n1 * sizeof *gown), *gdeath = malloc((size_t)n1 * sizeof *gdeath);
    int64_t nsrc_all = 0; /* bounds the parameters the plan may give a gradient buffer */
    for (int64_t c = 0; c < n; c++) nsrc_all += g->nodes[c]->nsrc;
    const size_t nbuf_max = (size_t)(12 * n + nsrc_all + 1);
    buffer *bufs = malloc(nbuf_max * sizeof *bufs);
    buffer **order = malloc(nbuf_max * sizeof *order);
    bool *consumed = malloc((size_t)n1 * sizeof *consumed);
    cg_status st = CG_OK;
    int *consumers = NULL, *sole = NULL;
    if (!vdeath || !rdeath || !rbirth || !sdeath || !gbirth || !bt || !rt || !bufs || !order || !consumed || !gown || !gdeath) {
        st = cgi_fail(CG_ERR_NOMEM, "[plan] out of memory for %lld nodes", (long long)n);
        goto done;
    }
    consumers = calloc((size_t)n1, sizeof *consumers);
    sole = calloc((size_t)n1, sizeof *sole);
    if (!consumers || !sole) {
        st = cgi_fail(CG_ERR_NOMEM, "[plan] out of memory for %lld nodes", (long long)n);
        goto done;
    }
    for (int64_t i = 0; i < n; i++) {
        consumed[i] = false;
        consumers[i] = 0;
        sole[i] = -1;
    }
    for (int64_t c = 0; c < n; c++) {
        cg_tensor *t = g->nodes[c];
        for (int k = 0; k < t->nsrc; k++) {
            cg_tensor *r = t->src[k]->root;
            if (r->id < 0) continue; /* parameters own their storage */
            consumers[r->id]++;
            sole[r->id] = (int)c;
            consumed[t->src[k]->id] = true; /* the direct source, so a view nobody reads counts as an output */
        }
    }
    for (int64_t i = 0; i < n; i++) { /* a root whose view is an output is an output too */
        cg_tensor *t = g->nodes[i];
        if (t->root != t && t->root->id >= 0 && !consumed[i]) consumed[t->root->id] = false;
    }
    for (int64_t i = 0; i < n; i++) {
        cg_tensor *t = g->nodes[i];
        t->kept = cgi_ops[t->op].kind != CGI_KIND_COMPUTE || t->retain || !consumed[i] ||
                  (cgi_ops[t->op].bwd_grad & CGI_OUT_IN_SRC0);
    }
    plan_ctx pc = {vdeath, rdeath, rbirth, gbirth, bt, rt, sdeath, gown, gdeath, consumers, sole, consumed, bufs, 0, 0};
    if ((st = plan_with_regen(g, &pc))) goto done;
    const int nb = pc.nb;
    const int64_t end = pc.end;
    uint64_t steps = 0;
    const size_t total = cgi_plan_place(bufs, order, nb, &steps);
    if (total == SIZE_MAX) {
        st = cgi_fail(CG_ERR_NOMEM, "[plan] out of memory for %d buffers", nb);
        goto done;
    }
    g->plan_bytes = total;
    g->plan_steps = steps;
    if (total > g->block_bytes) {
        g->block = cgi_arena_alloc(&g->bufs, total);
        if (!g->block) {
            st = CG_ERR_NOMEM;
            goto done;
        }
        g->block_bytes = total;
    }
    for (int i = 0; i < nb; i++) *bufs[i].target = (char *)g->block + bufs[i].offset;
    if (getenv("CGRAD_PLAN")) cgi_plan_print(bufs, order, nb, total, end);
    for (int64_t i = 0; i < n; i++) {
        if (g->nodes[i]->grad_in_value) g->nodes[i]->grad = g->nodes[i]->data;
        if (gown[i] >= 0) g->nodes[i]->grad = g->nodes[gown[i]]->grad;
    }

    g->work = cgi_graph_work(g); /* with the plan, once: each run's thread decision reads it */
    g->planned = true;
done:
    free(consumers);
    free(sole);
    free(vdeath);
    free(rdeath);
    free(rbirth);
    free(sdeath);
    free(gbirth);
    free(gown);
    free(gdeath);
    free(bt);
    free(rt);
    free(bufs);
    free(order);
    free(consumed);
    return st;
}
