/* SPDX-License-Identifier: MIT */
/* bench_head: a language model's loss head, fused (cg_linear_cross_entropy) against the composite
 * (cg_linear, then cg_cross_entropy on the full [rows, vocab] logits), forward + backward, 1 chunk
 * or many, interleaved repetitions, the weight and bias parameters whose gradients are zeroed before
 * each pass. Usage: bench_head [reps] [rows] [d] [vocab] [threads] [bias 0/1].
 * encdec-base: 1024 512 8000 1 1; gpt-small: 1024 768 50304 1 0; gpt-tiny: 4096 256 256 1 0.
 *
 * bench_head step [reps] [batch] [context] [threads] [d] [layers] [vocab]: a whole GPT-2 training
 * step's forward + backward (cgrad bench's gpt-small by default: 4 x 256 tokens, d 768, 12 layers,
 * vocab 50304), built twice on one parameter set, with the head fused with its loss (cg_gpt_loss,
 * as training graphs are built) and unfused (cg_gpt_logits, then cg_cross_entropy), interleaved. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_timing.h"
#include "models/gpt.h"
#include <cgrad/cgrad.h>

/* As bench_interleaved, with the parameters' gradients zeroed before each pass, as a training step
 * does (the fused head writes its weight's gradient ahead only when it is the first writer). */
static void interleaved_steps(bench_timed *t, cg_params *ps, int reps) {
    for (int k = 0; k < reps; k++)
        for (int i = 0; i < 2; i++) {
            const double t0 = omp_get_wtime(), c0 = bench_cpu_now();
            cg_params_zero_grad(ps);
            cg_graph_forward(t[i].g);
            cg_graph_backward(t[i].g, t[i].loss);
            t[i].ms[k] = (omp_get_wtime() - t0) * 1e3;
            t[i].cpu[k] = (bench_cpu_now() - c0) * 1e3;
        }
    for (int i = 0; i < 2; i++) {
        qsort(t[i].ms, (size_t)reps, sizeof(double), bench_cmp);
        qsort(t[i].cpu, (size_t)reps, sizeof(double), bench_cmp);
    }
}

/* Prints the variants' medians and spreads and their ratio, and frees them. */
static void report(bench_timed *ts, const char *const *names, int reps) {
    for (int i = 0; i < 2; i++)
        printf("%-24s %8.2f [%7.2f, %7.2f] ms, cpu %8.2f [%8.2f, %8.2f] ms\n", names[i], ts[i].ms[reps / 2], ts[i].ms[0],
               ts[i].ms[reps - 1], ts[i].cpu[reps / 2], ts[i].cpu[0], ts[i].cpu[reps - 1]);
    printf("fused / unfused: wall %.3f, cpu %.3f\n", ts[1].ms[reps / 2] / ts[0].ms[reps / 2],
           ts[1].cpu[reps / 2] / ts[0].cpu[reps / 2]);
    for (int i = 0; i < 2; i++) bench_free(&ts[i]);
}

static int bench_step(int argc, char **argv) {
    const int reps = argc > 2 ? atoi(argv[2]) : 5;
    const int64_t batch = argc > 3 ? atoll(argv[3]) : 4, ctx = argc > 4 ? atoll(argv[4]) : 256;
    cg_set_threads(argc > 5 ? atoi(argv[5]) : 0);
    cg_gpt_config cfg = {.vocab_size = argc > 8 ? atoll(argv[8]) : 50304, .n_positions = ctx,
                         .n_embd = argc > 6 ? atoll(argv[6]) : 768, .n_layer = argc > 7 ? atoll(argv[7]) : 12,
                         .layer_norm_epsilon = 1e-5};
    cfg.n_head = cfg.n_embd / 64 > 0 ? cfg.n_embd / 64 : 1;
    cg_params *ps = cg_params_new();
    cg_gpt *m = cg_gpt_new(&cfg, ps, 1);
    if (!m) {
        fprintf(stderr, "bench_head: %s\n", cg_last_error());
        return 1;
    }
    const char *names[2] = {"unfused step", "fused step"};
    bench_timed ts[2];
    const int64_t s[2] = {batch, ctx};
    for (int i = 0; i < 2; i++) {
        cg_rng rng;
        cg_rng_seed(&rng, 2);
        bench_timed *t = &ts[i];
        t->g = cg_graph_new(CG_TRAIN);
        cg_tensor *ids = cg_input(t->g, "ids", CG_INT32, 2, s), *tg = cg_input(t->g, "targets", CG_INT32, 2, s);
        int32_t *I = cg_idata(ids), *T = cg_idata(tg);
        for (int64_t r = 0; r < batch * ctx; r++) {
            I[r] = (int32_t)(cg_rng_next(&rng) % (uint64_t)cfg.vocab_size);
            T[r] = (int32_t)(cg_rng_next(&rng) % (uint64_t)cfg.vocab_size);
        }
        t->loss = i ? cg_gpt_loss(t->g, m, ids, tg, -100) : cg_cross_entropy(t->g, cg_gpt_logits(t->g, m, ids), tg, -100);
        t->ms = t->cpu = NULL;
        cg_params_zero_grad(ps);
        if (!bench_ready(t, "bench_head", names[i], reps)) return 1;
    }
    interleaved_steps(ts, ps, reps);
    printf("# bench_head step: GPT-2 d %lld, %lld layers, vocab %lld, %lld x %lld tokens, %d thread(s), %d interleaved\n"
           "# repetitions; forward + backward, ms: median [min, max] of wall time, then of the CPU time of all threads\n",
           (long long)cfg.n_embd, (long long)cfg.n_layer, (long long)cfg.vocab_size, (long long)batch, (long long)ctx,
           cg_threads(), reps);
    report(ts, names, reps);
    cg_gpt_free(m);
    cg_params_free(ps);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "step")) return bench_step(argc, argv);
    const int reps = argc > 1 ? atoi(argv[1]) : 7;
    const int64_t rows = argc > 2 ? atoll(argv[2]) : 1024, d = argc > 3 ? atoll(argv[3]) : 512,
                  v = argc > 4 ? atoll(argv[4]) : 8000;
    cg_set_threads(argc > 5 ? atoi(argv[5]) : 0);
    const bool with_bias = argc > 6 ? atoi(argv[6]) != 0 : true;
    const char *names[2] = {"linear + cross_entropy", "linear_cross_entropy"};
    bench_timed ts[2];
    cg_params *ps = cg_params_new(); /* the head's weight and bias, as in a model */
    const int64_t xs[2] = {rows, d}, ws[2] = {v, d};
    cg_tensor *w = cg_params_add(ps, "w", 2, ws), *b = with_bias ? cg_params_add(ps, "b", 1, &v) : NULL;
    cg_rng prng;
    cg_rng_seed(&prng, 3);
    cg_fill_uniform(w, &prng, -0.1, 0.1);
    if (b) cg_fill_uniform(b, &prng, -0.1, 0.1);
    for (int i = 0; i < 2; i++) {
        cg_rng rng;
        cg_rng_seed(&rng, 1);
        bench_timed *t = &ts[i];
        t->g = cg_graph_new(CG_TRAIN);
        cg_tensor *x = bench_input(t->g, "x", 2, xs, &rng, -1, 1);
        cg_tensor *tg = cg_input(t->g, "targets", CG_INT32, 1, &rows);
        int32_t *T = cg_idata(tg);
        for (int64_t r = 0; r < rows; r++) T[r] = (int32_t)(cg_rng_next(&rng) % (uint64_t)v);
        t->loss = i ? cg_linear_cross_entropy(t->g, x, w, b, tg, -100)
                    : cg_cross_entropy(t->g, cg_linear(t->g, x, w, b), tg, -100);
        t->ms = t->cpu = NULL;
        if (!bench_ready(t, "bench_head", names[i], reps)) return 1;
    }
    interleaved_steps(ts, ps, reps);
    printf("# bench_head: x[%lld, %lld] w[%lld, %lld]%s, %d thread(s), %d interleaved repetitions; forward +\n"
           "# backward, ms: median [min, max] of wall time, then of the CPU time of all threads\n",
           (long long)rows, (long long)d, (long long)v, (long long)d, with_bias ? " + bias" : "", cg_threads(), reps);
    report(ts, names, reps);
    cg_params_free(ps);
    return 0;
}
