/* SPDX-License-Identifier: MIT */
/* Training progress figures: throughput and ETA from the last CLI_RATE_WINDOW steps only. A
 * cumulative average counts start-up, the step-0 evaluation and every saved checkpoint as training
 * time, and on a loaded machine it lags the present by minutes; a window follows what the run does
 * now. One definition serves the progress line and the metrics files. */
#include "cli/session.h"

void cli_rate_add(cli_rate *r, double seconds, int64_t tokens) {
    const int k = r->n % CLI_RATE_WINDOW;
    if (r->n >= CLI_RATE_WINDOW) r->sum_s -= r->s[k], r->sum_tokens -= r->tokens[k];
    r->s[k] = seconds, r->tokens[k] = tokens;
    r->sum_s += seconds, r->sum_tokens += tokens;
    r->n++;
    if (r->n % (64 * CLI_RATE_WINDOW) == 0) { /* re-add now and then: the running sums do not drift */
        r->sum_s = 0, r->sum_tokens = 0;
        for (int i = 0; i < CLI_RATE_WINDOW; i++) r->sum_s += r->s[i], r->sum_tokens += r->tokens[i];
    }
}

double cli_rate_tokens_per_s(const cli_rate *r) { return r->n && r->sum_s > 0 ? (double)r->sum_tokens / r->sum_s : 0; }

double cli_rate_eta(const cli_rate *r, int64_t steps_left, int64_t evals_left, double eval_s) {
    if (!r->n) return -1;
    const int in_window = r->n < CLI_RATE_WINDOW ? (int)r->n : CLI_RATE_WINDOW;
    return r->sum_s / in_window * (double)steps_left + (eval_s > 0 ? eval_s * (double)evals_left : 0);
}
