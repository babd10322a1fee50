/* SPDX-License-Identifier: MIT */
/* What test_threads and test_threads_ops share: the team's counts over a stretch of runs. */
#ifndef CGRAD_TEAM_CHECK_H
#define CGRAD_TEAM_CHECK_H
#include "graph/internal.h"

/* The team's counts (cgi_team_stats) since a. */
static inline cgi_team_counts team_delta(const cgi_team_counts *a) {
    cgi_team_counts b;
    cgi_team_stats(&b);
    return (cgi_team_counts){b.runs_with_helpers - a->runs_with_helpers, b.runs_without - a->runs_without,
                             b.helper_pieces - a->helper_pieces, b.stalls - a->stalls, b.pieces - a->pieces,
                             b.wait_ns - a->wait_ns, b.naps - a->naps};
}

#endif
