/* SPDX-License-Identifier: MIT */
/* cgrad dist module: data-parallel training over MPI (Open MPI through CMake's FindMPI).
 *
 * Every rank holds the whole model. A step runs each rank's micro-batches, then a reducer sums
 * the gradients over micro-batches and ranks and divides by their count, so every rank applies
 * the same update. The sum over ranks is an all-reduce (reduce-scatter + all-gather around the
 * ring of ranks, over MPI point-to-point messages) on contiguous buckets of the gradient block,
 * started from cg_graph_backward's ready callback as soon as a bucket's gradients are final and
 * moved on at every later ready parameter, so communication overlaps the rest of backward.
 *
 * Order of additions (what makes runs bit-identical): within a rank, micro-batch gradients are
 * added in order, acc = ((g0 + g1) + g2) ...; across ranks MPI sums the per-rank totals. For two
 * ranks that is one addition a + b, which is commutative, so 2 ranks x 1 micro-batch equal 1 rank
 * x 2 micro-batches bit for bit. For more ranks each chunk is summed around the ring, then copied:
 * the same on every rank, so ranks never drift apart, but not the sequential order; results then
 * agree with one process to float32 rounding (~1e-7 relative).
 *
 * Without MPI in the build, or in a process not started by mpirun, the world has one rank and
 * every call works locally. Waits are bounded: a rank that dies or hangs makes the others fail
 * with a message after the timeout instead of waiting forever. */
#ifndef CGRAD_DIST_H
#define CGRAD_DIST_H

#include "../graph/graph.h"

CG_BEGIN_DECLS

/* The ranks of an MPI job (or a world of one): opaque, from cg_dist_init. */
typedef struct cg_dist cg_dist;
/* Sums gradients over micro-batches and ranks: opaque, from cg_dist_reducer_new. */
typedef struct cg_dist_reducer cg_dist_reducer;

/* True when the library was built with MPI. */
bool cg_dist_built(void);
/* True when this process was started by an MPI launcher (mpirun sets its environment). */
bool cg_dist_launched(void);
/* Joins the MPI job when launched by mpirun, else makes a world of one; every wait gives up after
 * timeout_s seconds (<= 0: 600). NULL with a message on failure. Free with cg_dist_free. */
cg_dist *cg_dist_init(double timeout_s);
/* Leaves the job (MPI_Finalize if cg_dist_init started MPI). NULL is a no-op. */
void cg_dist_free(cg_dist *d);
/* This process's rank, 0 .. size-1 (0 for NULL). */
int cg_dist_rank(const cg_dist *d);
/* Number of ranks (1 for NULL). */
int cg_dist_size(const cg_dist *d);
/* Ends every rank of the job with exit code code (MPI_Abort); returns in a world of one. For a
 * rank that cannot go on: the others would otherwise wait for it until their timeout. */
void cg_dist_abort(cg_dist *d, int code);
/* Compares value with rank 0's: CG_OK on every rank if all agree, else CG_ERR_STATE on every rank
 * with "[dist] <what> differs: rank R has 'x', rank 0 has 'y'" (the lowest differing rank). */
cg_status cg_dist_check(cg_dist *d, const char *what, const char *value);
/* Copies bytes of buf from rank 0 to every rank. */
cg_status cg_dist_bcast(cg_dist *d, void *buf, size_t bytes);
/* Sums x[0..n) over the ranks in place (doubles; for losses, counts and flags). */
cg_status cg_dist_sum(cg_dist *d, double *x, int n);
/* Waits until every rank has arrived. */
cg_status cg_dist_barrier(cg_dist *d);
/* Sums x[0..n) over the ranks in place with the gradient all-reduce (reduce-scatter + all-gather
 * around the ring of ranks); every rank gets the same bits, and with 2 ranks those of a + b. */
cg_status cg_dist_sum_reals(cg_dist *d, cg_real *x, int64_t n);

/* ---- ZeRO stage 1: optimizer state sharded by element ranges ---- */

/* Rank's share [*lo, *hi) of a block of span elements: equal parts cut at multiples of 16. */
void cg_dist_shard(const cg_dist *d, int rank, int64_t span, int64_t *lo, int64_t *hi);
/* Copies every rank's shard of block (span elements, shards as cg_dist_shard) to every rank, in place. */
cg_status cg_dist_allgather(cg_dist *d, cg_real *block, int64_t span);
/* Gathers every rank's shard (mine: its hi - lo elements) into full (span elements) on rank 0;
 * other ranks pass full NULL. */
cg_status cg_dist_gather(cg_dist *d, const cg_real *mine, cg_real *full, int64_t span);

/* ---- gradient averaging ---- */

/* What the reducer did so far (cg_dist_reducer_stats). */
typedef struct {
    int64_t steps;      /* finished reductions */
    int64_t buckets;    /* buckets per step */
    int64_t bytes;      /* gradient bytes all-reduced per step */
    int64_t early;      /* buckets started inside backward, over all steps */
    int64_t held;       /* buckets final before an earlier one (held back to keep the order), since reordering */
    int64_t held_first; /* the same in the first step, whose buckets start in memory order */
    double comm_s;      /* from the first bucket's start to the last one's observed end, summed over steps */
    double wait_s;      /* of that, the time after backward (finish waiting): not hidden by backward */
} cg_dist_stats;

/* Reducer for ps over d's ranks with micro micro-batches per rank and step, buckets of about
 * bucket_bytes (<= 0: 1 MB); overlap false defers every bucket to finish. Allocates the
 * accumulator (one gradient block) when micro > 1. Free with cg_dist_reducer_free. */
cg_dist_reducer *cg_dist_reducer_new(cg_dist *d, cg_params *ps, int64_t micro, size_t bucket_bytes, bool overlap);
/* Frees the reducer and detaches it from its graph. NULL is a no-op. */
void cg_dist_reducer_free(cg_dist_reducer *r);
/* Lets the reducer start buckets from g's backward (cg_graph_on_grad_ready); g must outlive it. */
void cg_dist_reducer_attach(cg_dist_reducer *r, cg_graph *g);
/* Call before the backward of micro-batch m (0 .. micro-1) of a step: zeroes the gradients,
 * keeping what earlier micro-batches left in the accumulator. */
cg_status cg_dist_reducer_begin(cg_dist_reducer *r, int64_t m);
/* Call after the last micro-batch's backward: the gradients become the mean over all micro-batches
 * of all ranks, identical on every rank. An error (timeout, MPI failure) leaves them undefined. */
cg_status cg_dist_reducer_finish(cg_dist_reducer *r);
/* Timings and sizes so far. */
cg_dist_stats cg_dist_reducer_stats(const cg_dist_reducer *r);

CG_END_DECLS

#endif
