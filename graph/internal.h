/* SPDX-License-Identifier: MIT */
/* Internals shared by graph/ and ops/: node layout, the op table, arenas, strided iteration,
 * and the shared kernels that undo broadcasting. Not installed; prefix cgi_. */
#ifndef CGRAD_INTERNAL_H
#define CGRAD_INTERNAL_H

#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "graph/graph.h"

#define CGI_ALIGN 64

typedef enum {
#define CG_LEAF(ID, name) CGI_OP_##ID,
#define CG_VIEW(ID, name) CGI_OP_##ID,
#define CG_OP(ID, name, family, reads, reads_out, grad) CGI_OP_##ID,
#include "ops/ops.def"
#undef CG_LEAF
#undef CG_VIEW
#undef CG_OP
    CGI_OP_COUNT
} cgi_op;

typedef enum { CGI_KIND_LEAF, CGI_KIND_VIEW, CGI_KIND_COMPUTE } cgi_kind;

typedef struct {
    const char *name;
    cgi_kind kind;
    /* Computes out from out->src; may fail only on data values (ids, targets). */
    cg_status (*forward)(cg_tensor *out);
    /* Adds d(loss)/d(src) into src->grad for every src with requires_grad, from out->grad. */
    void (*backward)(cg_tensor *out);
    unsigned bwd_reads;   /* bit k: backward reads the value of src[k] */
    bool bwd_reads_out;   /* backward reads out's own value */
    unsigned bwd_grad;    /* the last column of ops.def: CGI_GRAD_OVER_VALUE, CGI_GRAD_CLAIMS_SRC0, CGI_GRAD_CLAIMS_ALL, CGI_OUT_IN_SRC0 or 0 */
} cgi_op_desc;

enum { CGI_GRAD_OVER_VALUE = 1, CGI_GRAD_CLAIMS_SRC0 = 2, CGI_OUT_IN_SRC0 = 4, CGI_GRAD_CLAIMS_ALL = 8 };

extern const cgi_op_desc cgi_ops[CGI_OP_COUNT];

/* Hot loops in a portable build (CGRAD_NATIVE=OFF): each function marked so is compiled for
 * x86-64-v4 (AVX-512), x86-64-v3 (AVX2, FMA) and the x86-64-v2 baseline, and the loader picks the
 * best the CPU has, once (an ifunc). GCC clones the OpenMP bodies inside with them, and the static
 * inline helpers (cgi_exp, the row reductions) are inlined into each clone. A native build compiles
 * everything once for the build machine instead. Every op's forward and backward carries it.
 * GCC keeps the clones local to the file that defines them, so a file that only refers to a
 * marked function must see it unmarked: graph.c, which fills the op table, defines
 * CGI_OP_TABLE_FILE before including this header. */
#if defined(CGRAD_PORTABLE) && defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CGI_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CGI_CLONES
#endif
/* Loops bound by arithmetic on long rows (the exponentials of a cross-entropy over a vocabulary)
 * marked so run 16 lanes wide in a native AVX-512 build: GCC's tuning for these CPUs keeps to 8
 * lanes, which suits memory-bound loops but halves the rate of the exponential polynomial. */
#if defined(__AVX512F__) && defined(__GNUC__) && !defined(__clang__) && !defined(CGRAD_PORTABLE)
#define CGI_WIDE __attribute__((target("prefer-vector-width=512")))
#else
#define CGI_WIDE
#endif
#ifdef CGI_OP_TABLE_FILE
#define CGI_KERNEL
#else
#define CGI_KERNEL CGI_CLONES
#endif

#define CG_LEAF(ID, name)
#define CG_VIEW(ID, name)
#define CG_OP(ID, name, family, reads, reads_out, grad) \
    CGI_KERNEL cg_status cgi_fwd_##name(cg_tensor *out); \
    CGI_KERNEL void cgi_bwd_##name(cg_tensor *out);
#include "ops/ops.def"
#undef CG_LEAF
#undef CG_VIEW
#undef CG_OP

struct cg_tensor {
    int op;            /* cgi_op */
    cg_dtype dtype;
    int ndim;
    int id;            /* position in the graph's build order; -1 for parameters */
    bool requires_grad;/* a gradient flows into this node */
    bool trainable;    /* parameters: receives gradients */
    bool mark;         /* scratch for the backward sweep */
    bool retain;       /* value (and gradient) stay valid after forward and backward */
    bool kept;         /* planned: the value is still there when forward (and backward) end */
    bool used;         /* some node reads it: too late to make it require a gradient */
    uint32_t grad_epoch; /* backward pass in which the gradient was last zeroed */
    bool grad_in_value;  /* planned: the gradient overwrites the value in place (no zeroing) */
    bool grad_stale;     /* parameters: reads as zero, buffer not cleared yet (cg_params_zero_grad is lazy) */
    bool grad_exposed;   /* parameters: cg_grad handed out the buffer, so zero_grad clears it at once */
    const cg_tensor *grad_ahead; /* parameters: the node whose forward wrote this still-stale gradient for its backward to
                                  * take (the fused LM head); cleared by cg_params_zero_grad */
    int ready_at;        /* parameters, during a backward with a ready callback: id of the last rule adding to the gradient */
    float prof_ms[2];    /* last forward and backward time under CGRAD_PROFILE, for cg_graph_dot */
    int64_t shape[CG_MAX_DIMS];
    int64_t stride[CG_MAX_DIMS]; /* elements */
    int64_t offset;    /* elements from the start of root's storage */
    cg_tensor *root;   /* owner of the storage (self unless a view) */
    void *data;        /* root storage + offset, valid once the graph is planned */
    cg_real *grad;     /* same layout as data, NULL when not required */
    void *aux;         /* op scratch that forward saves for backward */
    size_t aux_bytes;
    void *bwd_aux;     /* op scratch that only the backward rule uses, alive while it runs */
    size_t bwd_aux_bytes;
    void *fwd_aux;     /* op scratch that only the forward rule uses, alive while it runs (a checkpoint
                        * recompute's is fwd_alt, swapped in with alt_data) */
    size_t fwd_aux_bytes;
    void *fwd_alt;
    int nsrc;
    cg_tensor **src;
    int64_t iarg[4];   /* op arguments */
    double farg[2];
    void *params;      /* an op's settings beyond iarg and farg: a struct of its own (cgi_node_params) */
    cg_graph *graph;   /* NULL for parameters */
    uint64_t *pversion;/* parameters: their set's value version (trainable or frozen), bumped on every change */
    void *lp;          /* parameters: bf16 copy of the value (ops/bf16.c), made on first use */
    bool lp_value;     /* planned, bf16 graphs: the value is stored as bf16, only linears read it (ops/bf16.c) */
    void *lp_tmp[2];   /* planned, bf16 graphs: conversion scratch of the forward and backward products */
    bool lp_shadowed;  /* planned, bf16 graphs: gets lp_shadow (ops/bf16.c) */
    void *lp_shadow;   /* planned, bf16 graphs: a bf16 copy of the value that linears' backward reads (dW), made
                        * after forward writes the value, so the float dies with its last forward reader */
    void *lp_alt;      /* the recompute's forward conversion scratch, swapped in with alt_data */
    const char *name;
    int seg;           /* checkpoint segment built in (1, 2, ...; 0: none) */
    bool recompute;    /* planned: backward recomputes the value (into alt_data, aux into alt_aux) */
    void *alt_data, *alt_aux; /* the other of the forward and recompute buffers, swapped in and out */
    bool regen;        /* planned: forward's value dies with its last forward reader, and backward remakes
                        * it cheaply into alt_data before its first backward reader (cgi_regen_ok) */
    bool regen_live;   /* during backward: the remade value is in data (swapped with alt_data) */
    int regen_at;      /* planned: the node whose backward reads the value first */
    /* parameters with a low-rank adapter (optim/lora.c): value + lora_scale * lora_b @ lora_a */
    cg_tensor *lora_a, *lora_b;
    double lora_scale;
    /* parameters (graph/params_store.c): where the value lives, and an initialisation deferred by
     * cg_params_defer_init (the rng state it starts from, so that running it later draws the same) */
    uint8_t store;       /* CGI_STORE_*: the set's block, or outside it with no gradient */
    int64_t block_off;   /* elements from the start of the value and gradient blocks; out of them (no elements
                          * there), where it would be: offsets rise with the index, for walks over the blocks */
    const void *mapped;  /* CGI_STORE_HALF: the value's half-precision elements in a file mapping */
    uint8_t half;        /* CGI_STORE_HALF: their type, CGI_EL_BF16 or CGI_EL_F16 */
    size_t own_bytes;    /* CGI_STORE_OWN / HALF: bytes of the float storage the parameter owns (data) */
    bool widened;        /* CGI_STORE_HALF: data holds the widened float value */
    uint8_t init_kind;   /* CGI_INIT_*: the pending fill */
    uint64_t init_state;
    double init_a, init_b;
    struct cg_params *pset; /* the set a parameter belongs to */
};

/* Where a parameter's value lives. Only CGI_STORE_BLOCK parameters have a gradient and take part in
 * the set's span (optimizer moments): the others are frozen for good. */
enum {
    CGI_STORE_BLOCK = 0, /* the set's value block, its gradient in the gradient block */
    CGI_STORE_OWN,       /* a float buffer of its own (a frozen parameter moved out of the block) */
    CGI_STORE_F32MAP,    /* data points into a read-only file mapping (float32 on disk) */
    CGI_STORE_HALF       /* bf16 or fp16 elements in a file mapping, read in place by the products, the
                          * embedding gather and the fused LM head; data is an inaccessible reservation
                          * until a reader that needs float widens it (cgi_param_float) */
};
/* Element types of a product's operand (cgi_gemm_job.ta, .tb): float (cg_real), bfloat16, IEEE
 * binary16, both half types stored as uint16_t. */
enum { CGI_EL_F32 = 0, CGI_EL_BF16, CGI_EL_F16 };
enum { CGI_INIT_NONE, CGI_INIT_CONST, CGI_INIT_UNIFORM, CGI_INIT_NORMAL };
/* The float value of a CGI_STORE_HALF parameter, widened into its reservation on first call (every
 * other parameter has one already); CG_ERR_NOMEM with a message naming it on failure. */
cg_status cgi_param_float(cg_tensor *p);
/* An optimizer step changed the trainable parameters of ps (and no frozen one). */
void cgi_params_stepped(cg_params *ps);
/* Parameter p's value changed (its bf16 copy, and those of its side of the set, are remade). */
void cgi_param_changed(cg_tensor *p);
/* Whether node t reads its input k in place when that is a half-precision parameter (CGI_STORE_HALF):
 * the weight of linear, lora_linear, linear_act and the fused LM head (their products widen it as they pack it),
 * the embedding table (the gather widens its rows). Every other reader gets the float value,
 * widened once when the graph is planned (ops/half.c). */
bool cgi_reads_half(const cg_graph *g, const cg_tensor *t, int k);
/* Makes p's value writable as float (a mapped parameter gets a copy of its own); before writing. */
cg_status cgi_param_writable(cg_tensor *p);
/* The bf16 elements of a bf16 CGI_STORE_HALF parameter (read in place), else NULL. */
static inline const uint16_t *cgi_param_bf16_mapped(const cg_tensor *p) {
    return p->store == CGI_STORE_HALF && p->half == CGI_EL_BF16 ? (const uint16_t *)p->mapped : NULL;
}
/* The half-precision elements tensor t reads in place (a view of a CGI_STORE_HALF parameter, at
 * t's offset and strides), their type to *el; NULL (and *el CGI_EL_F32) when t reads floats. */
static inline const uint16_t *cgi_half_operand(const cg_tensor *t, int *el) {
    const cg_tensor *r = t->root;
    const bool half = r->op == CGI_OP_PARAM && r->store == CGI_STORE_HALF;
    *el = half ? r->half : CGI_EL_F32;
    return half ? (const uint16_t *)r->mapped + t->offset : NULL;
}
/* Records a fill of parameter t while its set defers initialisation: true when deferred (nothing
 * written; r advanced as the fill would have). kind CGI_INIT_*, a and b its arguments. */
bool cgi_param_defer_fill(cg_tensor *t, cg_rng *r, int kind, double a, double b);
/* Runs t's deferred fill now, if it has one. */
void cgi_param_run_fill(cg_tensor *t);
/* Frees what a parameter owns outside the blocks (cg_params_free). */
void cgi_param_store_free(cg_tensor *p);
/* graph/params.c's state for graph/params_store.c */
bool cgi_params_deferring(const cg_params *ps);
void cgi_params_set_deferring(cg_params *ps, bool on);
int64_t cgi_params_capacity(const cg_params *ps);
/* Replaces the set's blocks (freeing the old ones) by values and grads of cap elements, used in use. */
void cgi_params_adopt_blocks(cg_params *ps, cg_real *values, cg_real *grads, int64_t used, int64_t cap);
cg_real *cgi_params_block_new(int64_t cap);
void cgi_params_block_free(cg_real *b, int64_t cap);

/* ---- arenas: bump allocation in chunks, reset keeps the memory ---- */
typedef struct cgi_chunk cgi_chunk;
typedef struct {
    cgi_chunk *head;
    cgi_chunk *cur;
    size_t total;      /* bytes reserved in all chunks */
} cgi_arena;

void *cgi_arena_alloc(cgi_arena *a, size_t bytes); /* 64-byte aligned, uninitialised */
void cgi_arena_reset(cgi_arena *a);                /* rewinds; merges chunks into one */
void cgi_arena_free(cgi_arena *a);
/* A large block (plan chunks, parameters, moments, packs, bf16 copies): 64-byte aligned,
 * uninitialised, free() frees it; from 2 MB up aligned to 2 MB and advised to use transparent huge
 * pages. */
void *cgi_alloc_large(size_t bytes);

struct cg_graph {
    cg_mode mode;
    cgi_arena meta;    /* node structs, names, source lists */
    cgi_arena bufs;    /* values, gradients, op scratch */
    cg_tensor **nodes;
    int n, cap;
    bool planned;      /* the memory plan covers every node */
    bool ran_forward;  /* values exist for the current plan */
    uint32_t epoch;    /* backward passes run, to zero each gradient on its first write */
    void *block;       /* planned storage for values, gradients and scratch */
    size_t block_bytes;
    size_t plan_bytes;   /* the last plan's size (block_bytes may be larger, from an earlier plan) */
    uint64_t plan_steps; /* elementary steps the last plan took, for the test of its growth */
    size_t regen_peak;   /* the last plan's peak live bytes plus its bf16 weight copies (cgi_lp_copy_bytes) */
    size_t regen_line;   /* bf16: the same graph's fp32 peak, which regen_peak stays at or below; 0 if not compared */
    int regen_plans;     /* bf16: plans the choice of remade values took */
    uint64_t seed, step;
    uint64_t fwd_step;  /* the step the last forward drew dropout masks with (recompute redraws them) */
    bool checkpointing; /* segments drop their activations in forward and recompute them in backward */
    int nseg;           /* segments begun so far */
    int seg_open;       /* the segment being built (0: none) and the node count when it began */
    int seg_open_at;
    cg_grad_ready_fn ready_fn; /* told as each parameter's gradient becomes final in backward */
    void *ready_ctx;
    /* cg_optim_attach: trainable parameters' gradients are buffers of the plan, alive from their first
     * write to the update that consumes them inside backward (optim/optim.c) */
    bool param_grads_planned;
    bool fused_backward;     /* inside cg_optim_backward_step: backward may use those buffers */
    int npgrad;              /* planned parameter gradients: the parameter, its plan buffer and the */
    struct cgi_pgrad { cg_tensor *p; cg_real *grad, *block_grad; } *pgrad; /* set's own, swapped back after */
    /* gradient checks of a computed node: forward adds nudge_by to its element nudge_at (row-major)
     * right after computing it, and records the step the element really took */
    cg_tensor *nudge;
    int64_t nudge_at;
    double nudge_by, nudge_took;
    cg_precision precision;
    struct cgi_lp *lp; /* bf16 primitives and scratch (ops/bf16.c), kept across resets */
    double work;       /* cgi_graph_work, found with the plan: decides each run's threads */
    struct cgi_owned *owned; /* what the graph frees with itself or its reset (custom ops' composite graphs) */
    cg_status bwd_status;    /* the first failure of a backward rule that can fail (custom ops) in this pass */
};

/* Has g free p with free_fn when g is freed or reset. CG_ERR_NOMEM (with a message) if it cannot. */
cg_status cgi_graph_own(cg_graph *g, void (*free_fn)(void *), void *p);

/* ---- custom ops (ops/custom.c): the description, not the table, says what backward reads ---- */
unsigned cgi_custom_reads(const cg_tensor *t);
bool cgi_custom_reads_out(const cg_tensor *t);
const char *cgi_custom_name(const cg_tensor *t);
/* Whether a gradient can flow through the custom node t (a backward kernel or a composite). */
bool cgi_custom_differentiable(const cg_tensor *t);
/* Bit k: backward of t reads its input k's value. */
static inline unsigned cgi_bwd_reads(const cg_tensor *t) {
    if (t->op == CGI_OP_CUSTOM) return cgi_custom_reads(t);
    unsigned r = cgi_ops[t->op].bwd_reads;
    /* a linear reads its input only for dW and its weight only for dX: a frozen weight's product
     * keeps no input alive for backward (LoRA's bases), a constant input keeps no weight */
    if (t->op == CGI_OP_LINEAR || t->op == CGI_OP_LINEAR_ADD) {
        if (!t->src[1]->requires_grad) r &= ~1u;
        if (!t->src[0]->requires_grad) r &= ~2u;
    }
    /* LoRA's fused linear (x, w, a, b): x for dW and dA, w and a for dX, b for dX and dA */
    if (t->op == CGI_OP_LORA_LINEAR) {
        const bool dx = t->src[0]->requires_grad, dw = t->src[1]->requires_grad, da = t->src[2]->requires_grad;
        if (!dw && !da) r &= ~1u;
        if (!dx) r &= ~6u;
        if (!dx && !da) r &= ~8u;
    }
    return r;
}
/* Whether backward of t reads t's own value. */
static inline bool cgi_bwd_reads_out(const cg_tensor *t) {
    return t->op == CGI_OP_CUSTOM ? cgi_custom_reads_out(t) : cgi_ops[t->op].bwd_reads_out;
}
/* The name of t's op: a custom op's own name, else the table's. */
static inline const char *cgi_op_name_of(const cg_tensor *t) {
    return t->op == CGI_OP_CUSTOM ? cgi_custom_name(t) : cgi_ops[t->op].name;
}

/* Assigns storage to every value, gradient and scratch buffer of g by liveness (graph/plan.c). */
cg_status cgi_plan(cg_graph *g);
/* Whether backward can remake t's value from what it keeps for its own backward, bit for bit and
 * for a small part of forward's cost (graph/plan.c). */
bool cgi_regen_ok(const cg_tensor *t);
/* Writes t's value again into t->data (cgi_regen_ok(t)). */
void cgi_regen(cg_tensor *t);
/* A fused linear + GELU's output again, from the product it keeps (ops/matmul.c). */
void cgi_linear_act_regen(cg_tensor *t);
/* A layer norm's (or residual add + layer norm's, from the sum it keeps) output again, from the
 * statistics its backward keeps (ops/norm.c). */
void cgi_norm_regen(cg_tensor *t);
/* Fused attention node t keeps no probabilities for its backward, which remakes them from the
 * scores (ops/attention.c): the bytes its scratch would shrink by (0: it would not), and with
 * apply, done where it does. */
size_t cgi_sdpa_remake_probs(cg_tensor *t, bool apply);
/* The fused LM head t runs in chunks of half the rows (ops/loss_head.c): the bytes its scratch would
 * shrink by (0: unchanged), and with apply, done. */
size_t cgi_lce_halve_chunks(cg_tensor *t, bool apply);
/* The fused LM head t sizes its chunks from the rows its targets count, if they are a graph input
 * already filled (ops/loss_head.c); the plan calls it before it sizes the buffers. */
void cgi_lce_plan(cg_tensor *t);
/* Whether the fused LM head t would write its weight's gradient in its forward if the optimizer's
 * plan held that gradient from then (ops/loss_head.c): a float training graph, a trainable weight
 * that is a parameter itself, a forward that checkpointing does not run again in backward. */
bool cgi_lce_ahead_plannable(const cg_tensor *t);
/* The plan holds the weight's gradient of LM head t, g->pgrad[j], from t's forward on (j < 0: it
 * does not); cgi_lce_plan clears it. */
void cgi_lce_set_planned_grad(cg_tensor *t, int j);

/* ---- gradient checkpointing (graph/checkpoint.c) ---- */
/* Decides which nodes backward recomputes (t->recompute), from each node's kept flag and its
 * readers: consumers[i] counts them, sole[i] is the last. Clears every flag when checkpointing is off. */
void cgi_ckpt_decide(cg_graph *g, const int *consumers, const int *sole);
/* The plan's time axis: forward of node i at time i, then the backward sweep, where node i's
 * backward is at bt[i] and, when it is recomputed, its recompute at rt[i] (else -1), just before
 * its segment's backward. Returns the number of times. */
int64_t cgi_ckpt_timeline(const cg_graph *g, int64_t *bt, int64_t *rt);
/* Backward entering the segment whose last node (in the sweep: the first met) is hi: swaps in the
 * recompute buffers of nodes [lo, hi] and recomputes them from the segment's inputs. */
cg_status cgi_ckpt_recompute(cg_graph *g, int lo, int hi);
/* Backward leaving the segment [lo, hi]: swaps the forward buffers back in. */
void cgi_ckpt_restore(cg_graph *g, int lo, int hi);
/* Runs node t's forward kernel (profiled, and nudged under a gradient check). */
cg_status cgi_run_forward(cg_graph *g, cg_tensor *t);
/* Re-points every view at its root's value and gradient: parameter storage may move between runs. */
void cgi_resolve_views(cg_graph *g);
/* Whether CGRAD_PROFILE asks for per-op kernel times. */
bool cgi_profiling(void);
/* The profile's clock in seconds (> 0): wall time, or the thread's CPU time under CGRAD_PROFILE_CLOCK=cpu. */
double cgi_profile_now(void);
/* cgi_profile_now at a node's start (cgi_profile_node ends it): also marks the team's counters
 * (cgi_team_profile), so the node's time shared with helpers is told from its time alone. */
double cgi_profile_clock(void);
/* Records node t's kernel time since t0 for pass 0 (forward) or 1 (backward). */
void cgi_profile_node(cg_tensor *t, int pass, double t0);

/* ---- errors: the library's short names for public calls (graph.h) ---- */
#define cgi_fail cg_set_error    /* sets the message, returns the status */
#define cgi_shp cg_shape_str     /* "[2,3]" in a rotating thread-local buffer */
/* For a module's own printf-style error wrapper: sets the message to head (the module's "[op] file:
 * " prefix) followed by fmt formatted from ap (at most 767 characters of it), and returns s. */
cg_status cgi_fail_headed(cg_status s, const char *head, const char *fmt, va_list ap);
#define cgi_dims cg_dims_str

/* ---- node construction ---- */
#define cgi_inputs_ok cg_graph_check_inputs /* false if g or an input is NULL or from another graph */
/* New contiguous compute node; requires_grad follows the sources and the graph's mode. */
cg_tensor *cgi_node(cg_graph *g, int op, cg_dtype dt, int ndim, const int64_t *shape, int nsrc,
                    cg_tensor *const *src);
/* Zeroed storage for a node's settings (a struct the op defines, kept in its t->params), in the
 * graph's node arena, so it lives as long as the node and kernels read it on every run. NULL with
 * a message naming op when out of memory. Allocate before cgi_node, so that a failure leaves no
 * node behind. For ops whose settings outgrow iarg and farg (attention's options, rope's table). */
void *cgi_node_params(cg_graph *g, const char *op, size_t bytes);
/* New view of x with the given shape, strides and offset (elements from x's root). */
cg_tensor *cgi_view(cg_graph *g, int op, cg_tensor *x, int ndim, const int64_t *shape,
                    const int64_t *stride, int64_t offset);
/* Normalises a possibly negative axis; -1 (with message) if out of range. */
int cgi_axis(const char *op, const cg_tensor *t, int axis);
bool cgi_expect_real(const char *op, const cg_tensor *t, const char *role);
int64_t cgi_numel(int ndim, const int64_t *shape);
bool cgi_contiguous(const cg_tensor *t);
/* Offset in elements of element i (row-major position) of t through its strides: for serial
 * loops over small or int32 tensors (ids, targets, masks) that may be views. */
static inline int64_t cgi_elem_offset(const cg_tensor *t, int64_t i) {
    int64_t off = 0;
    for (int d = t->ndim - 1; d >= 0; d--) {
        off += (i % t->shape[d]) * t->stride[d];
        i /= t->shape[d];
    }
    return off;
}
/* True when t reads one element for several positions: an axis longer than 1 with stride 0 (a
 * cg_expand view, or a view of one). Backward rules must not add into such a gradient through its
 * strides (several threads would add into one element); the graph hands such a source to an op only
 * if the op reads strides and reduces its gradient over those axes (cgi_op_reads_broadcast), and
 * to every other op as a contiguous copy. */
static inline bool cgi_broadcast_view(const cg_tensor *t) {
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] > 1 && t->stride[d] == 0) return true;
    return false;
}
/* Whether op reads a cgi_broadcast_view source in place: its forward reads any strides and its
 * backward sums the gradient over the zero-stride axes in one deterministic reduction. */
bool cgi_op_reads_broadcast(int op);
void cgi_contig_strides(int ndim, const int64_t *shape, int64_t *stride);
/* Broadcast shape of a and b into out; false if incompatible. */
bool cgi_broadcast_shape(const cg_tensor *a, const cg_tensor *b, int *ndim, int64_t *out);
/* The node of a binary op over a and b broadcast together (NumPy's rule), of dtype dt; NULL with
 * "[op] a[..] and b[..] do not broadcast" when they do not. The caller checks inputs and dtypes first
 * (ops/elementwise.c). */
cg_tensor *cgi_broadcast_node(cg_graph *g, int op, cg_dtype dt, cg_tensor *a, cg_tensor *b);
/* Strides of t read as the broadcast shape (0 where t is broadcast). */
void cgi_broadcast_strides(const cg_tensor *t, int ndim, const int64_t *shape, int64_t *stride);

/* y (= linear(x, w, ...)) plus the low-rank adapter of w's parameter, when it has one (ops/lora.c). */
cg_tensor *cgi_lora_linear(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *y);
/* linear(x, w) for a weight with an adapter read as its parameter or a block of its rows, as one
 * fused node (cgi_lora_linear_fused); NULL when the layout is another or on an error (then
 * cgi_lora_linear composes it). */
cg_tensor *cgi_lora_linear_plain(cg_graph *g, cg_tensor *x, cg_tensor *w);
/* y[..., n] = x w^T + scale (x a^T) b^T in one node (LoRA's fused linear): x [..., k], w [n, k],
 * a [r, k], b [n, r]; the adapter's low-rank product is kept for backward, no [.., n] delta is
 * made, and backward runs the adapter's products beside dX's. NULL (cg_last_error) on bad shapes. */
cg_tensor *cgi_lora_linear_fused(cg_graph *g, cg_tensor *x, cg_tensor *w, cg_tensor *a, cg_tensor *b, double scale);
/* Whether t is a linear product whose src[0] is its input x and src[1] its weight [out, in]
 * (linear, or LoRA's fused linear): the bf16 planner and the memory plan treat both alike. */
static inline bool cgi_is_linear(const cg_tensor *t) { return t->op == CGI_OP_LINEAR || t->op == CGI_OP_LORA_LINEAR; }

/* ---- threads ---- */
/* Threads a kernel may use: the run's count (cgi_run_begin) inside a graph run, else cg_threads() (1 while
 * the cores guard holds one thread). */
int cgi_nthreads(void);
#define CGI_RUN_PAR_MIN 1073741824.0 /* estimated multiply-adds below which a graph run stays on one thread */
/* Threads a graph run of this much work (cgi_graph_work) uses: 1 below CGI_RUN_PAR_MIN or while the cores
 * guard holds one thread, else all. */
int cgi_run_threads(double work);
/* Sets the calling thread's count for a graph run; returns the previous one for cgi_run_end. */
int cgi_run_begin(int threads);
void cgi_run_end(int was);
/* The work below which a graph run stays on one thread: CGI_RUN_PAR_MIN or CGRAD_RUN_PAR_MIN. */
double cgi_run_par_min(void);
#define CGI_RUN_TEAM_MIN 67108864.0 /* estimated multiply-adds from which a run below CGI_RUN_PAR_MIN is a team span */
/* True when a graph run of this much work runs as a team span of its own (graph/threads.c):
 * from CGI_RUN_TEAM_MIN (CGRAD_RUN_TEAM_MIN), above cgi_run_par_min too unless CGRAD_TEAM_LARGE=0,
 * on several threads, not inside a team, not while the cores guard holds one. */
bool cgi_run_in_team(double work);
#define CGI_TEAM_LARGE_DEFAULT 1 /* whether runs from cgi_run_par_min are team spans too (CGRAD_TEAM_LARGE) */
/* Tests: 1 runs from cgi_run_par_min as team spans, 0 as parallel regions per op, -1 reads CGRAD_TEAM_LARGE again. */
void cgi_set_team_large(int on);

/* ---- the cores guard (graph/cores.c): one thread when the others get no core ---- */
enum { CGI_CORES_WATCH, CGI_CORES_PROBE, CGI_CORES_HOLD, CGI_CORES_RETRY }; /* PROBE, HOLD: one thread */
enum { CGI_CORES_WINDOW = 4 }; /* runs timed per side */
typedef struct {
    int phase, runs, settle, contended;
    bool started;
    int hold_len, quiet_len, quiet;                       /* runs one thread is held / the watch rests */
    double t[2][CGI_CORES_WINDOW], w[2][CGI_CORES_WINDOW]; /* the last runs' seconds and work: [0] every thread, [1] one */
    int filled[2];
    long long runs_all, runs_one, switches;
} cgi_cores_guard;
/* True while g holds (or probes) one thread. */
bool cgi_cores_one(const cgi_cores_guard *g);
/* One finished run into g: its wall seconds, the run delay of the process's threads over it per thread
 * of the run, its work. */
void cgi_cores_feed(cgi_cores_guard *g, double seconds, double delay, double work);
/* True while the process's guard has large runs (and the kernels outside runs) on one thread. */
bool cgi_cores_holding_one(void);
/* The guard's setting in words, for cg_runtime_info. */
const char *cgi_cores_describe(void);
/* Tests: 0 off, 1 on, 2 printing decisions, 3 and every run; resets the process's guard. */
void cgi_cores_set_mode(int mode);
/* Tests: 1 holds one thread, 0 every thread, whatever the guard measures; -1 lets it decide again. */
void cgi_cores_force(int one);
/* Large runs so far on every thread and on one, and the probes of either side. */
void cgi_cores_counts(long long *runs_all, long long *runs_one, long long *switches);
/* A sentence on the runs the guard held on one thread, for a command's summary; NULL when it held none. */
const char *cgi_cores_summary(void);
/* A graph run in progress: its thread count (cgi_run_begin) and, when the guard times it, its start. */
typedef struct {
    int was, threads;
    double work, t0, d0;
    bool timed;
} cgi_run;
/* Opens a run of this much work (one: on one thread whatever it is, as inside a team). */
cgi_run cgi_run_open(double work, bool one);
/* Closes it, and feeds the guard when it was timed. */
void cgi_run_close(const cgi_run *r);
/* Estimated multiply-adds (or element operations) of one forward of g's compute nodes. */
double cgi_graph_work(const cg_graph *g);
/* True on the thread running cg_run_with_team's body: its products are cut into team pieces. */
bool cgi_team_on(void);
/* True when a team's helpers are awake to share pieces (the guard is not resting them). */
bool cgi_team_sharing(void);
/* The threads that take a team's pieces: thread 0 and its helpers while they share, else 1. */
int cgi_team_threads(void);
/* fn(ctx, 0 .. pieces-1), shared with the team's helpers when they are awake; returns when all are done. */
void cgi_team_pieces(void (*fn)(void *ctx, int piece), void *ctx, int pieces);
/* body(ctx, lo, hi) over [lo, hi) ranges covering [0, n): as a team's pieces while its helpers
 * share and `work` (elements) reaches CGI_TEAM_PART_MIN, as one range per thread when
 * cgi_par(work), else [0, n) at once. Ranges hold whole items, so a body whose items are
 * independent writes the same bits however [0, n) is cut. */
void cgi_par_ranges(int64_t n, int64_t work, void (*body)(int64_t lo, int64_t hi, void *ctx), void *ctx);
/* fn(ctx, 0 .. n-1) (n <= INT_MAX), each piece whole on one thread, for an op with a scratch slot
 * per thread (`slots`, sized at construction; a piece uses slot omp_get_thread_num()): a team's
 * pieces inside a team whose threads the slots cover, else an OpenMP loop over at most `slots` of
 * the run's threads, else in order. The bits do not depend on which thread runs a piece. */
void cgi_slot_pieces(int64_t n, int slots, void (*fn)(void *ctx, int piece), void *ctx);
/* Inside a team span: [0, n) cut into `parts` even ranges that the team's threads claim (cgi_team_pieces). */
void cgi_team_ranges(int64_t n, int parts, void (*body)(int64_t lo, int64_t hi, void *ctx), void *ctx);
#define CGI_TEAM_PART_MIN 16384 /* elements from which a team shares an op's rows (graph/team.c) */
/* Whether thread 0's wait of `waited` s for the helpers' last pieces, after `own` s on its own
 * pieces, means a helper was switched out mid-piece (a stall), not an uneven split. */
bool cgi_team_stalled(double waited, double own);
/* Around each graph run inside a team: the guard times it per unit of work (graph/team.c). */
void cgi_team_run_begin(void);
void cgi_team_run_end(double work);
/* body(ctx) as a graph run of this much work: a team span when cgi_run_in_team(work) (from
 * cgi_run_par_min, a span whose helpers always share, and only for an fp32 graph), else as it is. */
cg_status cgi_run_graph(double work, bool fp32, cg_status (*body)(void *ctx), void *ctx);
/* True on thread 0 of a large run's span (cgi_run_graph): the cores guard times the run. */
bool cgi_team_large(void);
/* The guard's modes (CGRAD_TEAM_GUARD=auto|on|off|fallback): measure; helpers always; never; and
 * measure but always judge the helpers slower (to test the fallback). */
enum { CGI_TEAM_GUARD_AUTO, CGI_TEAM_GUARD_ON, CGI_TEAM_GUARD_OFF, CGI_TEAM_GUARD_FALLBACK };
void cgi_team_set_guard(int mode);
typedef struct {
    long long runs_with_helpers, runs_without, helper_pieces, stalls;
    long long pieces, wait_ns; /* pieces shared in all; thread 0's time waiting for helpers' last pieces */
    long long naps; /* helpers' naps between tasks (never in a large run's span) */
} cgi_team_counts;
/* Counts since the process began, for tests and the bench. */
void cgi_team_stats(cgi_team_counts *c);
/* Under CGRAD_PROFILE: this thread's seconds (the profile's clock) inside a team's shared pieces so
 * far, and of them waiting for a helper's last piece. */
void cgi_team_profile(double *shared, double *wait);
/* Tests: thread 0 waits (up to 100 ms) for a helper to claim each task's first piece, so a loaded
 * machine that keeps the helpers switched out cannot leave them without work to check. */
void cgi_team_wait_for_helpers(bool on);
/* The executor's place on this thread: node t's pass (0 forward, 1 backward) begins (done false)
 * or ends (done true). CGRAD_TEAM_STATS=2 names the places around each stretch in which thread 0
 * gave a team no task for long enough that its helper stopped spinning. */
void cgi_team_note(const cg_tensor *t, int pass, bool done);
/* Chooses BLIS's kernel set (graph/kernels.c) once; call before BLIS's first use. */
void cgi_blis_init(void);
enum { CGI_CPU_AVX2_FMA = 1, CGI_CPU_AVX512 = 2, CGI_CPU_AMD = 4 };
/* This CPU's CGI_CPU_* flags. */
unsigned cgi_cpu_features(void);
/* The kernel set to run given BLIS's own pick (NULL: unknown) and its log, and why (static text). */
const char *cgi_pick_kernels(const char *blis_pick, const char *blis_log, unsigned features, const char **why);
#define CGI_PAR_MIN 131072 /* elements below which a kernel stays on one thread */
/* True when a kernel's loop over `work` elements runs on several threads: above CGI_PAR_MIN, in a
 * run with more than one. */
static inline bool cgi_par(int64_t work) { return work > CGI_PAR_MIN && cgi_nthreads() > 1; }
/* CGI_PAR_FOR(work, for (...) body): the loop as an OpenMP parallel for (static schedule) when
 * cgi_par(work), else run as plain C. OpenMP's `if` clause would still enter the runtime, which
 * makes and ends a team of one each time: 0.5 us, 1 us nested inside a thread team, and a cached
 * gpt-tiny token ran 36 such regions (layer norms, adds, cache writes, GELU, embeddings). The body
 * is written twice by the preprocessor, so it may hold no directive of its own. */
#define CGI_PAR_FOR(work, ...)                                                         \
    do {                                                                               \
        if (cgi_par(work)) {                                                           \
            _Pragma("omp parallel for schedule(static) num_threads(cgi_nthreads())")   \
            __VA_ARGS__                                                                \
        } else {                                                                       \
            __VA_ARGS__                                                                \
        }                                                                              \
    } while (0)
/* For a backward rule about to write x's gradient for the first time in its op: true when it may
 * assign rather than add (x owns its storage and nothing has written it in this pass), which saves
 * zeroing it; otherwise the gradient is zeroed if this pass has not done so yet, and the rule adds. */
bool cgi_grad_begin(cg_tensor *x);
/* cgi_grad_begin, and also true for a view holding all of a node's gradient that nothing wrote this
 * pass; for a rule that writes x's gradient before any other input's that may share its storage. */
bool cgi_grad_begin_whole(cg_tensor *x);
/* cgi_grad_begin for n views of one node that together hold each element of its gradient once (q, k
 * and v cut from one projection), for a rule that writes all of them in full before anything adds to
 * them: true when nothing has written that gradient this pass (they may assign). */
bool cgi_grad_begin_views(cg_tensor *const *v, int n);
/* As cgi_grad_begin for a rule that only adds into x's gradient: zeroes it if nothing has written it. */
void cgi_grad_prepare(cg_tensor *x);
/* cgi_grad_begin when the rule can assign, else cgi_grad_prepare: true when it may write, not add. */
bool cgi_grad_claim(cg_tensor *x, bool can_assign);
/* C[i, j] = bias[j * bs] for i < m, j < n (C's strides rsc, csc): the "C = bias" start of a product
 * that then adds A B into C (beta 1), where the bias cannot go to the output stage. */
static inline void cgi_fill_bias(cg_real *c, int64_t m, int64_t n, int64_t rsc, int64_t csc, const cg_real *bias,
                                 int64_t bs) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) c[i * rsc + j * csc] = bias[j * bs];
}
/* row[j] += bias[j * bs] for j < n; the contiguous case apart, so it vectorises. */
static inline void cgi_add_bias_row(cg_real *row, const cg_real *bias, int64_t bs, int64_t n) {
    if (bs == 1)
        for (int64_t j = 0; j < n; j++) row[j] += bias[j];
    else
        for (int64_t j = 0; j < n; j++) row[j] += bias[j * bs];
}
/* Zeroes a parameter's stale gradient (cg_params_zero_grad defers it to the first reader or writer). */
void cgi_param_settle(cg_tensor *p);
/* Settles parameters first .. first + n - 1 of the set (n < 0: all). */
void cgi_params_settle(cg_params *ps, int first, int n);
/* The gradient block without settling or marking it handed out (library readers settle first). */
cg_real *cgi_params_grads(cg_params *ps);
/* True when a and b both receive gradients and their gradient storage may share an element
 * (same root, overlapping views; exact for views with the same strides, conservative otherwise).
 * A backward rule that writes two gradients concurrently must write them one after the other
 * when this holds: they would race on the shared elements. */
bool cgi_grads_alias(const cg_tensor *a, const cg_tensor *b);
/* True when a and b are the same view of the same root (same offset, shape and strides). */
bool cgi_same_view(const cg_tensor *a, const cg_tensor *b);
/* memset to zero, split over the threads when large (a lone memset leaves the others spinning) */
void cgi_zero(void *p, size_t bytes);
/* Bytes cgi_zero has cleared so far (tests: gradients a rule writes first are not zeroed). */
long long cgi_zeroed_bytes(void);

/* ---- strided iteration: shape split into rows x inner, dims collapsed where possible ---- */
/* Inner runs are cut into chunks so that one long contiguous row still spreads over threads. */
#define CGI_CHUNK 8192
static inline int64_t cgi_chunks(int64_t inner) { return inner > 0 ? (inner + CGI_CHUNK - 1) / CGI_CHUNK : 1; }
#define CGI_ITER_MAX 4
typedef struct {
    int ndim;                       /* >= 1 after collapsing */
    int nops;
    int64_t shape[CG_MAX_DIMS];
    int64_t st[CGI_ITER_MAX][CG_MAX_DIMS];
    int64_t rows, inner;
} cgi_iter;

void cgi_iter_init(cgi_iter *it, int ndim, const int64_t *shape, int nops,
                   const int64_t *const *strides);

/* Start offset of each operand for row r. */
static inline void cgi_iter_row(const cgi_iter *it, int64_t r, int64_t *off) {
    for (int k = 0; k < it->nops; k++) off[k] = 0;
    for (int d = it->ndim - 2; d >= 0; d--) {
        int64_t i = r % it->shape[d];
        r /= it->shape[d];
        for (int k = 0; k < it->nops; k++) off[k] += i * it->st[k][d];
    }
}

/* ---- shared kernels ---- */
/* C[m,n] = alpha A[m,k] B[k,n] + beta C through BLIS, any strides, on up to `threads` threads
 * (ops/gemm.c). */
void cgi_gemm(int64_t m, int64_t n, int64_t k, const cg_real *a, int64_t rsa, int64_t csa, const cg_real *b,
              int64_t rsb, int64_t csb, cg_real alpha, cg_real beta, cg_real *c, int64_t rsc, int64_t csc, int threads);
/* Whether float products with row-major C run through cgrad's blocked driver (ops/gemm.c) rather
 * than BLIS's (the kernel set and CGRAD_GEMM_BLIS decide). */
bool cgi_gemm_blocked_on(void);
/* Whether the blocked driver packs an A stored by rows a panel at a time, just before the panel's
 * tiles (on: the default; CGRAD_GEMM_PANELS=0 sets it off), or as a whole block ahead; benches
 * switch it between products to compare the two. The results are the same bits. */
void cgi_gemm_set_panels(bool on);
/* C[m,n] (rows rsc, columns contiguous) = alpha A B (+ a contiguous bias row) + beta C from
 * bfloat16 operands (uint16_t, any strides) with float accumulation on the fp32 FMA units: cgrad's
 * blocked driver on BLIS's float micro-kernel, the operands widened to float (exact) as they are
 * packed, on up to `threads` threads. c_bf16: C is bfloat16, rounded once from the float sum plus
 * the bias (beta must be 0). False (nothing written) in the float64 build. */
bool cgi_gemm_bf16(int64_t m, int64_t n, int64_t k, const uint16_t *a, int64_t rsa, int64_t csa, const uint16_t *b,
                   int64_t rsb, int64_t csb, float alpha, float beta, void *c, int64_t rsc, const float *bias, bool c_bf16,
                   int threads);
/* cgi_gemm_bf16 with each operand's element type given (CGI_EL_*: float, bf16 or fp16, any mix):
 * the products that read a frozen weight in place from its file. False in the float64 build. */
bool cgi_gemm_half(int64_t m, int64_t n, int64_t k, const void *a, int ta, int64_t rsa, int64_t csa, const void *b, int tb,
                   int64_t rsb, int64_t csb, float alpha, float beta, void *c, int64_t rsc, const float *bias, bool c_bf16,
                   int threads);
/* Whether products can read half-precision operands in place (cgi_gemm_half; not in the float64 build). */
static inline bool cgi_half_products(void) {
#ifdef CGRAD_DOUBLE
    return false;
#else
    return true;
#endif
}
/* What a product reads for tensor t: a half-precision parameter's elements in place (their type
 * to *el) where products can (cgi_half_products), else t's floats (*el CGI_EL_F32; a half
 * parameter's must have been widened, cgi_param_float). */
static inline const void *cgi_operand_elems(const cg_tensor *t, int *el) {
    const uint16_t *h = cgi_half_products() ? cgi_half_operand(t, el) : NULL;
    if (h) return h;
    *el = CGI_EL_F32;
    return t->data;
}
/* One product for cgi_gemm_many: C[m,n] = alpha A[m,k] B[k,n] + beta C, or, with a bias (a row
 * of n, stride bias_stride), alpha A B + the bias on every row (beta unused); relu: then
 * C = max(C, 0) (NaN to 0, as cg_relu), applied to each strip of C while it is in cache. */
typedef struct {
    int64_t m, n, k;
    const cg_real *a;
    int64_t rsa, csa;
    const cg_real *b;
    int64_t rsb, csb;
    cg_real alpha, beta;
    cg_real *c;
    int64_t rsc, csc;
    const cg_real *bias;
    int64_t bias_stride;
    bool relu;
    uint8_t ta, tb; /* CGI_EL_*: a's and b's element type (0, float, unless set); a half-precision operand
                     * is widened as it is packed, its strides counted in its own elements */
    const cg_real *res; /* set: then C += res[m, n] (rows res_rs apart, columns contiguous), added
                         * after the whole sum (and bias) while each strip of C is in cache: a
                         * residual add folded into the product (float C, no relu) */
    int64_t res_rs;
} cgi_gemm_job;
/* Independent products (no C shared) side by side on up to `threads` threads, each cut into
 * pieces the threads share: one team, no barrier but the last. */
void cgi_gemm_many(const cgi_gemm_job *jobs, int njobs, int threads);
/* cgi_gemm_many, then task(ctx, i) for i < ntasks as further pieces of the same parallel region
 * (each wakes no thread of its own: under a passive wait policy a region costs a wake); tasks must
 * not touch the products' operands' memory as written. */
void cgi_gemm_many_then(const cgi_gemm_job *jobs, int njobs, int threads, void (*task)(void *ctx, int i), void *ctx,
                        int ntasks);
/* Tests: how a sharing team cuts matrix products, "guided" (the default), "taper" or "even"; NULL
 * reads CGRAD_TEAM_SPLIT again. */
void cgi_gemm_set_split(const char *mode);
/* Tests: the pieces a sharing team of `threads` cuts jobs into, in claiming order, as {job, lo, hi}
 * (rows of C, or columns where C has more of them); returns how many, or -1 above max. */
int cgi_gemm_team_cuts(const cgi_gemm_job *jobs, int njobs, int threads, int64_t (*cuts)[3], int max);
/* Tests: blocks that a sharing team's pieces have read from a shared pack another piece packed, so far. */
long long cgi_gemm_shared_reads(void);
/* Products on BLIS's own micro-kernel over operands packed by the caller, for small products
 * that reuse an operand many times (attention's keys and values): packing it once replaces a
 * repack in every BLIS call (ops/gemm.c). A packed operand is a run of panels: A's of `mr`
 * rows, B's of `nr` columns, each panel k deep with the other index fastest. */
typedef struct {
    int64_t mr, nr;     /* the micro-tile along C's rows and columns */
    int64_t pmr, pnr;   /* panel widths, the tile padded as BLIS packs it */
    bool swap;          /* the kernel prefers C by columns: it computes C^T, A's panels as its B */
    void *kernel, *cntx;
    void *pack_a, *pack_b; /* BLIS's packing kernels for those widths, NULL where it has none */
} cgi_ukr;
/* The micro-kernel of the running machine for cg_real. */
void cgi_ukr_init(cgi_ukr *u);
/* Reals to allocate for a packed A of m rows (or B of n columns) and depth k: its panels and the
 * kernel's read-ahead past the last one. */
size_t cgi_ukr_packed_a(const cgi_ukr *u, int64_t m, int64_t k);
size_t cgi_ukr_packed_b(const cgi_ukr *u, int64_t k, int64_t n);
/* Packs A[m,k] (strides rs, cs) into A panels, rows past m zero. */
void cgi_ukr_pack_a(const cgi_ukr *u, int64_t m, int64_t k, const cg_real *a, int64_t rs, int64_t cs, cg_real *dst);
/* Packs B[k,n] (strides rs, cs) into B panels, columns past n zero. */
void cgi_ukr_pack_b(const cgi_ukr *u, int64_t k, int64_t n, const cg_real *b, int64_t rs, int64_t cs, cg_real *dst);
/* cgi_ukr_pack_a / cgi_ukr_pack_b from half-precision elements of type el (CGI_EL_BF16 or
 * CGI_EL_F16), widened as they are packed (ops/gemm.c; float builds only). */
void cgi_ukr_pack_a_half(const cgi_ukr *u, int64_t m, int64_t k, const uint16_t *a, int el, int64_t rs, int64_t cs,
                         float *dst);
void cgi_ukr_pack_b_half(const cgi_ukr *u, int64_t k, int64_t n, const uint16_t *b, int el, int64_t rs, int64_t cs,
                         float *dst);
/* C[m,n] = alpha A B + beta C from packed A (depth ka) and B (depth kb), using the first k of
 * each. Causal shapes: unless n_diag is CGI_UKR_FULL, a tile whose first column exceeds its last
 * row + n_diag is skipped (left unwritten); unless k_diag is CGI_UKR_FULL, rows [i, i + mr) use
 * only depth i + mr + k_diag. Single-threaded. */
#define CGI_UKR_FULL INT64_MIN
void cgi_ukr_gemm(const cgi_ukr *u, int64_t m, int64_t n, int64_t k, cg_real alpha, const cg_real *a, int64_t ka,
                  const cg_real *b, int64_t kb, cg_real beta, cg_real *c, int64_t rsc, int64_t csc, int64_t n_diag,
                  int64_t k_diag);
/* dst (dst_stride) = or += scale * src (src_stride), over shape. */
void cgi_copy(cg_real *dst, const int64_t *dst_stride, const cg_real *src, const int64_t *src_stride,
              int ndim, const int64_t *shape, double scale, bool accumulate);
/* Sums src (shape, src_stride) over the axes in reduce_mask into dst (dst_stride read over the
 * same ndim, ignored on reduced axes), times scale, added to dst when accumulate. Deterministic. */
void cgi_reduce(cg_real *dst, const int64_t *dst_stride, const cg_real *src, const int64_t *src_stride,
                int ndim, const int64_t *shape, unsigned reduce_mask, double scale, bool accumulate);
/* Adds a gradient computed in the output's shape (contiguous) into the gradient of input t,
 * times scale, summing over the axes along which t was broadcast. */
void cgi_unbroadcast_add(cg_tensor *t, const cg_real *g_out, int ndim, const int64_t *out_shape,
                         double scale);
/* cgi_unbroadcast_add for a rule that claims t (CGI_GRAD_CLAIMS_ALL): assigns when it is t's first
 * writer (cgi_grad_begin), else adds. */
void cgi_unbroadcast_claim(cg_tensor *t, const cg_real *g_out, int ndim, const int64_t *out_shape, double scale);
/* Column sums of m[rows, cols] (row stride ld) added into dst[cols]; fixed blocking keeps the
 * result independent of the thread count. scratch holds cgi_colsum_scratch(rows, cols) reals. */
void cgi_colsum_add(cg_real *dst, const cg_real *m, int64_t rows, int64_t cols, int64_t ld,
                    cg_real *scratch);
size_t cgi_colsum_scratch(int64_t rows, int64_t cols);
/* cgi_colsum_add in pieces, for a caller that runs them inside a parallel region of its own (a
 * linear's gradient products, cgi_gemm_many_then): cgi_colsum_task(ctx, i) for every i below
 * cgi_colsum_tasks(), in any order and on any threads, then cgi_colsum_tasks_finish; the same blocks
 * and order as cgi_colsum_add, so the same sums. */
typedef struct {
    cg_real *dst, *scratch;
    const cg_real *m;
    int64_t rows, cols, ld;
} cgi_colsum_ctx;
int cgi_colsum_tasks(void);
void cgi_colsum_task(void *ctx, int i);
void cgi_colsum_tasks_finish(const cgi_colsum_ctx *c);
/* As cgi_colsum_add over the rows make(ctx, r) returns, which may compute row r first (a fused
 * producer); same blocks and order, so it sums exactly as cgi_colsum_add over the finished rows. */
void cgi_colsum_add_made(cg_real *dst, int64_t rows, int64_t cols, cg_real *scratch,
                         const cg_real *(*make)(void *ctx, int64_t r), void *ctx);
/* The activation of the fused linear + activation op (cg_linear_gelu, cg_linear_relu), its iarg[0]. */
typedef enum { CGI_ACT_GELU, CGI_ACT_GELU_TANH, CGI_ACT_RELU } cgi_act;
/* The fused linear + activation's passes (ops/act_passes.c): y = gelu(c + b) over the product
 * c[m, n] (b NULL: none; GELU's only: ReLU's forward is in the product, see cgi_gemm_job), for
 * the tanh form with deriv also c = gelu'(c + b) over the product, from the same exponential (y NULL:
 * not written); and backward c = dpre = dy * act'(pre): the tanh form's from the derivative c holds
 * (c_deriv), else from the product c, pre = c + b, to the same bits; erf's from the product and y;
 * ReLU's from y's sign (c any buffer); with db += its column sums (db NULL: none; scratch as
 * cgi_colsum_add's). */
void cgi_bias_gelu_fwd(cg_real *c, const cg_real *b, cg_real *y, int64_t m, int64_t n, bool tanh_form, bool deriv);
void cgi_bias_act_bwd(cg_real *c, const cg_real *b, const cg_real *y, const cg_real *dy, int64_t m, int64_t n,
                      cgi_act act, bool c_deriv, cg_real *db, cg_real *scratch);

/* The constants of cgi_exp's Cephes polynomial: log2(e), ln 2 split in a high and a low part, and
 * the polynomial's coefficients from the highest power down. Named once, so the hand-vectorised copy
 * (cgi_exp16 in ops/exp16.h: GELU's passes, attention's softmax) computes the same function. */
#define CGI_EXP_LOG2E 1.44269504088896341f
#define CGI_EXP_LN2_HI 0.693359375f
#define CGI_EXP_LN2_LO 2.12194440e-4f
#define CGI_EXP_P0 1.9875691500e-4f
#define CGI_EXP_P1 1.3981999507e-3f
#define CGI_EXP_P2 8.3334519073e-3f
#define CGI_EXP_P3 4.1665795894e-2f
#define CGI_EXP_P4 1.6666665459e-1f
#define CGI_EXP_P5 5.0000001201e-1f

/* e^x for the softmax family: a branch-free Cephes-style polynomial (about 2 ulp in float) that
 * the compiler vectorises, where libm's expf is a scalar call per element. e^-inf is exactly 0;
 * e^NaN is NaN. */
static inline cg_real cgi_exp(cg_real x) {
#ifdef CGRAD_DOUBLE
    return exp(x);
#else
    /* Clamped with comparisons that are false for NaN, so NaN becomes -87 here (a finite exponent,
     * no undefined float-to-int conversion or negative shift) and is put back at the end. */
    float xc = x > -87.0f ? x : -87.0f;
    xc = xc < 88.3762626647949f ? xc : 88.3762626647949f;
    float fx = __builtin_floorf(xc * CGI_EXP_LOG2E + 0.5f);
    float r = xc - fx * CGI_EXP_LN2_HI + fx * CGI_EXP_LN2_LO;
    float y = CGI_EXP_P0;
    y = y * r + CGI_EXP_P1;
    y = y * r + CGI_EXP_P2;
    y = y * r + CGI_EXP_P3;
    y = y * r + CGI_EXP_P4;
    y = y * r + CGI_EXP_P5;
    y = y * r * r + r + 1.0f;
    union { uint32_t i; float f; } scale = {.i = (uint32_t)((int32_t)fx + 127) << 23};
    return x < -103.97f ? 0.0f : x == x ? y * scale.f : x;
#endif
}

/* Row reductions of the softmax family in CGI_LANES independent partial results, so that the loops
 * vectorise without reassociation and give the same answer on every run and thread count. */
enum { CGI_LANES = 16 };

/* CGI_LANES reals as one vector (GCC's and clang's vector extension), with lane masks */
typedef cg_real cgi_lanes __attribute__((vector_size(CGI_LANES * sizeof(cg_real))));
#ifdef CGRAD_DOUBLE
typedef int64_t cgi_lane_mask __attribute__((vector_size(CGI_LANES * sizeof(cg_real))));
#else
typedef int32_t cgi_lane_mask __attribute__((vector_size(CGI_LANES * sizeof(cg_real))));
#endif

/* max over x[0..n) (-inf when n is 0). Lane l keeps x > m ? x : m as a mask select: GCC 12 left
 * that form in scalar code (a third of the fused LM head's softmax time); same bits. */
static inline cg_real cgi_row_max(const cg_real *x, int64_t n) {
    cgi_lanes m;
    for (int l = 0; l < CGI_LANES; l++) m[l] = -INFINITY;
    int64_t c = 0;
    for (; c + CGI_LANES <= n; c += CGI_LANES) {
        cgi_lanes v;
        memcpy(&v, x + c, sizeof v);
        const cgi_lane_mask gt = v > m;
        m = (cgi_lanes)((gt & (cgi_lane_mask)v) | (~gt & (cgi_lane_mask)m));
    }
    cg_real mx = -INFINITY;
    for (; c < n; c++) mx = x[c] > mx ? x[c] : mx;
    for (int l = 0; l < CGI_LANES; l++) mx = m[l] > mx ? m[l] : mx;
    return mx;
}

/* sum of x[0..n), and of (x - mu)^2 */
static inline double cgi_row_sum(const cg_real *x, int64_t n) {
    cg_real acc[CGI_LANES] = {0};
    int64_t c = 0;
    for (; c + CGI_LANES <= n; c += CGI_LANES)
        for (int l = 0; l < CGI_LANES; l++) acc[l] += x[c + l];
    double sum = 0;
    for (; c < n; c++) sum += x[c];
    for (int l = 0; l < CGI_LANES; l++) sum += acc[l];
    return sum;
}

static inline double cgi_row_sqdev(const cg_real *x, int64_t n, cg_real mu) {
    cg_real acc[CGI_LANES] = {0};
    int64_t c = 0;
    for (; c + CGI_LANES <= n; c += CGI_LANES)
        for (int l = 0; l < CGI_LANES; l++) acc[l] += (x[c + l] - mu) * (x[c + l] - mu);
    double sum = 0;
    for (; c < n; c++) sum += (double)(x[c] - mu) * (x[c] - mu);
    for (int l = 0; l < CGI_LANES; l++) sum += acc[l];
    return sum;
}

/* sum of e^(x[j] - shift); the terms also go to out[j] when out is not NULL (it may be x) */
static inline double cgi_sum_exp(const cg_real *x, int64_t n, cg_real shift, cg_real *out) {
    cg_real acc[CGI_LANES] = {0};
    int64_t c = 0;
    if (out)
        for (; c + CGI_LANES <= n; c += CGI_LANES)
            for (int l = 0; l < CGI_LANES; l++) acc[l] += out[c + l] = cgi_exp(x[c + l] - shift);
    else
        for (; c + CGI_LANES <= n; c += CGI_LANES)
            for (int l = 0; l < CGI_LANES; l++) acc[l] += cgi_exp(x[c + l] - shift);
    double sum = 0;
    for (; c < n; c++) {
        const cg_real e = cgi_exp(x[c] - shift);
        if (out) out[c] = e;
        sum += e;
    }
    for (int l = 0; l < CGI_LANES; l++) sum += acc[l];
    return sum;
}

/* Counter-based random bits: the same (key, counter) gives the same bits on any thread. */
static inline uint64_t cgi_hash64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Dropout's keep mask, shared by cg_dropout and the fused attention: element `index` of node `id`
 * in forward pass `step` is kept when its hash clears the threshold. Counter-based, so backward
 * draws the same mask again instead of storing it, on any thread count. */
static inline uint64_t cgi_dropout_key(uint64_t seed, int id, uint64_t step) {
    return cgi_hash64(seed ^ cgi_hash64((uint64_t)id * 0x100000001b3ULL ^ cgi_hash64(step)));
}
static inline uint64_t cgi_dropout_threshold(double p) { return (uint64_t)(p * 18446744073709551616.0); }
static inline bool cgi_dropout_keeps(uint64_t key, uint64_t index, uint64_t threshold) {
    return cgi_hash64(key + index * 0x9e3779b97f4a7c15ULL) >= threshold;
}

/* Elementwise loop over a cgi_iter of 4 operands: P0[..] ACC EXPR, where EXPR reads A, B, C,
 * the current elements of P1..P3 (repeat an operand for an unused slot). ACC is = or +=. Rows run
 * in parallel; all-unit inner strides get their own loop so the compiler can vectorise it. */
#define CGI_EW_LOOP(it, P0, P1, P2, P3, ACC, EXPR)                                               \
    do {                                                                                         \
        const int64_t tot_ = (it).rows * cgi_chunks((it).inner);                                 \
        CGI_PAR_FOR((it).rows * (it).inner,                                                      \
        for (int64_t c_ = 0; c_ < tot_; c_++) CGI_EW_CHUNK(it, c_, P0, P1, P2, P3, ACC, EXPR););  \
    } while (0)
/* CGI_EW_LOOP's chunks [c0, c1) on the calling thread: a body for cgi_par_ranges over
 * (it).rows * cgi_chunks((it).inner) chunks, which a thread team shares. */
#define CGI_EW_CHUNKS(it, c0, c1, P0, P1, P2, P3, ACC, EXPR)                                      \
    do {                                                                                         \
        for (int64_t c_ = (c0); c_ < (c1); c_++) CGI_EW_CHUNK(it, c_, P0, P1, P2, P3, ACC, EXPR); \
    } while (0)
/* Chunk c (CGI_CHUNK elements of a row) of an elementwise loop. */
#define CGI_EW_CHUNK(it, c, P0, P1, P2, P3, ACC, EXPR)                                           \
    do {                                                                                         \
        const int64_t s0_ = (it).st[0][(it).ndim - 1], s1_ = (it).st[1][(it).ndim - 1];           \
        const int64_t s2_ = (it).st[2][(it).ndim - 1], s3_ = (it).st[3][(it).ndim - 1];           \
        const int64_t n_ = (it).inner, nch_ = cgi_chunks(n_);                                    \
        const bool unit_ = s0_ == 1 && s1_ == 1 && s2_ == 1 && s3_ == 1;                          \
        const int64_t r_ = (c) / nch_, lo_ = ((c) % nch_) * CGI_CHUNK;                           \
        const int64_t hi_ = lo_ + CGI_CHUNK < n_ ? lo_ + CGI_CHUNK : n_;                          \
        int64_t off_[4];                                                                         \
        cgi_iter_row(&(it), r_, off_);                                                           \
        cg_real *p0_ = (P0) + off_[0];                                                           \
        const cg_real *p1_ = (P1) + off_[1], *p2_ = (P2) + off_[2], *p3_ = (P3) + off_[3];        \
        if (unit_) {                                                                             \
            for (int64_t j_ = lo_; j_ < hi_; j_++) {                                             \
                const cg_real A = p1_[j_], B = p2_[j_], C = p3_[j_];                             \
                (void)A, (void)B, (void)C;                                                       \
                p0_[j_] ACC(EXPR);                                                               \
            }                                                                                    \
        } else {                                                                                 \
            for (int64_t j_ = lo_; j_ < hi_; j_++) {                                             \
                const cg_real A = p1_[j_ * s1_], B = p2_[j_ * s2_], C = p3_[j_ * s3_];            \
                (void)A, (void)B, (void)C;                                                       \
                p0_[j_ * s0_] ACC(EXPR);                                                         \
            }                                                                                    \
        }                                                                                        \
    } while (0)

#endif
