/* SPDX-License-Identifier: MIT */
/* Gradient checkpointing. The nodes built between cg_checkpoint_begin and cg_checkpoint_end form a
 * segment (a transformer block, say). With checkpointing on, the memory plan keeps across forward
 * only what a segment reads from outside itself, its inputs; the values inside die at their last
 * forward reader. Backward, on reaching the segment, recomputes the values that the segment's
 * backward rules read, from those inputs, into buffers the plan placed for the recompute, and then
 * runs the segment's rules as usual. The same kernels on the same inputs at the same thread count
 * give the same bits, and dropout draws with the forward's step, so the gradients are those of the
 * run without checkpointing, bit for bit, for one more forward of each segment. */
#include "graph/internal.h"

cg_status cg_checkpoint_begin(cg_graph *g) {
    if (!g) return cgi_fail(CG_ERR_ARG, "[checkpoint_begin] graph is NULL");
    if (g->seg_open)
        return cgi_fail(CG_ERR_STATE, "[checkpoint_begin] segment %d, begun at node %d, is still open: segments do not "
                        "nest (call cg_checkpoint_end first)", g->seg_open, g->seg_open_at);
    g->seg_open = ++g->nseg;
    g->seg_open_at = g->n;
    return CG_OK;
}

cg_status cg_checkpoint_end(cg_graph *g) {
    if (!g) return cgi_fail(CG_ERR_ARG, "[checkpoint_end] graph is NULL");
    if (!g->seg_open)
        return cgi_fail(CG_ERR_STATE, "[checkpoint_end] no segment is open (%d begun and ended so far): call "
                        "cg_checkpoint_begin first", g->nseg);
    g->seg_open = 0;
    return CG_OK;
}

void cg_graph_set_checkpointing(cg_graph *g, bool on) {
    if (!g || g->checkpointing == on) return;
    g->checkpointing = on;
    g->planned = g->ran_forward = false; /* every lifetime changes */
}

bool cg_graph_checkpointing(const cg_graph *g) { return g && g->checkpointing; }

/* Whether t's only reader writes its gradient over t's value (logits into a fused loss): the plan
 * then gives value and gradient one buffer, so the value must be the forward's. */
static bool grad_over_value(const cg_graph *g, const cg_tensor *t, const int *consumers, const int *sole) {
    if (consumers[t->id] != 1 || sole[t->id] < 0) return false;
    const cg_tensor *r = g->nodes[sole[t->id]];
    return (cgi_ops[r->op].bwd_grad & CGI_GRAD_OVER_VALUE) && r->src[0] == t;
}

void cgi_ckpt_decide(cg_graph *g, const int *consumers, const int *sole) {
    for (int i = 0; i < g->n; i++) g->nodes[i]->recompute = g->nodes[i]->mark = false;
    if (!g->checkpointing) return;
    /* Readers come after what they read, so one sweep in reverse sees every reader of a node before
     * the node: mark says a recomputed node or a backward rule of the same segment reads it. */
    for (int c = g->n - 1; c >= 0; c--) {
        cg_tensor *t = g->nodes[c];
        if (!t->seg) continue;
        const cgi_op_desc *d = &cgi_ops[t->op];
        if (d->kind != CGI_KIND_COMPUTE) continue; /* a view's readers mark its root */
        if (t->root == t && !t->kept && !(d->bwd_grad & CGI_OUT_IN_SRC0) && !grad_over_value(g, t, consumers, sole))
            t->recompute = t->mark || (t->requires_grad && (cgi_bwd_reads_out(t) || t->aux_bytes));
        for (int k = 0; k < t->nsrc; k++) {
            cg_tensor *r = t->src[k]->root;
            if (r->id < 0 || r->seg != t->seg) continue;
            if (t->recompute || (t->requires_grad && k < 32 && (cgi_bwd_reads(t) & (1u << k)))) r->mark = true;
        }
    }
    for (int i = 0; i < g->n; i++) g->nodes[i]->mark = false;
}

int64_t cgi_ckpt_timeline(const cg_graph *g, int64_t *bt, int64_t *rt) {
    const int n = g->n;
    int64_t now = n;
    for (int i = 0; i < n; i++) rt[i] = -1;
    for (int i = n - 1; i >= 0; i--) {
        const cg_tensor *t = g->nodes[i];
        if (t->seg && (i == n - 1 || g->nodes[i + 1]->seg != t->seg)) {
            int lo = i;
            while (lo > 0 && g->nodes[lo - 1]->seg == t->seg) lo--;
            for (int j = lo; j <= i; j++)
                if (g->nodes[j]->recompute) rt[j] = now++;
        }
        bt[i] = now++;
    }
    return now;
}

/* Swaps the forward and recompute buffers of the segment [lo, hi]. Only the segment's own views
 * of them need re-pointing: a view built later is read by rules that ran before the swap. */
static void swap_buffers(cg_graph *g, int lo, int hi) {
    for (int j = lo; j <= hi; j++) {
        cg_tensor *t = g->nodes[j];
        if (t->recompute) {
            void *p = t->data;
            t->data = t->alt_data, t->alt_data = p;
            p = t->aux;
            t->aux = t->alt_aux, t->alt_aux = p;
            p = t->lp_tmp[0];
            t->lp_tmp[0] = t->lp_alt, t->lp_alt = p;
            p = t->fwd_aux;
            t->fwd_aux = t->fwd_alt, t->fwd_alt = p;
        } else if (t->root != t && t->root->recompute && t->root->id >= lo) {
            const size_t es = t->dtype == CG_INT32 ? sizeof(int32_t) : sizeof(cg_real);
            t->data = (char *)t->root->data + t->offset * es;
        }
    }
}

cg_status cgi_ckpt_recompute(cg_graph *g, int lo, int hi) {
    swap_buffers(g, lo, hi);
    /* dropout keys its mask on the step, which forward advanced when it finished */
    const uint64_t step = g->step;
    g->step = g->fwd_step;
    cg_status s = CG_OK;
    for (int j = lo; j <= hi && !s; j++)
        if (g->nodes[j]->recompute) s = cgi_run_forward(g, g->nodes[j]);
    g->step = step;
    return s;
}

void cgi_ckpt_restore(cg_graph *g, int lo, int hi) { swap_buffers(g, lo, hi); }
