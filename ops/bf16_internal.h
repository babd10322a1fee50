/* SPDX-License-Identifier: MIT */
/* bf16 mixed precision (ops/bf16.c): the hooks the product ops call when their graph computes in
 * bf16. Each returns false when it did nothing (fp32 graph, or scratch could not be had), and the
 * caller then runs its own fp32 path, so an fp32 graph never enters this code. Not installed. */
#ifndef CGRAD_BF16_INTERNAL_H
#define CGRAD_BF16_INTERNAL_H

#include <string.h>

#include "graph/internal.h"

typedef struct cgi_lp cgi_lp;

/* True when t's graph computes its products in bf16. */
static inline bool cgi_lp_on(const cg_tensor *t) { return t->graph && t->graph->precision == CG_BF16; }

/* The precision new graphs start with (cg_set_precision). */
cg_precision cgi_default_precision(void);
/* Frees a graph's primitives and scratch; NULL is a no-op. */
void cgi_lp_free(cgi_lp *lp);
/* Frees a parameter's bf16 copy. */
void cgi_lp_param_free(cg_tensor *p);

/* Parameters converted to bf16 so far, process-wide (tests count them). */
extern int64_t cgi_lp_param_conversions;

/* The OpenMP thread count oneDNN was given for the last bf16 product (tests check the run's). */
extern int cgi_lp_exec_threads;

/* bf16 numbers: the upper half of a float's bits. */
typedef uint16_t cgi_bf16;

/* float to bf16, round to nearest even as vcvtneps2bf16 does; NaN stays NaN. */
static inline cgi_bf16 cgi_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (cgi_bf16)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : r);
}

/* bf16 to float (exact). */
static inline float cgi_from_bf16(cgi_bf16 h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* dst[i] = bf16(src[i * stride]) for i < n: the one rounding loop of every op that writes bf16. */
static inline void cgi_lp_round(cgi_bf16 *restrict dst, const cg_real *restrict src, int64_t n, int64_t stride) {
    if (stride == 1)
        for (int64_t i = 0; i < n; i++) dst[i] = cgi_to_bf16((float)src[i]);
    else
        for (int64_t i = 0; i < n; i++) dst[i] = cgi_to_bf16((float)src[i * stride]);
}

/* Plans a bf16 graph's storage formats (graph/plan.c, before sizing its buffers): sets
 * t->lp_value on the values that only linears read as their input and whose producer can write
 * bf16 (LayerNorm, RMSNorm, GELU, ReLU), so they are stored at half size and never converted.
 * consumers[i] counts the readers of node i. Clears every flag on an fp32 graph. */
void cgi_lp_plan_values(cg_graph *g, const int *consumers);
/* Decides whether fused attention node t stores its kept probabilities in bf16 (its graph is bf16)
 * and sizes its aux to match (ops/attention.c); the plan calls it before sizing the buffers. */
void cgi_sdpa_plan(cg_tensor *t);
/* Writes t's bf16 shadow (t->lp_shadow, planned by cgi_lp_plan_values) from its float value, right
 * after t's forward. */
void cgi_lp_shadow_fill(cg_tensor *t);
/* Bytes of bf16 conversion scratch t's forward (bwd false) or backward products need, planned
 * at the time they run (0 for an fp32 graph or an op without bf16 products). */
size_t cgi_lp_scratch_bytes(const cg_tensor *t, bool bwd);
/* Bytes of conversion scratch held for the graph's life because a product found no planned
 * scratch (an unplanned graph); tests check the zoo's graphs need none. */
size_t cgi_lp_unplanned_bytes(const cg_graph *g);
/* Bytes of the bf16 copies of parameters g's products read (the fused LM head's weight, frozen
 * weights), outside its plan (cgi_plan weighs them). */
size_t cgi_lp_copy_bytes(const cg_graph *g);

/* C[m,n] = alpha A[m,k] B[k,n] + beta C in bf16 with float accumulation, for product node t
 * (bwd: in its backward rule, whose scratch it converts into). a and b are cg_real with any
 * strides; a_src / b_src (may be NULL) is the tensor whose storage a / b points into: when that
 * is a parameter, its bf16 copy is read instead of converting a again. */
bool cgi_lp_gemm(const cg_tensor *t, bool bwd, int64_t m, int64_t n, int64_t k, const cg_real *a, int64_t rsa,
                 int64_t csa, const cg_tensor *a_src, const cg_real *b, int64_t rsb, int64_t csb, const cg_tensor *b_src,
                 cg_real alpha, cg_real beta, cg_real *c, int64_t rsc, int64_t csc);
/* linear's forward product and bias into t (in bf16 when t->lp_value); false with nothing
 * written when no bf16 operand could be had (the caller's float product runs). */
bool cgi_lp_linear_fwd(cg_tensor *t);
/* linear's dX and dW products; assign: dX is written, not added. The bias gradient must be taken
 * before: when nothing else reads t's gradient it is converted to bf16 in place. */
bool cgi_lp_linear_bwd(cg_tensor *t, bool assign);
/* LoRA's fused linear (ops/lora.c): its three forward products in bf16 (the scaled low-rank
 * product into t->aux in float); false with nothing written when an operand could not be had. */
bool cgi_lp_lora_fwd(cg_tensor *t);
/* Its backward products in bf16, dY converted once for all of them; *_assign: that input's
 * gradient is written, not added. False with nothing written (the caller's float products). */
bool cgi_lp_lora_bwd(cg_tensor *t, bool x_assign, bool w_assign, bool a_assign, bool b_assign);
/* The fused LM head's backward products for one chunk of m counted rows: dlogits [m, v] (float,
 * op scratch, converted to bf16 in place), xs [m, d]; dxs [m, d] is written, dW added to. False
 * when nothing was done (the caller runs its float products). */
bool cgi_lp_lce_bwd(cg_tensor *t, int64_t m, int64_t v, int64_t d, cg_real *dlogits, const cg_real *xs, cg_real *dxs,
                    bool dx, bool dw);
/* Converts rows [m, n] of float in place into bf16 rows that keep each row's start (row stride
 * 2n bf16), so no scratch is needed; the floats are gone after. */
void cgi_lp_to_bf16_inplace(cg_real *x, int64_t m, int64_t n);
/* C[m,n] = alpha A B (+ a contiguous bias row) + beta C from bf16 operands on kernel `which`: 0 the
 * reference loops, 1 oneDNN, 2 the fp32 units, 3 whichever a graph's product of this shape runs on,
 * through the entry the products use (with a bias or c_bf16 (C bf16, rounded once; beta ignored):
 * C by rows, k > 0). False when that kernel cannot run here (tests and bench/bench_bf16_gemm.c). */
bool cgi_lp_product(int which, int64_t m, int64_t n, int64_t k, const cgi_bf16 *a, int64_t rsa, int64_t csa,
                    const cgi_bf16 *b, int64_t rsb, int64_t csb, float alpha, float beta, void *c, int64_t rsc,
                    int64_t csc, const float *bias, bool c_bf16);
/* The core's peak rates in flop/s, register-only loops of 24 independent vfmadd231ps, of 24
 * vdpbf16ps and of 4 AMX tdpbf16ps (medians of 7, thread CPU time): what decides the bf16 kernel.
 * NaN without the instruction (AMX: also where the OS does not allow it). */
void cgi_lp_peaks(double *fp32, double *bf16, double *amx);
/* Tests: 0 runs bf16 products on the process's kernel choice; 1 forces oneDNN (the CPU must have
 * avx512_bf16), 2 the fp32 units (set between graphs' runs, not during one). */
extern int cgi_lp_force_kernel;
/* Forces the reference loop in place of oneDNN for products with a bf16-stored operand (tests). */
extern bool cgi_lp_force_ref;
/* Makes a parameter's bf16 copy fail to allocate, as out of memory would (tests). */
extern bool cgi_lp_fail_param_copy;

#endif
