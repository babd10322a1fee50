/* SPDX-License-Identifier: MIT */
/* Data parallelism over MPI: a world handle with bounded waits, and the gradient reducer that
 * starts its buckets from the backward sweep. Built without MPI, the world has one rank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>

#include "dist/dist.h"
#include "graph/internal.h"
#include "optim/optim.h"

#ifdef CGRAD_MPI
#include <mpi.h>
#endif

struct cg_dist {
    int rank, size;
    bool owns_mpi; /* cg_dist_init called MPI_Init, so cg_dist_free finalizes */
    bool comms;    /* comm and gcomm were made */
    double timeout;
#ifdef CGRAD_MPI
    MPI_Comm comm;  /* control: checks, losses, barriers */
    MPI_Comm gcomm; /* gradient buckets, so their order never mixes with control messages */
    int *counts, *displs; /* per rank, for the shard collectives */
#endif
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

bool cg_dist_built(void) {
#ifdef CGRAD_MPI
    return true;
#else
    return false;
#endif
}

/* Open MPI's mpirun sets OMPI_COMM_WORLD_SIZE; PMIx and PMI launchers set their ranks. */
bool cg_dist_launched(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
}

cg_dist *cg_dist_init(double timeout_s) {
    cg_dist *d = calloc(1, sizeof *d);
    if (!d) {
        cgi_fail(CG_ERR_NOMEM, "[dist] out of memory");
        return NULL;
    }
    d->size = 1;
    d->timeout = timeout_s > 0 ? timeout_s : 600;
    if (!cg_dist_launched()) return d;
#ifdef CGRAD_MPI
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        /* FUNNELED: only the main thread calls MPI; OpenMP workers run the kernels. */
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
            cgi_fail(CG_ERR_STATE, "[dist] MPI_Init_thread failed");
            free(d);
            return NULL;
        }
        d->owns_mpi = true;
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &d->comm);
    MPI_Comm_dup(MPI_COMM_WORLD, &d->gcomm);
    d->comms = true;
    /* Errors come back as codes, so a failure is reported with the rank and what it was doing. */
    MPI_Comm_set_errhandler(d->comm, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(d->gcomm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(d->comm, &d->rank);
    MPI_Comm_size(d->comm, &d->size);
    d->counts = calloc((size_t)d->size, sizeof *d->counts);
    d->displs = calloc((size_t)d->size, sizeof *d->displs);
    if (!d->counts || !d->displs) {
        cgi_fail(CG_ERR_NOMEM, "[dist] out of memory");
        cg_dist_free(d);
        return NULL;
    }
#else
    const char *n = getenv("OMPI_COMM_WORLD_SIZE");
    if (n && atoi(n) > 1) {
        cgi_fail(CG_ERR_STATE, "[dist] started by mpirun with %s ranks, but this cgrad was built without MPI "
                               "(install libopenmpi-dev and rebuild with -DCGRAD_MPI=ON)", n);
        free(d);
        return NULL;
    }
#endif
    return d;
}

void cg_dist_free(cg_dist *d) {
    if (!d) return;
#ifdef CGRAD_MPI
    if (d->comms) {
        MPI_Comm_free(&d->comm);
        MPI_Comm_free(&d->gcomm);
    }
    if (d->owns_mpi) MPI_Finalize();
    free(d->counts);
    free(d->displs);
#endif
    free(d);
}

int cg_dist_rank(const cg_dist *d) { return d ? d->rank : 0; }
int cg_dist_size(const cg_dist *d) { return d ? d->size : 1; }

void cg_dist_abort(cg_dist *d, int code) {
#ifdef CGRAD_MPI
    if (d && d->size > 1) {
        fflush(stdout);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, code);
    }
#else
    (void)d, (void)code;
#endif
}

#ifdef CGRAD_MPI
/* One turn of a wait loop that started at t0. Open MPI's TCP transport moves bytes only inside MPI
 * calls, so a waiting rank polls: for the first 100 ms it only yields its core (a rank waits on its
 * own core when there is one core a rank, and a 50 us sleep there became milliseconds under load),
 * then it sleeps 50 us a turn so that ranks sharing cores leave them to the others' kernels. */
static void idle(double t0) {
    if (now_s() - t0 < 0.1) sched_yield();
    else {
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
}

static cg_status mpi_fail(const cg_dist *d, int rc, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return cgi_fail(CG_ERR_IO, "[dist] rank %d: %s failed: %s", d->rank, what, msg);
}

/* Waits for n requests, polling so that a rank that died or hangs becomes an error after the
 * timeout instead of a hang. done_at (may be NULL) gets each request's completion time. */
static cg_status wait_all(const cg_dist *d, int n, MPI_Request *req, double *done_at, const char *what) {
    const double t0 = now_s();
    int *idx = done_at ? malloc((size_t)n * sizeof *idx) : NULL;
    for (;;) {
        int flag = 0, rc;
        if (done_at && idx) {
            int k = 0;
            rc = MPI_Testsome(n, req, &k, idx, MPI_STATUSES_IGNORE);
            const double t = now_s();
            for (int i = 0; rc == MPI_SUCCESS && k != MPI_UNDEFINED && i < k; i++) done_at[idx[i]] = t;
            flag = k == MPI_UNDEFINED; /* every request is MPI_REQUEST_NULL now */
        } else rc = MPI_Testall(n, req, &flag, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) {
            free(idx);
            return mpi_fail(d, rc, what);
        }
        if (flag) break;
        if (now_s() - t0 > d->timeout) {
            free(idx);
            return cgi_fail(CG_ERR_IO, "[dist] rank %d: no answer from the other ranks for %.0f s in %s: a rank has "
                                       "died or hangs", d->rank, d->timeout, what);
        }
        idle(t0);
    }
    free(idx);
    return CG_OK;
}
#endif

cg_status cg_dist_bcast(cg_dist *d, void *buf, size_t bytes) {
    if (!d || d->size == 1) return CG_OK;
#ifdef CGRAD_MPI
    MPI_Request req;
    int rc = MPI_Ibcast(buf, (int)bytes, MPI_BYTE, 0, d->comm, &req);
    return rc != MPI_SUCCESS ? mpi_fail(d, rc, "broadcast") : wait_all(d, 1, &req, NULL, "a broadcast");
#else
    (void)buf, (void)bytes;
    return CG_OK;
#endif
}

cg_status cg_dist_sum(cg_dist *d, double *x, int n) {
    if (!d || d->size == 1) return CG_OK;
#ifdef CGRAD_MPI
    MPI_Request req;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, x, n, MPI_DOUBLE, MPI_SUM, d->comm, &req);
    return rc != MPI_SUCCESS ? mpi_fail(d, rc, "all-reduce") : wait_all(d, 1, &req, NULL, "an all-reduce");
#else
    (void)x, (void)n;
    return CG_OK;
#endif
}

cg_status cg_dist_barrier(cg_dist *d) {
    if (!d || d->size == 1) return CG_OK;
#ifdef CGRAD_MPI
    MPI_Request req;
    int rc = MPI_Ibarrier(d->comm, &req);
    return rc != MPI_SUCCESS ? mpi_fail(d, rc, "barrier") : wait_all(d, 1, &req, NULL, "a barrier");
#else
    return CG_OK;
#endif
}

#ifdef CGRAD_MPI
/* Rank root's string, broadcast to all (length first); the caller frees it. */
static cg_status bcast_str(cg_dist *d, int root, const char *mine, char **out) {
    double len = d->rank == root ? (double)strlen(mine) + 1 : 0;
    MPI_Request req;
    int rc = MPI_Ibcast(&len, 1, MPI_DOUBLE, root, d->comm, &req);
    cg_status st = rc != MPI_SUCCESS ? mpi_fail(d, rc, "broadcast") : wait_all(d, 1, &req, NULL, "a broadcast");
    if (st) return st;
    char *s = malloc((size_t)len);
    if (!s) return cgi_fail(CG_ERR_NOMEM, "[dist] out of memory");
    if (d->rank == root) memcpy(s, mine, (size_t)len);
    rc = MPI_Ibcast(s, (int)len, MPI_CHAR, root, d->comm, &req);
    st = rc != MPI_SUCCESS ? mpi_fail(d, rc, "broadcast") : wait_all(d, 1, &req, NULL, "a broadcast");
    if (st) {
        free(s);
        return st;
    }
    *out = s;
    return CG_OK;
}
#endif

cg_status cg_dist_check(cg_dist *d, const char *what, const char *value) {
    if (!d || d->size == 1) return CG_OK;
#ifdef CGRAD_MPI
    char *ref = NULL, *theirs = NULL;
    cg_status st = bcast_str(d, 0, value, &ref);
    if (st) return st;
    double bad = strcmp(ref, value) ? d->rank : d->size;
    MPI_Request req;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, &bad, 1, MPI_DOUBLE, MPI_MIN, d->comm, &req);
    st = rc != MPI_SUCCESS ? mpi_fail(d, rc, "all-reduce") : wait_all(d, 1, &req, NULL, "a settings check");
    if (!st && bad < d->size) {
        st = bcast_str(d, (int)bad, value, &theirs);
        if (!st)
            st = cgi_fail(CG_ERR_STATE, "[dist] %s differs: rank %d has '%s', rank 0 has '%s'", what, (int)bad, theirs, ref);
    }
    free(ref);
    free(theirs);
    return st;
#else
    (void)what, (void)value;
    return CG_OK;
#endif
}

/* ---- ZeRO stage 1 ---- */

void cg_dist_shard(const cg_dist *d, int rank, int64_t span, int64_t *lo, int64_t *hi) {
    const int n = cg_dist_size(d);
    int64_t per = (span + n - 1) / n;
    per = (per + 15) / 16 * 16;
    *lo = per * rank < span ? per * rank : span;
    *hi = per * (rank + 1) < span ? per * (rank + 1) : span;
}

#ifdef CGRAD_MPI
static MPI_Datatype real_type(void) { return sizeof(cg_real) == sizeof(float) ? MPI_FLOAT : MPI_DOUBLE; }

static void shard_layout(cg_dist *d, int64_t span) {
    for (int k = 0; k < d->size; k++) {
        int64_t lo, hi;
        cg_dist_shard(d, k, span, &lo, &hi);
        d->displs[k] = (int)lo, d->counts[k] = (int)(hi - lo);
    }
}
#endif

cg_status cg_dist_allgather(cg_dist *d, cg_real *block, int64_t span) {
    if (!d || d->size == 1) return CG_OK;
#ifdef CGRAD_MPI
    shard_layout(d, span);
    MPI_Request req;
    int rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, block, d->counts, d->displs, real_type(), d->gcomm, &req);
    return rc != MPI_SUCCESS ? mpi_fail(d, rc, "all-gather") : wait_all(d, 1, &req, NULL, "the parameter all-gather");
#else
    (void)block, (void)span;
    return CG_OK;
#endif
}

cg_status cg_dist_gather(cg_dist *d, const cg_real *mine, cg_real *full, int64_t span) {
    if (!d || d->size == 1) {
        if (full && full != mine) memcpy(full, mine, (size_t)span * sizeof(cg_real));
        return CG_OK;
    }
#ifdef CGRAD_MPI
    shard_layout(d, span);
    MPI_Request req;
    int rc = MPI_Igatherv(mine, d->counts[d->rank], real_type(), full, d->counts, d->displs, real_type(), 0, d->gcomm, &req);
    return rc != MPI_SUCCESS ? mpi_fail(d, rc, "gather") : wait_all(d, 1, &req, NULL, "the optimizer-state gather");
#else
    return CG_OK;
#endif
}

/* ---- the all-reduce: reduce-scatter, then all-gather, around the ring of ranks ---- */

#ifdef CGRAD_MPI
/* One in-place sum of x[0, n) over the ranks, in 2 (N - 1) steps of point-to-point messages: in
 * step s < N - 1 rank r sends its chunk r - s to rank r + 1, receives chunk r - s - 1 from rank
 * r - 1 and adds it into its own (own + received); after that rank r holds chunk r + 1 summed over
 * every rank, and the last N - 1 steps pass the summed chunks around. Each rank sends and receives
 * 2 (N - 1) / N of the bytes, both ways at once, which is the least an all-reduce can (libnbc's
 * MPI_Iallreduce sends every byte to one rank and back for 2 ranks: twice the time). Each chunk
 * is summed by one rank and copied to the rest, so every rank ends with the same bits; for 2
 * ranks each element is one addition a + b, which commutes, so it equals one process's sum.
 * A step moves on only when polled (ring_poll): Open MPI's TCP transport progresses inside calls. */
typedef struct {
    cg_real *x, *tmp; /* the data, and room for the largest chunk received */
    int64_t n;
    int step, tag; /* step == 2 (N - 1): done */
    MPI_Request req[2];
} ring;

static int64_t chunk_lo(const cg_dist *d, int64_t n, int c) {
    c = ((c % d->size) + d->size) % d->size;
    return n * c / d->size;
}

static int64_t chunk_n(const cg_dist *d, int64_t n, int c) {
    c = ((c % d->size) + d->size) % d->size;
    return n * (c + 1) / d->size - n * c / d->size;
}

static cg_status ring_post(cg_dist *d, ring *o) {
    const int N = d->size, r = d->rank, right = (r + 1) % N, left = (r + N - 1) % N;
    const bool scatter = o->step < N - 1;
    const int s = scatter ? o->step : o->step - (N - 1);
    const int send_c = scatter ? r - s : r + 1 - s, recv_c = scatter ? r - s - 1 : r - s;
    cg_real *into = scatter ? o->tmp : o->x + chunk_lo(d, o->n, recv_c);
    int rc = MPI_Irecv(into, (int)chunk_n(d, o->n, recv_c), real_type(), left, o->tag, d->gcomm, &o->req[0]);
    if (rc == MPI_SUCCESS)
        rc = MPI_Isend(o->x + chunk_lo(d, o->n, send_c), (int)chunk_n(d, o->n, send_c), real_type(), right, o->tag,
                       d->gcomm, &o->req[1]);
    return rc == MPI_SUCCESS ? CG_OK : mpi_fail(d, rc, "gradient all-reduce");
}

static cg_status ring_start(cg_dist *d, ring *o, cg_real *x, int64_t n, cg_real *tmp, int tag) {
    *o = (ring){.x = x, .tmp = tmp, .n = n, .tag = tag, .req = {MPI_REQUEST_NULL, MPI_REQUEST_NULL}};
    return ring_post(d, o);
}

static bool ring_done(const cg_dist *d, const ring *o) { return o->step >= 2 * (d->size - 1); }

/* Moves o on as far as the messages that arrived allow; *moved tells whether it did. */
static cg_status ring_poll(cg_dist *d, ring *o, bool *moved) {
    while (!ring_done(d, o)) {
        int flag = 0;
        const int rc = MPI_Testall(2, o->req, &flag, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_fail(d, rc, "gradient all-reduce");
        if (!flag) return CG_OK;
        *moved = true;
        if (o->step < d->size - 1) {
            const int c = d->rank - o->step - 1;
            cg_real *dst = o->x + chunk_lo(d, o->n, c);
            const int64_t m = chunk_n(d, o->n, c);
            for (int64_t i = 0; i < m; i++) dst[i] += o->tmp[i]; /* own + received: see above */
        }
        if (++o->step < 2 * (d->size - 1)) {
            cg_status st = ring_post(d, o);
            if (st) return st;
        }
    }
    return CG_OK;
}

/* Polls rings [0, n) until all are done or the timeout passes; done_at (may be NULL) gets each
 * one's completion time. */
static cg_status ring_wait(cg_dist *d, ring *o, int n, double *done_at, const char *what) {
    const double t0 = now_s();
    for (int left = n;;) {
        left = 0;
        for (int k = 0; k < n; k++) {
            if (ring_done(d, &o[k])) continue;
            bool moved = false;
            cg_status st = ring_poll(d, &o[k], &moved);
            if (st) return st;
            if (ring_done(d, &o[k])) {
                if (done_at) done_at[k] = now_s();
            } else left++;
        }
        if (!left) return CG_OK;
        if (now_s() - t0 > d->timeout)
            return cgi_fail(CG_ERR_IO, "[dist] rank %d: no answer from the other ranks for %.0f s in %s: a rank has "
                                       "died or hangs", d->rank, d->timeout, what);
        idle(t0);
    }
}
#endif

cg_status cg_dist_sum_reals(cg_dist *d, cg_real *x, int64_t n) {
    if (!d || d->size == 1 || n <= 0) return CG_OK;
#ifdef CGRAD_MPI
    if (n > INT32_MAX) return cgi_fail(CG_ERR_ARG, "[dist] all-reduce of %lld elements: at most 2^31 - 1", (long long)n);
    cg_real *tmp = malloc((size_t)(n / d->size + 1) * sizeof *tmp);
    if (!tmp) return cgi_fail(CG_ERR_NOMEM, "[dist] out of memory for the all-reduce of %lld elements", (long long)n);
    ring o;
    cg_status st = ring_start(d, &o, x, n, tmp, 0);
    if (!st) st = ring_wait(d, &o, 1, NULL, "an all-reduce");
    free(tmp);
    return st;
#else
    (void)x;
    return CG_OK;
#endif
}

/* ---- the reducer ---- */

/* A bucket is a run of consecutive parameters, params [first, first + n), whose gradients are one
 * range of the gradient block, all-reduced in place as one message. */
typedef struct {
    int first, n;   /* its parameters */
    int64_t lo, hi; /* their range of the gradient block */
    int final_at;   /* position of its last gradient in the observed ready order */
    int pending;    /* of its trainable parameters, not yet final in this backward */
    int tag;        /* its messages' tag: its index in memory order */
    int64_t tmp_off; /* its room in the scratch for received chunks */
    double start;   /* when its all-reduce started */
} bucket;

struct cg_dist_reducer {
    cg_dist *d;
    cg_params *ps;
    cg_graph *g;
    int64_t micro, m, span;
    bool overlap;
    cg_real *acc;   /* earlier micro-batches' gradients, summed in order */
    int np;         /* parameters */
    int *bucket_of; /* parameter index -> its bucket */
    int *ready;     /* parameters in the order the first overlapped backward made them final */
    int nready;
    bool reordered; /* buckets start in that order (from the second step on) */
    bucket *b;
    int nb, next; /* buckets, and the next to start (they start in index order on every rank) */
    double *done_at, first_start;
    cg_dist_stats st;
#ifdef CGRAD_MPI
    ring *rings;      /* bucket k's all-reduce */
    cg_real *scratch; /* received chunks: (hi - lo) / N + 1 elements a bucket */
#endif
};

/* Offset of a parameter's gradient in the block (a frozen one out of the blocks has none: where it would be). */
static int64_t grad_off(cg_dist_reducer *r, int i) { return cg_params_at(r->ps, i)->block_off; }

/* Index of the parameter whose gradient starts at element off (parameters lie in index order). */
static int param_at(cg_dist_reducer *r, int64_t off) {
    int lo = 0, hi = r->np - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (grad_off(r, mid) <= off) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

cg_dist_reducer *cg_dist_reducer_new(cg_dist *d, cg_params *ps, int64_t micro, size_t bucket_bytes, bool overlap) {
    if (!ps || micro < 1) {
        cgi_fail(CG_ERR_ARG, "[dist] reducer needs parameters and micro >= 1, got %lld", (long long)micro);
        return NULL;
    }
    cg_dist_reducer *r = calloc(1, sizeof *r);
    if (!r) goto nomem;
    r->d = d, r->ps = ps, r->micro = micro, r->overlap = overlap;
    r->span = cg_params_span(ps);
    if (!bucket_bytes) bucket_bytes = 1 << 20;
    const int n = r->np = cg_params_count(ps);
    const size_t nn = (size_t)(n > 0 ? n : 1);
    r->b = calloc(nn, sizeof *r->b), r->done_at = calloc(nn, sizeof *r->done_at);
    r->bucket_of = malloc(nn * sizeof *r->bucket_of), r->ready = malloc(nn * sizeof *r->ready);
    if (!r->b || !r->done_at || !r->bucket_of || !r->ready) goto nomem;
    /* Buckets of consecutive parameters from the last one back: backward finishes the last layers
     * first, so bucket 0 is ready earliest. The first backward then shows the real order, and the
     * buckets start in that order from the second step on (reorder). */
    int64_t hi = r->span;
    for (int i = n - 1; i >= 0;) {
        bucket *bk = &r->b[r->nb];
        *bk = (bucket){.hi = hi, .final_at = r->nb};
        size_t bytes = 0;
        for (; i >= 0 && (bytes == 0 || bytes < bucket_bytes); i--) {
            bk->lo = grad_off(r, i);
            bk->first = i, bk->n++;
            bytes = (size_t)(bk->hi - bk->lo) * sizeof(cg_real);
            r->bucket_of[i] = r->nb;
        }
        hi = bk->lo;
        bk->tag = r->nb;
        bk->tmp_off = r->nb ? r->b[r->nb - 1].tmp_off + (r->b[r->nb - 1].hi - r->b[r->nb - 1].lo) / cg_dist_size(d) + 1 : 0;
        r->nb++;
    }
    if (micro > 1 && !(r->acc = aligned_alloc(CGI_ALIGN, (size_t)((r->span * (int64_t)sizeof(cg_real) + CGI_ALIGN - 1) /
                                                                  CGI_ALIGN * CGI_ALIGN))))
        goto nomem;
#ifdef CGRAD_MPI
    if (!(r->rings = calloc(nn, sizeof *r->rings))) goto nomem;
    if (cg_dist_size(d) > 1) {
        const bucket *last = &r->b[r->nb - 1];
        const int64_t scratch = r->nb ? last->tmp_off + (last->hi - last->lo) / cg_dist_size(d) + 1 : 1;
        if (!(r->scratch = malloc((size_t)scratch * sizeof *r->scratch))) goto nomem;
    }
#endif
    r->st.buckets = cg_dist_size(d) > 1 ? r->nb : 0;
    r->st.bytes = cg_dist_size(d) > 1 ? r->span * (int64_t)sizeof(cg_real) : 0;
    return r;
nomem:
    cg_dist_reducer_free(r);
    cgi_fail(CG_ERR_NOMEM, "[dist] out of memory for the reducer");
    return NULL;
}

void cg_dist_reducer_free(cg_dist_reducer *r) {
    if (!r) return;
    if (r->g) cg_graph_on_grad_ready(r->g, NULL, NULL);
    free(r->b);
    free(r->done_at);
    free(r->bucket_of);
    free(r->ready);
    free(r->acc);
#ifdef CGRAD_MPI
    free(r->rings);
    free(r->scratch);
#endif
    free(r);
}

/* Starts bucket k: adds the earlier micro-batches into it, then the in-place all-reduce. */
static cg_status start(cg_dist_reducer *r, int k) {
    bucket *bk = &r->b[k];
    cg_real *gr = cg_params_grads_settled(r->ps, bk->first, bk->n); /* its frozen or unused parameters read as zero */
    if (r->acc) /* g_last + acc: addition commutes, so this is the in-order sum */
        for (int64_t i = bk->lo; i < bk->hi; i++) gr[i] += r->acc[i];
    bk->start = now_s();
    if (k == 0) r->first_start = bk->start;
#ifdef CGRAD_MPI
    return ring_start(r->d, &r->rings[k], gr + bk->lo, bk->hi - bk->lo, r->scratch + bk->tmp_off, bk->tag);
#else
    return CG_OK;
#endif
}

static void on_ready(cg_tensor *p, void *ctx) {
    cg_dist_reducer *r = ctx;
    if (r->m != r->micro - 1) return; /* earlier micro-batches only accumulate */
    const int i = param_at(r, p->block_off), k = r->bucket_of[i];
    if (!r->reordered && r->nready < r->np) r->ready[r->nready++] = i;
    if (r->b[k].pending > 0 && --r->b[k].pending == 0 && k > r->next) r->st.held++;
    while (r->next < r->nb && r->b[r->next].pending == 0) {
        if (start(r, r->next)) return; /* finish reports it: the request stays null */
        r->next++, r->st.early++;
    }
#ifdef CGRAD_MPI
    for (int k = 0; k < r->next; k++) /* the transport moves only inside MPI calls: give it a turn */
        if (!ring_done(r->d, &r->rings[k])) {
            bool moved = false;
            if (ring_poll(r->d, &r->rings[k], &moved)) return; /* the next poll in finish reports it */
            if (ring_done(r->d, &r->rings[k])) r->done_at[k] = now_s();
        }
#endif
}

static int by_final_at(const void *a, const void *b) {
    const bucket *x = a, *y = b;
    return (x->final_at > y->final_at) - (x->final_at < y->final_at);
}

/* After the first overlapped backward: the buckets start in the order their last gradient became
 * final there (rank 0's order, so every rank starts the same bucket as k-th), which is not always
 * the memory order (BERT's and the encoder-decoder's heads and embeddings). They stay ranges of
 * the block, reduced in place, so nothing is copied. */
static cg_status reorder(cg_dist_reducer *r) {
    r->reordered = true;
    r->st.held_first = r->st.held, r->st.held = 0;
    int32_t n = r->nready;
    cg_status st = cg_dist_bcast(r->d, &n, sizeof n);
    if (!st && n > 0) st = cg_dist_bcast(r->d, r->ready, (size_t)n * sizeof *r->ready);
    if (st || n <= 0) return st;
    for (int k = 0; k < r->nb; k++) r->b[k].final_at = -1;
    for (int j = 0; j < n && j < r->np; j++) r->b[r->bucket_of[r->ready[j]]].final_at = j;
    for (int k = 0; k < r->nb; k++) /* frozen only: never final, start at the end in memory order */
        if (r->b[k].final_at < 0) r->b[k].final_at = r->np + k;
    qsort(r->b, (size_t)r->nb, sizeof *r->b, by_final_at); /* final_at are distinct: deterministic */
    for (int k = 0; k < r->nb; k++)
        for (int i = r->b[k].first; i < r->b[k].first + r->b[k].n; i++) r->bucket_of[i] = k;
    return CG_OK;
}

void cg_dist_reducer_attach(cg_dist_reducer *r, cg_graph *g) {
    if (!r || !g) return;
    r->g = g;
    if (r->overlap && cg_dist_size(r->d) > 1) cg_graph_on_grad_ready(g, on_ready, r);
}

cg_status cg_dist_reducer_begin(cg_dist_reducer *r, int64_t m) {
    if (!r || m < 0 || m >= r->micro) return cgi_fail(CG_ERR_ARG, "[dist] micro-batch %lld of %lld", (long long)m,
                                                      r ? (long long)r->micro : 0LL);
    cg_real *gr = cg_params_grads_settled(r->ps, 0, -1);
    if (m == 1) memcpy(r->acc, gr, (size_t)r->span * sizeof(cg_real));
    else if (m > 1)
        for (int64_t i = 0; i < r->span; i++) r->acc[i] += gr[i];
    cg_params_zero_grad(r->ps);
    r->m = m;
    if (m == r->micro - 1) {
        for (int k = 0; k < r->nb; k++) {
            r->b[k].pending = 0, r->done_at[k] = 0;
            for (int i = r->b[k].first; i < r->b[k].first + r->b[k].n; i++)
                r->b[k].pending += cg_param_trainable(cg_params_at(r->ps, i));
        }
        r->next = 0;
    }
    return CG_OK;
}

cg_status cg_dist_reducer_finish(cg_dist_reducer *r) {
    if (!r) return cgi_fail(CG_ERR_ARG, "[dist] reducer is NULL");
    const double t_end = now_s();
    cg_status st = CG_OK;
    if (cg_dist_size(r->d) == 1) {
        if (r->acc) {
            cg_real *gr = cg_params_grads_settled(r->ps, 0, -1);
            for (int64_t i = 0; i < r->span; i++) gr[i] += r->acc[i];
        }
    } else {
        while (!st && r->next < r->nb) st = start(r, r->next++);
#ifdef CGRAD_MPI
        if (!st) st = ring_wait(r->d, r->rings, r->nb, r->done_at, "the gradient all-reduce");
#endif
        const double t_done = now_s();
        double last = r->first_start;
        for (int k = 0; k < r->nb; k++) last = r->done_at[k] > last ? r->done_at[k] : last;
        r->st.wait_s += t_done - t_end;
        r->st.comm_s += (last > t_done ? t_done : last) - r->first_start;
        if (!st && r->overlap && !r->reordered) st = reorder(r);
    }
    if (st) return st;
    const int64_t n = r->micro * cg_dist_size(r->d);
    if (n > 1) cg_grads_scale(r->ps, 1.0 / (double)n);
    r->st.steps++;
    return CG_OK;
}

cg_dist_stats cg_dist_reducer_stats(const cg_dist_reducer *r) {
    cg_dist_stats s;
    memset(&s, 0, sizeof s);
    return r ? r->st : s;
}
