/* SPDX-License-Identifier: MIT */
/* Mixture-of-experts feed-forward layer (Shazeer et al. 2017; Switch, GShard, Mixtral): a router
 * (linear, softmax) sends each token to its top_k experts, SwiGLU feed-forwards, whose outputs are
 * summed weighted by the renormalised top-k probabilities. Each expert runs on the tokens routed to it
 * only: the compute is proportional to the routed tokens, not to tokens x experts. Composed from ops.
 * Parameters carry Hugging Face's MixtralSparseMoeBlock names under a prefix P: P.gate.weight
 * [E, D], P.experts.N.w1.weight [F, D] (gate), .w3.weight [F, D] (up), .w2.weight [D, F]. */
#ifndef CGRAD_MOE_H
#define CGRAD_MOE_H

#include "../graph/graph.h"

CG_BEGIN_DECLS

/* Settings of a mixture-of-experts layer. */
typedef struct {
    int64_t hidden_size;       /* model width D */
    int64_t intermediate_size; /* each expert's SwiGLU width F */
    int64_t num_experts;       /* E, Mixtral's num_local_experts */
    int64_t top_k;             /* experts per token (num_experts_per_tok), 1..E */
    double capacity_factor;    /* 0: dropless (Mixtral); > 0: an expert takes at most ceil(factor * top_k * N / E)
                                  of N tokens, first choices first, then in token order; the rest are dropped
                                  (their share of the output is 0, as in Switch and GShard) */
} cg_moe_config;
typedef struct cg_moe cg_moe; /* a mixture-of-experts layer: config and borrowed parameters (opaque) */

/* Declares the layer's parameters in ps under prefix (router and matrices normal(0, 0.02), seeded by r). */
cg_moe *cg_moe_new(const cg_moe_config *cfg, cg_params *ps, cg_rng *r, const char *prefix);
/* Frees the layer (not its parameters). */
void cg_moe_free(cg_moe *m);
/* The layer's configuration. */
const cg_moe_config *cg_moe_cfg(const cg_moe *m);
/* Sets the layer's capacity_factor (0: dropless) for graphs built afterwards; CG_ERR_ARG naming the
 * value when it is negative or not finite (the layer keeps its old one). */
cg_status cg_moe_set_capacity_factor(cg_moe *m, double capacity_factor);
/* Adds the layer to g: x[..., D] -> [..., D]. Each expert runs on the tokens routed to it (dropless:
 * the N x top_k assignments sorted by expert, cg_segment_linear_each reading each expert's matrices
 * where they are stored, LoRA adapters included; with a capacity: at most its capacity of them), and
 * its outputs are added back weighted by the renormalised top-k router probabilities.
 * *router_logits (may be NULL) receives the router's logits [N, E] over the N = x's rows, for
 * cg_moe_load_balancing_loss. */
cg_tensor *cg_moe_forward(cg_graph *g, const cg_moe *m, cg_tensor *x, cg_tensor **router_logits);
/* cg_moe_forward, and *dropped (may be NULL) receives a scalar node: how many of the N x top_k (token,
 * expert) choices the capacity dropped in the last forward (0 when dropless; retain it to read it). */
cg_tensor *cg_moe_forward_counted(cg_graph *g, const cg_moe *m, cg_tensor *x, cg_tensor **router_logits,
                                  cg_tensor **dropped);
/* The same layer in the dense formulation (every expert on every token, masked by the same routing
 * weights, dropped tokens included): the reference the routed layer is tested and measured against. */
cg_tensor *cg_moe_forward_dense(cg_graph *g, const cg_moe *m, cg_tensor *x, cg_tensor **router_logits);
/* Switch/GShard load-balancing loss over n layers' router logits [N_i, E], as Hugging Face's
 * load_balancing_loss_func (no attention mask): the logits concatenated, p = softmax, f[k][e] the
 * fraction of tokens whose k-th choice is e, P[e] the mean of p; E * sum over k, e of f[k][e] * P[e]
 * (1 when balanced; top_k x E when one expert takes everything). Unscaled: multiply by the
 * router_aux_loss_coef. The gradient flows through P. */
cg_tensor *cg_moe_load_balancing_loss(cg_graph *g, int n, cg_tensor *const *router_logits, int64_t top_k);

CG_END_DECLS
#endif
