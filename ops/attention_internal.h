/* SPDX-License-Identifier: MIT */
/* Helpers of the fused attention (ops/attention.c) kept in files of their own: the one-query-row
 * kernels (ops/attention_decode.c), which it calls for a block of a single query row (cached
 * generation), the relative position biases (ops/attention_bias.c) and the checks of the
 * constructor's inputs and options (ops/attention_opts.c); its node settings and the layout of its
 * scratch (ops/attention_scratch.c), which forward and backward share; and one head's view of the
 * inputs, its masks and its dropout (ops/attention_head.c). Not installed. */
#ifndef CGRAD_ATTENTION_INTERNAL_H
#define CGRAD_ATTENTION_INTERNAL_H

#include "graph/internal.h"
#include "ops/ops.h"

/* Measured on Zen 3 (T = 256 causal, T = 128 full): blocks this large run the BLIS products at
 * 1.4x the speed of 64 x 64 ones. A causal block on the diagonal computes scores that the mask
 * then throws away, so causal attention takes the smaller query block. */
#define BQ 128 /* scratch capacity; the query block is BQ, or BQ / 2 when causal */
#define BK 256

/* The node's settings (t->params). The bias options (ALiBi, T5's table) depend on the query and
 * key positions only through j - i, so per head they become one vector over the Tq + Tk - 1
 * relative offsets (rel), added to each row of scores as a contiguous run. */
typedef struct {
    double scale, dropout;
    int64_t window;
    bool causal, alibi, keeps_probs;
    bool remakes_probs;        /* one key block, but backward remakes P from the scores (decided by the plan) */
    bool lp_probs;             /* kept probabilities stored in bf16, or remade rounded so (a bf16 graph; the plan) */
    bool lp_inputs;            /* some of q, k, v stored in bf16: the slots hold a head's widened rows */
    int slots;                 /* scratch slots (the thread count at construction) */
    int kp, bias, table;       /* source index of the key padding, the bias tensor, T5's table (0: none) */
    int past;                  /* source index of the run-time past (opts->past; 0: none) */
    int64_t bias_st[4];        /* the bias read as [B, Hq, Tq, Tk] (0 where broadcast) */
    uint64_t step;             /* the graph's dropout step at the last forward */
    int64_t nrel;              /* Tq + Tk - 1: relative offsets j - i + Tq - 1 */
    int32_t bucket[];          /* with a T5 table: its bucket for each relative offset */
} sdpa_params;

static inline const sdpa_params *prm(const cg_tensor *t) { return t->params; }
static inline bool has_rel(const sdpa_params *p) { return p->alibi || p->table; }

/* A thread's packed operands in its slot (cgi_sdpa_packs_at). */
typedef struct {
    cg_real *kv1; /* K^T in forward, V^T in backward: B panels of depth D over the keys */
    cg_real *kv2; /* V in forward, K in backward: B panels of depth Tk over the features */
    cg_real *a;   /* the A operand of one product */
    cg_real *b;   /* a query block's dO or Q as B */
    bool direct;  /* cgi_attn_mm instead: kv1 holds K^T (forward) or V^T (backward) [D, Tk] in panels
                     (cgi_attn_transpose_panels), nothing else packed */
    const cg_real *rows; /* direct: V (forward) or K (backward) with dense rows (cgi_attn_dense_rows, maybe in kv2) */
    cg_real *kt;  /* backward remaking P (remakes_probs): K^T as forward's kv1 holds it */
} packs;

/* ---- the scratch layout (ops/attention_scratch.c): aux, and each thread's slot ---- */

/* Rows of a query block a slot has room for: BQ, or Tq rounded up to 32. */
int64_t cgi_sdpa_slot_rows(const cg_tensor *t);
/* Columns of a slot's blocks (their row stride): BK, or Tk rounded up to 16. */
int64_t cgi_sdpa_slot_cols(const cg_tensor *t);
/* A slot's relative-offset bias vector (after its blocks, accumulator and row statistics). */
cg_real *cgi_sdpa_rel_at(const cg_tensor *t, cg_real *slot);
/* A slot's room for a head's q, k and v rows widened from bf16 (after rel). */
cg_real *cgi_sdpa_inputs_at(const cg_tensor *t, cg_real *slot);
/* True when Tk keys fit in one block, so the probabilities are kept for backward. */
bool cgi_sdpa_keeps_probs(int64_t tk);
/* True when the products run on BLIS's micro-kernel over operands packed once per head. */
bool cgi_sdpa_packs_heads(const cg_tensor *t);
/* The keys present when a run starts: Tk, or past + Tq with a run-time past. */
int64_t cgi_sdpa_keys_present(const cg_tensor *t);
/* Reals of a thread's slot in forward's scratch, or in backward's (bwd: with room for K^T). */
size_t cgi_sdpa_slot_stride(const cg_tensor *t, const cgi_ukr *u, bool bwd);
/* The packed operands of a slot, 64-byte aligned. */
packs cgi_sdpa_packs_at(const cg_tensor *t, cg_real *slot, const cgi_ukr *u, bool bwd);
/* Where the kept probabilities start in aux: after the lse rows. */
size_t cgi_sdpa_probs_offset(const cg_tensor *t);
/* Reals of T5's table gradient at the start of backward's scratch (0 without one). */
size_t cgi_sdpa_drel_reals(const cg_tensor *t);
/* Sets t's aux, forward and backward scratch sizes from its settings. */
void cgi_sdpa_size_scratch(cg_tensor *t);

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
/* Backward's dS = P * (dO V^T - D) of a full (not causal) block in one pass: C[m, n] (row stride cs)
 * = P * (A B - d[row]), A's rows ars apart and contiguous, B in panels as cgi_attn_mm_panels's, P's
 * rows ps apart; each element as cgi_attn_mm_panels's dP then P * (dP - d) rounds it. Only when
 * cgi_attn_direct(). */
void cgi_attn_ds_panels(int64_t m, int64_t n, int64_t k, const cg_real *a, int64_t ars, const cg_real *b, cg_real *c,
                        int64_t cs, const cg_real *p, int64_t ps, const cg_real *d);
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

/* One (batch, head) of the op as forward and backward see it (cgi_attn_head_at): its rows of q,
 * k and v, its masks, biases and dropout. */
typedef struct {
    const cg_real *q, *k, *v;
    int64_t qs, ks, vs; /* row strides */
    const int32_t *keep; int64_t keep_s;
    const cg_real *bias; int64_t bias_si, bias_sj; /* this head's slice of the bias tensor */
    const cg_real *rel; /* ALiBi and T5 bias by relative offset j - i + Tq - 1, or NULL */
    int64_t tq, tk, d, shift;
    int64_t nk; /* keys present: Tk, or past + Tq at run time */
    int64_t os; /* the output's (and its gradient's) row stride */
    int64_t sc; /* the row stride of the slot's blocks (slot_cols) */
    int64_t window; /* a query sees keys less than this far from its own position (0: all) */
    bool causal;
    cg_real scale;
    /* dropout: element (i, j) is kept when its hash, counted at row (bh Tq + i) of [B Hq Tq, Tk], clears threshold */
    bool drop;
    uint64_t drop_key, drop_threshold, drop_row;
    cg_real drop_scale;
} head;

/* The micro-kernel's causal arguments for a query block at i0: its rows see keys up to row + diag. */
static inline int64_t diag(const head *h, int64_t i0) { return h->causal ? i0 + h->shift : CGI_UKR_FULL; }

/* Keys beyond this cannot be seen by any row of the query block. */
static inline int64_t key_end(const head *h, int64_t i0, int64_t nq) {
    if (!h->causal) return h->nk;
    int64_t e = i0 + nq + h->shift;
    return e < 0 ? 0 : e > h->nk ? h->nk : e;
}

/* Query row i sees keys [first, vis) of block [j0, j0+nk), counted from j0: the causal mask ends the
 * range at its own position, a sliding window w starts it w - 1 keys before (and ends it w - 1 keys
 * after, when not causal). */
static inline int64_t visible(const head *h, int64_t i, int64_t j0, int64_t nk) {
    const int64_t vis = h->causal ? i + h->shift + 1 - j0 : h->window ? i + h->shift + h->window - j0 : nk;
    return vis < 0 ? 0 : vis > nk ? nk : vis;
}
static inline int64_t first_visible(const head *h, int64_t i, int64_t j0, int64_t nk) {
    const int64_t f = h->window ? i + h->shift - h->window + 1 - j0 : 0;
    return f < 0 ? 0 : f > nk ? nk : f;
}

/* Key blocks that start before this hold no key any row of the query block sees. */
static inline int64_t key_start(const head *h, int64_t i0) {
    const int64_t f = h->window ? i0 + h->shift - h->window + 1 : 0;
    return f <= 0 ? 0 : f / BK * BK;
}

/* Head bh of attention node t, its inputs widened into scratch slot `slot` where stored in bf16,
 * and its relative bias there (ops/attention_head.c). */
void cgi_attn_head_at(const cg_tensor *t, int64_t bh, cg_real *slot, head *h);
/* Adds the biases to the scores s[nq][ss] of query rows [i0, i0+nq) against keys [j0, j0+nk) and
 * masks hidden ones to -inf; false when the whole block is hidden. */
bool cgi_attn_mask(const head *h, int64_t i0, int64_t nq, int64_t j0, int64_t nk, cg_real *s, int64_t ss);
/* Dropout on the probabilities p of query row i against keys [j0, j0 + n), into pt (may be p). */
void cgi_attn_drop_probs(const head *h, int64_t i, int64_t j0, int64_t n, const cg_real *p, cg_real *pt);
/* Backward through the dropout of row i, keys [j0, j0 + n): pt = M P, and dp (dO V^T on entry) =
 * P (M dP - di) when given. */
void cgi_attn_drop_grads(const head *h, int64_t i, int64_t j0, int64_t n, const cg_real *p, cg_real *pt, cg_real *dp,
                         cg_real di);

#endif
