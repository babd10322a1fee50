/* SPDX-License-Identifier: MIT */
/* The spirals example, run as a test: it must keep reaching 100% training accuracy and >= 95%
 * on held-out points, so an API change or a wrong gradient that breaks it fails here. */
#include "check.h"
#define SPIRALS_NO_MAIN
#include "../examples/spirals.c"

/* The data generator: balanced labels, every point on the ring 0.1 <= r <= 1 up to noise, and
 * each point of class 1 (noise aside) half a turn away from a class-0 arm, i.e. the two arms
 * interleave rather than overlap. */
static void test_data(void) {
    cg_real x[2 * 2 * 50];
    int32_t y[2 * 50];
    cg_rng r;
    cg_rng_seed(&r, 42);
    spirals_data(&r, 50, x, y);
    int ones = 0, ring = 0;
    for (int i = 0; i < 100; i++) {
        ones += y[i] == 1;
        double rad = hypot(x[2 * i], x[2 * i + 1]);
        ring += rad > 0.1 - 0.1 && rad < 1 + 0.1; /* 0.1 = 5 standard deviations of noise */
    }
    CHECK(ones == 50, "%d of 100 points are class 1", ones);
    CHECK(y[0] == 0 && y[99] == 1, "labels %d, %d: class 0 first, then class 1", y[0], y[99]);
    CHECK(ring == 100, "%d of 100 points lie near the ring 0.1 <= r <= 1", ring);

    cg_real x2[2 * 2 * 50];
    int32_t y2[2 * 50];
    spirals_data(&r, 50, x2, y2); /* the held-out sample must be new points, not a copy */
    int same = 0;
    for (int i = 0; i < 200; i++) same += x[i] == x2[i];
    CHECK(same == 0, "%d coordinates repeat in a second sample", same);
}

static void test_train(uint64_t seed) {
    spirals_result r;
    cg_status st = spirals_train(seed, false, &r);
    CHECK(st == CG_OK, "seed %llu: %s", (unsigned long long)seed, cg_last_error());
    if (st) return;
    printf("seed %llu: %d steps, loss %.4f, train %.1f%%, held-out %.1f%%\n", (unsigned long long)seed, r.steps,
           r.loss, 100 * r.train_acc, 100 * r.test_acc);
    CHECK(r.train_acc == 1, "seed %llu: train accuracy %.4f", (unsigned long long)seed, r.train_acc);
    CHECK(r.test_acc >= 0.95, "seed %llu: held-out accuracy %.4f", (unsigned long long)seed, r.test_acc);
    CHECK(r.steps < MAX_STEPS, "seed %llu: %d steps", (unsigned long long)seed, r.steps);
    CHECK(r.loss >= 0 && r.loss < 0.2, "seed %llu: last loss %g", (unsigned long long)seed, r.loss);
}

int main(void) {
    /* Matrices of 80 x 64 gain nothing from threads, and on a loaded machine waiting for a
     * second thread made this test 10x slower; the threaded kernels have their own tests. */
    cg_set_threads(1);
    test_data();
    test_train(1);
    test_train(2); /* a second seed, so passing is not one lucky initialisation */
    TEST_END();
}
