/* SPDX-License-Identifier: MIT */
/* What the product engine (ops/gemm.c) and its packs (ops/gemm_pack.c) share. */
#ifndef CGRAD_GEMM_INTERNAL_H
#define CGRAD_GEMM_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "graph/internal.h"

/* BLIS with cgrad's kernel set and packing kernels in place: called before any product. */
void cgi_gemm_blis_ready(void);
/* True where the register-transposing packs run (x86-64 with AVX2, CGRAD_BLIS_PACK unset); valid
 * after cgi_gemm_blis_ready. */
bool cgi_pack_fast_transpose(void);
/* One panel: dst[p * w + i] = src[i * si + p * sp] for i < rows, zero for rows <= i < w. */
void cgi_pack_panel(int64_t rows, int64_t w, int64_t k, const cg_real *src, int64_t si, int64_t sp, cg_real *dst);


/* ---- cutting a call's products into pieces (ops/gemm_cut.c) ---- */

enum { CGI_GEMM_MAX_PIECES = 256 };
/* A piece of a call's products: the rows (cgi_gemm_cut_rows) or columns [lo, hi) of job's C. */
typedef struct {
    int job;
    int64_t lo, hi;
} cgi_gemm_piece;
/* True when job j's pieces cut C's rows, false when they cut its columns. */
static inline bool cgi_gemm_cut_rows(const cgi_gemm_job *j) { return j->m >= j->n; }
/* The pieces of jobs for `threads` threads (a sharing team's, share, guided where they can be,
 * else tapered; team: inside a team, finer pieces pay), written to pcs; returns how many. */
int cgi_gemm_cut(const cgi_gemm_job *jobs, int njobs, int threads, bool share, bool team, cgi_gemm_piece *pcs);

#endif
