/* SPDX-License-Identifier: MIT */
/* bench_moe: first the experts' grouped product alone, three ways of holding the weights: per-expert
 * parameters copied into a stack on every step (cg_concat, then cg_segment_linear), the same parameters
 * read in place (cg_segment_linear_each), and one stacked parameter (cg_segment_linear). Then the
 * mixture-of-experts layer routed (each expert on its own tokens: dropless, and with a
 * capacity factor) against the dense formulation (every expert on every token, masked), forward +
 * backward; then a Mixtral-tiny training step (forward + backward of the loss with the load-balancing
 * term) against the dense LLaMA with the same active parameters (intermediate_size top_k x the
 * experts'). All variants run interleaved, repetition by repetition; medians, [min, max], each graph's
 * memory plan (values, gradients, scratch) and the load average before and after. Usage: bench_moe [reps] [tokens] [d] [ffn] [experts] [top_k] [threads]. */
#include <stdio.h>
#include <stdlib.h>

#include "bench_timing.h"
#include "models/llama.h"
#include "models/moe.h"
#include <cgrad/cgrad.h>

static void loadavg(const char *when) {
    double a[3] = {0, 0, 0};
    FILE *f = fopen("/proc/loadavg", "r");
    if (f && fscanf(f, "%lf %lf %lf", &a[0], &a[1], &a[2]) == 3) printf("# load average %s: %.2f %.2f %.2f\n", when, a[0], a[1], a[2]);
    if (f) fclose(f);
}

static void report(const char *title, int n, const char *const *names, bench_timed *ts, int reps) {
    printf("%s\n", title);
    for (int i = 0; i < n; i++)
        printf("%-34s %9.2f [%8.2f, %8.2f] ms, cpu %9.2f ms, %5.2fx the first; memory plan %.1f MB\n", names[i],
               ts[i].ms[reps / 2], ts[i].ms[0], ts[i].ms[reps - 1], ts[i].cpu[reps / 2], ts[i].ms[reps / 2] / ts[0].ms[reps / 2],
               (double)cg_graph_plan_bytes(ts[i].g) / 1e6);
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 9;
    const int64_t n = argc > 2 ? atoll(argv[2]) : 512, d = argc > 3 ? atoll(argv[3]) : 256,
                  f = argc > 4 ? atoll(argv[4]) : 512, e = argc > 5 ? atoll(argv[5]) : 8, k = argc > 6 ? atoll(argv[6]) : 2;
    cg_set_threads(argc > 7 ? atoi(argv[7]) : 0);
    loadavg("before");

    /* 0. the grouped product of the experts' w1 over N x top_k rows split evenly, forward + backward */
    const char *seg_names[3] = {"per-expert params, stacked per step", "per-expert params, read in place",
                                "one stacked [E, out, in] param"};
    bench_timed ss[3];
    cg_params *sps = cg_params_new();
    cg_rng srng;
    cg_rng_seed(&srng, 2);
    cg_tensor **sw = malloc((size_t)e * sizeof *sw);
    for (int64_t i = 0; i < e; i++) {
        char name[32];
        snprintf(name, sizeof name, "w1.%lld", (long long)i);
        cg_fill_normal(sw[i] = cg_params_add(sps, name, 2, (int64_t[]){f, d}), &srng, 0, 0.02);
    }
    cg_tensor *stack = cg_params_add(sps, "w1", 3, (int64_t[]){e, f, d});
    cg_fill_normal(stack, &srng, 0, 0.02);
    for (int i = 0; i < 3; i++) {
        bench_timed *t = &ss[i];
        t->g = cg_graph_new(CG_TRAIN);
        t->ms = t->cpu = NULL;
        const int64_t rows = n * k, xs[2] = {rows, d}, ys[2] = {rows, f};
        cg_tensor *x = bench_input(t->g, "x", 2, xs, &srng, -1, 1), *ends = cg_input(t->g, "ends", CG_INT32, 1, &e), *w = stack;
        for (int64_t j = 0; j < e; j++) cg_idata(ends)[j] = (int32_t)(rows * (j + 1) / e);
        if (i == 0) {
            cg_tensor **v = malloc((size_t)e * sizeof *v);
            for (int64_t j = 0; j < e; j++) v[j] = cg_reshape(t->g, sw[j], 3, (int64_t[]){1, f, d});
            w = cg_concat(t->g, (int)e, v, 0);
            free(v);
        }
        cg_tensor *y = i == 1 ? cg_segment_linear_each(t->g, x, (int)e, sw, ends) : cg_segment_linear(t->g, x, w, ends);
        t->loss = bench_loss(t->g, y, bench_upstream(t->g, 2, ys, &srng));
        if (!bench_ready(t, "bench_moe", seg_names[i], reps)) return 1;
    }
    bench_interleaved(3, ss, reps);
    char title[512];
    snprintf(title, sizeof title, "# experts' grouped product: %lld rows x %lld experts of [%lld, %lld], %d thread(s), %d "
             "interleaved repetitions;\n# forward + backward, ms: median [min, max] wall, median CPU of all threads",
             (long long)(n * k), (long long)e, (long long)f, (long long)d, cg_threads(), reps);
    report(title, 3, seg_names, ss, reps);
    for (int i = 0; i < 3; i++) bench_free(&ss[i]);
    free(sw);
    cg_params_free(sps);

    /* 1. the layer alone: routed (dropless, capacity 1.25) against dense */
    const char *layer_names[3] = {"dense (every expert, masked)", "routed, dropless (sorted segments)", "routed, capacity_factor 1.25"};
    bench_timed ls[3];
    cg_params *lps[3];
    cg_moe *lm[3];
    for (int i = 0; i < 3; i++) {
        cg_rng rng;
        cg_rng_seed(&rng, 1);
        const cg_moe_config c = {.hidden_size = d, .intermediate_size = f, .num_experts = e, .top_k = k,
                                 .capacity_factor = i == 2 ? 1.25 : 0};
        lps[i] = cg_params_new();
        lm[i] = cg_moe_new(&c, lps[i], &rng, "moe");
        bench_timed *t = &ls[i];
        t->g = cg_graph_new(CG_TRAIN);
        t->ms = t->cpu = NULL;
        const int64_t xs[2] = {n, d};
        cg_tensor *x = bench_input(t->g, "x", 2, xs, &rng, -1, 1), *logits = NULL;
        cg_tensor *y = i ? cg_moe_forward(t->g, lm[i], x, &logits) : cg_moe_forward_dense(t->g, lm[i], x, &logits);
        t->loss = cg_add(t->g, bench_loss(t->g, y, bench_upstream(t->g, 2, xs, &rng)),
                         cg_moe_load_balancing_loss(t->g, 1, &logits, k));
        if (!bench_ready(t, "bench_moe", layer_names[i], reps)) return 1;
    }
    bench_interleaved(3, ls, reps);
    snprintf(title, sizeof title, "# MoE layer: %lld tokens, d %lld, %lld experts of ffn %lld, top-%lld, %d thread(s), %d "
             "interleaved repetitions;\n# forward + backward, ms: median [min, max] wall, median CPU of all threads",
             (long long)n, (long long)d, (long long)e, (long long)f, (long long)k, cg_threads(), reps);
    report(title, 3, layer_names, ls, reps);
    for (int i = 0; i < 3; i++) bench_free(&ls[i]), cg_moe_free(lm[i]), cg_params_free(lps[i]);

    /* 2. a training step: Mixtral-tiny against the dense LLaMA of the same active parameter count */
    const char *model_names[3] = {"llama, ffn top_k x experts' (dense)", "mixtral, dropless", "mixtral, capacity_factor 1.25"};
    const int64_t batch = 4, seq = n / 4 > 0 ? n / 4 : 1;
    bench_timed ms[3];
    cg_params *mps[3];
    cg_llama *mm[3];
    for (int i = 0; i < 3; i++) {
        cg_llama_config c = {.family = i ? CG_LLAMA_FAMILY_MIXTRAL : CG_LLAMA_FAMILY_LLAMA, .vocab_size = 512,
                             .hidden_size = d, .intermediate_size = i ? f : k * f, .num_hidden_layers = 2,
                             .num_attention_heads = 4, .num_key_value_heads = 2, .max_position_embeddings = seq,
                             .rms_norm_eps = 1e-5, .rope = {.theta = 1e6}};
        if (i) c.num_local_experts = e, c.num_experts_per_tok = k, c.router_aux_loss_coef = 0.02, c.output_router_logits = true;
        if (i == 2) c.capacity_factor = 1.25;
        mps[i] = cg_params_new();
        mm[i] = cg_llama_new(&c, mps[i], 3);
        if (!mm[i]) {
            fprintf(stderr, "bench_moe: %s\n", cg_last_error());
            return 1;
        }
        bench_timed *t = &ms[i];
        t->g = cg_graph_new(CG_TRAIN);
        t->ms = t->cpu = NULL;
        const int64_t s[2] = {batch, seq};
        cg_tensor *ids = cg_input(t->g, "ids", CG_INT32, 2, s), *tg = cg_input(t->g, "targets", CG_INT32, 2, s), *aux = NULL;
        cg_rng rng;
        cg_rng_seed(&rng, 4);
        for (int64_t j = 0; j < batch * seq; j++)
            cg_idata(ids)[j] = (int32_t)(cg_rng_next(&rng) % 512), cg_idata(tg)[j] = (int32_t)(cg_rng_next(&rng) % 512);
        cg_tensor *loss = cg_cross_entropy(t->g, cg_llama_logits_aux(t->g, mm[i], ids, &aux), tg, -100);
        t->loss = aux ? cg_add(t->g, loss, cg_scale(t->g, aux, 0.02)) : loss;
        if (!bench_ready(t, "bench_moe", model_names[i], reps)) return 1;
    }
    bench_interleaved(3, ms, reps);
    snprintf(title, sizeof title, "# training step (forward + backward): batch %lld x %lld tokens, d %lld, 2 layers, vocab "
             "512; mixtral %lld experts of ffn %lld, top-%lld; llama ffn %lld", (long long)batch, (long long)seq,
             (long long)d, (long long)e, (long long)f, (long long)k, (long long)(k * f));
    report(title, 3, model_names, ms, reps);
    for (int i = 0; i < 3; i++) bench_free(&ms[i]), cg_llama_free(mm[i]), cg_params_free(mps[i]);
    loadavg("after");
    return 0;
}
