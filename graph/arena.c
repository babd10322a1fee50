/* SPDX-License-Identifier: MIT */
/* Bump arenas in 64-byte-aligned chunks. Reset keeps the memory: if the last build needed
 * several chunks they are merged into one, so the next build of the same graph mallocs nothing.
 * Also the allocation of every large block (cgi_alloc_large). */
#define _DEFAULT_SOURCE /* madvise's MADV_HUGEPAGE */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "graph/internal.h"

/* From 2 MB up a block is aligned to 2 MB and marked for transparent huge pages: with 4 kB pages
 * the weight, activation and gradient streams of a step (and a generated token's 13 MB of weights)
 * miss the TLB every 4 kB, and packing reads 12-32 rows a page or more apart at once. Where the
 * kernel backs every mapping with huge pages anyway ("always"), or never, the advice changes
 * nothing; under "madvise" (this machine, Ubuntu's default) only advised memory gets them. The
 * rounding up to 2 MB costs at most one partly used huge page a block. CGRAD_HUGEPAGES=0 leaves
 * the advice out (comparisons). */
void *cgi_alloc_large(size_t bytes) {
    enum { HUGE = 2 << 20 };
    static _Atomic int advise = -1; /* threads may race to set it: all set the same answer */
    if (advise < 0) advise = !(getenv("CGRAD_HUGEPAGES") && !strcmp(getenv("CGRAD_HUGEPAGES"), "0"));
    if (bytes < HUGE || !advise) return aligned_alloc(CGI_ALIGN, (bytes + CGI_ALIGN - 1) / CGI_ALIGN * CGI_ALIGN);
    const size_t n = (bytes + HUGE - 1) / HUGE * HUGE;
    void *p = aligned_alloc(HUGE, n);
#ifdef MADV_HUGEPAGE
    if (p) madvise(p, n, MADV_HUGEPAGE); /* advice only: memory without it works the same */
#endif
    return p;
}

struct cgi_chunk {
    cgi_chunk *next;
    size_t size, used;
    unsigned char *mem;
};

static cgi_chunk *chunk_new(size_t size) {
    cgi_chunk *c = malloc(sizeof *c);
    if (!c) return NULL;
    c->mem = cgi_alloc_large(size);
    if (!c->mem) {
        free(c);
        return NULL;
    }
    c->next = NULL;
    c->size = size;
    c->used = 0;
    return c;
}

void *cgi_arena_alloc(cgi_arena *a, size_t bytes) {
    bytes = (bytes + CGI_ALIGN - 1) / CGI_ALIGN * CGI_ALIGN;
    if (bytes == 0) bytes = CGI_ALIGN;
    for (;;) {
        cgi_chunk *c = a->cur;
        if (c && c->size - c->used >= bytes) {
            void *p = c->mem + c->used;
            c->used += bytes;
            return p;
        }
        if (c && c->next) { /* a chunk kept from before: use it from its start */
            a->cur = c->next;
            a->cur->used = 0;
            continue;
        }
        size_t want = a->total > bytes ? a->total : bytes;
        if (want < ((size_t)1 << 16)) want = (size_t)1 << 16;
        cgi_chunk *n = chunk_new(want);
        if (!n) {
            cgi_fail(CG_ERR_NOMEM, "[arena] cannot allocate %zu bytes", want);
            return NULL;
        }
        a->total += want;
        if (c) c->next = n; else a->head = n;
        a->cur = n;
    }
}

void cgi_arena_free(cgi_arena *a) {
    for (cgi_chunk *c = a->head, *n; c; c = n) {
        n = c->next;
        free(c->mem);
        free(c);
    }
    a->head = a->cur = NULL;
    a->total = 0;
}

void cgi_arena_reset(cgi_arena *a) {
    if (a->head && a->head->next) {
        size_t total = a->total;
        cgi_arena_free(a);
        a->head = a->cur = chunk_new(total);
        if (a->head) a->total = total;
    }
    if (a->head) a->head->used = 0;
    a->cur = a->head;
}
