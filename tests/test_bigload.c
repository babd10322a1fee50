/* SPDX-License-Identifier: MIT */
/* Loading large models: sharded safetensors (and the ways an index can be wrong), frozen weights
 * read in place from a file (bf16 and float32), frozen parameters out of the gradient and optimizer
 * blocks, and deferred initialisation drawing exactly what an immediate one draws. */
#define _GNU_SOURCE /* MAP_ANONYMOUS */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cgrad/cgrad.h>
#include "check.h"
#include "io/safetensors.h"

static char dir[256];

static void path(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", dir, name); }

static void write_text(const char *name, const char *text) {
    char p[512];
    path(p, sizeof p, name);
    FILE *f = fopen(p, "w");
    fputs(text, f);
    fclose(f);
}

/* Two shards: a [2,3] (1..6) in shard 1, b [4] (7..10) and c [1] (11) in shard 2. */
static void write_shards(void) {
    const cg_real a[6] = {1, 2, 3, 4, 5, 6}, b[4] = {7, 8, 9, 10}, c[1] = {11};
    char p[512];
    cg_st_writer *w = cg_st_writer_new();
    cg_st_add(w, "a", 2, (int64_t[]){2, 3}, a);
    path(p, sizeof p, "model-00001-of-00002.safetensors");
    CHECK(cg_st_write(w, p) == CG_OK, "%s", cg_last_error());
    cg_st_writer_free(w);
    w = cg_st_writer_new();
    cg_st_add(w, "b", 1, (int64_t[]){4}, b);
    cg_st_add(w, "c", 1, (int64_t[]){1}, c);
    path(p, sizeof p, "model-00002-of-00002.safetensors");
    CHECK(cg_st_write(w, p) == CG_OK, "%s", cg_last_error());
    cg_st_writer_free(w);
}

static const char *good_index = "{\"metadata\": {\"total_size\": 44}, \"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", "
                                "\"b\": \"model-00002-of-00002.safetensors\", \"c\": \"model-00002-of-00002.safetensors\"}}";

/* Opens an index with this text; expects failure with a message containing want (NULL: success). */
static void index_case(const char *text, const char *want) {
    write_text("model.safetensors.index.json", text);
    char p[512];
    path(p, sizeof p, "model.safetensors.index.json");
    cg_st *f = cg_st_open_index(p);
    if (!want) {
        CHECK(f != NULL, "%s", cg_last_error());
        cg_real a[6] = {0}, b[4] = {0}, c = 0;
        CHECK(f && cg_st_count(f) == 3, "%d tensors", cg_st_count(f));
        CHECK(f && !cg_st_read(f, "a", a, 2, (int64_t[]){2, 3}) && a[5] == 6, "a[5] %g: %s", a[5], cg_last_error());
        CHECK(f && !cg_st_read(f, "b", b, 1, (int64_t[]){4}) && b[0] == 7 && b[3] == 10, "b %g %g", b[0], b[3]);
        CHECK(f && !cg_st_read(f, "c", &c, 1, (int64_t[]){1}) && c == 11, "c %g", c);
    } else {
        CHECK(f == NULL && strstr(cg_last_error(), want), "wanted '%s', got '%s'", want, f ? "success" : cg_last_error());
    }
    cg_st_close(f);
}

static void test_shards(void) {
    write_shards();
    index_case(good_index, NULL);
    /* a shard the index names is missing */
    index_case("{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", \"b\": \"model-00003-of-00003.safetensors\"}}",
               "model-00003-of-00003.safetensors is missing");
    /* a tensor listed twice, in two shards */
    index_case("{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", \"b\": \"model-00002-of-00002.safetensors\", "
               "\"c\": \"model-00002-of-00002.safetensors\", \"a\": \"model-00002-of-00002.safetensors\"}}",
               "tensor 'a' is listed twice");
    /* the index places a tensor in a shard that does not hold it */
    index_case("{\"weight_map\": {\"a\": \"model-00002-of-00002.safetensors\", \"b\": \"model-00002-of-00002.safetensors\", "
               "\"c\": \"model-00002-of-00002.safetensors\"}}",
               "tensor 'a' is not in model-00002-of-00002.safetensors");
    /* a tensor the index lists that no shard holds */
    index_case("{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", \"b\": \"model-00002-of-00002.safetensors\", "
               "\"c\": \"model-00002-of-00002.safetensors\", \"d\": \"model-00002-of-00002.safetensors\"}}",
               "tensor 'd' is not in model-00002-of-00002.safetensors");
    /* a tensor a shard holds that the index does not list */
    index_case("{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", \"b\": \"model-00002-of-00002.safetensors\"}}",
               "tensor 'c' is stored in model-00002-of-00002.safetensors, but the index does not list it");
    /* a file name that leaves the directory */
    index_case("{\"weight_map\": {\"a\": \"../model-00001-of-00002.safetensors\"}}", "is not a file name beside the index");
    index_case("{\"weight_map\": {}}", "non-empty \"weight_map\"");
    index_case("[1, 2]", "non-empty \"weight_map\"");
    /* the same tensor stored in both shards (the index can name only one of them) */
    char p[512];
    cg_st_writer *w = cg_st_writer_new();
    cg_st_add(w, "a", 2, (int64_t[]){2, 3}, (cg_real[]){1, 2, 3, 4, 5, 6});
    cg_st_add(w, "b", 1, (int64_t[]){4}, (cg_real[]){7, 8, 9, 10});
    path(p, sizeof p, "model-00001-of-00002.safetensors");
    cg_st_write(w, p);
    cg_st_writer_free(w);
    index_case(good_index, "tensor 'b' is stored in model-00001-of-00002.safetensors, but the index places it in "
                           "model-00002-of-00002.safetensors");
    write_shards();
}

/* bf16 bits of a float (round to nearest even; no NaN here) */
static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

enum { M = 6, K = 40, N = 24, R = 4 };

/* loss = mean(square(linear(x, W) + LoRA)) with W frozen (mapped when bf16 is not NULL, else a
 * block parameter holding the same values), x fixed; the loss and the adapters' gradients. */
static double lora_loss(const uint16_t *bf16, const float *wf, cg_precision prec, cg_real *ga, cg_real *gb) {
    cg_params *ps = cg_params_new();
    cg_tensor *w = cg_params_add(ps, "w", 2, (int64_t[]){N, K});
    cg_real wv[N * K];
    for (int i = 0; i < N * K; i++) wv[i] = wf[i];
    cg_write(w, wv);
    cg_rng r;
    cg_rng_seed(&r, 7);
    CHECK(cg_lora_add(ps, w, R, 2.0 * R, &r) == CG_OK, "%s", cg_last_error());
    cg_tensor *b = cg_params_find(ps, "w.lora_B");
    cg_fill_normal(b, &r, 0, 0.1); /* B nonzero, so the adapter changes the output */
    if (bf16) CHECK(cg_param_map(w, bf16, CG_MAP_BF16) == CG_OK, "%s", cg_last_error());
    CHECK(cg_params_compact(ps) == CG_OK, "%s", cg_last_error());
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_graph_set_precision(g, prec);
    cg_tensor *x = cg_input(g, "x", CG_REAL, 2, (int64_t[]){M, K});
    cg_tensor *loss = cg_mean_all(g, cg_square(g, cg_linear(g, x, w, NULL)));
    cg_real xv[M * K];
    cg_rng_seed(&r, 3);
    for (int i = 0; i < M * K; i++) xv[i] = (cg_real)cg_rng_normal(&r);
    cg_write(x, xv);
    double l = NAN;
    cg_params_zero_grad(ps);
    if (cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK) {
        l = cg_item(loss);
        cg_read_grad(cg_params_find(ps, "w.lora_A"), ga);
        cg_read_grad(b, gb);
    } else {
        CHECK(0, "%s", cg_last_error());
    }
    CHECK(!bf16 || prec != CG_BF16 || cg_param_storage(w) == CG_MAP_BF16, "a bf16 graph's linear reads the weight in place");
    cg_graph_free(g);
    cg_params_free(ps);
    return l;
}

static void test_mapped_bf16(void) {
    if (cg_bf16_unavailable()) {
        printf("bf16 products unavailable here (%s): mapped-bf16 checks skipped\n", cg_bf16_unavailable());
        return;
    }
    static uint16_t wb[N * K];
    static float wf[N * K];
    cg_rng r;
    cg_rng_seed(&r, 11);
    for (int i = 0; i < N * K; i++) {
        wb[i] = to_bf16((float)(0.2 * cg_rng_normal(&r)));
        wf[i] = from_bf16(wb[i]);
    }
    cg_real ga[2][R * K], gb[2][N * R], ga2[R * K], gb2[N * R];
    /* bf16 graph: the mapped bf16 weight and the float one (converted to the same bf16) agree bit for bit */
    const double l_map = lora_loss(wb, wf, CG_BF16, ga[0], gb[0]);
    const double l_blk = lora_loss(NULL, wf, CG_BF16, ga[1], gb[1]);
    CHECK(l_map == l_blk, "loss mapped %.9g, block %.9g", l_map, l_blk);
    CHECK(!memcmp(ga[0], ga[1], sizeof ga[0]) && !memcmp(gb[0], gb[1], sizeof gb[0]), "adapter gradients differ");
    /* and run again: bit-identical */
    const double l_again = lora_loss(wb, wf, CG_BF16, ga2, gb2);
    CHECK(l_again == l_map && !memcmp(ga2, ga[0], sizeof ga2) && !memcmp(gb2, gb[0], sizeof gb2), "a second run differs");
    /* against the float path (float weight, float products): within bf16's rounding of x */
    const double l_f32 = lora_loss(NULL, wf, CG_FP32, ga2, gb2);
    CHECK(fabs(l_map - l_f32) <= 1e-2 * fabs(l_f32), "loss bf16-mapped %.9g, fp32 %.9g", l_map, l_f32);
    double worst = 0, scale = 0;
    for (int i = 0; i < N * R; i++) {
        worst = fmax(worst, fabs(gb[0][i] - gb2[i]));
        scale = fmax(scale, fabs(gb2[i]));
    }
    CHECK(worst <= 2e-2 * scale, "dB differs by %.3g (largest %.3g)", worst, scale);
    /* an fp32 graph widens the mapped weight once and then matches the float path exactly */
    const double l_wide = lora_loss(wb, wf, CG_FP32, ga[0], gb[0]);
    CHECK(l_wide == l_f32 && !memcmp(gb[0], gb2, sizeof gb2), "widened mapped %.9g, float %.9g", l_wide, l_f32);
}

static void test_frozen_out_of_blocks(void) {
    cg_params *ps = cg_params_new();
    cg_tensor *big = cg_params_add(ps, "big.weight", 2, (int64_t[]){64, 128});
    cg_tensor *small = cg_params_add(ps, "small.weight", 2, (int64_t[]){16, 8});
    cg_tensor *norm = cg_params_add(ps, "norm.weight", 1, (int64_t[]){64});
    cg_rng r;
    cg_rng_seed(&r, 1);
    cg_fill_normal(big, &r, 0, 1);
    cg_fill(norm, 1);
    const int64_t all = (64 * 128 + 16 * 8 + 64) * (int64_t)sizeof(cg_real);
    CHECK(cg_params_grad_bytes(ps) == all, "grad bytes %lld before, want %lld", (long long)cg_params_grad_bytes(ps), (long long)all);
    cg_real before[64 * 128], after[64 * 128];
    cg_read(big, before);
    CHECK(cg_lora_apply(ps, "big", 4, 4, &r) == 1, "%s", cg_last_error());
    CHECK(cg_params_compact(ps) == CG_OK, "%s", cg_last_error());
    /* only the adapters [4,128] and [64,4] keep gradients; the span (and so the moments) is theirs */
    const int64_t adapters = (4 * 128 + 64 * 4) * (int64_t)sizeof(cg_real);
    CHECK(cg_params_grad_bytes(ps) == adapters, "grad bytes %lld after, want %lld", (long long)cg_params_grad_bytes(ps),
          (long long)adapters);
    CHECK(cg_params_span(ps) * (int64_t)sizeof(cg_real) == adapters, "span %lld elements", (long long)cg_params_span(ps));
    CHECK(cg_grad(big) == NULL && cg_grad(small) == NULL && cg_grad(norm) == NULL, "a frozen parameter has a gradient");
    cg_read(big, after);
    CHECK(!memcmp(before, after, sizeof before), "compaction changed a frozen value");
    cg_param_set_trainable(big, true);
    CHECK(!cg_param_trainable(big), "a parameter out of the blocks cannot train again");
    cg_optim_config oc = cg_optim_defaults(CG_OPT_ADAMW);
    cg_optim *o = cg_optim_new(ps, &oc);
    CHECK(o != NULL, "%s", cg_last_error());
    cg_optim_free(o);
    cg_params_free(ps);
}

/* The optimizer and the gradient norm walk the blocks by each parameter's offset in them. Frozen
 * weights read in place lie anywhere in memory: with their values above the blocks (place 0) or
 * below them (place 1), every adapter still gets its share of the norm and its step. Placed above,
 * offsets taken from data pointers sent the walk past the adapters: a LoRA fine-tune (weights first,
 * adapters after them, compacted) never moved its B adapters. */
static void test_adapters_step_beside_mapped(void) {
    enum { NW = 3, WN = 48, WK = 64, WR = 4, NB = NW * WN * WR };
    for (int place = 0; place < 2; place++) {
        cg_params *ps = cg_params_new();
        cg_tensor *w[NW], *a[NW], *b[NW];
        char name[32];
        for (int k = 0; k < NW; k++) snprintf(name, sizeof name, "w%d", k), w[k] = cg_params_add(ps, name, 2, (int64_t[]){WN, WK});
        cg_rng r;
        cg_rng_seed(&r, 21);
        CHECK(cg_lora_apply(ps, "w", WR, WR, &r) == NW, "%s", cg_last_error());
        const size_t bytes = (NW * WN * WK * sizeof(cg_real) + 4095) / 4096 * 4096;
        char *values = (char *)cg_params_values(ps), *hint = place == 0 ? values + (1ull << 32) : values - (1ull << 32);
        void *m = mmap(hint, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(m != MAP_FAILED, "mmap: %zu bytes", bytes);
        if (m == MAP_FAILED) return;
        cg_real *wv = m;
        for (int i = 0; i < NW * WN * WK; i++) wv[i] = (cg_real)(0.1 * cg_rng_normal(&r));
        for (int k = 0; k < NW; k++) {
            CHECK(cg_param_map(w[k], wv + k * WN * WK, CG_MAP_F32) == CG_OK, "%s", cg_last_error());
            snprintf(name, sizeof name, "w%d.lora_A", k), a[k] = cg_params_find(ps, name);
            snprintf(name, sizeof name, "w%d.lora_B", k), b[k] = cg_params_find(ps, name);
        }
        CHECK(cg_params_compact(ps) == CG_OK, "%s", cg_last_error());
        values = (char *)cg_params_values(ps);
        CHECK(place == 0 ? (char *)m > values : (char *)m < values, "the frozen values are not %s the blocks (%p, blocks at %p)",
              place == 0 ? "above" : "below", m, (void *)values);
        cg_optim_config oc = cg_optim_defaults(CG_OPT_ADAMW);
        oc.weight_decay = 0;
        cg_optim *o = cg_optim_new(ps, &oc);
        cg_graph *g = cg_graph_new(CG_TRAIN);
        cg_tensor *x = cg_input(g, "x", CG_REAL, 2, (int64_t[]){8, WK}), *y = NULL;
        for (int k = 0; k < NW; k++) y = k ? cg_add(g, y, cg_linear(g, x, w[k], NULL)) : cg_linear(g, x, w[k], NULL);
        cg_tensor *loss = cg_mean_all(g, cg_square(g, y));
        cg_fill_normal(x, &r, 0, 1);
        cg_params_zero_grad(ps);
        CHECK(o && cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "%s", cg_last_error());
        static cg_real ga[NW][WR * WK], gb[NW][WN * WR], a0[NW][WR * WK], b0[NW][WN * WR], a1[NW][WR * WK], b1[NW][WN * WR];
        double want = 0; /* B starts at zero, so A's gradient is zero and B's is not */
        for (int k = 0; k < NW; k++) {
            cg_read_grad(a[k], ga[k]), cg_read_grad(b[k], gb[k]), cg_read(a[k], a0[k]), cg_read(b[k], b0[k]);
            for (int i = 0; i < WR * WK; i++) want += (double)ga[k][i] * ga[k][i];
            for (int i = 0; i < WN * WR; i++) want += (double)gb[k][i] * gb[k][i];
        }
        want = sqrt(want);
        const double norm = cg_grad_norm(ps);
        CHECK(want > 0 && fabs(norm - want) <= 1e-6 * want, "place %d: gradient norm %.9g, the adapters' %.9g", place, norm, want);
        CHECK(cg_optim_step(o, 0.01) == CG_OK, "%s", cg_last_error());
        int moved = 0, wrong = 0; /* AdamW's first step moves each element by lr * sign(g) (eps aside) */
        for (int k = 0; k < NW; k++) {
            cg_read(a[k], a1[k]), cg_read(b[k], b1[k]);
            for (int i = 0; i < WN * WR; i++)
                if (gb[k][i] != 0) moved++, wrong += fabs((double)b1[k][i] - b0[k][i] + 0.01 * (gb[k][i] > 0 ? 1 : -1)) > 1e-4;
        }
        CHECK(moved > NB / 2 && wrong == 0, "place %d: %d of %d B elements with a gradient took no step or a wrong one", place,
              wrong, moved);
        CHECK(!memcmp(a0, a1, sizeof a0), "place %d: an A moved with a zero gradient and no decay", place);
        cg_graph_free(g);
        cg_optim_free(o);
        cg_params_free(ps);
        munmap(m, bytes);
    }
}

/* Values drawn with initialisation deferred and then run equal those drawn at once. */
static void test_deferred_init(void) {
    cg_real v[2][3][50];
    for (int d = 0; d < 2; d++) {
        cg_params *ps = cg_params_new();
        if (d) cg_params_defer_init(ps, true);
        cg_rng r;
        cg_rng_seed(&r, 5);
        cg_tensor *a = cg_params_add(ps, "a", 1, (int64_t[]){50}), *b = cg_params_add(ps, "b", 2, (int64_t[]){5, 10}),
                  *c = cg_params_add(ps, "c", 1, (int64_t[]){50});
        cg_fill_normal(a, &r, 0, 1);
        cg_fill_uniform(b, &r, -1, 1);
        cg_fill(c, 3);
        cg_fill_normal(c, &r, 1, 2);
        if (d) {
            cg_real probe[50];
            CHECK(cg_read(a, probe) == CG_OK, "a read runs the pending fill: %s", cg_last_error());
            cg_params_defer_init(ps, false);
        }
        cg_read(a, v[d][0]);
        cg_read(b, v[d][1]);
        cg_read(c, v[d][2]);
        cg_params_free(ps);
    }
    CHECK(!memcmp(v[0], v[1], sizeof v[0]), "deferred initialisation drew other values");
    /* a value written while deferred is kept: the pending fill is dropped */
    cg_params *ps = cg_params_new();
    cg_params_defer_init(ps, true);
    cg_tensor *a = cg_params_add(ps, "a", 1, (int64_t[]){3});
    cg_rng r;
    cg_rng_seed(&r, 5);
    cg_fill_normal(a, &r, 0, 1);
    cg_write(a, (cg_real[]){1, 2, 3});
    cg_params_defer_init(ps, false);
    cg_real got[3];
    cg_read(a, got);
    CHECK(got[0] == 1 && got[1] == 2 && got[2] == 3, "loaded value overwritten: %g %g %g", got[0], got[1], got[2]);
    cg_params_free(ps);
}

/* A float32 tensor mapped from a file: read in place, written only through a copy of its own. */
static void test_mapped_f32(void) {
    char p[512];
    path(p, sizeof p, "model-00001-of-00002.safetensors");
    cg_st *f = cg_st_open(p);
    cg_params *ps = cg_params_new();
    cg_tensor *a = cg_params_add(ps, "a", 2, (int64_t[]){2, 3});
    CHECK(cg_param_map(a, (float[6]){0}, CG_MAP_F32) != CG_OK && strstr(cg_last_error(), "trainable"),
          "a trainable parameter mapped");
    cg_param_set_trainable(a, false); /* frozen: the load reads it in place */
    cg_st_load *l = cg_st_load_new();
    CHECK(cg_st_load_add(l, a, f, "a") == CG_OK && cg_st_load_run(l) == CG_OK, "%s", cg_last_error());
    cg_st_load_free(l);
    CHECK(cg_params_grad_bytes(ps) == 0, "the frozen parameter was copied, not mapped");
    cg_st_close(f); /* the set keeps it open */
    cg_real v[6];
    cg_read(a, v);
    CHECK(v[0] == 1 && v[5] == 6, "mapped a: %g .. %g", v[0], v[5]);
    cg_write(a, (cg_real[]){6, 5, 4, 3, 2, 1});
    cg_read(a, v);
    CHECK(v[0] == 6 && v[5] == 1, "written a: %g .. %g", v[0], v[5]);
    cg_params_free(ps);
    f = cg_st_open(p); /* the file is unchanged */
    cg_st_read(f, "a", v, 2, (int64_t[]){2, 3});
    CHECK(v[0] == 1 && v[5] == 6, "the file changed: %g .. %g", v[0], v[5]);
    cg_st_close(f);
}

/* The plan keeps no activation that only a frozen weight's gradient would read: h = tanh(x W1) feeds
 * a linear with a frozen W2, and h is kept for backward only when W2 trains. */
static size_t plan_with(bool w2_trains) {
    cg_params *ps = cg_params_new();
    cg_tensor *w1 = cg_params_add(ps, "w1", 2, (int64_t[]){256, 64});
    cg_tensor *w2 = cg_params_add(ps, "w2", 2, (int64_t[]){64, 256});
    cg_rng r;
    cg_rng_seed(&r, 2);
    cg_fill_normal(w1, &r, 0, 0.1);
    cg_fill_normal(w2, &r, 0, 0.1);
    cg_param_set_trainable(w2, w2_trains);
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = cg_input(g, "x", CG_REAL, 2, (int64_t[]){512, 64});
    cg_fill(x, 0.5);
    cg_tensor *h = cg_scale(g, cg_linear(g, x, w1, NULL), 2.0); /* its backward reads no value */
    cg_tensor *loss = cg_mean_all(g, cg_square(g, cg_linear(g, h, w2, NULL)));
    size_t bytes = 0;
    if (cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK) bytes = cg_graph_plan_bytes(g);
    else CHECK(0, "%s", cg_last_error());
    cg_graph_free(g);
    cg_params_free(ps);
    return bytes;
}

static void test_frozen_plan(void) {
    const size_t trains = plan_with(true), frozen = plan_with(false);
    /* h [512, 256] is kept through backward only for W2's gradient */
    CHECK(frozen + 64 * 1024 <= trains, "plan %zu bytes with W2 frozen, %zu trained", frozen, trains);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/cgrad_bigload_%ld", (long)getpid());
    char cmd[300];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    if (system(cmd)) return 1;
    test_shards();
    test_mapped_f32();
    test_frozen_out_of_blocks();
    test_adapters_step_beside_mapped();
    test_deferred_init();
    test_mapped_bf16();
    test_frozen_plan();
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) return 1;
    TEST_END();
}
