/* SPDX-License-Identifier: MIT */
/* The memory plan's placement (graph/plan_place.c): where in the block each buffer goes, once
 * graph/plan.c has given every buffer its life on the plan's time axis. */
#ifndef CGRAD_GRAPH_PLAN_PLACE_H
#define CGRAD_GRAPH_PLAN_PLACE_H

#include <stdint.h>
#include <stddef.h>

#include "graph/internal.h"

typedef struct {
    int64_t birth, death; /* inclusive times */
    size_t bytes, offset;
    void **target;        /* where the address goes */
    const cg_tensor *node;
    char kind;            /* 'v' value, 'r' recomputed value, 'g' gradient, 'a' op scratch */
} cgi_plan_buffer;

/* Gives every buffer an offset in the block, largest first while that stays within its step
 * budget, else by a sweep of the time axis (CGRAD_PLAN_ALLOC=sweep or largest-first forces one);
 * order is scratch for nb pointers. The block's size, or SIZE_MAX without memory; *steps counts
 * the work, for the test of the planner's growth. */
size_t cgi_plan_place(cgi_plan_buffer *bufs, cgi_plan_buffer **order, int nb, uint64_t *steps);

/* The first time (of 0..end) at which the buffers' live bytes are most, and those bytes in *peak;
 * -1 without memory for the count. */
int64_t cgi_plan_peak_time(const cgi_plan_buffer *bufs, int nb, int64_t end, int64_t *peak);

/* Prints what the block holds at its fullest moment (CGRAD_PLAN=1; =2 also sums it per op). */
void cgi_plan_print(cgi_plan_buffer *bufs, cgi_plan_buffer **order, int nb, size_t total, int64_t end);

#endif
