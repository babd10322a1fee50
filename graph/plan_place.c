/* SPDX-License-Identifier: MIT */
/* The memory plan's placement: offsets in one block for buffers whose lives (graph/plan.c) are
 * given, so that buffers live at the same time never overlap and the block stays near the peak of
 * live bytes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/plan_place.h"

/* Free address ranges of the block, as a treap keyed by offset whose nodes also carry the
 * largest free size in their subtree: first fit by address is then one descent, and the ranges on
 * either side of a freed cgi_plan_buffer are its neighbours in key order, so each allocation and each free
 * costs O(log n). Priorities come from a fixed hash of the slot, so the plan is deterministic. */
typedef struct {
    size_t lo, size, max_size; /* the range [lo, lo + size) and the largest size below */
    int left, right;           /* slots, -1 for none */
    uint32_t prio;
} free_range;

typedef struct {
    free_range *r;
    int *spare; /* slots freed by merges, reused before new ones */
    int nspare, used, root;
    uint64_t steps; /* nodes visited, for the test of the planner's growth */
} free_map;

static size_t max3(size_t a, size_t b, size_t c) { return a > b ? (a > c ? a : c) : (b > c ? b : c); }

static void fm_fix(free_map *m, int x) {
    free_range *r = &m->r[x];
    r->max_size = max3(r->size, r->left >= 0 ? m->r[r->left].max_size : 0, r->right >= 0 ? m->r[r->right].max_size : 0);
}

/* Splits the treap at x into ranges below lo (*a) and from lo on (*b). */
static void fm_split(free_map *m, int x, size_t lo, int *a, int *b) {
    m->steps++;
    if (x < 0) {
        *a = *b = -1;
        return;
    }
    if (m->r[x].lo < lo) {
        fm_split(m, m->r[x].right, lo, &m->r[x].right, b);
        *a = x;
    } else {
        fm_split(m, m->r[x].left, lo, a, &m->r[x].left);
        *b = x;
    }
    fm_fix(m, x);
}

/* Joins treaps a and b where every key of a is below every key of b. */
static int fm_join(free_map *m, int a, int b) {
    m->steps++;
    if (a < 0) return b;
    if (b < 0) return a;
    if (m->r[a].prio > m->r[b].prio) {
        m->r[a].right = fm_join(m, m->r[a].right, b);
        fm_fix(m, a);
        return a;
    }
    m->r[b].left = fm_join(m, a, m->r[b].left);
    fm_fix(m, b);
    return b;
}

static void fm_insert(free_map *m, size_t lo, size_t size) {
    int x = m->nspare ? m->spare[--m->nspare] : m->used++;
    m->r[x] = (free_range){lo, size, size, -1, -1, (uint32_t)(((uint64_t)x + 1) * 0x9E3779B97F4A7C15ull >> 32)};
    int a, b;
    fm_split(m, m->root, lo, &a, &b);
    m->root = fm_join(m, fm_join(m, a, x), b);
}

/* Removes and returns the slot of the range starting at lo (which must exist). */
static int fm_take(free_map *m, size_t lo) {
    int a, b, c, d;
    fm_split(m, m->root, lo, &a, &b);
    fm_split(m, b, lo + 1, &c, &d);
    m->root = fm_join(m, a, d);
    m->spare[m->nspare++] = c;
    return c;
}

/* The lowest range of at least size bytes, or -1. */
static int fm_first_fit(free_map *m, size_t size) {
    int x = m->root;
    if (x < 0 || m->r[x].max_size < size) return -1;
    for (;; m->steps++) {
        const free_range *r = &m->r[x];
        if (r->left >= 0 && m->r[r->left].max_size >= size) x = r->left;
        else if (r->size >= size) return x;
        else x = r->right;
    }
}

/* The range ending exactly at hi, or -1. */
static int fm_ending_at(free_map *m, size_t hi) {
    int x = m->root, best = -1;
    for (; x >= 0; m->steps++) { /* the last range starting below hi */
        if (m->r[x].lo < hi) best = x, x = m->r[x].right;
        else x = m->r[x].left;
    }
    return best >= 0 && m->r[best].lo + m->r[best].size == hi ? best : -1;
}

/* The range starting exactly at lo, or -1. */
static int fm_starting_at(free_map *m, size_t lo) {
    int x = m->root;
    for (; x >= 0 && m->r[x].lo != lo; m->steps++) x = lo < m->r[x].lo ? m->r[x].left : m->r[x].right;
    return x;
}

/* Places a buffer: the lowest free range that holds it, else the top of the block (taking a free
 * range that reaches the top, so the block grows by as little as possible). */
static size_t fm_alloc(free_map *m, size_t bytes, size_t *top) {
    int x = fm_first_fit(m, bytes);
    if (x < 0) {
        int t = fm_ending_at(m, *top);
        size_t at = t >= 0 ? m->r[t].lo : *top;
        if (t >= 0) fm_take(m, at);
        *top = at + bytes;
        return at;
    }
    const size_t at = m->r[x].lo, size = m->r[x].size;
    fm_take(m, at);
    if (size > bytes) fm_insert(m, at + bytes, size - bytes);
    return at;
}

/* Returns [lo, lo + bytes) to the map, merged with free neighbours. */
static void fm_free(free_map *m, size_t lo, size_t bytes) {
    int below = fm_ending_at(m, lo), above = fm_starting_at(m, lo + bytes);
    if (below >= 0) {
        const size_t blo = m->r[below].lo;
        bytes += lo - blo;
        lo = blo;
        fm_take(m, blo);
    }
    if (above >= 0) {
        bytes += m->r[above].size;
        fm_take(m, m->r[above].lo);
    }
    fm_insert(m, lo, bytes);
}

/* A birth or death on the plan's time axis; at one time births come first (lives are inclusive),
 * the longer-lived before the shorter (an op's scratch for one time above the values that outlive
 * it, not between them), then larger buffers before smaller ones. */
typedef struct {
    int64_t time;
    int death;
    int64_t until; /* births: the buffer's death */
    size_t bytes;
    int buf;
} event;

static int by_time(const void *a, const void *b) {
    const event *x = a, *y = b;
    if (x->time != y->time) return x->time < y->time ? -1 : 1;
    if (x->death != y->death) return x->death - y->death;
    if (x->until != y->until) return x->until > y->until ? -1 : 1;
    if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1;
    return x->buf - y->buf;
}

static int by_size_desc(const void *a, const void *b) {
    const cgi_plan_buffer *x = *(const cgi_plan_buffer *const *)a, *y = *(const cgi_plan_buffer *const *)b;
    if (x->bytes != y->bytes) return x->bytes < y->bytes ? 1 : -1;
    return x->birth < y->birth ? -1 : x->birth > y->birth;
}

typedef struct {
    size_t lo, hi;
} span;

static int by_lo(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Steps the exact placement may take before the sweep takes over: about 1.5 ms, twice what
 * gpt-small (12 layers, 361 buffers) needs. */
enum { GREEDY_BUDGET = 1 << 19 };

/* Largest cgi_plan_buffer first, each at the lowest offset clear of the buffers already placed that live
 * at the same time: on the zoo's graphs the block comes out at the peak of live bytes, where the
 * sweep loses up to 2%. Its work grows with the square of the cgi_plan_buffer count, so it gives up (and
 * returns SIZE_MAX) past budget steps. */
static size_t place_largest_first(cgi_plan_buffer *bufs, cgi_plan_buffer **order, span *used, int nb, size_t budget, uint64_t *steps) {
    if ((size_t)nb * (size_t)nb / 2 > budget) return SIZE_MAX; /* the pairs alone would overrun it */
    for (int i = 0; i < nb; i++) order[i] = &bufs[i];
    qsort(order, (size_t)nb, sizeof *order, by_size_desc);
    size_t total = 0, work = 0;
    for (int i = 0; i < nb; i++) {
        cgi_plan_buffer *b = order[i];
        int nu = 0;
        for (int j = 0; j < i; j++) {
            const cgi_plan_buffer *o = order[j];
            if (o->birth <= b->death && b->birth <= o->death) used[nu++] = (span){o->offset, o->offset + o->bytes};
        }
        work += (size_t)i + (size_t)nu * 8;
        *steps = work;
        if (work > budget) return SIZE_MAX;
        qsort(used, (size_t)nu, sizeof *used, by_lo);
        size_t at = 0;
        for (int j = 0; j < nu; j++) {
            if (used[j].lo >= at + b->bytes) break;
            if (used[j].hi > at) at = used[j].hi;
        }
        b->offset = at;
        if (at + b->bytes > total) total = at + b->bytes;
    }
    return total;
}

/* Gives every cgi_plan_buffer an offset by sweeping the time axis: a cgi_plan_buffer takes memory at its birth and
 * returns it after its death, O(n log n) in all. Returns the block size, or SIZE_MAX when out of
 * memory. */
static size_t place_sweep(cgi_plan_buffer *bufs, int nb, uint64_t *steps) {
    event *ev = malloc((size_t)(2 * nb + 1) * sizeof *ev);
    free_map m = {malloc((size_t)(nb + 1) * sizeof *m.r), malloc((size_t)(nb + 1) * sizeof *m.spare), 0, 0, -1, 0};
    size_t top = 0;
    if (!ev || !m.r || !m.spare) {
        top = SIZE_MAX;
        goto done;
    }
    for (int i = 0; i < nb; i++) {
        ev[2 * i] = (event){bufs[i].birth, 0, bufs[i].death, bufs[i].bytes, i};
        ev[2 * i + 1] = (event){bufs[i].death, 1, 0, bufs[i].bytes, i};
    }
    qsort(ev, (size_t)(2 * nb), sizeof *ev, by_time);
    for (int e = 0; e < 2 * nb; e++) {
        cgi_plan_buffer *b = &bufs[ev[e].buf];
        if (!ev[e].death) b->offset = fm_alloc(&m, b->bytes, &top);
        else fm_free(&m, b->offset, b->bytes);
    }
    *steps += m.steps + 2 * (uint64_t)nb;
done:
    free(ev);
    free(m.r);
    free(m.spare);
    return top;
}

int64_t cgi_plan_peak_time(const cgi_plan_buffer *bufs, int nb, int64_t end, int64_t *peak) {
    int64_t *delta = calloc((size_t)end + 2, sizeof *delta);
    *peak = 0;
    if (!delta) return -1;
    for (int i = 0; i < nb; i++) {
        delta[bufs[i].birth] += (int64_t)bufs[i].bytes;
        delta[bufs[i].death + 1] -= (int64_t)bufs[i].bytes;
    }
    int64_t peak_t = 0, live = 0;
    for (int64_t tm = 0; tm <= end; tm++) {
        live += delta[tm];
        if (live > *peak) *peak = live, peak_t = tm;
    }
    free(delta);
    return peak_t;
}

void cgi_plan_print(cgi_plan_buffer *bufs, cgi_plan_buffer **order, int nb, size_t total, int64_t end) {
    int64_t peak;
    const int64_t peak_t = cgi_plan_peak_time(bufs, nb, end, &peak);
    if (peak_t < 0) return;
    for (int i = 0; i < nb; i++) order[i] = &bufs[i];
    qsort(order, (size_t)nb, sizeof *order, by_size_desc);
    fprintf(stderr, "[plan] %d buffers in %.1f MB; %.1f MB live at time %lld of %lld, the largest:\n", nb,
            (double)total / 1e6, (double)peak / 1e6, (long long)peak_t, (long long)end);
    for (int i = 0, shown = 0; i < nb && shown < 12; i++) {
        const cgi_plan_buffer *b = order[i];
        if (b->birth > peak_t || peak_t > b->death) continue;
        fprintf(stderr, "  %8.1f MB %c %-14s %s [%lld, %lld]\n", (double)b->bytes / 1e6, b->kind,
                cgi_ops[b->node->op].name, cgi_shp(b->node), (long long)b->birth, (long long)b->death);
        shown++;
    }
    if (atoi(getenv("CGRAD_PLAN")) < 2) return;
    /* CGRAD_PLAN=2: everything live at the peak, summed per kind, op and storage format */
    enum { GROUPS = 256 };
    struct peak_group { char kind; int op; bool bf16; size_t bytes; int count; } grp[GROUPS];
    int ng = 0;
    for (int i = 0; i < nb; i++) {
        const cgi_plan_buffer *b = &bufs[i];
        if (b->birth > peak_t || peak_t > b->death) continue;
        const bool h = b->kind == 'v' && b->node->lp_value;
        int k = 0;
        while (k < ng && !(grp[k].kind == b->kind && grp[k].op == b->node->op && grp[k].bf16 == h)) k++;
        if (k == ng && ng < GROUPS) grp[ng++] = (struct peak_group){b->kind, b->node->op, h, 0, 0};
        if (k < ng) grp[k].bytes += b->bytes, grp[k].count++;
    }
    for (int k = 0; k < ng; k++)
        fprintf(stderr, "  [peak] %8.1f MB %c %-22s %-4s x%d\n", (double)grp[k].bytes / 1e6, grp[k].kind,
                cgi_ops[grp[k].op].name, grp[k].bf16 ? "bf16" : "", grp[k].count);
}

size_t cgi_plan_place(cgi_plan_buffer *bufs, cgi_plan_buffer **order, int nb, uint64_t *steps) {
    const char *alloc = getenv("CGRAD_PLAN_ALLOC");
    const bool sweep_only = alloc && !strcmp(alloc, "sweep"), exact_only = alloc && !strcmp(alloc, "largest-first");
    size_t total = SIZE_MAX;
    if (!sweep_only) {
        span *used = malloc((size_t)(nb > 0 ? nb : 1) * sizeof *used);
        if (used) total = place_largest_first(bufs, order, used, nb, exact_only ? SIZE_MAX : GREEDY_BUDGET, steps);
        free(used);
    }
    return total == SIZE_MAX ? place_sweep(bufs, nb, steps) : total;
}
