/* SPDX-License-Identifier: MIT */
/* bf16 mixed precision: the products of a CG_BF16 graph take bfloat16 operands and accumulate in
 * float, on oneDNN's matmul primitive (vdpbf16ps) or on the fp32 FMA units with the operands
 * widened as they are packed (cgi_gemm_bf16), whichever this CPU runs faster (ops/bf16_kernel.c);
 * everything else stays cg_real (see docs/mixed-precision.md). Conversions happen
 * here and only here:
 *  - a parameter is converted once per change of its set's version (an optimizer step bumps it)
 *    into a bf16 copy that lives beside it, and every product that reads it reads the copy;
 *  - an activation or gradient operand is converted into the graph's scratch right before its
 *    product, in the orientation it lies in memory, so no conversion transposes;
 *  - results are written as float straight into the op's output or gradient (beta = 1 adds).
 * oneDNN's primitives are made on first use and cached per graph, keyed by shapes, strides and
 * scales, so a graph rebuilt each step of the same shape reuses them. */
#include <omp.h>
#include <stdlib.h>

#include "graph/internal.h"
#include "ops/bf16_internal.h"
#include "ops/half.h"

#if defined(CGRAD_DNNL) && !defined(CGRAD_DOUBLE)
#define LP_BUILD 1
#include "ops/bf16_engine.h"
#endif

static cg_precision default_precision = CG_FP32;

cg_precision cgi_default_precision(void) { return default_precision; }
cg_precision cg_default_precision(void) { return default_precision; }

cg_status cg_precision_parse(const char *name, cg_precision *p) {
    if (name && p && !strcmp(name, "fp32")) *p = CG_FP32;
    else if (name && p && !strcmp(name, "bf16")) *p = CG_BF16;
    else return cgi_fail(CG_ERR_ARG, "[precision] '%s': expected fp32 or bf16", name ? name : "(null)");
    return CG_OK;
}

const char *cg_precision_name(cg_precision p) { return p == CG_BF16 ? "bf16" : "fp32"; }

cg_precision cg_graph_precision(const cg_graph *g) { return g ? g->precision : CG_FP32; }

cg_status cg_graph_set_precision(cg_graph *g, cg_precision p) {
    if (!g) return cgi_fail(CG_ERR_ARG, "[precision] graph is NULL");
    if (p != CG_FP32 && p != CG_BF16) return cgi_fail(CG_ERR_ARG, "[precision] unknown precision %d", (int)p);
    const char *why = p == CG_BF16 ? cg_bf16_unavailable() : NULL;
    if (why) return cgi_fail(CG_ERR_STATE, "[precision] bf16: %s", why);
    g->precision = p;
    return CG_OK;
}

cg_status cg_set_precision(cg_precision p) {
    if (p != CG_FP32 && p != CG_BF16) return cgi_fail(CG_ERR_ARG, "[precision] unknown precision %d", (int)p);
    const char *why = p == CG_BF16 ? cg_bf16_unavailable() : NULL;
    if (why) return cgi_fail(CG_ERR_STATE, "[precision] bf16: %s", why);
    default_precision = p;
    return CG_OK;
}

bool cgi_lp_force_ref;
bool cgi_lp_fail_param_copy;

/* In row blocks, each block read whole before it is written: the bf16 row lands in the first half
 * of the float row's bytes, so a write never reaches a float not yet read. memcpy through one char
 * pointer keeps the compiler from reordering the reads and writes of the shared bytes. */
void cgi_lp_to_bf16_row(cg_real *x, int64_t i, int64_t n) {
#ifndef CGRAD_DOUBLE
    enum { BLK = 64 };
    char *row = (char *)(x + i * n);
    for (int64_t j = 0; j < n; j += BLK) {
        const int64_t len = n - j < BLK ? n - j : BLK;
        float f[BLK];
        cgi_bf16 h[BLK];
        memcpy(f, row + j * sizeof(float), (size_t)len * sizeof(float));
        cgi_lp_round(h, f, len, 1);
        memcpy(row + j * sizeof(cgi_bf16), h, (size_t)len * sizeof(cgi_bf16));
    }
#else
    (void)x, (void)i, (void)n;
#endif
}

void cgi_lp_to_bf16_inplace(cg_real *x, int64_t m, int64_t n) {
#pragma omp parallel for schedule(static) if (m * n > CGI_PAR_MIN) num_threads(cgi_nthreads())
    for (int64_t i = 0; i < m; i++) cgi_lp_to_bf16_row(x, i, n);
}

#ifndef LP_BUILD

const char *cg_bf16_unavailable(void) {
#ifdef CGRAD_DOUBLE
    return "the float64 build computes in double only";
#else
    return "this build has no oneDNN (run ./setup.sh for libdnnl-dev, then rebuild)";
#endif
}
void cgi_lp_free(cgi_lp *lp) { (void)lp; }
void cgi_lp_param_free(cg_tensor *p) { (void)p; }
void cgi_lp_plan_values(cg_graph *g, const int *consumers) {
    (void)consumers;
    for (int i = 0; i < g->n; i++) g->nodes[i]->lp_value = g->nodes[i]->lp_shadowed = false;
}
void cgi_lp_shadow_fill(cg_tensor *t) { (void)t; }
size_t cgi_lp_scratch_bytes(const cg_tensor *t, bool bwd) { return 0; }
size_t cgi_lp_unplanned_bytes(const cg_graph *g) { return 0; }
size_t cgi_lp_copy_bytes(const cg_graph *g) { return 0; }
bool cgi_lp_gemm(const cg_tensor *t, bool bwd, int64_t m, int64_t n, int64_t k, const cg_real *a, int64_t rsa,
                 int64_t csa, const cg_tensor *a_src, const cg_real *b, int64_t rsb, int64_t csb, const cg_tensor *b_src,
                 cg_real alpha, cg_real beta, cg_real *c, int64_t rsc, int64_t csc) {
    return false;
}
bool cgi_lp_linear_fwd(cg_tensor *t) { return false; }
double cg_bf16_gemm_gflops(int64_t n, int reps) { return NAN; }
double cg_bf16_onednn_gemm_gflops(int64_t n, int reps) { return NAN; }
const char *cg_bf16_kernel(void) { return NULL; }
bool cgi_lp_product(int which, int64_t m, int64_t n, int64_t k, const cgi_bf16 *a, int64_t rsa, int64_t csa,
                    const cgi_bf16 *b, int64_t rsb, int64_t csb, float alpha, float beta, void *c, int64_t rsc,
                    int64_t csc, const float *bias, bool c_bf16) {
    return false;
}
double cg_bf16_dot_ratio(void) { return NAN; }
void cgi_lp_peaks(double *fp32, double *bf16, double *amx) { *fp32 = *bf16 = *amx = NAN; }
double cg_bf16_amx_ratio(void) { return NAN; }
const char *cg_bf16_kernel_why(void) { return cg_bf16_unavailable(); }
bool cgi_lp_linear_bwd(cg_tensor *t, bool assign) { return false; }
bool cgi_lp_lce_bwd(cg_tensor *t, int64_t m, int64_t v, int64_t d, cg_real *dlogits, const cg_real *xs, cg_real *dxs,
                    bool dx, bool dw) {
    return false;
}
int64_t cgi_lp_param_conversions;
int cgi_lp_force_kernel;

#else

/* ---- the engine: one per process, like the thread pool ---- */

static dnnl_engine_t engine;
static dnnl_stream_t stream;

/* The engine and stream, made on first use; false if oneDNN cannot make them. */
static bool engine_ready(void) {
    bool ok;
#pragma omp critical(cgi_lp_engine)
    {
        if (!engine && dnnl_engine_create(&engine, dnnl_cpu, 0) == dnnl_success &&
            dnnl_stream_create(&stream, engine, dnnl_stream_default_flags) != dnnl_success) {
            dnnl_engine_destroy(engine);
            engine = NULL;
        }
        ok = engine != NULL;
    }
    return ok;
}

/* ---- conversion (cgi_to_bf16: round to nearest even, NaN stays NaN) ---- */

/* dst[0..n) = bf16(src[0..n)) over the run's threads, in runs (one row of n would run on one) */
static void convert_all(const float *src, cgi_bf16 *dst, int64_t n) {
    enum { RUN = 1 << 14 };
#pragma omp parallel for schedule(static) if (n > CGI_PAR_MIN) num_threads(cgi_nthreads())
    for (int64_t i = 0; i < n; i += RUN) cgi_lp_round(dst + i, src + i, n - i < RUN ? n - i : RUN, 1);
}

/* dst = bf16(src[rows, cols]) (strides rs, cs), laid out in the source's own orientation: by rows
 * unless the source is stored by columns. Its strides go to *drs, *dcs. */
void cgi_lp_convert(const float *src, int64_t rows, int64_t cols, int64_t rs, int64_t cs, cgi_bf16 *dst, int64_t *drs,
                    int64_t *dcs) {
    const bool by_cols = rs == 1 && cs != 1 && rows > 1;
    const int64_t outer = by_cols ? cols : rows, inner = by_cols ? rows : cols;
    const int64_t so = by_cols ? cs : rs, si = by_cols ? rs : cs;
    *drs = by_cols ? 1 : cols;
    *dcs = by_cols ? rows : 1;
#pragma omp parallel for schedule(static) if (rows * cols > CGI_PAR_MIN) num_threads(cgi_nthreads())
    for (int64_t o = 0; o < outer; o++) {
        const float *s = src + o * so;
        cgi_bf16 *d = dst + o * inner;
        cgi_lp_round(d, s, inner, si);
    }
}

/* ---- parameters: one bf16 copy each, remade when the set's version moves ---- */

typedef struct {
    cgi_bf16 *v;
    uint64_t version;
} shadow;

int64_t cgi_lp_param_conversions;

void cgi_lp_param_free(cg_tensor *p) {
    shadow *s = p->lp;
    if (s) free(s->v);
    free(s);
    p->lp = NULL;
}

/* bf16 copy of parameter p (same layout as its storage); NULL without memory. */
static const cgi_bf16 *param_bf16(cg_tensor *p) {
    const cgi_bf16 *mapped = cgi_param_bf16_mapped(p); /* a frozen bf16 weight, read in place from its file */
    if (mapped) return mapped;
    shadow *s = p->lp;
    const int64_t n = cgi_numel(p->ndim, p->shape);
    if (!s) {
        s = cgi_lp_fail_param_copy ? NULL : calloc(1, sizeof *s);
        if (!s || !(s->v = cgi_alloc_large((size_t)n * sizeof(cgi_bf16)))) {
            free(s);
            return NULL;
        }
        p->lp = s;
    }
    if (s->version != *p->pversion || !s->version) {
        convert_all(p->data, s->v, n);
        s->version = *p->pversion;
#pragma omp atomic
        cgi_lp_param_conversions++;
    }
    return s->v;
}

/* ---- per graph: cached primitives and conversion scratch ---- */


/* The kernel a product of this context runs on: forced by the context or the tests, else the choice */
static int kernel_of(const cgi_lp *lp) {
    return lp && lp->force ? lp->force - 1 : cgi_lp_force_kernel ? cgi_lp_force_kernel - 1 : cgi_lp_kernel;
}

/* The kernel an m x n product runs on. One row or one column of C (a generated token's products)
 * reads each weight once and is bound by memory, not by the instruction: it stays on the fp32
 * units' line path, which a generation's thread team shares (graph/team.c), unless a kernel is
 * forced. On oneDNN with AMX, gpt-tiny's cached bf16 generation read 2130 / 2014 tokens/s on 1 / 2
 * threads against 2461-2575 / 3032-3153 on that path. */
int cgi_lp_kernel_for(const cgi_lp *lp, int64_t m, int64_t n) {
    if ((lp && lp->force) || cgi_lp_force_kernel || (m != 1 && n != 1)) return kernel_of(lp);
    return K_FP32;
}

void cgi_lp_free(cgi_lp *lp) {
    if (!lp) return;
    for (int i = 0; i < lp->n; i++) {
        dnnl_primitive_destroy(lp->e[i].prim);
        dnnl_memory_destroy(lp->e[i].ma);
        dnnl_memory_destroy(lp->e[i].mb);
        dnnl_memory_destroy(lp->e[i].mc);
        if (lp->e[i].mbias) dnnl_memory_destroy(lp->e[i].mbias);
    }
    free(lp->e);
    free(lp->slot[0]);
    free(lp->slot[1]);
    free(lp);
}

cgi_lp *cgi_lp_ctx(cg_graph *g) {
    if (!g->lp && !cg_bf16_unavailable() && (kernel_of(NULL) == K_FP32 || engine_ready())) g->lp = calloc(1, sizeof *g->lp);
    return g->lp;
}

/* Scratch slot i of at least n elements; grows only while the first steps find larger products. */
static cgi_bf16 *slot(cgi_lp *lp, int i, int64_t n) {
    if ((size_t)n > lp->slot_n[i]) {
        free(lp->slot[i]);
        lp->slot_n[i] = 0;
        lp->slot[i] = cgi_alloc_large((size_t)n * sizeof(cgi_bf16));
        if (!lp->slot[i]) return NULL;
        lp->slot_n[i] = (size_t)n;
    }
    return lp->slot[i];
}

static bool make_md(dnnl_memory_desc_t *md, int64_t r, int64_t c, int64_t rs, int64_t cs, dnnl_data_type_t dt) {
    dnnl_dims_t dims = {r, c}, strides = {rs, cs};
    return dnnl_memory_desc_init_by_strides(md, 2, dims, dt, strides) == dnnl_success;
}

/* The primitive for these shapes, strides and scales: from the cache, else made and cached. */
int cgi_lp_exec_threads;

static entry *prim(cgi_lp *lp, int64_t m, int64_t n, int64_t k, int64_t rsa, int64_t csa, int64_t rsb, int64_t csb,
                   int64_t rsc, float alpha, float beta, int out, int piece) {
    /* oneDNN fixes a primitive's thread count when it is made: one per count a run may use; a
     * piece of a split product has its own (its memory objects hold that piece's pointers) */
    const int64_t key[11] = {m, n, k, rsa, csa, rsb, csb, rsc, omp_get_max_threads(), out, piece};
    for (int i = 0; i < lp->n; i++)
        if (!memcmp(lp->e[i].key, key, sizeof key) && lp->e[i].alpha == alpha && lp->e[i].beta == beta) return &lp->e[i];
    if (lp->n == lp->cap) {
        int cap = lp->cap ? 2 * lp->cap : 16;
        entry *e = realloc(lp->e, (size_t)cap * sizeof *e);
        if (!e) return NULL;
        lp->e = e;
        lp->cap = cap;
    }
    dnnl_memory_desc_t a, b, c, bias;
    if (!make_md(&a, m, k, rsa, csa, dnnl_bf16) || !make_md(&b, k, n, rsb, csb, dnnl_bf16) ||
        !make_md(&c, m, n, rsc, 1, out & OUT_BF16 ? dnnl_bf16 : dnnl_f32) ||
        ((out & OUT_BIAS) && !make_md(&bias, 1, n, n, 1, dnnl_f32)))
        return NULL;
    dnnl_matmul_desc_t md;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    entry e = {.alpha = alpha, .beta = beta};
    memcpy(e.key, key, sizeof key);
    bool ok = dnnl_matmul_desc_init(&md, &a, &b, out & OUT_BIAS ? &bias : NULL, &c) == dnnl_success &&
              dnnl_primitive_attr_create(&attr) == dnnl_success && dnnl_post_ops_create(&po) == dnnl_success;
    if (ok && alpha != 1) ok = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha) == dnnl_success;
    if (ok && beta != 0) ok = dnnl_post_ops_append_sum(po, beta) == dnnl_success &&
                               dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
    ok = ok && dnnl_primitive_desc_create(&pd, &md, attr, engine, NULL) == dnnl_success &&
         dnnl_primitive_create(&e.prim, pd) == dnnl_success;
    ok = ok && dnnl_memory_create(&e.ma, &a, engine, DNNL_MEMORY_NONE) == dnnl_success &&
         dnnl_memory_create(&e.mb, &b, engine, DNNL_MEMORY_NONE) == dnnl_success &&
         dnnl_memory_create(&e.mc, &c, engine, DNNL_MEMORY_NONE) == dnnl_success &&
         (!(out & OUT_BIAS) || dnnl_memory_create(&e.mbias, &bias, engine, DNNL_MEMORY_NONE) == dnnl_success);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (!ok) {
        if (e.prim) dnnl_primitive_destroy(e.prim);
        if (e.ma) dnnl_memory_destroy(e.ma);
        if (e.mb) dnnl_memory_destroy(e.mb);
        if (e.mc) dnnl_memory_destroy(e.mc);
        if (e.mbias) dnnl_memory_destroy(e.mbias);
        return NULL;
    }
    lp->e[lp->n] = e;
    return &lp->e[lp->n++];
}

static bool run(cgi_lp *lp, int64_t m, int64_t n, int64_t k, const cgi_bf16 *a, int64_t rsa, int64_t csa,
                const cgi_bf16 *b, int64_t rsb, int64_t csb, float alpha, float beta, void *c, int64_t rsc,
                const float *bias, int out, unsigned ty);


/* C[m,n] = alpha A B + beta C from bf16 operands. oneDNN's fast kernels want C stored by rows; C
 * stored by columns is computed as C^T = B^T A^T. Other C layouts are refused (false). */
static bool gemm_bf16(cgi_lp *lp, int64_t m, int64_t n, int64_t k, const cgi_bf16 *a, int64_t rsa, int64_t csa, const cgi_bf16 *b,
                      int64_t rsb, int64_t csb, float alpha, float beta, float *c, int64_t rsc, int64_t csc, unsigned ty) {
    if (m == 0 || n == 0) return true;
    if (k == 0) {
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) c[i * rsc + j * csc] = beta == 0 ? 0 : beta * c[i * rsc + j * csc];
        return true;
    }
    if (n == 1 && m > 1) csc = 1; /* a column: any column stride will do */
    if (m == 1) rsc = n * csc;
    if (csc != 1) {
        if (rsc != 1) return false;
        return gemm_bf16(lp, n, m, k, b, csb, rsb, a, csa, rsa, alpha, beta, c, csc, rsc, TY(ty_b(ty), ty_a(ty)));
    }
    return run(lp, m, n, k, a, rsa, csa, b, rsb, csb, alpha, beta, c, rsc, NULL, 0, ty);
}

/* One cached primitive on these operands, waited for. */
static bool execute(entry *e, dnnl_stream_t s, const void *a, const void *b, void *c, const float *bias, int out) {
    dnnl_memory_set_data_handle(e->ma, (void *)a);
    dnnl_memory_set_data_handle(e->mb, (void *)b);
    dnnl_memory_set_data_handle(e->mc, c);
    if (out & OUT_BIAS) dnnl_memory_set_data_handle(e->mbias, (void *)bias);
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, e->ma}, {DNNL_ARG_WEIGHTS, e->mb}, {DNNL_ARG_DST, e->mc}, {DNNL_ARG_BIAS, e->mbias}};
    return dnnl_primitive_execute(e->prim, s, out & OUT_BIAS ? 4 : 3, args) == dnnl_success &&
           dnnl_stream_wait(s) == dnnl_success;
}


static dnnl_stream_t piece_stream[SPLIT_MAX];

/* The streams of the first n pieces, made on first use. */
bool cgi_lp_piece_streams(int n) {
    for (int p = 0; p < n; p++)
        if (!piece_stream[p] && dnnl_stream_create(&piece_stream[p], engine, dnnl_stream_default_flags) != dnnl_success) {
            piece_stream[p] = NULL;
            return false;
        }
    return true;
}

/* The cache index of a one-thread primitive (made now if new), -1 if oneDNN refuses it: an index,
 * since making the next one may move the cache. */
int cgi_lp_piece_prim(cgi_lp *lp, int64_t m, int64_t n, int64_t k, int64_t rsa, int64_t csa, int64_t rsb, int64_t csb,
                      int64_t rsc, float alpha, float beta, int out, int piece) {
    const int was = omp_get_max_threads();
    omp_set_num_threads(1);
    entry *e = prim(lp, m, n, k, rsa, csa, rsb, csb, rsc, alpha, beta, out, piece);
    omp_set_num_threads(was);
    return e ? (int)(e - lp->e) : -1;
}

/* One product, C stored by rows (row stride rsc): C = alpha A B + beta C (+ bias row), C in float
 * or, with OUT_BF16, in bf16 (then beta is 0), on the kernel chosen for the process: the fp32 units
 * (cgi_gemm_bf16) or oneDNN. */
static bool run(cgi_lp *lp, int64_t m, int64_t n, int64_t k, const cgi_bf16 *a, int64_t rsa, int64_t csa,
                const cgi_bf16 *b, int64_t rsb, int64_t csb, float alpha, float beta, void *c, int64_t rsc,
                const float *bias, int out, unsigned ty) {
    /* oneDNN's OpenMP team follows omp_get_max_threads(), not the graph run's thread decision: a
     * generation step kept on one thread (graph/threads.c) woke the second thread in every product
     * here, and bf16 cached generation fell from 1795 to 594 tokens/s on two threads */
    const int want = (double)m * (double)n * (double)k < lp->serial_below ? 1 : cgi_nthreads(), was = omp_get_max_threads();
    if (cgi_lp_kernel_for(lp, m, n) == K_FP32 || ty != TY_BF16) { /* an fp16 operand: the fp32 units widen it as they pack */
        cgi_lp_exec_threads = want;
        return cgi_gemm_half(m, n, k, a, ty_a(ty), rsa, csa, b, ty_b(ty), rsb, csb, alpha, out & OUT_BF16 ? 0 : beta, c,
                             rsc, out & OUT_BIAS ? bias : NULL, out & OUT_BF16, want);
    }
    if (want != was) omp_set_num_threads(want);
    cgi_lp_exec_threads = omp_get_max_threads();
    entry *e = prim(lp, m, n, k, rsa, csa, rsb, csb, rsc, alpha, beta, out, 0);
    bool ok = e && execute(e, stream, a, b, c, bias, out);
    if (want != was) omp_set_num_threads(was);
    return ok;
}

/* C = alpha A B (+ a contiguous bias row) + beta C by plain loops over bf16 operands, float
 * accumulation, C in float or (c_bf16, beta 0) rounded once into bf16: where oneDNN cannot take
 * an operand that only exists in bf16 (and under cgi_lp_force_ref, for the tests). The one
 * reference loop of every bf16 product, linear's output stage included. */
void cgi_lp_ref_gemm(int64_t m, int64_t n, int64_t k, const cgi_bf16 *a, int64_t rsa, int64_t csa, const cgi_bf16 *b,
                     int64_t rsb, int64_t csb, float alpha, float beta, const float *bias, float *c, cgi_bf16 *c_bf16,
                     int64_t rsc, int64_t csc, unsigned ty) {
#pragma omp parallel for schedule(static) if (m * n * k > CGI_PAR_MIN) num_threads(cgi_nthreads())
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            float acc = 0;
            for (int64_t p = 0; p < k; p++)
                acc += cgi_half_at(a, i * rsa + p * csa, ty_a(ty)) * cgi_half_at(b, p * rsb + j * csb, ty_b(ty));
            acc = alpha * acc + (bias ? bias[j] : 0);
            if (c_bf16) c_bf16[i * rsc + j * csc] = cgi_to_bf16(acc);
            else {
                float *d = c + i * rsc + j * csc;
                *d = acc + (beta != 0 ? beta * *d : 0);
            }
        }
}

/* A one-thread product from the cache (index i) on its own stream, else the reference loops */
void cgi_lp_piece_mm(cgi_lp *lp, int i, int stream_of, int64_t m, int64_t n, int64_t k, const cgi_bf16 *a, int64_t rsa,
                     int64_t csa, const cgi_bf16 *b, int64_t rsb, int64_t csb, float alpha, float beta, float *c,
                     int64_t rsc) {
    if (!execute(&lp->e[i], piece_stream[stream_of], a, b, c, NULL, 0))
        cgi_lp_ref_gemm(m, n, k, a, rsa, csa, b, rsb, csb, alpha, beta, NULL, c, NULL, rsc, 1, TY_BF16);
}

/* The product on bf16 operands: oneDNN, else the reference loops, so it always happens. */
void cgi_lp_mm(cgi_lp *lp, int64_t m, int64_t n, int64_t k, const cgi_bf16 *a, int64_t rsa, int64_t csa, const cgi_bf16 *b,
               int64_t rsb, int64_t csb, float alpha, float beta, float *c, int64_t rsc, int64_t csc, unsigned ty) {
    if (cgi_lp_force_ref || !gemm_bf16(lp, m, n, k, a, rsa, csa, b, rsb, csb, alpha, beta, c, rsc, csc, ty))
        cgi_lp_ref_gemm(m, n, k, a, rsa, csa, b, rsb, csb, alpha, beta, NULL, c, NULL, rsc, csc, ty);
}

static size_t round_up(size_t n) { return (n + CGI_ALIGN - 1) / CGI_ALIGN * CGI_ALIGN; }

/* A weight being trained, read by a linear or matmul of a step that computes gradients (whose many
 * rows make the conversion a small part of the product), is converted into t's planned scratch at
 * each read, as an activation is: its bf16 copy, remade every step anyway, would sit outside the
 * plan for the whole step (gpt-small's layers: 162 MiB, more than the plan's bf16 values save).
 * The fused LM head keeps its copy: converting would repeat per chunk, and its scratch would hold
 * the whole weight at the loss's backward, the peak, as the copy does. LoRA's fused op keeps its
 * copies: its base weight is frozen, converted once for all steps. */
static bool converted_per_use(const cg_tensor *t, const cg_tensor *x) {
    return (t->op == CGI_OP_LINEAR || t->op == CGI_OP_MATMUL) && t->requires_grad && x->requires_grad &&
           x->root->store != CGI_STORE_HALF;
}
/* t reads x's bf16 copy: a parameter's, or its mapped half. */
static bool reads_copy(const cg_tensor *t, const cg_tensor *x) { return cgi_lp_param_backed(x) && !converted_per_use(t, x); }
bool cgi_lp_no_conversion(const cg_tensor *t, const cg_tensor *x) {
    return reads_copy(t, x) || (x && x->root && (x->root->lp_value || x->root->lp_shadowed));
}



/* Elements of the two conversion areas (A, B) that t's forward or backward products use. */
void cgi_lp_need(const cg_tensor *t, bool bwd, int64_t s[2]) {
    s[0] = s[1] = 0;
    if (!t->graph || t->graph->precision != CG_BF16) return;
    if (cgi_lp_lora_backed(t)) { /* forward: x, then the low-rank product; backward: dY; x, low and dlow */
        const cg_tensor *x = t->src[0], *w = t->src[1];
        const int64_t m = cgi_lp_rows(x), n = w->shape[0], k = w->shape[1], r = t->src[2]->shape[0];
        const bool xb = cgi_lp_no_conversion(t, x);
        if (!bwd) s[0] = (xb ? 0 : m * k) + m * r; /* x, and beside it the low-rank product */
        else {
            s[0] = cgi_lp_dy_in_place(t) ? 0 : m * n;
            s[1] = ((w->requires_grad || t->src[2]->requires_grad) && !xb ? m * k : 0) + 2 * m * r;
        }
    } else if (t->op == CGI_OP_LINEAR) {
        const cg_tensor *x = t->src[0], *w = t->src[1];
        const int64_t m = cgi_lp_rows(x), n = w->shape[0], k = w->shape[1];
        const bool xb = cgi_lp_no_conversion(t, x), wb = reads_copy(t, w);
        if (!bwd) {
            s[0] = xb ? 0 : m * k;
            s[1] = wb ? 0 : n * k;
        } else {
            s[1] = cgi_lp_max2(x->requires_grad && !wb ? n * k : 0, w->requires_grad && !xb ? m * k : 0);
            s[0] = cgi_lp_dy_in_place(t) ? 0 : m * n;
        }
    } else if (t->op == CGI_OP_MATMUL) { /* per batch, one at a time; the whole tensors bound it */
        const int64_t na = cgi_numel(t->src[0]->ndim, t->src[0]->shape), nb = cgi_numel(t->src[1]->ndim, t->src[1]->shape);
        const int64_t nc = cgi_numel(t->ndim, t->shape);
        s[0] = bwd ? cgi_lp_max2(na, nc) : na;
        s[1] = bwd ? cgi_lp_max2(nb, nc) : nb;
    } else if (t->op == CGI_OP_LINEAR_CROSS_ENTROPY) { /* chunks of iarg[2] rows: xs [cap, d], W [v, d] */
        const cg_tensor *w = t->src[1];
        const int64_t cap = t->iarg[2], v = w->shape[0], d = w->shape[1], wn = reads_copy(t, w) ? 0 : v * d;
        s[0] = cap * d; /* xs, for the logits (recomputed in backward when there are several chunks) */
        s[1] = bwd ? cgi_lp_max2(wn, cap * d) : wn;
    }
}

size_t cgi_lp_scratch_bytes(const cg_tensor *t, bool bwd) {
    int64_t s[2];
    cgi_lp_need(t, bwd, s);
    if (!s[0] && !s[1]) return 0;
    return round_up((size_t)s[0] * sizeof(cgi_bf16)) + (size_t)s[1] * sizeof(cgi_bf16);
}

size_t cgi_lp_unplanned_bytes(const cg_graph *g) {
    return g && g->lp ? (g->lp->slot_n[0] + g->lp->slot_n[1]) * sizeof(cgi_bf16) : 0;
}

size_t cgi_lp_copy_bytes(const cg_graph *g) {
    size_t bytes = 0;
    for (int64_t c = 0; g->precision == CG_BF16 && c < g->n; c++) {
        const cg_tensor *t = g->nodes[c];
        if (t->op != CGI_OP_LINEAR && t->op != CGI_OP_MATMUL && t->op != CGI_OP_LINEAR_CROSS_ENTROPY) continue;
        for (int k = 0; k < t->nsrc; k++) {
            const cg_tensor *p = t->src[k]->root;
            if (!reads_copy(t, t->src[k]) || cgi_param_bf16_mapped((cg_tensor *)p)) continue;
            bool seen = false; /* an earlier reader of the same parameter */
            for (int64_t e = 0; e < c && !seen; e++)
                for (int j = 0; j < g->nodes[e]->nsrc && !seen; j++)
                    seen = g->nodes[e]->src[j]->root == p && (g->nodes[e]->op == CGI_OP_LINEAR ||
                           g->nodes[e]->op == CGI_OP_MATMUL || g->nodes[e]->op == CGI_OP_LINEAR_CROSS_ENTROPY) &&
                           reads_copy(g->nodes[e], g->nodes[e]->src[j]);
            if (!seen) bytes += (size_t)cgi_numel(p->ndim, p->shape) * sizeof(cgi_bf16);
        }
    }
    return bytes;
}

/* Conversion area i for n elements: t's planned scratch, else the graph's held slot. */
cgi_bf16 *cgi_lp_scratch(cgi_lp *lp, const cg_tensor *t, bool bwd, int i, int64_t n) {
    int64_t s[2];
    cgi_lp_need(t, bwd, s);
    char *base = t->lp_tmp[bwd];
    if (base && n <= s[i]) return (cgi_bf16 *)(base + (i ? round_up((size_t)s[0] * sizeof(cgi_bf16)) : 0));
    return slot(lp, i, n);
}

/* bf16 form of operand x[rows, cols] (strides rs, cs) whose storage belongs to src: a parameter's
 * copy or a bf16-stored value (same strides), else a conversion into area i of t's scratch
 * (strides set to its layout). *el gets its element type: CGI_EL_BF16, or CGI_EL_F16 for an fp16
 * parameter read in place from its file. */
const cgi_bf16 *cgi_lp_operand(cgi_lp *lp, const cg_tensor *t, bool bwd, int i, const float *x, int64_t rows, int64_t cols,
                               int64_t *rs, int64_t *cs, const cg_tensor *src, int *el) {
    cg_tensor *root = src ? src->root : NULL;
    *el = CGI_EL_BF16;
    if (cgi_lp_param_backed(src) && root->store == CGI_STORE_HALF && root->half == CGI_EL_F16) {
        *el = CGI_EL_F16;
        return (const cgi_bf16 *)root->mapped + (x - (const float *)root->data);
    }
    if (reads_copy(t, src)) {
        const cgi_bf16 *p = param_bf16(root);
        return p ? p + (x - (const float *)root->data) : NULL;
    }
    if (root && root->lp_value) return (const cgi_bf16 *)x;
    if (root && root->lp_shadowed && root->lp_shadow) return (const cgi_bf16 *)root->lp_shadow + (x - (const float *)root->data);
    cgi_bf16 *d = cgi_lp_scratch(lp, t, bwd, i, rows * cols);
    if (d) cgi_lp_convert(x, rows, cols, *rs, *cs, d, rs, cs);
    return d;
}

bool cgi_lp_gemm(const cg_tensor *t, bool bwd, int64_t m, int64_t n, int64_t k, const cg_real *a, int64_t rsa,
                 int64_t csa, const cg_tensor *a_src, const cg_real *b, int64_t rsb, int64_t csb, const cg_tensor *b_src,
                 cg_real alpha, cg_real beta, cg_real *c, int64_t rsc, int64_t csc) {
    cgi_lp *lp = t->graph && t->graph->precision == CG_BF16 ? cgi_lp_ctx(t->graph) : NULL;
    if (!lp) return false;
    if (m == 0 || n == 0 || k == 0) return gemm_bf16(lp, m, n, k, NULL, 0, 0, NULL, 0, 0, alpha, beta, c, rsc, csc, TY_BF16);
    int ea, eb;
    const cgi_bf16 *ab = cgi_lp_operand(lp, t, bwd, 0, a, m, k, &rsa, &csa, a_src, &ea);
    const cgi_bf16 *bb = ab ? cgi_lp_operand(lp, t, bwd, 1, b, k, n, &rsb, &csb, b_src, &eb) : NULL;
    if (!bb) return false;
    const unsigned ty = TY(ea, eb);
    if (cgi_lp_force_ref || !gemm_bf16(lp, m, n, k, ab, rsa, csa, bb, rsb, csb, alpha, beta, c, rsc, csc, ty)) {
        /* a C layout oneDNN refuses: float operands go back to the caller's BLIS product */
        const bool bf16_only = (a_src && a_src->root->lp_value) || (b_src && b_src->root->lp_value);
        if (!bf16_only && !cgi_lp_force_ref) return false;
        cgi_lp_ref_gemm(m, n, k, ab, rsa, csa, bb, rsb, csb, alpha, beta, NULL, c, NULL, rsc, csc, ty);
    }
    return true;
}

/* ---- the reference: the bf16 kernel's (or oneDNN's) product on square operands already in bf16 ---- */

static double gemm_ref(int64_t n, int reps, bool onednn) {
    if (cg_bf16_unavailable() || n < 1 || ((onednn || kernel_of(NULL) == K_ONEDNN) && (!cgi_lp_cpu_has_bf16() || !engine_ready())))
        return NAN;
    cgi_lp lp = {.force = onednn ? 1 + K_ONEDNN : 0};
    cgi_bf16 *a = calloc((size_t)(n * n), sizeof *a), *b = calloc((size_t)(n * n), sizeof *b);
    float *c = calloc((size_t)(n * n), sizeof *c);
    double best = INFINITY;
    for (int64_t i = 0; a && b && i < n * n; i++) a[i] = cgi_to_bf16((float)(i % 7) * 0.25f), b[i] = cgi_to_bf16((float)(i % 5) * 0.5f);
    for (int r = 0; a && b && c && r <= reps; r++) { /* r = 0 warms up (and makes the primitive) */
        double t0 = omp_get_wtime();
        if (!gemm_bf16(&lp, n, n, n, a, n, 1, b, n, 1, 1, 0, c, n, 1, TY_BF16)) break;
        double dt = omp_get_wtime() - t0;
        if (r > 0 && dt < best) best = dt;
    }
    for (int i = 0; i < lp.n; i++) {
        dnnl_primitive_destroy(lp.e[i].prim);
        dnnl_memory_destroy(lp.e[i].ma), dnnl_memory_destroy(lp.e[i].mb), dnnl_memory_destroy(lp.e[i].mc);
    }
    free(lp.e), free(a), free(b), free(c);
    return isfinite(best) ? 2.0 * (double)n * (double)n * (double)n / best / 1e9 : NAN;
}

double cg_bf16_gemm_gflops(int64_t n, int reps) { return gemm_ref(n, reps, false); }

bool cgi_lp_product(int which, int64_t m, int64_t n, int64_t k, const cgi_bf16 *a, int64_t rsa, int64_t csa,
                    const cgi_bf16 *b, int64_t rsb, int64_t csb, float alpha, float beta, void *c, int64_t rsc,
                    int64_t csc, const float *bias, bool c_bf16) {
    static cgi_lp lp[3]; /* primitives kept for the process, one context per forced kernel and one unforced */
    if (which < 0 || which > 3 || cg_bf16_unavailable() ||
        ((which == 1 || (which == 3 && cgi_lp_kernel == K_ONEDNN)) && (!cgi_lp_cpu_has_bf16() || !engine_ready())))
        return false;
    if (which == 0) {
        cgi_lp_ref_gemm(m, n, k, a, rsa, csa, b, rsb, csb, alpha, c_bf16 ? 0 : beta, bias, c_bf16 ? NULL : c,
                        c_bf16 ? c : NULL, rsc, csc, TY_BF16);
        return true;
    }
    bool ok;
#pragma omp critical(cgi_lp_product)
    {
        cgi_lp *l = &lp[which - 1];
        l->force = which == 1 ? 1 + K_ONEDNN : which == 2 ? 1 + K_FP32 : 0;
        if (!bias && !c_bf16) ok = gemm_bf16(l, m, n, k, a, rsa, csa, b, rsb, csb, alpha, beta, c, rsc, csc, TY_BF16);
        else ok = csc == 1 && k > 0 && m > 0 && n > 0 &&
                  run(l, m, n, k, a, rsa, csa, b, rsb, csb, alpha, c_bf16 ? 0 : beta, c, rsc, bias,
                      (bias ? OUT_BIAS : 0) | (c_bf16 ? OUT_BF16 : 0), TY_BF16);
    }
    return ok;
}
double cg_bf16_onednn_gemm_gflops(int64_t n, int reps) { return gemm_ref(n, reps, true); }

/* ---- linear: x[..., in] @ w[out, in]^T ---- */

/* The bias goes in at the product's output stage (oneDNN's bias argument: the float sum plus the
 * float bias), so no pass fills the output with it first and the product does not read it back.
 * A value stored in bf16 (t->lp_value: GELU alone reads it, see plan_linear_outputs) is rounded
 * once from that float sum, with no float value and no extra pass. A strided bias view is
 * copied into the output first and added as C (beta 1), as before. */
bool cgi_lp_linear_fwd(cg_tensor *t) {
    cg_tensor *x = t->src[0], *w = t->src[1], *bias = t->nsrc > 2 ? t->src[2] : NULL;
    cgi_lp *lp = cgi_lp_ctx(t->graph);
    if (!lp) return false;
    const int64_t m = cgi_lp_rows(x), n = w->shape[0], k = w->shape[1];
    int64_t rsa = cgi_lp_row_stride(x), csa = x->stride[x->ndim - 1], rsb = w->stride[1], csb = w->stride[0];
    int ea, eb;
    const cgi_bf16 *ab = cgi_lp_operand(lp, t, false, 0, x->data, m, k, &rsa, &csa, x, &ea);
    const cgi_bf16 *bb = ab ? cgi_lp_operand(lp, t, false, 1, w->data, k, n, &rsb, &csb, w, &eb) : NULL;
    if (!bb) return false; /* nothing written: the caller's float product (its bias included) */
    const unsigned ty = TY(ea, eb);
    const bool filled = bias && bias->stride[0] != 1 && !t->lp_value;
    if (filled) {
        const cg_real *bv = bias->data;
        const int64_t bs = bias->stride[0];
        cg_real *c = t->data;
#pragma omp parallel for schedule(static) if (m * n > CGI_PAR_MIN) num_threads(cgi_nthreads())
        for (int64_t i = 0; i < m; i++) cgi_fill_bias(c + i * n, 1, n, n, 1, bv, bs);
    }
    const float *bv = bias && !filled ? bias->data : NULL;
    const int out = (t->lp_value ? OUT_BF16 : 0) | (bv ? OUT_BIAS : 0);
    if (m == 0 || n == 0) return true;
    if (cgi_lp_force_ref || k == 0 || !run(lp, m, n, k, ab, rsa, csa, bb, rsb, csb, 1, filled ? 1 : 0, t->data, n, bv, out, ty)) {
        cgi_lp_ref_gemm(m, n, k, ab, rsa, csa, bb, rsb, csb, 1, filled ? 1 : 0, bv, t->lp_value ? NULL : t->data,
                        t->lp_value ? t->data : NULL, n, 1, ty);
    }
    return true;
}

bool cgi_lp_linear_bwd(cg_tensor *t, bool assign) {
    cg_tensor *x = t->src[0], *w = t->src[1];
    cgi_lp *lp = cgi_lp_ctx(t->graph);
    if (!lp) return false;
    const int64_t m = cgi_lp_rows(x), n = w->shape[0], k = w->shape[1];
    int64_t s[2], rd = n, cd = 1; /* dY, converted once for both products */
    cgi_lp_need(t, true, s);
    const cgi_bf16 *dy;
    int edy = CGI_EL_BF16;
    if (cgi_lp_dy_in_place(t) && (s[1] == 0 || t->lp_tmp[1])) { /* nothing can fail once the floats are gone */
        cgi_lp_to_bf16_inplace(t->grad, m, n);
        dy = (const cgi_bf16 *)t->grad;
        rd = 2 * n;
    } else if (!(dy = cgi_lp_operand(lp, t, true, 0, t->grad, m, n, &rd, &cd, NULL, &edy)))
        return false;
    /* from here on nothing fails: planned areas fit, and a held slot that cannot grow leaves dY float */
    if (x->requires_grad) { /* dX[m,k] (+)= dY[m,n] @ W[n,k] */
        int64_t rw = w->stride[0], cw = w->stride[1];
        int ew;
        const cgi_bf16 *wb = cgi_lp_operand(lp, t, true, 1, w->data, n, k, &rw, &cw, w, &ew);
        if (!wb) return false; /* only with dY still float and nothing written */
        cgi_lp_mm(lp, m, k, n, dy, rd, cd, wb, rw, cw, 1, assign ? 0 : 1, x->grad, cgi_lp_row_stride(x), x->stride[x->ndim - 1],
                  TY(edy, ew));
    }
    if (w->requires_grad) { /* dW[n,k] += dY^T[n,m] @ X[m,k] */
        int64_t rx = cgi_lp_row_stride(x), cx = x->stride[x->ndim - 1];
        int ex;
        const cgi_bf16 *xb = cgi_lp_operand(lp, t, true, 1, x->data, m, k, &rx, &cx, x, &ex);
        if (xb) cgi_lp_mm(lp, n, k, m, dy, cd, rd, xb, rx, cx, 1, 1, w->grad, w->stride[0], w->stride[1], TY(edy, ex));
        else /* dX is already written (and dY is float: a held slot failed): finish in float */
            cgi_gemm(n, k, m, t->grad, 1, n, x->data, cgi_lp_row_stride(x), x->stride[x->ndim - 1], 1, 1, w->grad,
                     w->stride[0], w->stride[1], cgi_nthreads());
    }
    return true;
}

/* ---- the fused LM head's backward, one chunk ---- */

bool cgi_lp_lce_bwd(cg_tensor *t, int64_t m, int64_t v, int64_t d, cg_real *dlogits, const cg_real *xs, cg_real *dxs,
                    bool dx, bool dw) {
    cg_tensor *w = t->src[1];
    cgi_lp *lp = t->graph->precision == CG_BF16 ? cgi_lp_ctx(t->graph) : NULL;
    int64_t s[2];
    cgi_lp_need(t, true, s);
    if (!lp || (s[1] && !t->lp_tmp[1])) return false; /* unplanned: the caller's float products */
    cgi_lp_to_bf16_inplace(dlogits, m, v);
    const cgi_bf16 *dl = (const cgi_bf16 *)dlogits;
    if (dx) { /* dxs[m,d] = dlogits[m,v] @ W[v,d] */
        int64_t rw = w->stride[0], cw = w->stride[1];
        int ew;
        const cgi_bf16 *wb = cgi_lp_operand(lp, t, true, 1, w->data, v, d, &rw, &cw, w, &ew);
        cgi_lp_mm(lp, m, d, v, dl, 2 * v, 1, wb, rw, cw, 1, 0, dxs, d, 1, TY(CGI_EL_BF16, ew));
    }
    if (dw) { /* dW[v,d] += dlogits^T[v,m] @ xs[m,d] */
        int64_t rx = d, cx = 1;
        int ex;
        const cgi_bf16 *xb = cgi_lp_operand(lp, t, true, 1, xs, m, d, &rx, &cx, NULL, &ex);
        cgi_lp_mm(lp, v, d, m, dl, 1, 2 * v, xb, rx, cx, 1, 1, w->grad, w->stride[0], w->stride[1], TY(CGI_EL_BF16, ex));
    }
    return true;
}

void cgi_lp_shadow_fill(cg_tensor *t) { convert_all(t->data, t->lp_shadow, cgi_numel(t->ndim, t->shape)); }

#endif
