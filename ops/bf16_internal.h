/* bf16 mixed precision (ops/bf16.c): the hooks the product ops call when their graph computes in
 * bf16. Each returns false when it did nothing (fp32 graph, or scratch could not be had), and the
 * caller then runs its own fp32 path, so an fp32 graph never enters this code. Not installed. */
#ifndef CGRAD_BF16_INTERNAL_H
#define CGRAD_BF16_INTERNAL_H

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

/* C[m,n] = alpha A[m,k] B[k,n] + beta C in bf16 with float accumulation, for graph g. a and b are
 * cg_real with any strides; a_src / b_src (may be NULL) is the tensor whose storage a / b points
 * into: when that is a parameter, its bf16 copy is read instead of converting a again. */
bool cgi_lp_gemm(cg_graph *g, int64_t m, int64_t n, int64_t k, const cg_real *a, int64_t rsa, int64_t csa,
                 const cg_tensor *a_src, const cg_real *b, int64_t rsb, int64_t csb, const cg_tensor *b_src,
                 cg_real alpha, cg_real beta, cg_real *c, int64_t rsc, int64_t csc);
/* linear's forward product into t (bias already in t when has_bias: added to). */
bool cgi_lp_linear_fwd(cg_tensor *t, bool has_bias);
/* linear's dX and dW products (the bias is left to the caller); assign: dX is written, not added. */
bool cgi_lp_linear_bwd(cg_tensor *t, bool assign);

#endif
