/* SPDX-License-Identifier: MIT */
/* The fused attention's scratch (ops/attention.c): what aux keeps from forward to backward, and
 * the layout of each thread's slot (blocks, row statistics, relative bias, widened inputs, packed
 * operands) in forward's and backward's scratch, sized when the node is made and again when the
 * plan decides its probabilities' format. */
#include "graph/internal.h"
#include "ops/attention_internal.h"

/* aux: lse[B*H*Tq], then P[B*H*Tq*Tk] when kept; per slot (size_scratch): s[R*C], dp[R*C],
 * acc[R*D], rows[3*R], rel[nrel] (with a relative bias), a head's q, k and v rows widened from bf16
 * (when stored so), and when kept the packed operands below. R is a query block's rows, BQ, or
 * fewer with fewer queries (slot_rows), C a block's columns (slot_cols). */
static size_t align16(size_t n) { return (n + 15) / 16 * 16; }
/* Rows of a query block a slot has room for: BQ, or Tq rounded up to 32 (token-by-token decoding,
 * small graphs), which bounds every block's rows. */
int64_t cgi_sdpa_slot_rows(const cg_tensor *t) {
    const int64_t tq = t->shape[2];
    return tq >= BQ ? BQ : (tq + 31) / 32 * 32;
}
static size_t inputs_reals(const cg_tensor *t) {
    const int64_t tq = t->shape[2], tk = t->src[1]->shape[2], dq = t->src[0]->shape[3], dv = t->shape[3];
    return prm(t)->lp_inputs ? align16((size_t)(tq * dq + tk * dq + tk * dv)) : 0;
}
/* Columns of a slot's blocks (their row stride): BK, or Tk rounded up to 16 when every key fits
 * in one block narrower than BK (each block then has at most Tk keys). */
int64_t cgi_sdpa_slot_cols(const cg_tensor *t) {
    const int64_t tk = t->src[1]->shape[2];
    return tk >= BK ? BK : (tk + 15) / 16 * 16;
}
static size_t slot_reals(const cg_tensor *t) {
    const sdpa_params *p = prm(t);
    const int64_t rq = cgi_sdpa_slot_rows(t);
    return (size_t)(2 * rq * cgi_sdpa_slot_cols(t) + rq * t->shape[3] + 3 * rq) + (has_rel(p) ? align16((size_t)p->nrel) : 0) +
           inputs_reals(t);
}
cg_real *cgi_sdpa_rel_at(const cg_tensor *t, cg_real *slot) {
    const int64_t rq = cgi_sdpa_slot_rows(t);
    return slot + 2 * rq * cgi_sdpa_slot_cols(t) + rq * t->shape[3] + 3 * rq;
}
cg_real *cgi_sdpa_inputs_at(const cg_tensor *t, cg_real *slot) {
    return cgi_sdpa_rel_at(t, slot) + (has_rel(prm(t)) ? align16((size_t)prm(t)->nrel) : 0);
}

/* When every key fits in one block the softmax needs no running rescale, and the probabilities
 * (Tq x Tk per head, at most 256 keys wide, so still linear in Tq) are kept for backward, which
 * then skips recomputing the scores: one product and one exponential pass fewer per block.
 * Measured on gpt-tiny's attention (T = 256, causal): backward 16.2 -> 12.3 ms per layer
 * on two threads, and 6.3 -> 4.7 ms for bert-small's (T = 128, full). */
bool cgi_sdpa_keeps_probs(int64_t tk) { return tk <= BK; }

/* With the probabilities kept, the products run on BLIS's micro-kernel over operands packed here:
 * a head's keys and values once for all its query blocks (BLIS packs them again in every call),
 * and causal tiles above the diagonal skipped at the micro-tile rather than the block. Below a
 * few query rows (token-by-token generation) BLIS's own gemv stays the faster. */
bool cgi_sdpa_packs_heads(const cg_tensor *t) { return prm(t)->keeps_probs && t->shape[2] >= 16; }

/* The keys present when a run starts: Tk, or past + Tq with a run-time past (read from its int32). */
int64_t cgi_sdpa_keys_present(const cg_tensor *t) {
    const sdpa_params *p = prm(t);
    return p->past ? *(const int32_t *)t->src[p->past]->data + t->shape[2] : t->src[1]->shape[2];
}

/* Room for K^T or V^T, packed for the micro-kernel or in the direct path's panels. */
static size_t keys_t_reals(const cgi_ukr *u, int64_t tk, int64_t d) {
    const size_t packed = cgi_ukr_packed_b(u, d, tk), panels = (size_t)cgi_attn_panels_reals(tk, d);
    return align16(packed > panels ? packed : panels);
}

static size_t packs_reals(const cgi_ukr *u, int64_t rq, int64_t tk, int64_t d) {
    const int64_t rows = rq > tk ? rq : tk, depth = d > rows ? d : rows;
    return keys_t_reals(u, tk, d) + align16(cgi_ukr_packed_b(u, tk, d)) +
           align16(cgi_ukr_packed_a(u, rows, depth)) + align16(cgi_ukr_packed_b(u, rq, d)) + 16;
}

/* Backward's remake of P needs forward's K^T (packed or, direct, plain) beside its own V^T and K. */
static size_t kt_reals(const cg_tensor *t, const cgi_ukr *u) {
    return prm(t)->remakes_probs ? keys_t_reals(u, t->src[1]->shape[2], t->shape[3]) : 0;
}

/* A thread's slot in forward's scratch, or in backward's (bwd: with room for K^T to remake P). */
size_t cgi_sdpa_slot_stride(const cg_tensor *t, const cgi_ukr *u, bool bwd) {
    return align16(slot_reals(t) +
                   (cgi_sdpa_packs_heads(t) ? packs_reals(u, cgi_sdpa_slot_rows(t), t->src[1]->shape[2], t->shape[3]) + (bwd ? kt_reals(t, u) : 0) : 0));
}

/* The packed operands of a slot, 64-byte aligned as the micro-kernel's loads want. */
packs cgi_sdpa_packs_at(const cg_tensor *t, cg_real *slot, const cgi_ukr *u, bool bwd) {
    const int64_t tk = t->src[1]->shape[2], d = t->shape[3];
    cg_real *p = slot + slot_reals(t);
    p += (16 - ((uintptr_t)p / sizeof(cg_real)) % 16) % 16;
    packs w;
    w.kv1 = p, p += keys_t_reals(u, tk, d);
    w.kv2 = p, p += align16(cgi_ukr_packed_b(u, tk, d));
    const int64_t rq = cgi_sdpa_slot_rows(t), rows = rq > tk ? rq : tk;
    w.a = p, p += align16(cgi_ukr_packed_a(u, rows, d > rows ? d : rows));
    w.b = p, p += align16(cgi_ukr_packed_b(u, rq, d));
    w.kt = bwd && prm(t)->remakes_probs ? p : NULL;
    return w;
}

size_t cgi_sdpa_probs_offset(const cg_tensor *t) { return (size_t)(t->shape[0] * t->shape[1] * t->shape[2]); }
/* Reals the kept probabilities take: half as many in bf16. */
static size_t probs_reals(const cg_tensor *t) {
    const size_t n = prm(t)->keeps_probs && !prm(t)->remakes_probs ? cgi_sdpa_probs_offset(t) * (size_t)t->src[1]->shape[2] : 0;
    return prm(t)->lp_probs ? (n + 1) / 2 : n;
}
/* T5's table gradient per (batch, head) and offset, summed into the table in a fixed order: the
 * first reals of backward's scratch. */
size_t cgi_sdpa_drel_reals(const cg_tensor *t) {
    const sdpa_params *p = prm(t);
    return p->table && t->src[p->table]->requires_grad ? align16((size_t)(t->shape[0] * t->shape[1] * p->nrel)) : 0;
}
/* The scratch: aux, kept from forward to backward, holds the lse rows and the kept probabilities;
 * each thread's slot (blocks, packed operands) is forward's scratch (fwd_aux) while forward runs
 * and backward's (bwd_aux, after the table's gradient) while backward runs, so no slot is live
 * between them, at a training step's fullest moment. */
void cgi_sdpa_size_scratch(cg_tensor *t) {
    cgi_ukr u;
    cgi_ukr_init(&u);
    const size_t slots = (size_t)prm(t)->slots;
    t->aux_bytes = (cgi_sdpa_probs_offset(t) + probs_reals(t)) * sizeof(cg_real);
    t->fwd_aux_bytes = (slots * cgi_sdpa_slot_stride(t, &u, false) + 16) * sizeof(cg_real);
    t->bwd_aux_bytes = (cgi_sdpa_drel_reals(t) + slots * cgi_sdpa_slot_stride(t, &u, true) + 16) * sizeof(cg_real);
}

/* In a bf16 graph the kept probabilities (Tq x Tk per head: gpt-small's twelve layers hold 160 MB
 * of them in float at its peak) are stored in bf16, as torch's autocast does (its P V takes bf16
 * P). Forward still runs the softmax and P V in float from a float block, which is then rounded
 * into the store; backward widens a query block's rows into the slot's scratch for dV and dS.
 * Called by the plan before it sizes the buffers, since the precision may be set after this node
 * was made. */
void cgi_sdpa_plan(cg_tensor *t) {
    sdpa_params *p = t->params;
    p->lp_probs = p->keeps_probs && t->graph->precision == CG_BF16;
    p->lp_inputs = false;
    for (int i = 0; i < 3; i++) p->lp_inputs |= t->src[i]->root->lp_value;
    p->remakes_probs = false;
    cgi_sdpa_size_scratch(t);
}

/* Backward then runs each query block's scores and softmax again, as forward did (block_probs), on
 * the head's K^T packed once more: one product of Q K^T's size and one exponential pass per block,
 * against Tq x Tk kept floats per head from forward to backward. */
size_t cgi_sdpa_remake_probs(cg_tensor *t, bool apply) {
    sdpa_params *p = t->params;
    /* below 16 query rows the blocks run on BLIS, whose recompute from the lse is not forward's bits */
    if (!cgi_sdpa_packs_heads(t) || p->remakes_probs) return 0;
    const size_t before = t->aux_bytes + t->bwd_aux_bytes;
    p->remakes_probs = true;
    cgi_sdpa_size_scratch(t);
    const size_t after = t->aux_bytes + t->bwd_aux_bytes;
    p->remakes_probs = apply && after < before; /* few probabilities: K^T's room may outweigh them */
    cgi_sdpa_size_scratch(t);
    return after < before ? before - after : 0;
}
