/* SPDX-License-Identifier: MIT */
/* Which values of a bf16 graph are stored in bf16 (t->lp_value) or keep a bf16 shadow
 * (t->lp_shadowed): the plan graph/plan.c asks for before it sizes its buffers. Only in a build
 * with oneDNN (ops/bf16.c holds the stub of the others). */
#include <stdlib.h>

#include "graph/internal.h"
#include "ops/bf16_internal.h"

#if defined(CGRAD_DNNL) && !defined(CGRAD_DOUBLE)
#include "ops/bf16_engine.h"

/* ---- which values are stored in bf16 ---- */

/* The producers that can write their value as bf16: their backward never reads it. */
static bool writes_bf16(const cg_tensor *t) {
    if (t->op == CGI_OP_LAYERNORM || t->op == CGI_OP_RMSNORM) return true;
    /* GELU recomputes its output from x in backward; ReLU's reads only its sign (ops/elementwise.c) */
    if ((t->op == CGI_OP_GELU || t->op == CGI_OP_GELU_TANH || t->op == CGI_OP_RELU) && cgi_contiguous(t->src[0])) return true;
    /* SwiGLU's backward reads gate and up (ops/elementwise.c); CGRAD_BF16_SWIGLU_OFF=1 keeps it float */
    return t->op == CGI_OP_SWIGLU && cgi_contiguous(t->src[0]) && cgi_contiguous(t->src[1]) && cgi_contiguous(t) &&
           !getenv("CGRAD_BF16_SWIGLU_OFF");
}


/* Shadows (t->lp_shadowed): a float value whose only readers in backward are linears taking it
 * as their input (a post-LN block's LayerNorm output, read by the next block's products and by
 * the residual add) keeps a bf16 copy for them, made once right after forward writes it; the float
 * dies with its last forward reader. The same bits as converting it at each product, one
 * conversion instead of one per reader, half the memory from forward's end to backward. Not with
 * checkpoint segments, whose recompute would need the copy remade. */
static void plan_shadows(cg_graph *g) {
    int *lin = calloc((size_t)g->n + 1, sizeof *lin), *other = calloc((size_t)g->n + 1, sizeof *other);
    const bool segs = g->checkpointing;
    for (int c = 0; lin && other && !segs && c < g->n; c++) {
        const cg_tensor *t = g->nodes[c];
        const cgi_op_desc *d = &cgi_ops[t->op];
        for (int k = 0; k < t->nsrc; k++) {
            const cg_tensor *r = t->src[k]->root;
            if (r->id < 0) continue;
            if (d->kind == CGI_KIND_VIEW) other[r->id]++; /* a view may pass it to anything */
            else if (t->requires_grad && k < 32 && (cgi_bwd_reads(t) & (1u << k)))
                ((t->op == CGI_OP_LINEAR || cgi_lp_lora_backed(t)) && k == 0 && t->src[0] == r ? lin : other)[r->id]++;
        }
    }
    for (int i = 0; lin && other && !segs && i < g->n; i++) {
        cg_tensor *t = g->nodes[i];
        const cgi_op_desc *d = &cgi_ops[t->op];
        t->lp_shadowed = !t->lp_value && t->root == t && !t->kept && !t->retain && t->dtype == CG_REAL &&
                         d->kind == CGI_KIND_COMPUTE && !(d->bwd_grad & CGI_OUT_IN_SRC0) &&
                         !(cgi_bwd_reads_out(t) && t->requires_grad) && lin[i] > 0 && other[i] == 0;
    }
    free(lin);
    free(other);
}

/* A linear's value can be stored in bf16 when every reader is an activation that reads it back from
 * bf16: a GELU that stores its own value in bf16 (lp_unary_fwd / lp_unary_bwd), GPT-2's and BERT's
 * FC pre-activation, or a SwiGLU that does (lp_swiglu_fwd / lp_swiglu_both, ops/elementwise.c),
 * LLaMA's gate and up, the largest values its MLP keeps for backward (8 x 11.3 MB of llama-tiny's
 * 276 MB bf16 peak as floats). torch's autocast stores them in bf16 too. The bias must be contiguous
 * (oneDNN adds it in the product's output stage). CGRAD_BF16_PREACT_OFF=1 keeps them float. */
static void plan_linear_outputs(cg_graph *g, const int *consumers) {
    if (getenv("CGRAD_BF16_PREACT_OFF")) return;
    int *act_readers = calloc((size_t)g->n + 1, sizeof *act_readers);
    if (!act_readers) return;
    for (int c = 0; c < g->n; c++) {
        const cg_tensor *t = g->nodes[c];
        const bool gelu = t->op == CGI_OP_GELU || t->op == CGI_OP_GELU_TANH;
        /* gate and up apart: one tensor as both would be read as two operands of one pass */
        const bool swiglu = t->op == CGI_OP_SWIGLU && t->src[0]->root != t->src[1]->root;
        if (!t->lp_value || !(gelu || swiglu)) continue;
        for (int k = 0; k < (swiglu ? 2 : 1); k++)
            if (t->src[k]->root == t->src[k] && t->src[k]->id >= 0) act_readers[t->src[k]->id]++;
    }
    for (int i = 0; i < g->n; i++) {
        cg_tensor *t = g->nodes[i];
        const cg_tensor *b = t->nsrc > 2 ? t->src[2] : NULL;
        if (t->op == CGI_OP_LINEAR && t->root == t && !t->kept && !t->retain && consumers[i] > 0 &&
            act_readers[i] == consumers[i] && cgi_contiguous(t) && (!b || b->stride[0] == 1))
            t->lp_value = true;
    }
    free(act_readers);
}

/* A linear's value can be stored in bf16 when everything that reads it, through views (split,
 * split_heads), is fused attention taking it as q, k or v: attention widens a head's rows into its
 * slot when it starts the head (ops/attention.c), in forward and in backward, so the float value
 * (GPT-2's c_attn output, 113 MB over gpt-small's twelve blocks) is never needed. The rounding is
 * oneDNN's output stage's, as for the FC pre-activation, and torch's autocast makes it too (its
 * linear outputs are bf16). CGRAD_BF16_QKV_OFF=1 turns it off. */
static void plan_attention_inputs(cg_graph *g, const int *consumers) {
    if (getenv("CGRAD_BF16_QKV_OFF")) return;
    int *attn = calloc((size_t)g->n + 1, sizeof *attn), *other = calloc((size_t)g->n + 1, sizeof *other);
    for (int c = 0; attn && other && c < g->n; c++) {
        const cg_tensor *t = g->nodes[c];
        for (int k = 0; k < t->nsrc; k++) {
            const cg_tensor *r = t->src[k]->root;
            if (r->id < 0) continue;
            if (cgi_ops[t->op].kind == CGI_KIND_VIEW) { /* its readers are counted as the root's */
                if (t->retain) other[r->id]++; /* ... but a retained view is read as float */
                continue;
            }
            (t->op == CGI_OP_ATTENTION && k < 3 && t->src[k]->dtype == CG_REAL ? attn : other)[r->id]++;
        }
    }
    for (int i = 0; attn && other && i < g->n; i++) {
        cg_tensor *t = g->nodes[i];
        const cg_tensor *b = t->nsrc > 2 ? t->src[2] : NULL;
        if (t->op == CGI_OP_LINEAR && t->root == t && !t->kept && !t->retain && consumers[i] > 0 && attn[i] > 0 &&
            other[i] == 0 && cgi_contiguous(t) && (!b || b->stride[0] == 1))
            t->lp_value = true;
    }
    free(attn);
    free(other);
}

void cgi_lp_plan_values(cg_graph *g, const int *consumers) {
    for (int i = 0; i < g->n; i++) {
        g->nodes[i]->lp_value = g->nodes[i]->lp_shadowed = false;
        g->nodes[i]->lp_shadow = NULL;
    }
    if (g->precision != CG_BF16 || !cgi_lp_ctx(g) || getenv("CGRAD_BF16_VALUES_OFF")) return;
    int *linear_readers = calloc((size_t)g->n + 1, sizeof *linear_readers);
    if (!linear_readers) return; /* everything stays float: slower, not wrong */
    for (int c = 0; c < g->n; c++) {
        const cg_tensor *t = g->nodes[c];
        if (t->op == CGI_OP_LINEAR && t->src[0]->root == t->src[0] && t->src[0]->id >= 0 && t->src[1]->root != t->src[0] &&
            (t->nsrc < 3 || t->src[2]->root != t->src[0]))
            linear_readers[t->src[0]->id]++;
        else if (cgi_lp_lora_backed(t) && t->src[0]->root == t->src[0] && t->src[0]->id >= 0) /* its weights are parameters */
            linear_readers[t->src[0]->id]++;
    }
    for (int i = 0; i < g->n; i++) {
        cg_tensor *t = g->nodes[i];
        t->lp_value = writes_bf16(t) && t->root == t && !t->kept && !t->retain && t->dtype == CG_REAL &&
                      cgi_ops[t->op].kind == CGI_KIND_COMPUTE && consumers[i] > 0 && linear_readers[i] == consumers[i];
    }
    free(linear_readers);
    plan_linear_outputs(g, consumers);
    plan_attention_inputs(g, consumers);
    plan_shadows(g);
}

#endif
