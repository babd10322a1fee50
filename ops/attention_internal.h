/* SPDX-License-Identifier: MIT */
/* Helpers of the fused attention (ops/attention.c) kept in files of their own: the one-query-row
 * kernels (ops/attention_decode.c), which it calls for a block of a single query row (cached
 * generation), the relative position biases (ops/attention_bias.c) and the checks of the
 * constructor's inputs and options (ops/attention_opts.c). Not installed. */
#ifndef CGRAD_ATTENTION_INTERNAL_H
#define CGRAD_ATTENTION_INTERNAL_H

#include "graph/internal.h"
#include "ops/ops.h"

/* s[c] = scale (q . k_c) for nk keys k_c = k + c ks of d features. */
void cgi_attn_row_scores(const cg_real *restrict q, const cg_real *restrict k, int64_t ks, int64_t nk, int64_t d,
                         cg_real scale, cg_real *restrict s);
/* o[e] = beta o[e] + sum_c p[c] v_c[e] over nk values v_c = v + c vs of d features (beta 0 or 1). */
void cgi_attn_row_pv(const cg_real *restrict p, int64_t nk, const cg_real *restrict v, int64_t vs, int64_t d,
                     cg_real beta, cg_real *restrict o);

/* T5's bucket (of nb) for a key rel = key - query positions away, distances logarithmic up to max_distance. */
int32_t cgi_t5_bucket(int64_t rel, bool bidirectional, int64_t nb, int64_t max_distance);
/* ALiBi's slope for query head h of n (BLOOM's when n is not a power of two). */
double cgi_alibi_slope(int64_t h, int64_t n);

/* True when q, k, v and opts make a valid cg_sdpa_ex (else sets cg_last_error, "[sdpa] ..."); a
 * bias's strides read as [B, Hq, Tq, Tk] go to bias_st (untouched without a bias). */
bool cgi_sdpa_opts_ok(cg_graph *g, cg_tensor *q, cg_tensor *k, cg_tensor *v, const cg_sdpa_opts *opts,
                      int64_t bias_st[4]);
/* The strides of bias read as [B, Hq, Tq, Tk] = want, 0 where broadcast; false if it does not broadcast. */
bool cgi_sdpa_bias_strides(const cg_tensor *bias, const int64_t *want, int64_t *st);

/* True when attention's small products run on cgi_attn_mm (AVX-512, float; the environment's
 * CGRAD_ATTN_UKR set keeps BLIS's micro-kernel instead), decided once. */
bool cgi_attn_direct(void);
/* Tests: the direct path on (where the CPU has it) or off, for every later node. */
void cgi_attn_direct_force(bool on);
/* C[m, n] (row stride cs) = alpha A B + beta C (beta 0: C not read, or 1), A(i, p) = a[i ars + p acs],
 * B's rows bs apart and contiguous. Causal shapes as cgi_ukr_gemm, by strips of rows: unless
 * CGI_UKR_FULL, columns past row + n_diag stay unwritten, rows [i, i + strip) use depth below
 * i + strip + k_diag and from i + k_first on. Only when cgi_attn_direct(). */
void cgi_attn_mm(int64_t m, int64_t n, int64_t k, cg_real alpha, const cg_real *a, int64_t ars, int64_t acs,
                 const cg_real *b, int64_t bs, cg_real beta, cg_real *c, int64_t cs, int64_t n_diag, int64_t k_diag,
                 int64_t k_first);
/* Columns of a panel of cgi_attn_mm_panels's B. */
#define CGI_ATTN_PANEL 64
/* cgi_attn_mm with B in panels of CGI_ATTN_PANEL columns, each k rows of CGI_ATTN_PANEL contiguous:
 * B(p, j) = b[(j / 64) 64 k + p 64 + j % 64], as cgi_attn_transpose_panels writes K^T or V^T. A
 * strip's columns then come from one 16 kB run instead of k rows Tk apart (the whole of K^T, 64 kB at
 * 256 keys, streamed from L2 for every strip of rows): T 256 causal, dP 26 -> 20 us. Same sums as
 * cgi_attn_mm, element by element. Only when cgi_attn_direct(). */
void cgi_attn_mm_panels(int64_t m, int64_t n, int64_t k, cg_real alpha, const cg_real *a, int64_t ars, int64_t acs,
                        const cg_real *b, cg_real beta, cg_real *c, int64_t cs, int64_t n_diag, int64_t k_diag,
                        int64_t k_first);
/* Reals cgi_attn_transpose_panels writes for rows x cols of src: cols x rows rounded up to panels. */
int64_t cgi_attn_panels_reals(int64_t rows, int64_t cols);
/* src's rows x cols (rows ss apart) transposed into panels of CGI_ATTN_PANEL rows of src (B of
 * cgi_attn_mm_panels with k = cols). */
void cgi_attn_transpose_panels(int64_t rows, int64_t cols, const cg_real *src, int64_t ss, cg_real *dst);
/* The softmax of nq rows of scores s (rows ss apart) over keys [0, kend), kend <= 256, in place: row r
 * sees the keys below vis0 + r when causal (all otherwise) whose keep[c keep_s] is not 0 (keep may be
 * NULL); hidden keys get 0, lse[r] the row's log-sum-exp, a row with no key all zeros and lse
 * infinity. False when no row sees a key. Only when cgi_attn_direct(). */
bool cgi_attn_softmax(cg_real *s, int64_t ss, int64_t nq, int64_t kend, bool causal, int64_t vis0, const int32_t *keep,
                      int64_t keep_s, cg_real *lse);
/* x's rows x d (rows *rs apart), or their dense copy in dst (then *rs = d) when they lie apart. */
const cg_real *cgi_attn_dense_rows(const cg_real *x, int64_t *rs, int64_t rows, int64_t d, cg_real *dst);
/* dst[c ds + r] = src[r ss + c] for r < rows, c < cols. */
void cgi_attn_transpose(int64_t rows, int64_t cols, const cg_real *src, int64_t ss, cg_real *dst, int64_t ds);

#endif
