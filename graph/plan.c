/* The memory plan. On one time axis (forward of node i at time i, its backward at 2n-1-i) every
 * value, gradient and op scratch buffer lives from its first write to its last read; buffers whose
 * lives do not overlap share memory. The op table says which values backward reads, so a value
 * that only forward needs dies as soon as its last consumer has run, and a gradient dies once its
 * node's backward has run. The plan is made once per graph and reused by every step. */
#include <stdio.h>
#include <stdlib.h>

#include "graph/internal.h"

typedef struct {
    int64_t birth, death; /* inclusive times */
    size_t bytes, offset;
    void **target;        /* where the address goes */
    const cg_tensor *node;
    char kind;            /* 'v' value, 'g' gradient, 'a' op scratch */
} buffer;

static int by_size_desc(const void *a, const void *b) {
    const buffer *x = *(const buffer *const *)a, *y = *(const buffer *const *)b;
    if (x->bytes != y->bytes) return x->bytes < y->bytes ? 1 : -1;
    return x->birth < y->birth ? -1 : x->birth > y->birth;
}

typedef struct {
    size_t lo, hi;
} range;

static int by_lo(const void *a, const void *b) {
    const range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static size_t round_up(size_t n) { return (n + CGI_ALIGN - 1) / CGI_ALIGN * CGI_ALIGN; }

cg_status cgi_plan(cg_graph *g) {
    const int64_t n = g->n, end = 2 * n;
    int64_t *vdeath = malloc((size_t)(n ? n : 1) * sizeof *vdeath);
    int64_t *gbirth = malloc((size_t)(n ? n : 1) * sizeof *gbirth);
    buffer *bufs = malloc((size_t)(4 * n + 1) * sizeof *bufs);
    buffer **order = malloc((size_t)(4 * n + 1) * sizeof *order);
    range *used = malloc((size_t)(4 * n + 1) * sizeof *used);
    cg_status st = CG_OK;
    int *consumers = NULL, *sole = NULL;
    if (!vdeath || !gbirth || !bufs || !order || !used) {
        st = cgi_fail(CG_ERR_NOMEM, "[plan] out of memory for %lld nodes", (long long)n);
        goto done;
    }
    bool *consumed = (bool *)used; /* scratch before `used` is needed */
    consumers = malloc((size_t)(n ? n : 1) * sizeof *consumers);
    sole = malloc((size_t)(n ? n : 1) * sizeof *sole);
    if (!consumers || !sole) {
        st = cgi_fail(CG_ERR_NOMEM, "[plan] out of memory for %lld nodes", (long long)n);
        goto done;
    }
    for (int64_t i = 0; i < n; i++) {
        vdeath[i] = i;
        gbirth[i] = INT64_MAX;
        consumed[i] = false;
        consumers[i] = 0;
        sole[i] = -1;
    }
    for (int64_t c = 0; c < n; c++) {
        cg_tensor *t = g->nodes[c];
        const cgi_op_desc *d = &cgi_ops[t->op];
        const int64_t back = end - 1 - c;
        for (int k = 0; k < t->nsrc; k++) {
            cg_tensor *r = t->src[k]->root;
            if (r->id < 0) continue; /* parameters own their storage */
            consumers[r->id]++;
            sole[r->id] = (int)c;
            consumed[t->src[k]->id] = true; /* the direct source, so a view nobody reads counts as an output */
            if (vdeath[r->id] < c) vdeath[r->id] = c;
            if (t->requires_grad && k < 32 && (d->bwd_reads & (1u << k)) && vdeath[r->id] < back) vdeath[r->id] = back;
            if (t->requires_grad && t->src[k]->requires_grad && d->kind == CGI_KIND_COMPUTE && gbirth[r->id] > back)
                gbirth[r->id] = back;
        }
        if (t->requires_grad && d->bwd_reads_out && vdeath[c] < back) vdeath[c] = back;
    }
    for (int64_t i = 0; i < n; i++) { /* a root whose view is an output is an output too */
        cg_tensor *t = g->nodes[i];
        if (t->root != t && t->root->id >= 0 && !consumed[i]) consumed[t->root->id] = false;
    }
    int nb = 0;
    for (int64_t i = 0; i < n; i++) {
        cg_tensor *t = g->nodes[i];
        if (t->root != t) continue;
        const int64_t back = end - 1 - i;
        bool outlives = t->retain || !consumed[i];
        t->kept = cgi_ops[t->op].kind != CGI_KIND_COMPUTE || outlives || (cgi_ops[t->op].bwd_grad & CGI_OUT_IN_SRC0);
        /* Logits read only by a fused loss that writes their gradient in place share one buffer:
         * the value's life ends where the gradient's begins. */
        const cg_tensor *reader = consumers[i] == 1 && sole[i] >= 0 ? g->nodes[sole[i]] : NULL;
        t->grad_in_value = reader && (cgi_ops[reader->op].bwd_grad & CGI_GRAD_OVER_VALUE) && reader->src[0] == t &&
                           reader->requires_grad &&
                           t->requires_grad && !outlives && cgi_ops[t->op].kind == CGI_KIND_COMPUTE &&
                           t->dtype == CG_REAL && vdeath[i] == end - 1 - reader->id;
        if (t->bwd_aux_bytes && t->requires_grad && cgi_ops[t->op].kind == CGI_KIND_COMPUTE)
            bufs[nb++] = (buffer){back, back, round_up(t->bwd_aux_bytes), 0, &t->bwd_aux, t, 'a'};
        if (t->grad_in_value) {
            bufs[nb++] = (buffer){i, back, round_up((size_t)cgi_numel(t->ndim, t->shape) * sizeof(cg_real)), 0, &t->data, t, 'v'};
            if (t->aux_bytes) bufs[nb++] = (buffer){i, back, round_up(t->aux_bytes), 0, &t->aux, t, 'a'};
            continue;
        }
        if (cgi_ops[t->op].kind == CGI_KIND_COMPUTE && !(cgi_ops[t->op].bwd_grad & CGI_OUT_IN_SRC0)) {
            size_t es = t->dtype == CG_INT32 ? sizeof(int32_t) : sizeof(cg_real);
            bufs[nb++] = (buffer){i, outlives ? end : vdeath[i], round_up((size_t)cgi_numel(t->ndim, t->shape) * es),
                                  0, &t->data, t, 'v'};
            if (t->aux_bytes)
                bufs[nb++] = (buffer){i, t->requires_grad ? back : i, round_up(t->aux_bytes), 0, &t->aux, t, 'a'};
        }

        if (t->requires_grad && t->op != CGI_OP_INPUT) {
            int64_t birth = gbirth[i] == INT64_MAX ? back : gbirth[i];
            bufs[nb++] = (buffer){birth, t->retain ? end : back,
                                  round_up((size_t)cgi_numel(t->ndim, t->shape) * sizeof(cg_real)), 0, (void **)&t->grad, t, 'g'};
        }
        if (t->requires_grad && t->op == CGI_OP_INPUT && !t->grad) { /* the caller reads it after backward */
            t->grad = cgi_arena_alloc(&g->bufs, round_up((size_t)cgi_numel(t->ndim, t->shape) * sizeof(cg_real)));
            if (!t->grad) {
                st = CG_ERR_NOMEM;
                goto done;
            }
            memset(t->grad, 0, (size_t)cgi_numel(t->ndim, t->shape) * sizeof(cg_real)); /* read before any backward */
        }
    }
    for (int i = 0; i < nb; i++) order[i] = &bufs[i];
    qsort(order, (size_t)nb, sizeof *order, by_size_desc);
    size_t total = 0;
    for (int i = 0; i < nb; i++) { /* first fit among the buffers alive at the same time */
        buffer *b = order[i];
        int nu = 0;
        for (int j = 0; j < i; j++) {
            const buffer *o = order[j];
            if (o->birth <= b->death && b->birth <= o->death) used[nu++] = (range){o->offset, o->offset + o->bytes};
        }
        qsort(used, (size_t)nu, sizeof *used, by_lo);
        size_t at = 0;
        for (int j = 0; j < nu; j++) {
            if (used[j].lo >= at + b->bytes) break;
            if (used[j].hi > at) at = used[j].hi;
        }
        b->offset = at;
        if (at + b->bytes > total) total = at + b->bytes;
    }
    if (total > g->block_bytes) {
        g->block = cgi_arena_alloc(&g->bufs, total);
        if (!g->block) {
            st = CG_ERR_NOMEM;
            goto done;
        }
        g->block_bytes = total;
    }
    for (int i = 0; i < nb; i++) *bufs[i].target = (char *)g->block + bufs[i].offset;
    if (getenv("CGRAD_PLAN")) { /* what the block holds at its fullest moment */
        int64_t peak_t = 0;
        size_t peak = 0;
        for (int64_t tm = 0; tm < end; tm++) {
            size_t live = 0;
            for (int i = 0; i < nb; i++) live += bufs[i].birth <= tm && tm <= bufs[i].death ? bufs[i].bytes : 0;
            if (live > peak) peak = live, peak_t = tm;
        }
        fprintf(stderr, "[plan] %d buffers in %.1f MB; %.1f MB live at time %lld of %lld, the largest:\n", nb,
                (double)total / 1e6, (double)peak / 1e6, (long long)peak_t, (long long)end);
        for (int i = 0, shown = 0; i < nb && shown < 12; i++) {
            const buffer *b = order[i];
            if (b->birth > peak_t || peak_t > b->death) continue;
            fprintf(stderr, "  %8.1f MB %c %-14s %s [%lld, %lld]\n", (double)b->bytes / 1e6, b->kind,
                    cgi_ops[b->node->op].name, cgi_shp(b->node), (long long)b->birth, (long long)b->death);
            shown++;
        }
    }
    for (int64_t i = 0; i < n; i++)
        if (g->nodes[i]->grad_in_value) g->nodes[i]->grad = g->nodes[i]->data;

    g->planned = true;
done:
    free(consumers);
    free(sole);
    free(vdeath);
    free(gbirth);
    free(bufs);
    free(order);
    free(used);
    return st;
}
