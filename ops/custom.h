/* SPDX-License-Identifier: MIT */
/* Custom ops: a user's own kernel, with its own backward, as a node of the graph, defined outside
 * the library. The op states its output shape and the scratch it needs (the memory plan gives the
 * space, so a step allocates nothing), then runs wherever a built-in op runs: forward and backward,
 * gradient checks, checkpointed recomputation, graph resets, CGRAD_PROFILE and cg_graph_dot under
 * its own name, float32 and float64 builds, and bf16 graphs (where it reads and writes floats).
 *
 * The gradient comes from the op's backward kernel, or, for a forward-only kernel, from a composite
 * of built-in ops that computes the same function: backward then runs the composite's backward on
 * the same inputs (the way MLX's fused ops keep a composite twin). A forward-only op with neither is
 * refused by cg_graph_backward, naming it. Kernels return a cg_status; a failure becomes the graph
 * run's error, with the op's name in the message. */
#ifndef CGRAD_OPS_CUSTOM_H
#define CGRAD_OPS_CUSTOM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../graph/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CG_CUSTOM_MAX_INPUTS 8 /* most tensor inputs a custom op can take */

/* The node a kernel runs for: valid only during the kernel call. */
typedef struct cg_custom_ctx cg_custom_ctx;

/* A tensor as a kernel sees it: data (NULL where absent), dtype, shape and strides in elements. */
typedef struct {
    void *data;                  /* cg_real or int32_t elements; NULL where absent */
    cg_dtype dtype;              /* CG_REAL or CG_INT32 */
    int ndim;                    /* dimensions in use */
    int64_t shape[CG_MAX_DIMS];  /* size of each dimension */
    int64_t stride[CG_MAX_DIMS]; /* elements between neighbours along each dimension */
} cg_custom_tensor;

/* What the shape rule returns: the output's shape, and the bytes of three kinds of scratch. */
typedef struct {
    int ndim;                  /* the output's dimensions */
    int64_t shape[CG_MAX_DIMS]; /* the output's size along each */
    cg_dtype dtype;            /* the output's dtype (CG_REAL unless set) */
    size_t saved_bytes;        /* written by forward, read by backward (cg_custom_saved) */
    size_t scratch_bytes;      /* forward's own scratch (cg_custom_scratch in forward) */
    size_t bwd_scratch_bytes;  /* backward's own scratch (cg_custom_scratch in backward) */
} cg_custom_shape;

/* A custom op: the description outlives every graph built with it (a static const is usual). */
typedef struct {
    const char *name; /* names the op in errors, CGRAD_PROFILE and cg_graph_dot */
    int n_inputs;     /* 1 .. CG_CUSTOM_MAX_INPUTS */
    /* The shape rule: from the inputs (shapes and dtypes; data NULL) and the op's parameters, fills
     * *out; a non-OK status, with cg_set_error's message, refuses the op at build time. */
    cg_status (*shape)(const cg_custom_tensor *inputs, int n, const void *params, void *user, cg_custom_shape *out);
    /* Writes the output (cg_custom_output) from the inputs; may run again on the same inputs (a
     * recompute under checkpointing), so it must give the same result. */
    cg_status (*forward)(cg_custom_ctx *c);
    /* Adds d(loss)/d(input k) into cg_custom_input_grad(c, k) for every k whose data is not NULL,
     * from cg_custom_output_grad; NULL for a forward-only op. */
    cg_status (*backward)(cg_custom_ctx *c);
    unsigned backward_reads;    /* bit k: backward reads input k's value (the plan keeps it alive) */
    bool backward_reads_output; /* backward reads the output's value */
    /* For a forward-only op: the same function built from ops on g (inputs as given to cg_custom),
     * whose gradient serves as the op's; NULL if none. */
    cg_tensor *(*composite)(cg_graph *g, cg_tensor *const *inputs, const void *params, void *user);
    void *user; /* passed to every callback */
} cg_custom_op;

/* A node of op on inputs[0 .. op->n_inputs); params (params_bytes, may be 0) is copied into the
 * graph, so the caller's struct may go. NULL with a message naming the op on a failed shape rule,
 * a NULL kernel or a bad input. */
cg_tensor *cg_custom(cg_graph *g, const cg_custom_op *op, cg_tensor *const *inputs, const void *params,
                     size_t params_bytes);

/* Input k's value as the kernel reads it. */
cg_custom_tensor cg_custom_input(const cg_custom_ctx *c, int k);
/* The output: forward writes it (contiguous); backward reads it if the op says so. */
cg_custom_tensor cg_custom_output(const cg_custom_ctx *c);
/* In backward: input k's gradient (same shape and strides as the input) to add into; data is NULL
 * when no gradient flows to input k. */
cg_custom_tensor cg_custom_input_grad(const cg_custom_ctx *c, int k);
/* In backward: d(loss)/d(output), contiguous, read only. */
cg_custom_tensor cg_custom_output_grad(const cg_custom_ctx *c);
/* The saved-for-backward space (saved_bytes of the shape rule; NULL if 0), 64-byte aligned. */
void *cg_custom_saved(const cg_custom_ctx *c);
/* The running kernel's own scratch (scratch_bytes in forward, bwd_scratch_bytes in backward). */
void *cg_custom_scratch(const cg_custom_ctx *c);
/* The graph's copy of the op's parameters (NULL if none were given). */
const void *cg_custom_params(const cg_custom_ctx *c);
/* The op description's user pointer. */
void *cg_custom_user(const cg_custom_ctx *c);
/* The op's name, for a kernel's own messages. */
const char *cg_custom_name(const cg_custom_ctx *c);

/* Runs body(lo, hi, ctx) over [0, n) cut into pieces of at least grain, on cgrad's threads (the
 * one OpenMP pool a graph run uses); inside an already parallel region it runs on the calling
 * thread, so teams never nest. Pieces are contiguous and in order per thread. */
void cg_parallel_for(int64_t n, int64_t grain, void (*body)(int64_t lo, int64_t hi, void *ctx), void *ctx);

#ifdef __cplusplus
}
#endif
#endif
