/* SPDX-License-Identifier: MIT */
/* cg_graph_dot: the graph as Graphviz DOT, for looking at what a model built and how the memory
 * plan packed it. One box per node (op, shape, build position), an edge per input, parameters as
 * ellipses; blue fill for everything a gradient flows through. After a forward the plan is known:
 * each label gives the value's and the gradient's offset in the graph's one block, and a dashed
 * grey edge ("shares") goes to a node from the last earlier node whose buffers overlap its own.
 * After a run under CGRAD_PROFILE, each label also gives the node's last forward and backward
 * time. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/internal.h"

typedef struct {
    size_t lo, hi; /* byte range in the block; hi == lo when the buffer is not in it */
} span;

static size_t elem_bytes(const cg_tensor *t) { return t->dtype == CG_INT32 ? sizeof(int32_t) : sizeof(cg_real); }

static span in_block(const cg_graph *g, const void *p, size_t bytes) {
    const char *b = g->block, *q = p;
    if (!g->planned || !p || !b || q < b || q >= b + g->block_bytes) return (span){0, 0};
    return (span){(size_t)(q - b), (size_t)(q - b) + bytes};
}

static bool overlap(span a, span b) { return a.hi > a.lo && b.hi > b.lo && a.lo < b.hi && b.lo < a.hi; }

/* Sizes in the unit that keeps three digits or fewer. */
static const char *human(size_t bytes, char *buf, size_t n) {
    if (bytes >= 1u << 20) snprintf(buf, n, "%.1f MB", (double)bytes / (1u << 20));
    else if (bytes >= 1u << 10) snprintf(buf, n, "%.1f KB", (double)bytes / (1u << 10));
    else snprintf(buf, n, "%zu B", bytes);
    return buf;
}

/* Node names are the caller's: quotes and backslashes are escaped. */
static void put_escaped(FILE *f, const char *s) {
    for (; s && *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', f);
        fputc(*s, f);
    }
}

static void put_param(FILE *f, const cg_tensor *p) {
    fprintf(f, "  p%p [shape=ellipse, label=\"", (const void *)p);
    put_escaped(f, p->name);
    fprintf(f, "\\n%s%s\"%s];\n", cgi_shp(p), p->trainable ? "" : "\\nfrozen",
            p->trainable ? ", style=filled, fillcolor=\"#cfe2ff\"" : "");
}

static void put_id(FILE *f, const cg_tensor *t) {
    if (t->id < 0) fprintf(f, "p%p", (const void *)t);
    else fprintf(f, "n%d", t->id);
}

cg_status cg_graph_dot(const cg_graph *g, const char *path) {
    if (!g || !path) return cgi_fail(CG_ERR_ARG, "[graph_dot] %s is NULL", g ? "path" : "graph");
    FILE *f = fopen(path, "w");
    if (!f) return cgi_fail(CG_ERR_IO, "[graph_dot] cannot write %s: %s", path, strerror(errno));
    span *val = malloc((size_t)(g->n ? g->n : 1) * sizeof *val), *grd = malloc((size_t)(g->n ? g->n : 1) * sizeof *grd);
    if (!val || !grd) {
        free(val), free(grd), fclose(f);
        return cgi_fail(CG_ERR_NOMEM, "[graph_dot] out of memory for %d nodes", g->n);
    }
    size_t unshared = 0;
    for (int i = 0; i < g->n; i++) {
        const cg_tensor *t = g->nodes[i];
        const bool root = t->root == t;
        const size_t bytes = (size_t)cgi_numel(t->ndim, t->shape) * elem_bytes(t);
        val[i] = root ? in_block(g, t->data, bytes) : (span){0, 0};
        grd[i] = root ? in_block(g, t->grad, (size_t)cgi_numel(t->ndim, t->shape) * sizeof(cg_real)) : (span){0, 0};
        unshared += (val[i].hi - val[i].lo) + (grd[i].hi - grd[i].lo);
        unshared += in_block(g, t->aux, t->aux_bytes).hi - in_block(g, t->aux, t->aux_bytes).lo;
        unshared += in_block(g, t->bwd_aux, t->bwd_aux_bytes).hi - in_block(g, t->bwd_aux, t->bwd_aux_bytes).lo;
    }
    char b1[32], b2[32];
    fprintf(f, "digraph cgrad {\n  rankdir=TB;\n  node [shape=box, fontname=\"Helvetica\", fontsize=10];\n"
               "  edge [fontname=\"Helvetica\", fontsize=8];\n");
    fprintf(f, "  label=\"%d nodes, %s mode", g->n, g->mode == CG_TRAIN ? "train" : "eval");
    if (g->planned)
        fprintf(f, "; memory plan: one %s block holds %s of values, gradients and op scratch", human(g->block_bytes, b1, sizeof b1),
                human(unshared, b2, sizeof b2));
    fprintf(f, "\\nblue: a gradient flows through it; dashed grey edge: the later node's value or gradient lives in memory the earlier one used\";\n");
    for (int i = 0; i < g->n; i++) {
        const cg_tensor *t = g->nodes[i];
        const cgi_kind kind = cgi_ops[t->op].kind;
        fprintf(f, "  n%d [label=\"#%d %s", i, i, cgi_op_name_of(t));
        if (t->name && *t->name) fputc(' ', f), put_escaped(f, t->name);
        fprintf(f, "\\n%s%s", cgi_shp(t), t->dtype == CG_INT32 ? " int32" : "");
        if (kind == CGI_KIND_VIEW) fprintf(f, "\\nview of #%d, offset %lld", t->root->id, (long long)t->offset);
        if (val[i].hi > val[i].lo) fprintf(f, "\\nvalue @%zu (%s)", val[i].lo, human(val[i].hi - val[i].lo, b1, sizeof b1));
        else if (kind != CGI_KIND_VIEW && t->data) fprintf(f, "\\nvalue: own storage, not shared");
        if (t->grad_in_value) fprintf(f, "\\ngradient over the value");
        else if (grd[i].hi > grd[i].lo) fprintf(f, "\\ngradient @%zu", grd[i].lo);
        if (t->prof_ms[0] > 0 || t->prof_ms[1] > 0)
            fprintf(f, "\\nfwd %.3f ms, bwd %.3f ms", (double)t->prof_ms[0], (double)t->prof_ms[1]);
        const bool view = kind == CGI_KIND_VIEW;
        fprintf(f, "\", style=\"%s\"%s];\n", t->requires_grad ? (view ? "filled,dashed" : "filled") : (view ? "dashed" : "solid"),
                t->requires_grad ? ", fillcolor=\"#cfe2ff\"" : "");
        for (int k = 0; k < t->nsrc; k++) {
            const cg_tensor *s = t->src[k];
            if (s->id < 0) put_param(f, s);
            fputs("  ", f), put_id(f, s), fprintf(f, " -> n%d;\n", i);
        }
        /* memory reuse: the latest earlier node whose value or gradient overlaps this one's */
        for (int pass = 0; pass < 2; pass++) {
            const span me = pass ? grd[i] : val[i];
            for (int j = i - 1; j >= 0; j--)
                if (overlap(me, val[j]) || overlap(me, grd[j])) {
                    fprintf(f, "  n%d -> n%d [style=dashed, color=grey, constraint=false, label=\"%s\"];\n", j, i,
                            pass ? "gradient shares" : "shares");
                    break;
                }
        }
    }
    fprintf(f, "}\n");
    free(val), free(grd);
    if (fclose(f) != 0) return cgi_fail(CG_ERR_IO, "[graph_dot] cannot write %s: %s", path, strerror(errno));
    return CG_OK;
}
