/* SPDX-License-Identifier: MIT */
/* Gradient checking: analytic gradients from backward against central finite differences. */
#ifndef CGRAD_GRADCHECK_H
#define CGRAD_GRADCHECK_H

#include <stdbool.h>
#include <stdio.h>

#include "graph.h"

CG_BEGIN_DECLS

/* One input's gradient check: how far the analytic gradient is from the finite differences. */
typedef struct {
    const char *name;   /* the input's name */
    int64_t numel;      /* elements checked */
    double max_abs_err; /* max |analytic - numeric| over the elements */
    double max_rel_err; /* max_abs_err / max(|analytic|, |numeric|) over the input (0 if both are 0) */
    bool pass;          /* every element within |analytic - numeric| <= atol + rtol * |numeric| */
    int64_t worst;      /* row-major index of the element furthest outside (or nearest to) that bound */
    double analytic;    /* the worst element's gradient from backward */
    double numeric;     /* and from central differences */
} cg_gradcheck_result;

#ifdef CGRAD_DOUBLE
#define CG_GRADCHECK_EPS 1e-6  /* finite-difference step of this build */
#define CG_GRADCHECK_TOL 1e-6  /* max relative error (max_rel_err) a check must stay under in this build */
#define CG_GRADCHECK_ATOL 1e-8 /* elementwise absolute tolerance of this build (round-off of the differences) */
#define CG_GRADCHECK_RTOL 1e-6 /* elementwise relative tolerance of this build */
#else
#define CG_GRADCHECK_EPS 1e-2  /* finite-difference step of this build */
#define CG_GRADCHECK_TOL 1e-3  /* max relative error (max_rel_err) a check must stay under in this build */
#define CG_GRADCHECK_ATOL 1e-4 /* elementwise absolute tolerance of this build (round-off of the differences) */
#define CG_GRADCHECK_RTOL 1e-3 /* elementwise relative tolerance of this build */
#endif

/* Checks d(sum(out * R))/d(input) for each of the n inputs, R a fixed random tensor (out itself if it
 * is a scalar). An input is a requires-grad input leaf, a trainable parameter, or any real node
 * computed from them (checked by perturbing its value as forward produces it; it is cg_retain'ed).
 * eps <= 0 picks CG_GRADCHECK_EPS; pass uses CG_GRADCHECK_ATOL and CG_GRADCHECK_RTOL. Fills
 * results[n]. Adds nodes to g (train mode). */
cg_status cg_gradcheck(cg_graph *g, cg_tensor *out, int n, cg_tensor *const *inputs, double eps,
                       cg_gradcheck_result *results);
/* cg_gradcheck judging each element by |analytic - numeric| <= atol + rtol * |numeric|, as
 * torch.autograd.gradcheck does, so that round-off on tiny gradients cannot fail a check
 * (atol or rtol < 0: the build's default). */
cg_status cg_gradcheck_tol(cg_graph *g, cg_tensor *out, int n, cg_tensor *const *inputs, double eps, double atol,
                           double rtol, cg_gradcheck_result *results);

/* Runs the built-in check of every op over several shapes (broadcasting, masks, ignored targets,
 * strided views), printing one table row per case to out (NULL: silent), and the worst element of
 * a failed input; only cases whose op name contains filter run (NULL: all). tol is the elementwise
 * relative tolerance (<= 0: CG_GRADCHECK_RTOL; atol is CG_GRADCHECK_ATOL). Returns the number of
 * failed rows, counting an op of the table with no case as failed. */
int cg_gradcheck_ops(FILE *out, double tol, const char *filter);
/* Name of op i of the op table (what filter matches), for i from 0; NULL past the last. */
const char *cg_op_name(int i);

/* The same cases with every real input cut from one requires-grad storage (all starting at its
 * first element, then each shifted by 3), the worst sharing a rule can meet: checks the shared
 * gradient against finite differences and that `runs` backward passes on 2 threads match 1 thread
 * bit for bit (a rule that writes two gradients side by side races otherwise). Restores the
 * thread count. Passes when max_rel_err <= tol (<= 0: CG_GRADCHECK_TOL, 10x that in float32: clustered
 * values leave float32 differences less exact). Returns the number of failed rows. */
int cg_gradcheck_ops_aliased(FILE *out, double tol, int runs, const char *filter);

/* The same cases inside a checkpoint segment with out * R (R fixed), the loss sum(out * R) after it
 * and then in it too (a scalar out is then the loss itself): with checkpointing on, backward
 * recomputes the segment, and the loss and every input's gradient (two passes) must equal those of
 * the graph without checkpointing bit for bit. Prints one row per case and segment (rec: the nodes
 * recomputed); returns the number of failed rows. */
int cg_gradcheck_ops_checkpointed(FILE *out, const char *filter);

CG_END_DECLS
#endif
