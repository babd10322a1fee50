/* SPDX-License-Identifier: MIT */
/* The progress figures of cgrad train (cli/progress.c) on hand-made step times: tokens per second
 * over the last CLI_RATE_WINDOW steps only, and an ETA from those steps plus the evaluations left,
 * so a slow start (start-up, the step-0 evaluation, a first step that faults its pages in) stops
 * counting once it leaves the window. */
#include <math.h>
#include <string.h>

#include "check.h"
#include "cli/session.h"

int main(void) {
    cli_rate r;
    memset(&r, 0, sizeof r);
    CHECK(cli_rate_eta(&r, 10, 0, 0) < 0 && cli_rate_tokens_per_s(&r) == 0, "no step yet: no estimate");

    /* A first step of 100 s (start-up) then steps of 1 s, 1000 tokens each. */
    cli_rate_add(&r, 100, 1000);
    CHECK(fabs(cli_rate_tokens_per_s(&r) - 10) < 1e-12, "after one step: %g tok/s, want 10", cli_rate_tokens_per_s(&r));
    CHECK(fabs(cli_rate_eta(&r, 5, 0, 0) - 500) < 1e-9, "eta %g, want 500", cli_rate_eta(&r, 5, 0, 0));
    for (int i = 0; i < 4; i++) cli_rate_add(&r, 1, 1000);
    /* window (100 + 4) s over 5 steps: 5000 / 104 tok/s, 20.8 s a step */
    CHECK(fabs(cli_rate_tokens_per_s(&r) - 5000.0 / 104) < 1e-9, "5 steps: %g", cli_rate_tokens_per_s(&r));
    CHECK(fabs(cli_rate_eta(&r, 10, 0, 0) - 208) < 1e-9, "5 steps eta %g, want 208", cli_rate_eta(&r, 10, 0, 0));
    for (int i = 0; i < CLI_RATE_WINDOW - 5; i++) cli_rate_add(&r, 1, 1000);
    CHECK(fabs(cli_rate_eta(&r, 10, 0, 0) - (10.0 * (100 + CLI_RATE_WINDOW - 1) / CLI_RATE_WINDOW)) < 1e-9,
          "full window still holds the slow step: %g", cli_rate_eta(&r, 10, 0, 0));
    cli_rate_add(&r, 1, 1000); /* the slow first step leaves the window */
    CHECK(fabs(cli_rate_tokens_per_s(&r) - 1000) < 1e-9, "steady: %g tok/s, want 1000", cli_rate_tokens_per_s(&r));
    CHECK(fabs(cli_rate_eta(&r, 300, 0, 0) - 300) < 1e-9, "steady eta %g, want 300", cli_rate_eta(&r, 300, 0, 0));
    /* evaluations left count at their own measured cost */
    CHECK(fabs(cli_rate_eta(&r, 300, 3, 7.5) - 322.5) < 1e-9, "eta with 3 evaluations of 7.5 s: %g",
          cli_rate_eta(&r, 300, 3, 7.5));
    /* a slow-down shows within the window: 20 steps of 2 s, 500 tokens */
    for (int i = 0; i < CLI_RATE_WINDOW; i++) cli_rate_add(&r, 2, 500);
    CHECK(fabs(cli_rate_tokens_per_s(&r) - 250) < 1e-9, "slowed: %g tok/s, want 250", cli_rate_tokens_per_s(&r));
    /* long runs: the running sums are re-added and stay exact */
    for (int i = 0; i < 5000; i++) cli_rate_add(&r, 0.1 * (1 + i % 3), 300);
    double s = 0;
    for (int i = 5000 - CLI_RATE_WINDOW; i < 5000; i++) s += 0.1 * (1 + i % 3);
    CHECK(fabs(cli_rate_tokens_per_s(&r) - 300.0 * CLI_RATE_WINDOW / s) < 1e-6, "after 5000 steps: %g, want %g",
          cli_rate_tokens_per_s(&r), 300.0 * CLI_RATE_WINDOW / s);
    TEST_END();
}
