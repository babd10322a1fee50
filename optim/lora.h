/* SPDX-License-Identifier: MIT */
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
#include "optim.h"

CG_BEGIN_DECLS

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
/* Writes only the adapters to a safetensors file at path (atomically: temp file, rename): their
 * values, each adapter's scale in the metadata and, when o is not NULL, their Adam(W) moments
 * ("<name>.exp_avg", "<name>.exp_avg_sq") and the step count. A fine-tune's file is then the
 * size of its adapters, not of the model. */
cg_status cg_lora_save(cg_params *ps, const cg_optim *o, const char *path);
/* Adds to ps the adapters saved at path (on the base parameters of the same names, which it
 * freezes, as cg_lora_apply does) and reads their values; ps then computes as the saved fine-tune.
 * Errors name the file and the tensor; on an error no adapter has been added. */
cg_status cg_lora_load(cg_params *ps, const char *path);
/* Restores the moments and step count that cg_lora_save stored into o, an optimizer made over ps
 * after cg_lora_load (resuming a fine-tune exactly); CG_ERR_FORMAT if the file has none. The
 * moments pass the checks of cg_st_load_run first: on an error o is unchanged. */
cg_status cg_lora_load_optim(cg_optim *o, cg_params *ps, const char *path);
/* Writes the adapters in PEFT's layout to directory dir (made if missing): adapter_model.safetensors
 * ("base_model.model.<module>.lora_A.weight" and ".lora_B.weight" for each parameter
 * "<module>.weight") and adapter_config.json (peft_type LORA, r, lora_alpha, target_modules,
 * base_model_name_or_path = base_model, may be NULL). Every adapter must share one rank and alpha. */
cg_status cg_lora_save_peft(cg_params *ps, const char *dir, const char *base_model);
/* Adds to ps the adapters of a PEFT LoRA directory (as cg_lora_save_peft writes, or PEFT's
 * save_pretrained) on the parameters "<module>.weight" they name, freezing every other parameter;
 * use_rslora is honoured, and settings that change the numbers but are not implemented (DoRA,
 * fan_in_fan_out, rank or alpha patterns, bias, modules_to_save) are refused by name. Everything
 * is checked before the first adapter is added. */
cg_status cg_lora_load_peft(cg_params *ps, const char *dir);
/* True when p is an adapter parameter (lora_A or lora_B) of some base parameter. */
bool cg_lora_is_adapter(const cg_tensor *p);
/* The base parameter an adapter belongs to, or NULL when p is not an adapter. */
cg_tensor *cg_lora_base(const cg_params *ps, const cg_tensor *p);

CG_END_DECLS
#endif
