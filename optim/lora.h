/* cgrad LoRA: low-rank adapters (Hu et al. 2021) for fine-tuning with the base weights frozen.
 *
 * An adapter on a 2-D parameter P[R, C] adds two parameters to the set, "<P>.lora_A" [r, C]
 * (uniform in +-1/sqrt(C)) and "<P>.lora_B" [R, r] (zeros, so training starts from the base
 * model), and from then on every cg_linear that reads P computes with P + (alpha / r) B A,
 * whether it reads P, a block of its rows, or their transpose. Add adapters before building
 * graphs; optimizers made afterwards see the adapters as ordinary trainable parameters. */
#ifndef CGRAD_LORA_H
#define CGRAD_LORA_H

#include "../graph/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Adds a rank-`rank` adapter with scale alpha / rank to 2-D parameter p of ps and freezes p;
 * CG_ERR_ARG if p is not a 2-D parameter of ps, already has one, or rank is not in [1, min(R, C)]. */
cg_status cg_lora_add(cg_params *ps, cg_tensor *p, int rank, double alpha, cg_rng *r);
/* Adds adapters to every 2-D parameter whose name contains one of the comma-separated targets
 * and freezes every other parameter (adapters excepted). Returns the number added, or -1 with
 * cg_last_error() set (also when no parameter matches). */
int cg_lora_apply(cg_params *ps, const char *targets, int rank, double alpha, cg_rng *r);
/* Folds every adapter into its base, P += (alpha / r) B A, and zeroes B, so the model computes
 * the same with or without the adapters (export the base weights alone after this). */
cg_status cg_lora_merge(cg_params *ps);
/* True when p is an adapter parameter (lora_A or lora_B) of some base parameter. */
bool cg_lora_is_adapter(const cg_tensor *p);
/* The base parameter an adapter belongs to, or NULL when p is not an adapter. */
cg_tensor *cg_lora_base(const cg_params *ps, const cg_tensor *p);

#ifdef __cplusplus
}
#endif
#endif
