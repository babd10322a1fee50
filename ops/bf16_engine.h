/* SPDX-License-Identifier: MIT */
/* The bf16 product engine inside ops/bf16.c (its kernel chosen in ops/bf16_kernel.c, its stored
 * values planned in ops/bf16_plan.c), shared with the ops whose bf16 paths live in their own
 * file (ops/lora_bf16.c): oneDNN's cached primitives, conversion scratch, operands in bf16 and the
 * one-thread pieces of a product split by hand. Only in a build with oneDNN. Not installed. */
#ifndef CGRAD_BF16_ENGINE_H
#define CGRAD_BF16_ENGINE_H

#include <oneapi/dnnl/dnnl.h>

#include "graph/internal.h"
#include "ops/bf16_internal.h"

/* which kernel runs the products (ops/bf16_kernel.c's decide_kernel) */
enum { K_ONEDNN, K_FP32 };
/* The kernel the process chose (K_ONEDNN or K_FP32), set by cg_bf16_unavailable's first call. */
extern int cgi_lp_kernel;
/* True when the CPU has avx512_bf16 (without it oneDNN is never used). */
bool cgi_lp_cpu_has_bf16(void);

/* ---- per graph: cached primitives and conversion scratch ---- */

typedef struct {
    int64_t key[11];
    float alpha, beta;
    dnnl_primitive_t prim;
    dnnl_memory_t ma, mb, mc, mbias; /* mbias: only with OUT_BIAS */
} entry;

/* What a product writes besides C = alpha A B + beta C in float (entry key[9]): a float bias row
 * added to every row, and C stored in bf16 (rounded once, from the float sum). */
enum { OUT_BIAS = 1, OUT_BF16 = 2 };

struct cgi_lp {
    entry *e;
    int n, cap;
    int force;            /* 0: the process's kernel; 1 + K_ONEDNN or 1 + K_FP32: that one (references, tests) */
    cgi_bf16 *slot[2];    /* converted operands: A, B */
    double serial_below;  /* products of fewer multiply-adds run on the calling thread alone */
    size_t slot_n[2]; /* elements */
};

/* The element types of a product's two half-precision operands (CGI_EL_BF16 or CGI_EL_F16), packed
 * as A's | B's << 2: an fp16 weight read in place from its file is the one operand not in bf16. */
#define TY(ta, tb) ((unsigned)(ta) | (unsigned)(tb) << 2)
enum { TY_BF16 = TY(CGI_EL_BF16, CGI_EL_BF16) };
static inline int ty_a(unsigned ty) { return (int)(ty & 3u); }
static inline int ty_b(unsigned ty) { return (int)(ty >> 2); }

/* Products split by hand into column blocks, one one-thread primitive per thread (LoRA's backward,
 * lora_bwd_overlap): at most SPLIT_MAX blocks of whole multiples of SPLIT_COLS columns, for products
 * of SPLIT_MIN_MACS multiply-adds or more. */
enum { SPLIT_MAX = 8, SPLIT_COLS = 64 };
#define SPLIT_MIN_MACS (1 << 26)

/* rows of x's product: all its leading dims (the folded M), and their stride */
static inline int64_t cgi_lp_rows(const cg_tensor *x) { return cgi_numel(x->ndim - 1, x->shape); }
static inline int64_t cgi_lp_row_stride(const cg_tensor *x) { return x->ndim >= 2 ? x->stride[x->ndim - 2] : 1; }
static inline int64_t cgi_lp_max2(int64_t a, int64_t b) { return a > b ? a : b; }

/* Storage that needs no conversion: a parameter's (its bf16 copy) or a value stored in bf16. */
static inline bool cgi_lp_param_backed(const cg_tensor *x) {
    return x && x->root && x->root->op == CGI_OP_PARAM && x->root->pversion;
}

/* A linear's dY can become bf16 in place when nothing reads it after its backward (the caller
 * takes the bias gradient first). */
static inline bool cgi_lp_dy_in_place(const cg_tensor *t) { return t->root == t && !t->retain && t->requires_grad; }

/* LoRA's fused linear runs in bf16 when its weight and both adapters are parameters (their bf16
 * copies, or the weight read in place): any other operand goes to its float products. */
static inline bool cgi_lp_lora_backed(const cg_tensor *t) {
    return t->op == CGI_OP_LORA_LINEAR && cgi_lp_param_backed(t->src[1]) && cgi_lp_param_backed(t->src[2]) &&
           cgi_lp_param_backed(t->src[3]);
}

/* The graph's bf16 context, made on first use; NULL when bf16 cannot run. */
cgi_lp *cgi_lp_ctx(cg_graph *g);
/* The kernel an m x n product of lp runs on (K_ONEDNN or K_FP32). */
int cgi_lp_kernel_for(const cgi_lp *lp, int64_t m, int64_t n);
/* Elements of the two conversion areas (A, B) that t's forward or backward products use. */
void cgi_lp_need(const cg_tensor *t, bool bwd, int64_t s[2]);
/* Conversion area i for n elements: t's planned scratch, else the graph's held slot. */
cgi_bf16 *cgi_lp_scratch(cgi_lp *lp, const cg_tensor *t, bool bwd, int i, int64_t n);
/* t reads x without converting it: a parameter's bf16 copy or a value stored in bf16. */
bool cgi_lp_no_conversion(const cg_tensor *t, const cg_tensor *x);
/* bf16 form of operand x[rows, cols] (strides *rs, *cs) whose storage belongs to src, converted
 * into area i of t's scratch when it must be (strides then set to its layout); *el its type. */
const cgi_bf16 *cgi_lp_operand(cgi_lp *lp, const cg_tensor *t, bool bwd, int i, const float *x, int64_t rows,
                               int64_t cols, int64_t *rs, int64_t *cs, const cg_tensor *src, int *el);
/* dst = bf16(src[rows, cols]) in the source's orientation; its strides go to *drs, *dcs. */
void cgi_lp_convert(const float *src, int64_t rows, int64_t cols, int64_t rs, int64_t cs, cgi_bf16 *dst, int64_t *drs,
                    int64_t *dcs);
/* Row i of float rows [.., n] into bf16 in place (the first half of the row's bytes). */
void cgi_lp_to_bf16_row(cg_real *x, int64_t i, int64_t n);
/* C = alpha A B + beta C on bf16 operands: oneDNN, else the reference loops. */
void cgi_lp_mm(cgi_lp *lp, int64_t m, int64_t n, int64_t k, const cgi_bf16 *a, int64_t rsa, int64_t csa,
               const cgi_bf16 *b, int64_t rsb, int64_t csb, float alpha, float beta, float *c, int64_t rsc, int64_t csc,
               unsigned ty);
/* The reference loops of every bf16 product (C in float, or c_bf16 rounded once). */
void cgi_lp_ref_gemm(int64_t m, int64_t n, int64_t k, const cgi_bf16 *a, int64_t rsa, int64_t csa, const cgi_bf16 *b,
                     int64_t rsb, int64_t csb, float alpha, float beta, const float *bias, float *c, cgi_bf16 *c_bf16,
                     int64_t rsc, int64_t csc, unsigned ty);
/* The streams of the first n pieces of a split product, made on first use. */
bool cgi_lp_piece_streams(int n);
/* The cache index of a one-thread primitive for piece `piece` (made now if new), -1 if refused. */
int cgi_lp_piece_prim(cgi_lp *lp, int64_t m, int64_t n, int64_t k, int64_t rsa, int64_t csa, int64_t rsb, int64_t csb,
                      int64_t rsc, float alpha, float beta, int out, int piece);
/* Runs cached one-thread primitive i on piece stream_of's stream, else the reference loops. */
void cgi_lp_piece_mm(cgi_lp *lp, int i, int stream_of, int64_t m, int64_t n, int64_t k, const cgi_bf16 *a, int64_t rsa,
                     int64_t csa, const cgi_bf16 *b, int64_t rsb, int64_t csb, float alpha, float beta, float *c,
                     int64_t rsc);

#endif
