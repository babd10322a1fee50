/* SPDX-License-Identifier: MIT */
/* How the product engine (ops/gemm.c) cuts a call's products into pieces for its threads or a
 * thread team: how many a product can take, the tapered and the guided cuts. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "graph/internal.h"
#include "ops/gemm_internal.h"

/* Threads over products. BLIS always runs on one thread; a product is cut into pieces along the
 * longer side of C, which the threads take in turn. BLIS's own threads wait for each other in
 * spinning barriers several times per product: with another busy process on the machine (or on
 * SMT siblings) a waiting thread burns the time its partner needs, and 2-thread steps took 3-10x
 * as long as 1-thread ones. Pieces share no barrier, only the join at the region's end, and a
 * thread held up elsewhere simply takes fewer of them. The cost is packing the uncut operand
 * once per piece, under 3% of a piece's work at the sizes allowed below (a sharing team's pieces
 * share that pack instead: share_packs). */

/* How many pieces job j can be cut into: at most want, each with at least 2^23 multiply-adds (a
 * matrix-vector product: 2^16) and 32 rows or columns (vector: 256 elements). A [64, 256] x
 * [256, 768] product (12.6M) took as long on two threads as on one here, a [128, 256] one 1.28x
 * less: below some 8M a piece, packing and waking the other thread eat the gain. A team's helpers
 * (graph/team.c) are awake already: there a vector piece of 64 outputs (2^15 multiply-adds, 128 kB
 * of gpt-tiny's weights, ~5 us) pays, and a matrix piece of 2^20 (~10 us): a small model's whole
 * training step runs in a team (cgi_run_in_team), and nanoGPT's [768, 128] x [128, 128] projections
 * (12.6M) stayed whole at 2^23. Uncached gpt-tiny generation (steps of 16-216 rows, 89% in products)
 * ran 171-173 tokens/s on two threads with matrix products whole, as on one, and 229-236 with them cut. */
static int pieces_of(const cgi_gemm_job *j, int want, bool team) {
    const int64_t len = cgi_gemm_cut_rows(j) ? j->m : j->n;
    const bool vec = j->m == 1 || j->n == 1;
    const double work = (double)j->m * (double)j->n * (double)j->k;
    const double min_work = vec ? (team ? 1 << 15 : 1 << 16) : team ? 1 << 20 : 1 << 23;
    const int64_t min_len = vec ? (team ? 64 : 256) : 32;
    int p = want;
    while (p > 1 && (work / p < min_work || len / p < min_len)) p--;
    return p;
}

/* A job's pieces inside a team, at most: tapered, half for thread 0 and two quarters, the second
 * to whichever thread is free first. Each piece is one stream through a slab of the weight, and
 * short streams lose to the hardware prefetcher's ramp and the claims' cache-line traffic: cached
 * gpt-tiny generation on two threads read 2122-2169 tokens/s with up to 16 pieces against
 * 2487-2510 with 3 (2459-2503 with 2: nothing left for the faster thread to balance with).
 * Matrix products (uncached generation) read the same at 3, 4, 6 and 8 pieces: 3 serves both. */
enum { TEAM_PIECES = 3 };

/* Inside a team a matrix-vector product's pieces taper: the first half weigh 2, the rest 1. Pieces
 * are claimed in order, so the last ones are the small ones, and the thread that finishes first
 * waits for at most a small piece of the other's (the tail wait, ~100 us of a two-thread token with
 * even pieces). The same holds outside a team. A team's matrix products are cut finer to the end
 * (guided_pieces below). Either way the cuts fall on multiples of 32 rows: the same bits.
 * CGRAD_TEAM_SPLIT=taper cuts a team's matrix products as its vectors, =even cuts every product
 * into even pieces, for comparisons. */
enum { SPLIT_EVEN, SPLIT_TAPER, SPLIT_GUIDED };
static _Atomic int split = -1; /* any thread that cuts a product reads it */
static int team_split(void) {
    int t = atomic_load_explicit(&split, memory_order_relaxed);
    if (t < 0) {
        const char *e = getenv("CGRAD_TEAM_SPLIT");
        t = e && !strcmp(e, "even") ? SPLIT_EVEN : e && !strcmp(e, "taper") ? SPLIT_TAPER : SPLIT_GUIDED;
        atomic_store_explicit(&split, t, memory_order_relaxed);
    }
    return t;
}

void cgi_gemm_set_split(const char *mode) {
    atomic_store(&split, !mode ? -1 : !strcmp(mode, "even") ? SPLIT_EVEN : !strcmp(mode, "taper") ? SPLIT_TAPER : SPLIT_GUIDED);
}

/* The weight of pieces [0, q) of p tapered pieces (of p + p / 2 in all). */
static int64_t cut_weight(int q, int p) { return q + (q < p / 2 ? q : p / 2); }

/* Guided pieces for a team's matrix products: each piece takes half the work left over all the
 * jobs (thread 0 claims the first, half of everything), down to a floor, so the pieces shrink to
 * the end and the thread that runs out first waits at most for one floor-sized piece. A piece
 * repacked the operand it does not cut (~12-16 multiply-adds per element on one thread here), so a
 * piece of L rows cost ~14/L more than its share (the float products of the blocked driver now
 * share that pack, share_packs; the first two pieces may each still pack a block): the floor is 256 rows (or columns; 1/8 of a
 * shorter job) and 2^20 multiply-adds, but at most the tapered cut's smallest piece (a quarter of 3
 * pieces: an uncached generation step's products of 16 rows stay at 3 pieces), at least 32. The jobs with the shortest cut side go first,
 * whole or in large pieces: a linear's dW (k the batch's rows) repacks 1M elements per piece in a
 * gpt-tiny step, its dX only the weight. Cuts fall on multiples of 32 from each job's start, as the
 * tapered ones: the same bits. Returns the pieces written to pcs (at most max), or -1: not all
 * matrix products, or too many pieces. */
enum { GUIDED_FLOOR = 256 };
static int guided_pieces(const cgi_gemm_job *jobs, int njobs, int threads, cgi_gemm_piece *pcs, int max) {
    int order[CGI_GEMM_MAX_PIECES], n = 0;
    double left = 0;
    for (int i = 0; i < njobs; i++) {
        const cgi_gemm_job *j = &jobs[i];
        if (j->m == 0 || j->n == 0) continue;
        if (j->m == 1 || j->n == 1 || n == CGI_GEMM_MAX_PIECES) return -1;
        const int64_t len = cgi_gemm_cut_rows(j) ? j->m : j->n;
        int at = n++; /* insertion by cut length, stable */
        while (at > 0) {
            const cgi_gemm_job *o = &jobs[order[at - 1]];
            if ((cgi_gemm_cut_rows(o) ? o->m : o->n) <= len) break;
            order[at] = order[at - 1], at--;
        }
        order[at] = i;
        left += (double)j->m * (double)j->n * (double)j->k;
    }
    int np = 0;
    for (int o = 0; o < n; o++) {
        const int i = order[o];
        const cgi_gemm_job *j = &jobs[i];
        const int64_t len = cgi_gemm_cut_rows(j) ? j->m : j->n;
        const double per = (double)(cgi_gemm_cut_rows(j) ? j->n : j->m) * (double)j->k; /* multiply-adds per row or column */
        int64_t least = len / 8 < GUIDED_FLOOR ? len / 8 : GUIDED_FLOOR;
        const double min_rows = per > 0 ? (double)(1 << 20) / per : 0;
        if ((double)least < min_rows) least = (int64_t)min_rows + 1;
        /* never coarser than the tapered cut, whose smallest piece is a quarter (3 pieces) or a half */
        const int tapered = pieces_of(j, TEAM_PIECES, true);
        const int64_t smallest = tapered < 2 ? len : (tapered < 3 ? len / 2 : len / 4) / 32 * 32;
        if (least > smallest) least = smallest;
        least = least < 32 ? 32 : (least + 31) / 32 * 32;
        for (int64_t lo = 0; lo < len;) {
            int64_t take = per > 0 ? (int64_t)(left / threads / per) : len;
            take = (take + 31) / 32 * 32;
            if (take < least) take = least;
            if (len - lo - take < least) take = len - lo; /* no remnant below the floor */
            if (np == max) return -1;
            pcs[np++] = (cgi_gemm_piece){i, lo, lo + take};
            left -= per * (double)take;
            lo += take;
        }
    }
    return np;
}

/* Pieces for `threads` threads (0: a sharing team's, TEAM_PIECES a job), two a thread over all jobs
 * by work, each job's tapered 2:1 (the first half of its pieces twice the size of the rest). */
static int tapered_pieces(const cgi_gemm_job *jobs, int njobs, int threads, bool team, cgi_gemm_piece *pcs) {
    double total = 0;
    for (int i = 0; i < njobs; i++) total += (double)jobs[i].m * (double)jobs[i].n * (double)jobs[i].k;
    int np = 0;
    for (int i = 0; i < njobs; i++) {
        const cgi_gemm_job *j = &jobs[i];
        if (j->m == 0 || j->n == 0) continue;
        /* two pieces per thread over all jobs, shared by work */
        const double part = total > 0 ? (double)j->m * (double)j->n * (double)j->k / total : 1;
        int want = threads == 0 ? TEAM_PIECES : threads > 1 ? (int)(2 * threads * part + 0.5) : 1;
        if (want < 1) want = 1;
        if (want > CGI_GEMM_MAX_PIECES - np - (njobs - 1 - i)) want = CGI_GEMM_MAX_PIECES - np - (njobs - 1 - i);
        const int p = pieces_of(j, want, team);
        const int64_t len = cgi_gemm_cut_rows(j) ? j->m : j->n;
        /* on threads outside a team too: with 4 even pieces on 2 threads the thread that finishes
         * first waits up to a quarter of the product at the region's join (more when the other was
         * woken late); tapered 2:2:1:1, at most a sixth */
        const bool taper = threads != 1 && p > 2 && team_split() != SPLIT_EVEN;
        for (int q = 0; q < p; q++) {
            /* cut on multiples of 32 so each piece keeps whole micro-tiles */
            const int64_t c0 = taper ? cut_weight(q, p) : q, c1 = taper ? cut_weight(q + 1, p) : q + 1,
                          ct = taper ? cut_weight(p, p) : p;
            int64_t lo = q == 0 ? 0 : len * c0 / ct / 32 * 32, hi = q == p - 1 ? len : len * c1 / ct / 32 * 32;
            if (p > 1 && len < 32 * p) lo = len * q / p, hi = len * (q + 1) / p;
            if (hi > lo) pcs[np++] = (cgi_gemm_piece){i, lo, hi};
        }
    }
    return np;
}

/* The pieces of jobs for `threads` threads: a sharing team's (share) guided where they can be,
 * else tapered (a sharing team's TEAM_PIECES a job whatever threads says). */
int cgi_gemm_cut(const cgi_gemm_job *jobs, int njobs, int threads, bool share, bool team, cgi_gemm_piece *pcs) {
    const int np = share && team_split() == SPLIT_GUIDED ? guided_pieces(jobs, njobs, threads, pcs, CGI_GEMM_MAX_PIECES) : -1;
    return np >= 0 ? np : tapered_pieces(jobs, njobs, share ? 0 : threads, team, pcs);
}

int cgi_gemm_team_cuts(const cgi_gemm_job *jobs, int njobs, int threads, int64_t (*cuts)[3], int max) {
    cgi_gemm_piece pcs[CGI_GEMM_MAX_PIECES];
    const int np = cgi_gemm_cut(jobs, njobs, threads, true, true, pcs);
    if (np > max) return -1;
    for (int q = 0; q < np; q++) cuts[q][0] = pcs[q].job, cuts[q][1] = pcs[q].lo, cuts[q][2] = pcs[q].hi;
    return np;
}
