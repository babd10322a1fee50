/* SPDX-License-Identifier: MIT */
/* The forward of a low-rank adapter (LoRA, Hu et al. 2021), composed from ops, so it needs no
 * backward of its own. A parameter P[R, C] with an adapter acts as P + s B A, B[R, r], A[r, C],
 * s = alpha / r. Every cg_linear whose weight reads P takes the adapter's path too, so the model
 * zoo gets LoRA without a line of change, however its weights are laid out: as P itself or a
 * block of its rows (nn.Linear, a fused QKV slice), or as such a block transposed (GPT-2's
 * Conv1D). The adapter path is x A^T B^T, or x B A transposed: never an [R, C] matrix. */
#include "graph/internal.h"
#include "ops/ops.h"

cg_tensor *cgi_lora_linear(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *y) {
    cg_tensor *p = w->root, *a = p->lora_a, *b = p->lora_b;
    if (!y || !x) return NULL;
    const int64_t C = p->shape[1];
    /* which rows [r0, r0 + n) of P the weight reads, and whether transposed */
    const bool plain = w->stride[1] == 1 && w->stride[0] == C && w->shape[1] == C;
    const bool transposed = w->stride[0] == 1 && w->stride[1] == C && w->shape[0] == C;
    if (p->ndim != 2 || (!plain && !transposed) || w->offset % C) {
        cgi_fail(CG_ERR_SHAPE, "[lora] %s%s is read as w%s strides%s: an adapter covers P, a block of its rows, or "
                 "their transpose", cg_name(p), cgi_shp(p), cgi_shp(w), cgi_dims(w->ndim, w->stride));
        return NULL;
    }
    const int64_t r0 = w->offset / C, n = plain ? w->shape[0] : w->shape[1];
    cg_tensor *b_rows = r0 == 0 && n == p->shape[0] ? b : cg_slice(g, b, 0, r0, r0 + n);
    cg_tensor *low, *delta;
    if (plain) { /* y += s (x A^T) B[rows]^T */
        low = cg_linear(g, x, a, NULL);
        delta = cg_linear(g, cg_scale(g, low, p->lora_scale), b_rows, NULL);
    } else { /* w = P[rows]^T: y += s (x B[rows]) A */
        low = cg_matmul(g, x, b_rows);
        delta = cg_matmul(g, cg_scale(g, low, p->lora_scale), a);
    }
    return cg_add(g, y, delta);
}
