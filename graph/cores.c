/* SPDX-License-Identifier: MIT */
/* The cores guard: a graph run on more threads than one only pays when those threads get cores.
 *
 * Why: beside one other busy process, Linux (autogroups: each session its share) gives this
 * process about one core's time whatever its thread count. Two threads then do the step's work plus
 * what a second thread adds (each product piece packs the uncut operand again, each parallel region
 * wakes a vCPU: 5-10% more CPU time in an encdec-base step) in that one core's time, and lose to one
 * thread: beside a `yes`, encdec-base took 1160-1185 ms a step on two threads against 1111-1147 on
 * one (docs/performance.md, "Kernel sets and threads").
 *
 * So each large run (the ones that use every thread, cgi_run_threads) reads how long the process's
 * threads waited for a CPU while it ran: the run delay of /proc/self/task/N/schedstat, time spent
 * runnable but not running, which the guard takes per thread of the run. On an idle machine that
 * is under 1% of a run (the vCPU wakes); past an eighth of the run in two runs in a row, the next
 * runs probe one thread. The faster side per unit of work (cgi_graph_work) is then held: one thread
 * for HOLD_MIN runs, doubling while it keeps winning, before every thread is timed again; or every
 * thread, with the watch paused for HOLD_MIN runs, doubling. Each side is timed over WINDOW runs
 * (two forwards and two backwards) after one run that lets a switch settle. One thread keeps ties
 * within 2%: it wins the same speed on half the CPU.
 *
 * Results do not depend on the thread count (every reduction has fixed partitions; test_cores
 * trains across forced switches bit for bit), so a switch changes the speed only.
 * CGRAD_CORES_GUARD=off keeps every large run on every thread; =stats prints each decision, =trace
 * each run too. */
#define _DEFAULT_SOURCE /* syscall */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <omp.h>

#include "graph/internal.h"

enum { WINDOW = CGI_CORES_WINDOW, HOLD_MIN = 16, HOLD_MAX = 1024 };
#define DELAY_SHARE 0.125 /* run delay per thread of the run, as a share of its wall time */
#define ONE_KEEPS 1.02   /* one thread wins unless every thread is this much faster */

static const char *phase_name[] = {"watch", "probe one thread", "hold one thread", "retry every thread"};

static double rate(const cgi_cores_guard *g, int side) {
    double t = 0, w = 0;
    for (int i = 0; i < WINDOW; i++) t += g->t[side][i], w += g->w[side][i];
    return t / (w > 0 ? w : 1);
}

static void enter(cgi_cores_guard *g, int phase) {
    g->phase = phase, g->runs = 0, g->settle = phase == CGI_CORES_HOLD ? 0 : 1, g->contended = 0;
    g->switches += phase == CGI_CORES_PROBE || phase == CGI_CORES_RETRY;
}

bool cgi_cores_one(const cgi_cores_guard *g) { return g->phase == CGI_CORES_PROBE || g->phase == CGI_CORES_HOLD; }

void cgi_cores_feed(cgi_cores_guard *g, double seconds, double delay, double work) {
    const int side = cgi_cores_one(g);
    side ? g->runs_one++ : g->runs_all++;
    if (!g->started) g->started = true, g->settle = 2; /* a graph's first runs touch their memory first */
    if (g->settle) {
        g->settle--;
        return;
    }
    const int slot = g->filled[side]++ % WINDOW;
    g->t[side][slot] = seconds, g->w[side][slot] = work;
    switch (g->phase) {
    case CGI_CORES_WATCH:
        if (g->quiet > 0) {
            g->quiet--;
            return;
        }
        g->contended = delay > DELAY_SHARE * seconds ? g->contended + 1 : 0;
        if (g->contended >= 2 && g->filled[0] >= WINDOW) enter(g, CGI_CORES_PROBE);
        return;
    case CGI_CORES_PROBE:
    case CGI_CORES_RETRY:
        if (++g->runs < WINDOW) return;
        if (rate(g, 1) < ONE_KEEPS * rate(g, 0)) {
            /* one thread won: held for longer each time it wins again */
            g->hold_len = g->phase == CGI_CORES_RETRY && g->hold_len ? 2 * g->hold_len : HOLD_MIN;
            if (g->hold_len > HOLD_MAX) g->hold_len = HOLD_MAX;
            g->quiet_len = 0;
            enter(g, CGI_CORES_HOLD);
        } else {
            /* every thread won: the watch rests, for longer each time a probe finds the same */
            g->quiet_len = g->phase == CGI_CORES_PROBE && g->quiet_len ? 2 * g->quiet_len : HOLD_MIN;
            if (g->quiet_len > HOLD_MAX) g->quiet_len = HOLD_MAX;
            g->hold_len = 0;
            enter(g, CGI_CORES_WATCH);
            g->quiet = g->quiet_len, g->settle = 0;
        }
        return;
    case CGI_CORES_HOLD:
        if (++g->runs >= g->hold_len) enter(g, CGI_CORES_RETRY);
        return;
    }
}

/* ---- the process's guard ---- */

static cgi_cores_guard guard;                /* under guard_lock */
static pthread_mutex_t guard_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic bool holding;                 /* cgi_cores_one(&guard), for readers without the lock */
static _Atomic int forced = -1;              /* tests: 1 one thread, 0 every thread, -1 the guard decides */
static _Atomic int mode = -1; /* 0 off, 1 on, 2 printing decisions, 3 and every run; CGRAD_CORES_GUARD, read once */

static int guard_mode(void) {
    if (mode < 0) {
        const char *e = getenv("CGRAD_CORES_GUARD");
        mode = e && (!strcmp(e, "off") || !strcmp(e, "0")) ? 0 : e && !strcmp(e, "stats") ? 2 : e && !strcmp(e, "trace") ? 3 : 1;
    }
    return mode;
}

const char *cgi_cores_describe(void) {
    if (cg_threads() < 2) return "idle (one thread)";
    return guard_mode() ? "on (one thread while other processes hold the cores)" : "off (CGRAD_CORES_GUARD)";
}

void cgi_cores_set_mode(int m) {
    pthread_mutex_lock(&guard_lock);
    atomic_store(&mode, m);
    guard = (cgi_cores_guard){0};
    atomic_store(&holding, false);
    pthread_mutex_unlock(&guard_lock);
}

bool cgi_cores_holding_one(void) {
    const int f = atomic_load_explicit(&forced, memory_order_relaxed);
    return f >= 0 ? f : guard_mode() && atomic_load_explicit(&holding, memory_order_relaxed);
}

void cgi_cores_force(int one) { atomic_store(&forced, one); }

void cgi_cores_counts(long long *runs_all, long long *runs_one, long long *switches) {
    pthread_mutex_lock(&guard_lock);
    *runs_all = guard.runs_all, *runs_one = guard.runs_one, *switches = guard.switches;
    pthread_mutex_unlock(&guard_lock);
}

const char *cgi_cores_summary(void) {
    static _Thread_local char line[256];
    long long all, one, probes;
    cgi_cores_counts(&all, &one, &probes);
    if (!one) return NULL;
    snprintf(line, sizeof line, "cores guard: %lld of %lld graph runs on one thread, %lld probe(s): the other threads "
             "waited for a CPU (another process held the cores; CGRAD_CORES_GUARD=off keeps every thread)", one, all + one,
             probes);
    return line;
}

/* Seconds the process's threads have spent runnable but not running, summed; negative where
 * /proc/self/task/N/schedstat cannot be read (the guard then stays out of the way). With file
 * descriptors and buffers on the stack: no allocation in a training loop (opendir and stdio's FILE
 * would take some on every run). */
typedef struct { /* the kernel's record from getdents64 */
    uint64_t ino;
    int64_t off;
    unsigned short reclen;
    unsigned char type;
    char name[];
} linux_dirent64;

static double run_delay(void) {
    const int dir = open("/proc/self/task", O_RDONLY | O_DIRECTORY);
    if (dir < 0) return -1;
    double sum = 0;
    bool any = false;
    char ents[4096];
    for (long got; (got = syscall(SYS_getdents64, dir, ents, sizeof ents)) > 0;)
        for (long at = 0; at < got;) {
            unsigned short reclen;
            memcpy(&reclen, ents + at + offsetof(linux_dirent64, reclen), sizeof reclen);
            const char *name = ents + at + offsetof(linux_dirent64, name);
            at += reclen;
            if (name[0] == '.') continue;
            char path[64], text[128];
            snprintf(path, sizeof path, "%.20s/schedstat", name);
            const int f = openat(dir, path, O_RDONLY);
            if (f < 0) continue;
            const ssize_t n = read(f, text, sizeof text - 1);
            close(f);
            if (n <= 0) continue;
            text[n] = 0;
            char *end;
            strtoull(text, &end, 10); /* the thread's CPU time, then its run delay, in ns */
            sum += (double)strtoull(end, NULL, 10) * 1e-9, any = true;
        }
    close(dir);
    return any ? sum : -1;
}

cgi_run cgi_run_open(double work, bool one) {
    const int threads = one ? 1 : cgi_run_threads(work);
    cgi_run r = {cgi_run_begin(threads), threads, work, 0, 0, false};
    /* a large run's team span (graph/team.c) runs its kernels on thread 0 and shares their pieces
     * with helpers: every thread's run, as the guard counts it */
    const bool large_team = one && cgi_team_large();
    if (large_team) r.threads = cg_threads();
    /* the outermost run of one that every thread could take: timed for the guard */
    if ((!one || large_team) && r.was == 0 && cg_threads() > 1 && work >= cgi_run_par_min() && guard_mode()) {
        r.d0 = run_delay();
        r.timed = r.d0 >= 0;
        r.t0 = omp_get_wtime();
    }
    return r;
}

void cgi_run_close(const cgi_run *r) {
    cgi_run_end(r->was);
    if (!r->timed) return;
    const double dt = omp_get_wtime() - r->t0, d1 = run_delay();
    if (d1 < 0) return;
    pthread_mutex_lock(&guard_lock);
    const int before = guard.phase;
    const bool one = cgi_cores_one(&guard);
    cgi_cores_feed(&guard, dt, (d1 - r->d0) / r->threads, r->work);
    atomic_store_explicit(&holding, cgi_cores_one(&guard), memory_order_relaxed);
    if (guard_mode() == 3)
        fprintf(stderr, "cores guard: %s run of %.1f ms, run delay %.0f%% of it a thread\n", one ? "one-thread" : "all-thread",
                1e3 * dt, 100 * (d1 - r->d0) / r->threads / dt);
    if (guard_mode() >= 2 && guard.phase != before)
        fprintf(stderr, "cores guard: %s -> %s (run of %.1f ms, run delay %.0f%% of it a thread; per unit of work: "
                "every thread %.3g, one %.3g)\n", phase_name[before], phase_name[guard.phase], 1e3 * dt,
                100 * (d1 - r->d0) / r->threads / dt, rate(&guard, 0), rate(&guard, 1));
    pthread_mutex_unlock(&guard_lock);
}
