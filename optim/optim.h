/* SPDX-License-Identifier: MIT */
/* cgrad optim module: SGD, Adam, AdamW over a cg_params set, gradient clipping and accumulation,
 * learning-rate schedules.
 *
 * An optimizer keeps its moments in blocks parallel to cg_params_values (cg_params_span
 * elements, same offsets), so one update is one pass over a few contiguous arrays and a
 * checkpoint saves the moments as they are. Updates follow torch 1.13 (torch.optim.SGD, Adam,
 * AdamW) operation by operation. The step count is global: a parameter that was frozen for some
 * steps uses the global count in its bias corrections (torch keeps one count per parameter). */
#ifndef CGRAD_OPTIM_H
#define CGRAD_OPTIM_H

#include "../graph/graph.h"

CG_BEGIN_DECLS

/* The update rules. */
typedef enum {
    CG_OPT_SGD,  /* p -= lr * (g + wd*p), with optional (Nesterov) momentum, dampening 0 */
    CG_OPT_ADAM, /* Adam with L2 decay: wd*p added to the gradient */
    CG_OPT_ADAMW /* Adam with decoupled decay: p *= 1 - lr*wd before the update */
} cg_optim_kind;

/* An optimizer's settings (cg_optim_defaults fills them as torch does). */
typedef struct {
    cg_optim_kind kind;  /* the update rule */
    double lr;           /* base rate, for callers that build a schedule from it; cg_optim_step takes the rate it applies */
    double beta1;        /* Adam(W) first-moment decay */
    double beta2;        /* Adam(W) second-moment decay */
    double eps;          /* Adam(W) denominator guard */
    double weight_decay; /* applied to parameters whose decay flag is on (all, initially) */
    double momentum;     /* SGD momentum, 0 for none */
    bool nesterov;       /* SGD Nesterov momentum (needs momentum > 0) */
} cg_optim_config;

typedef struct cg_optim cg_optim; /* an optimizer: settings, moments and parameter groups (opaque) */

/* torch defaults for kind: lr 1e-3, betas .9/.999, eps 1e-8, wd 0 (AdamW 0.01), momentum 0. */
cg_optim_config cg_optim_defaults(cg_optim_kind kind);
/* Kind named "sgd", "adam" or "adamw" into *kind; CG_ERR_ARG for any other name. */
cg_status cg_optim_parse(const char *name, cg_optim_kind *kind);
/* New optimizer over every parameter of ps (add them all first), zero moments, step 0; NULL on a
 * bad config. The caller frees it with cg_optim_free; ps must outlive it. */
cg_optim *cg_optim_new(cg_params *ps, const cg_optim_config *cfg);
/* Frees the optimizer and its moments. NULL is a no-op. */
void cg_optim_free(cg_optim *o);
/* The configuration the optimizer was made with. */
const cg_optim_config *cg_optim_config_of(const cg_optim *o);

/* Turns weight decay on or off for one parameter of the set; CG_ERR_ARG if it is not in the set. */
cg_status cg_optim_set_decay(cg_optim *o, const cg_tensor *param, bool decay);
/* True when weight decay applies to param. */
bool cg_optim_decays(const cg_optim *o, const cg_tensor *param);
/* The usual groups: decay only on parameters with >= 2 dims, so not on biases or LayerNorm
 * gains; embeddings (name contains "emb", "wte" or "wpe") decay only if decay_embeddings.
 * Returns how many parameters now decay. */
int cg_optim_decay_matrices_only(cg_optim *o, bool decay_embeddings);

/* One update with rate lr from the gradients in the set; frozen parameters are left alone.
 * CG_ERR_STATE if parameters were added after cg_optim_new. Allocates nothing. */
cg_status cg_optim_step(cg_optim *o, double lr);
/* cg_optim_step reading every gradient as g * grad_scale (the factor rounded to cg_real, as
 * cg_grads_scale would apply it), in the same single pass: clipping without a pass that rewrites
 * the gradients, which are left unscaled. Same bits as cg_grads_scale then cg_optim_step.
 * CG_ERR_ARG unless grad_scale is finite and >= 0. */
cg_status cg_optim_step_scaled(cg_optim *o, double lr, double grad_scale);
/* Makes g's backward apply this optimizer's update to each parameter as soon as its gradient is
 * final (cg_optim_backward_step), so g's memory plan holds a parameter's gradient only from its
 * first write to its update, not every gradient until a separate step. From then on g's backward
 * runs only through cg_optim_backward_step, and cg_optim_step refuses. g replans at its next forward.
 * NULL detaches. CG_ERR_STATE for a sharded optimizer or a graph with another optimizer attached. */
cg_status cg_optim_attach(cg_optim *o, cg_graph *g);
/* Backward of loss in g (attached with cg_optim_attach, after a forward) with the update at rate lr
 * applied inside it: the parameters come out bit for bit as after cg_params_zero_grad, forward,
 * cg_graph_backward and cg_optim_step(o, lr); no gradient is kept (cg_grad reads zero after it).
 * Clipping by the global norm needs every gradient first, so it has no place here. If backward
 * fails, the parameters it had reached are updated and the step count is not advanced. */
cg_status cg_optim_backward_step(cg_optim *o, cg_graph *g, cg_tensor *loss, double lr);
/* Number of updates done (or restored with cg_optim_set_steps). */
int64_t cg_optim_steps(const cg_optim *o);
/* Restores the update count from a checkpoint; CG_ERR_ARG if negative. */
cg_status cg_optim_set_steps(cg_optim *o, int64_t steps);
/* Keeps moments and makes updates only for elements [lo, hi) of the parameter block (lo a
 * multiple of 16); the moments outside are freed, those inside kept. ZeRO stage 1: each rank
 * updates its shard, then the ranks all-gather the values. Results per element are unchanged. */
cg_status cg_optim_shard(cg_optim *o, int64_t lo, int64_t hi);
/* The elements [*lo, *hi) the optimizer updates and keeps moments for ([0, span) unless sharded). */
void cg_optim_shard_range(const cg_optim *o, int64_t *lo, int64_t *hi);
/* First-moment block (SGD: momentum buffer), cg_params_span elements laid out as
 * cg_params_values (sharded: hi - lo elements from element lo); owned by o, write it to restore
 * a checkpoint. NULL for SGD without momentum. */
cg_real *cg_optim_moment1(cg_optim *o);
/* Second-moment block, same layout; owned by o. NULL for SGD. */
cg_real *cg_optim_moment2(cg_optim *o);

/* ---- gradients ---- */

/* Global L2 norm of the trainable gradients, returned as it was before clipping; if it exceeds
 * max_norm the gradients are scaled by max_norm / (norm + 1e-6) (torch clip_grad_norm_). A
 * non-finite norm is returned without scaling; NAN (message set) for a bad argument. */
double cg_clip_grad_norm(cg_params *ps, double max_norm);
/* Global L2 norm of the trainable gradients, nothing scaled (the same value cg_clip_grad_norm
 * returns, at any thread count); NAN (message set) if ps is NULL. */
double cg_grad_norm(cg_params *ps);
/* The factor clipping to max_norm applies at this norm: max_norm / (norm + 1e-6) when that is
 * below 1 and norm is finite, else 1. Fused clipping: cg_optim_step_scaled(o, lr,
 * cg_clip_scale(cg_grad_norm(ps), max_norm)). */
double cg_clip_scale(double norm, double max_norm);
/* Multiplies every trainable gradient by s (gradient accumulation: s = 1 / micro-batches). */
void cg_grads_scale(cg_params *ps, double s);

/* ---- learning-rate schedules ---- */

/* The learning-rate curves. */
typedef enum {
    CG_SCHED_CONSTANT, /* warmup, then lr */
    CG_SCHED_COSINE,   /* warmup, then cosine from lr to min_lr at total (nanoGPT get_lr) */
    CG_SCHED_LINEAR,   /* warmup, then straight line from lr to min_lr at total */
    CG_SCHED_NOAM      /* noam_factor * d_model^-0.5 * min(n^-0.5, n * warmup^-1.5), n = max(step, 1) */
} cg_sched_kind;

/* A learning-rate schedule: the rate as a function of the step (cg_schedule_lr). */
typedef struct {
    cg_sched_kind kind;   /* the curve */
    double lr;            /* peak; unused by noam */
    double min_lr;        /* floor; unused by noam */
    int64_t warmup;       /* steps of linear warmup from 0 (noam: steps to the peak) */
    int64_t total;        /* step at which cosine/linear reach min_lr and stay */
    int64_t d_model;      /* noam only */
    double noam_factor;   /* noam only */
} cg_schedule;

/* Rate for the update made after step updates (step = cg_optim_steps, from 0): lr * step /
 * warmup during warmup, then the kind's curve; steps past total give min_lr. */
double cg_schedule_lr(const cg_schedule *s, int64_t step);
/* CG_OK if the fields make sense for the kind, else CG_ERR_ARG with the offending field. */
cg_status cg_schedule_check(const cg_schedule *s);
/* Kind named "constant", "cosine", "linear" or "noam" into *kind; CG_ERR_ARG otherwise. */
cg_status cg_schedule_parse(const char *name, cg_sched_kind *kind);

CG_END_DECLS
#endif
