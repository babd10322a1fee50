/* SPDX-License-Identifier: MIT */
/* A thread team held open across many small graph runs (token-by-token generation).
 *
 * Why: a cached gpt-tiny token streams 12.9 MB of weights through matrix-vector products, and one
 * core here reads at most ~28 GB/s from L3, so one thread tops out near 2200 tokens/s. Two cores
 * stream more, but waking the idle vCPU for each parallel region costs 140-180 us in this KVM
 * guest (a token is ~580 us; graph/threads.c), so every small run stays on one thread. Here one
 * OpenMP region spans the whole loop instead: thread 0 runs the graphs op by op, and the other
 * threads, already awake, take pieces of the products (cgi_team_pieces) from an atomic counter.
 * Thread 0 takes pieces from the same counter, so it only ever waits for a piece a helper has
 * started. Pieces are cut the same way whoever computes them and at any thread count
 * (ops/gemm.c), so tokens are bit-identical at 1 and N threads.
 *
 * Helpers spin between pieces only briefly, then yield, then sleep, so that another busy process
 * is not starved. And a guard on thread 0 times each run per unit of work with helpers and
 * without: when another process holds the other core, a helper is switched out mid-piece and
 * thread 0 waits for it a whole time slice (spinning helpers collapsed generation from 1700 to
 * ~680 tokens/s with one `yes` beside it). The guard then rests the helpers and retries later. */
#include <limits.h>
#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <omp.h>

#include "graph/internal.h"

enum {
    WINDOW = 6,       /* runs timed per probe, with helpers and without */
    HOLD_MIN = 24,    /* runs the winner of a probe keeps before the next probe */
    HOLD_MAX = 768,   /* ... doubling while the same side keeps winning */
};
#define SPIN_S 200e-6   /* a helper spins this long after its last piece, then yields */
#define YIELD_S 2e-3    /* ... yields this long, then sleeps in short naps */
#define STALL_S 300e-6  /* thread 0 waiting this long (see cgi_team_stalled): the helper was switched out */

typedef struct {
    _Atomic uint64_t claim; /* task number << 32 | pieces << 16 | next piece to take */
    _Atomic int finished;   /* pieces of the current task done */
    _Atomic int stop;       /* the span is over */
    _Atomic int rest;       /* SHARE, or the guard rests the helpers: NAP (stay near), LEAVE (quit the loop) */
    void (*fn)(void *ctx, int piece);
    void *ctx;
    int helpers;
    double run_t0; /* thread 0 only: the run in progress */
    _Atomic double published; /* CGRAD_TEAM_STATS: when thread 0 published the current task */
    bool stalled;
    bool large; /* a large run's span (cgi_run_graph): helpers always share, the cores guard watches */
} team;

/* The guard's state lives on the calling thread across spans: a generation call is only ~200
 * runs, and starting every call with a fresh probe cost ~10% of them at one thread's speed. */
enum { SHARE, NAP, LEAVE };

typedef struct {
    int phase;          /* 1: probing without helpers, then 0: probing with them, 2: holding */
    int runs;           /* runs done in this phase */
    int hold, hold_len; /* the held side (1: helpers), and how many runs it holds */
    int warm;           /* runs of the window done that only warm the helpers up (or let them settle) */
    long long run, last_stall;
    long long pieces_at; /* the helpers' piece count when the window with them began */
    double rate[2][WINDOW];
} guard_state;

/* A thread's first span starts holding the helpers, as if a probe had found they pay, and probes
 * after HOLD_MIN runs. Starting with a probe without them (a window of 2 + WINDOW runs at one
 * thread's speed, then 2 + WINDOW with them) kept a short training run on one thread for most of
 * it: `cgrad bench --config nanogpt-char --threads 2` (1 + 5 steps, 12 runs) shared only its last
 * 4 runs. A busy machine rests them within a few runs anyway (two stalls within 8 runs). The
 * fallback mode, which exists to test the probe, starts with it. */
enum { FRESH = 3 }; /* gs.phase before the first span */
#define GUARD_FRESH {.phase = FRESH, .last_stall = -1000}
static _Thread_local guard_state gs = GUARD_FRESH;

static void guard_start(int mode) {
    if (mode == CGI_TEAM_GUARD_FALLBACK) gs = (guard_state){.phase = 1, .last_stall = -1000};
    else gs = (guard_state){.phase = 2, .hold = 1, .hold_len = HOLD_MIN, .last_stall = -1000};
}
static _Thread_local team *my_team;   /* on thread 0 of an open team */
static _Thread_local bool in_span;    /* on thread 0 inside cg_run_with_team, with or without helpers */
static _Thread_local bool in_task;    /* on thread 0 while its team's task is open (see cgi_team_pieces) */
static int guard_mode = -1;           /* CGI_TEAM_GUARD_*, from CGRAD_TEAM_GUARD once */
static _Atomic long long stat_on, stat_off, stat_helper_pieces, stat_stalls, stat_pieces, stat_wait_ns, stat_naps;
static _Atomic bool wait_for_helpers; /* tests: thread 0 leaves each task's first piece to a helper */
static int team_stats = -1; /* CGRAD_TEAM_STATS, read once per span */

/* CGRAD_TEAM_STATS=2: thread 0's stretches without a task longer than the helper's spin, each named
 * by the executor's place where the last task ended and where the next began. */
static _Thread_local const cg_tensor *note_t;
static _Thread_local int note_pass;
static _Thread_local bool note_done;
static _Thread_local double last_task_end;
static _Thread_local char last_task_at[96];

static _Thread_local double note_at, in_ops, between_ops; /* CGRAD_TEAM_STATS: thread 0's time in op calls and between them */

void cgi_team_note(const cg_tensor *t, int pass, bool done) {
    if (team_stats > 0 && in_span) {
        const double now = omp_get_wtime();
        if (note_at > 0) *(note_done || !note_t ? &between_ops : &in_ops) += now - note_at;
        note_at = now;
    }
    note_t = t, note_pass = pass, note_done = done;
}

static void note_place(char *buf, size_t n) {
    if (!note_t) snprintf(buf, n, "outside the ops");
    else snprintf(buf, n, "%s %s %s(#%d)", note_done ? "after" : "in", note_pass ? "bwd" : "fwd", cgi_op_name_of(note_t), note_t->id);
}

static int guard(void) {
    if (guard_mode < 0) {
        const char *e = getenv("CGRAD_TEAM_GUARD");
        guard_mode = !e || !strcmp(e, "auto") ? CGI_TEAM_GUARD_AUTO
                     : !strcmp(e, "on")       ? CGI_TEAM_GUARD_ON
                     : !strcmp(e, "off")      ? CGI_TEAM_GUARD_OFF
                     : !strcmp(e, "fallback") ? CGI_TEAM_GUARD_FALLBACK
                                              : CGI_TEAM_GUARD_AUTO;
    }
    return guard_mode;
}

void cgi_team_set_guard(int mode) {
    guard_mode = mode;
    gs = (guard_state)GUARD_FRESH;
}

void cgi_team_stats(cgi_team_counts *c) {
    c->runs_with_helpers = atomic_load(&stat_on);
    c->runs_without = atomic_load(&stat_off);
    c->helper_pieces = atomic_load(&stat_helper_pieces);
    c->stalls = atomic_load(&stat_stalls);
    c->pieces = atomic_load(&stat_pieces);
    c->wait_ns = atomic_load(&stat_wait_ns);
    c->naps = atomic_load(&stat_naps);
}

void cgi_team_wait_for_helpers(bool on) { atomic_store(&wait_for_helpers, on); }

/* Under CGRAD_PROFILE, thread 0's time (on the profile's clock) inside shared pieces and, of it,
 * waiting for a helper's last piece: the profile splits each op into time shared and time alone. */
static _Thread_local double prof_shared, prof_wait;

void cgi_team_profile(double *shared, double *wait) { *shared = prof_shared, *wait = prof_wait; }

bool cgi_team_on(void) { return in_span; }

bool cgi_team_sharing(void) {
    return my_team && !in_task && atomic_load_explicit(&my_team->rest, memory_order_relaxed) == SHARE;
}

int cgi_team_threads(void) { return cgi_team_sharing() ? 1 + my_team->helpers : 1; }

static void spin_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void nap(long ns) {
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
}

static void task_ended(void) {
    last_task_end = omp_get_wtime();
    note_place(last_task_at, sizeof last_task_at);
}

/* Runs the pieces of task `task` still unclaimed; returns how many this thread ran. fn and ctx
 * are read only after a claim succeeded, while thread 0 waits for that piece, so they are live. */
static int take_pieces(team *tm, uint64_t task) {
    int ran = 0;
    uint64_t c = atomic_load_explicit(&tm->claim, memory_order_acquire);
    while (c >> 32 == task && (c & 0xffff) < (c >> 16 & 0xffff)) {
        if (!atomic_compare_exchange_weak_explicit(&tm->claim, &c, c + 1, memory_order_acq_rel, memory_order_acquire))
            continue;
        tm->fn(tm->ctx, (int)(c & 0xffff));
        atomic_fetch_add_explicit(&tm->finished, 1, memory_order_release);
        ran++;
        c = atomic_load_explicit(&tm->claim, memory_order_acquire);
    }
    return ran;
}

/* A piece that thread 0 runs may itself ask for pieces (attention's heads run their block products
 * through the product engine, which cuts them for a sharing team): those run in turn on thread 0,
 * as they do on a helper. The team has one task at a time, and a nested one would replace the open
 * task's claims and count: its unclaimed pieces were lost and thread 0 waited for them forever. */
void cgi_team_pieces(void (*fn)(void *ctx, int piece), void *ctx, int pieces) {
    team *tm = my_team;
    if (!tm || in_task || atomic_load_explicit(&tm->rest, memory_order_relaxed) || pieces < 2 || pieces > 0xffff) {
        for (int i = 0; i < pieces; i++) fn(ctx, i);
        return;
    }
    in_task = true;
    tm->fn = fn, tm->ctx = ctx;
    if (team_stats) {
        const double now = omp_get_wtime();
        atomic_store_explicit(&tm->published, now, memory_order_relaxed);
        if (team_stats > 1 && last_task_end > 0 && now - last_task_end > SPIN_S) {
            char here[96];
            note_place(here, sizeof here);
            fprintf(stderr, "team_gap %.0f us from %s to %s\n", 1e6 * (now - last_task_end), last_task_at, here);
        }
    }
    atomic_store_explicit(&tm->finished, 0, memory_order_relaxed);
    const uint64_t task = (atomic_load_explicit(&tm->claim, memory_order_relaxed) >> 32) + 1;
    atomic_store_explicit(&tm->claim, task << 32 | (uint64_t)pieces << 16, memory_order_release); /* publishes fn, ctx */
    if (atomic_load_explicit(&wait_for_helpers, memory_order_relaxed)) /* a napping helper wakes within 1 ms */
        for (const double t0 = omp_get_wtime();
             !(atomic_load_explicit(&tm->claim, memory_order_acquire) & 0xffff) && omp_get_wtime() - t0 < 0.1;)
            sched_yield();
    const double p0 = cgi_profiling() ? cgi_profile_now() : 0;
    const double t_own = omp_get_wtime();
    const int mine = take_pieces(tm, task);
    const double own = omp_get_wtime() - t_own; /* thread 0's own pieces (it claims until none is left) */
    atomic_fetch_add_explicit(&stat_pieces, pieces, memory_order_relaxed);
    if (mine < pieces) atomic_fetch_add_explicit(&stat_helper_pieces, pieces - mine, memory_order_relaxed);
    const double p1 = p0 > 0 ? cgi_profile_now() : 0;
    in_task = false; /* thread 0's pieces are done: what follows only waits */
    if (atomic_load_explicit(&tm->finished, memory_order_acquire) >= pieces) {
        if (p0 > 0) prof_shared += p1 - p0;
        if (team_stats > 1) task_ended();
        return;
    }
    const double t0 = omp_get_wtime();
    while (atomic_load_explicit(&tm->finished, memory_order_acquire) < pieces) spin_pause();
    const double waited = omp_get_wtime() - t0; /* the tail: what an uneven split costs thread 0 */
    if (p0 > 0) {
        const double p2 = cgi_profile_now();
        prof_shared += p2 - p0, prof_wait += p2 - p1;
    }
    atomic_fetch_add_explicit(&stat_wait_ns, (long long)(1e9 * waited), memory_order_relaxed);
    if (cgi_team_stalled(waited, own)) tm->stalled = true;
    if (team_stats > 1) task_ended();
}

/* The ops between the products (layer norms, residual adds, attention's backward) ran on thread 0
 * alone inside a team, while the helper spun or slept: in nanoGPT's recipe they are 14% of the op
 * time of a one-thread step (CGRAD_PROFILE). Their rows are shared as the products' pieces are, in
 * TEAM_PARTS ranges; from CGI_TEAM_PART_MIN elements (~5 us of a memory-bound op) a range outweighs
 * the claim's cache-line traffic. */
enum { TEAM_PARTS = 4 };

typedef struct {
    void (*body)(int64_t lo, int64_t hi, void *ctx);
    void *ctx;
    int64_t n;
    int parts;
} ranges_task;

static void run_range(void *ctx, int q) {
    const ranges_task *t = ctx;
    const int64_t lo = t->n * q / t->parts, hi = t->n * (q + 1) / t->parts;
    if (hi > lo) t->body(lo, hi, t->ctx);
}

void cgi_slot_pieces(int64_t n, int slots, void (*fn)(void *ctx, int piece), void *ctx) {
    const int threads = slots < cgi_nthreads() ? slots : cgi_nthreads(); /* a run may use fewer */
    if (n > 1 && n <= INT_MAX && cgi_team_on() && omp_get_num_threads() <= slots)
        cgi_team_pieces(fn, ctx, (int)n);
    else if (n > 1 && threads > 1) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
        for (int64_t i = 0; i < n; i++) fn(ctx, (int)i);
    } else
        for (int64_t i = 0; i < n; i++) fn(ctx, (int)i);
}

void cgi_team_ranges(int64_t n, int parts, void (*body)(int64_t lo, int64_t hi, void *ctx), void *ctx) {
    const ranges_task t = {body, ctx, n, parts};
    cgi_team_pieces(run_range, (void *)&t, parts);
}

void cgi_par_ranges(int64_t n, int64_t work, void (*body)(int64_t lo, int64_t hi, void *ctx), void *ctx) {
    if (n <= 0) return;
    if (n > 1 && work >= CGI_TEAM_PART_MIN && cgi_team_sharing()) {
        cgi_team_ranges(n, n < TEAM_PARTS ? (int)n : TEAM_PARTS, body, ctx);
        return;
    }
    if (n > 1 && cgi_par(work)) {
#pragma omp parallel num_threads(cgi_nthreads())
        {
            const int64_t me = omp_get_thread_num(), all = omp_get_num_threads();
            body(n * me / all, n * (me + 1) / all, ctx);
        }
        return;
    }
    body(0, n, ctx);
}

/* Thread 0 claims pieces until none is left, so an uneven split makes it wait at most for the rest
 * of one helper's piece, and no piece weighs more than twice another (ops/gemm.c tapers 2:1): a
 * wait over twice thread 0's own pieces is a helper switched out. Without that bound a matrix
 * product's pieces (uncached generation), which can run longer than STALL_S, would read as stalls
 * and rest the helpers. */
bool cgi_team_stalled(double waited, double own) { return waited > STALL_S && waited > 2 * own; }

/* ---- the guard: helpers or not, by time per unit of work over windows of runs ---- */

static double median(double *v, int n) {
    for (int i = 1; i < n; i++) /* insertion sort: n is WINDOW */
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            const double t = v[j];
            v[j] = v[j - 1], v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void set_rest(team *tm, int rest) {
    if (atomic_load_explicit(&tm->rest, memory_order_relaxed) != LEAVE) /* a helper that left is gone */
        atomic_store_explicit(&tm->rest, rest, memory_order_relaxed);
}

void cgi_team_run_begin(void) {
    team *tm = my_team;
    if (!tm) return;
    tm->stalled = false;
    tm->run_t0 = omp_get_wtime();
}

/* The guard: a window of runs without helpers (they nap close by), then one with them; the faster
 * by 3% per unit of work is held for HOLD_MIN runs, doubling while it keeps winning. Resting
 * helpers leave the loop and sleep in the region's closing barrier: even napping 1 ms at a time
 * they cost a busy machine 8% (1740-1763 -> 1613-1619 tokens/s against one thread), since each
 * wake takes a core another process wants. So a probe after a rest starts with the next span. */
void cgi_team_run_end(double work) {
    team *tm = my_team;
    if (!tm) return;
    const bool on = atomic_load_explicit(&tm->rest, memory_order_relaxed) == SHARE;
    atomic_fetch_add_explicit(on ? &stat_on : &stat_off, 1, memory_order_relaxed);
    if (tm->large) return;
    const int mode = guard();
    if (mode != CGI_TEAM_GUARD_AUTO && mode != CGI_TEAM_GUARD_FALLBACK) return;
    const double rate = (omp_get_wtime() - tm->run_t0) / (work > 1 ? work : 1);
    gs.run++;
    if (on && tm->stalled) {
        atomic_fetch_add_explicit(&stat_stalls, 1, memory_order_relaxed);
        /* a helper was switched out mid-piece. Once happens on a quiet machine too (a kernel thread
         * took its core); twice within 8 runs means another process wants it: rest, probe later */
        const bool again = gs.run - gs.last_stall <= 8;
        gs.last_stall = gs.run;
        if (again) {
            gs.phase = 2, gs.runs = 0, gs.hold = 0;
            gs.hold_len = gs.hold_len < HOLD_MIN ? HOLD_MIN : gs.hold_len;
            set_rest(tm, LEAVE);
            return;
        }
    }
    if (gs.phase < 2) {
        if (gs.warm < 2) { /* a helper just woken or just told to rest: not yet what the window measures */
            gs.warm++;
            return;
        }
        gs.rate[gs.phase][gs.runs++] = rate;
        if (gs.runs < WINDOW) return;
        gs.runs = 0, gs.warm = 0;
        if (gs.phase == 1) { /* now the same window with helpers */
            gs.phase = 0;
            gs.pieces_at = atomic_load_explicit(&stat_helper_pieces, memory_order_relaxed);
            set_rest(tm, SHARE);
            return;
        }
        const double with = median(gs.rate[0], WINDOW), without = median(gs.rate[1], WINDOW);
        /* helpers cost a core: they must win by a margin, not by noise */
        const bool helped = atomic_load_explicit(&stat_helper_pieces, memory_order_relaxed) > gs.pieces_at;
        const int winner = mode != CGI_TEAM_GUARD_FALLBACK && helped && with < 0.97 * without;
        gs.hold_len = winner == gs.hold && gs.hold_len ? 2 * gs.hold_len : HOLD_MIN;
        if (gs.hold_len > HOLD_MAX) gs.hold_len = HOLD_MAX;
        gs.hold = winner;
        gs.phase = 2;
        set_rest(tm, winner ? SHARE : LEAVE);
        return;
    }
    if (++gs.runs < gs.hold_len || !gs.hold) return; /* after a rest, the next span probes */
    gs.phase = 1, gs.runs = 0, gs.warm = 0;
    set_rest(tm, NAP);
}

/* ---- the span ---- */

static void helper_loop(team *tm) {
    uint64_t seen = 0;
    double idle_since = omp_get_wtime();
    unsigned spins = 0;
    long tasks = 0, yields = 0, naps = 0, rests = 0;
    int state = 0; /* 0 spinning, 1 yielding, 2 napping: what the helper did when a task came */
    long late_n[3] = {0}; double late_s[3] = {0};
    const double start = omp_get_wtime();
    /* A large run's span never naps: its helper waits microseconds between tasks but, after a
     * stretch of thread 0 alone, took the next task a nap late (up to 200 us plus the wake). Another
     * busy process is the cores guard's to see (graph/cores.c): it keeps such runs on one thread,
     * without a span; a yielding helper gives up its core to whoever wants it meanwhile. */
    const double nap_after = tm->large ? INFINITY : YIELD_S;
    while (!atomic_load_explicit(&tm->stop, memory_order_acquire)) {
        const int rest = atomic_load_explicit(&tm->rest, memory_order_relaxed);
        if (rest == LEAVE) break; /* sleep in the region's barrier until the span ends */
        if (rest == NAP) { /* a probe without helpers: wake as rarely as resting would cost (nothing) */
            nap(1000000);
            rests++;
            idle_since = omp_get_wtime();
            continue;
        }
        const uint64_t task = atomic_load_explicit(&tm->claim, memory_order_acquire) >> 32;
        if (task != seen) {
            seen = task;
            if (team_stats) {
                const double late = omp_get_wtime() - atomic_load_explicit(&tm->published, memory_order_relaxed);
                late_n[state]++, late_s[state] += late;
            }
            state = 0;
            take_pieces(tm, task);
            tasks++;
            idle_since = omp_get_wtime(), spins = 0;
            continue;
        }
        if (++spins % 64) {
            spin_pause();
            continue;
        }
        const double idle = omp_get_wtime() - idle_since;
        if (idle < SPIN_S) spin_pause();
        else if (idle < nap_after) sched_yield(), yields++, state = 1;
        else nap(200000), naps++, state = 2, atomic_fetch_add_explicit(&stat_naps, 1, memory_order_relaxed);
    }
    if (team_stats)
        fprintf(stderr, "helper: %.0f us, %ld tasks seen, %ld yields, %ld naps, %ld rests; tasks found spinning %ld "
                "(%.1f us late on average), yielding %ld (%.1f us), napping %ld (%.1f us)\n", 1e6 * (omp_get_wtime() - start),
                tasks, yields, naps, rests, late_n[0], late_n[0] ? 1e6 * late_s[0] / late_n[0] : 0.0, late_n[1],
                late_n[1] ? 1e6 * late_s[1] / late_n[1] : 0.0, late_n[2], late_n[2] ? 1e6 * late_s[2] / late_n[2] : 0.0);
}

static cg_status span(cg_status (*body)(void *ctx), void *ctx, bool large) {
    if (!body) return cgi_fail(CG_ERR_ARG, "[team] body is NULL");
    if (in_span) return body(ctx); /* already inside one */
    const int n = cg_threads();
    const char *e = getenv("CGRAD_TEAM");
    if (e && !atoi(e)) return body(ctx); /* CGRAD_TEAM=0: the old way, each run decides alone */
    cg_status st = CG_OK;
    if (n < 2 || omp_in_parallel()) return body(ctx); /* no helpers: each run as without a team */
    team tm = {.helpers = n - 1, .large = large};
    if (team_stats < 0) team_stats = !getenv("CGRAD_TEAM_STATS") ? 0 : atoi(getenv("CGRAD_TEAM_STATS")) > 1 ? 2 : 1;
    last_task_end = 0, note_at = 0, in_ops = 0, between_ops = 0, note_t = NULL;
    const double span_t0 = omp_get_wtime();
    double body_t0 = 0, body_t1 = 0;
    /* resume the guard where the last span left it */
    int rest = SHARE;
    const int mode = guard();
    if (mode == CGI_TEAM_GUARD_OFF) rest = LEAVE;
    else if (mode != CGI_TEAM_GUARD_ON && !large) {
        if (gs.phase == FRESH) guard_start(mode);
        if (gs.phase == 2 && !gs.hold && gs.runs >= gs.hold_len) gs.phase = 1, gs.runs = 0, gs.warm = 0; /* probe */
        rest = gs.phase == 1 ? NAP : gs.phase == 0 || gs.hold ? SHARE : LEAVE;
    }
    atomic_init(&tm.rest, rest);
    if (rest == LEAVE) { /* no helpers for this span: no region, no wake */
        tm.helpers = 0;
        my_team = &tm, in_span = true;
        st = body(ctx);
        my_team = NULL, in_span = false;
        return st;
    }
#pragma omp parallel num_threads(n)
    {
        if (omp_get_thread_num() == 0) {
            body_t0 = omp_get_wtime();
            my_team = &tm, in_span = true;
            st = body(ctx);
            my_team = NULL, in_span = false;
            atomic_store_explicit(&tm.stop, 1, memory_order_release);
            body_t1 = omp_get_wtime();
        } else helper_loop(&tm);
    }
    if (team_stats) {
        cgi_team_counts c;
        cgi_team_stats(&c);
        fprintf(stderr, "team: %lld runs with helpers, %lld without, %lld of %lld pieces by helpers, %lld stalls, "
                "thread 0 waited %.1f us a run with helpers; this span %.0f us: thread 0 %.0f us in ops (from the first to "
                "the last), %.0f us between them, %.0f us before its body, %.0f us after\n", c.runs_with_helpers, c.runs_without, c.helper_pieces,
                c.pieces, c.stalls, c.runs_with_helpers ? 1e-3 * (double)c.wait_ns / (double)c.runs_with_helpers : 0.0,
                1e6 * (omp_get_wtime() - span_t0), 1e6 * in_ops, 1e6 * between_ops, 1e6 * (body_t0 - span_t0),
                1e6 * (omp_get_wtime() - body_t1));
    }
    return st;
}

cg_status cg_run_with_team(cg_status (*body)(void *ctx), void *ctx) { return span(body, ctx, false); }

/* A large run (from cgi_run_par_min) as a span opened one parallel region per op before: ~95-185 a
 * training step (bench/regions_per_step.py), each waking the second thread, which sleeps between
 * regions, and joining it again (gpt-tiny: 2 threads ran 252 ms a step where 1 thread's 441 ms over
 * the sgemm's 1.96x speed-up would be 225). In a span the helper stays awake across the ops. Its
 * helpers always share: such a run is timed by the cores guard (graph/cores.c), which holds one
 * thread when another process holds the cores, and the team's guard, which probes a window of runs
 * without helpers, would run 8 large runs at one thread's speed each time. */
bool cgi_team_large(void) { return my_team && my_team->large; }

cg_status cgi_run_graph(double work, bool fp32, cg_status (*body)(void *ctx), void *ctx) {
    const bool large = work >= cgi_run_par_min();
    /* a bf16 graph's products run on oneDNN's threads (ops/bf16.c), which a span would keep on thread 0 */
    if (!cgi_run_in_team(work) || (large && !fp32)) return body(ctx);
    return span(body, ctx, large);
}
