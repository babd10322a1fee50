/* SPDX-License-Identifier: MIT */
/* The image path: the IDX reader on hand-written files (and its refusals, each naming the file and
 * the field), image sets and their batches, the vit and cnn models against PyTorch
 * (tests/make_vision_fixtures.py: logits, loss and every gradient), and (part "train") a short
 * training run on Fashion-MNIST that must reach a stated accuracy; that part is skipped, visibly,
 * when Debian's dataset-fashion-mnist is not installed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "cgrad.h"
#include "tests/check.h"

#define FIX CGRAD_TEST_DIR "/fixtures/vision/"
#define FASHION_MNIST "/usr/share/datasets/fashion-mnist"

static char tmpdir[256];

/* Writes n bytes to tmpdir/name (gzip-compressed when gz) and returns the path (static buffer). */
static const char *put_file(const char *name, const void *bytes, size_t n, bool gz) {
    static char path[16][512];
    static int k;
    char *p = path[k++ % 16];
    snprintf(p, 512, "%s/%s", tmpdir, name);
    if (gz) {
        gzFile f = gzopen(p, "wb");
        gzwrite(f, bytes, (unsigned)n);
        gzclose(f);
    } else {
        FILE *f = fopen(p, "wb");
        fwrite(bytes, 1, n, f);
        fclose(f);
    }
    return p;
}

/* An IDX header: 00 00 08 nd, then the sizes big-endian; returns its length. */
static size_t header(uint8_t *h, int nd, const uint32_t *dims) {
    h[0] = h[1] = 0, h[2] = 0x08, h[3] = (uint8_t)nd;
    for (int i = 0; i < nd; i++)
        h[4 + 4 * i] = (uint8_t)(dims[i] >> 24), h[5 + 4 * i] = (uint8_t)(dims[i] >> 16),
                  h[6 + 4 * i] = (uint8_t)(dims[i] >> 8), h[7 + 4 * i] = (uint8_t)dims[i];
    return 4 + 4 * (size_t)nd;
}

/* A refusal: status st and a message holding every one of the words. */
static void refused(cg_status got, cg_status want, const char *what, const char *w1, const char *w2) {
    const char *e = cg_last_error();
    CHECK(got == want, "%s: status %d, want %d (%s)", what, (int)got, (int)want, e);
    CHECK(strstr(e, w1) && (!w2 || strstr(e, w2)), "%s: message '%s' lacks '%s' / '%s'", what, e, w1, w2 ? w2 : "");
}

static void test_idx_parse(void) {
    uint8_t buf[64];
    size_t h = header(buf, 3, (uint32_t[]){2, 2, 3});
    for (int i = 0; i < 12; i++) buf[h + i] = (uint8_t)(10 * i);
    cg_idx x = {0};
    CHECK(cg_idx_parse(buf, h + 12, "mem", &x) == CG_OK, "%s", cg_last_error());
    CHECK(x.ndim == 3 && x.dims[0] == 2 && x.dims[1] == 2 && x.dims[2] == 3 && x.count == 12, "dims %d %lld",
          x.ndim, (long long)x.count);
    CHECK(x.data && x.data[0] == 0 && x.data[5] == 50 && x.data[11] == 110, "values");
    cg_idx_free(&x);
    CHECK(x.data == NULL && x.count == 0, "free zeroes");
    /* sizes past 2^24 read big-endian */
    uint8_t big[8];
    header(big, 1, (uint32_t[]){0x01020304});
    cg_idx y = {.count = -7};
    refused(cg_idx_parse(big, 8, "big.idx", &y), CG_ERR_FORMAT, "size > length", "big.idx", "16909060");
    CHECK(y.count == -7 && y.data == NULL, "the output is untouched on a refusal");

    /* refusals, each naming the buffer and the field */
    refused(cg_idx_parse(buf, 3, "short", &x), CG_ERR_FORMAT, "3 bytes", "short", "magic");
    uint8_t bad[64];
    memcpy(bad, buf, h + 12);
    bad[0] = 0x1f;
    refused(cg_idx_parse(bad, h + 12, "m1", &x), CG_ERR_FORMAT, "magic", "m1", "magic");
    memcpy(bad, buf, h + 12);
    bad[2] = 0x0D;
    refused(cg_idx_parse(bad, h + 12, "m2", &x), CG_ERR_FORMAT, "float type", "element type 0x0d", "float32");
    memcpy(bad, buf, h + 12);
    bad[3] = 0;
    refused(cg_idx_parse(bad, h + 12, "m3", &x), CG_ERR_FORMAT, "0 dims", "dimension count 0", NULL);
    bad[3] = 5;
    refused(cg_idx_parse(bad, h + 12, "m4", &x), CG_ERR_FORMAT, "5 dims", "dimension count 5", NULL);
    refused(cg_idx_parse(buf, 10, "m5", &x), CG_ERR_FORMAT, "cut header", "m5", "header of 3 sizes");
    refused(cg_idx_parse(buf, h + 11, "m6", &x), CG_ERR_FORMAT, "one byte short", "m6", "need more than the 11");
    refused(cg_idx_parse(buf, h + 13, "m7", &x), CG_ERR_FORMAT, "one byte over", "give 12 elements", "13 bytes after");
    memcpy(bad, buf, h + 12);
    bad[7] = 0; /* dims[0] = 0 */
    refused(cg_idx_parse(bad, h + 12, "m8", &x), CG_ERR_FORMAT, "zero size", "m8", "size 0 is 0");
    /* four sizes of 2^32 - 1: the product must not wrap */
    uint8_t huge[20];
    header(huge, 4, (uint32_t[]){0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu});
    refused(cg_idx_parse(huge, 20, "m9", &x), CG_ERR_FORMAT, "overflow", "m9", "size 0");
    CHECK(cg_idx_parse(NULL, 4, "m10", &x) == CG_ERR_ARG, "NULL buffer");
}

static void test_idx_files(void) {
    uint8_t img[4 + 12 + 3 * 2 * 2], lab[8 + 3];
    size_t hi = header(img, 3, (uint32_t[]){3, 2, 2}), hl = header(lab, 1, (uint32_t[]){3});
    for (int i = 0; i < 12; i++) img[hi + i] = (uint8_t)(i * 20);
    lab[hl] = 2, lab[hl + 1] = 0, lab[hl + 2] = 7;
    cg_idx x;
    const char *raw = put_file("raw.idx", img, hi + 12, false), *gz = put_file("img.idx.gz", img, hi + 12, true);
    CHECK(cg_idx_read(raw, &x) == CG_OK && x.count == 12 && x.data[11] == 220, "raw: %s", cg_last_error());
    cg_idx_free(&x);
    CHECK(cg_idx_read(gz, &x) == CG_OK && x.count == 12 && x.data[11] == 220, "gzip: %s", cg_last_error());
    cg_idx_free(&x);
    /* a corrupt or cut gzip stream, and a missing file */
    FILE *f = fopen(gz, "rb");
    uint8_t z[256];
    size_t nz = fread(z, 1, sizeof z, f);
    fclose(f);
    refused(cg_idx_read(put_file("cut.gz", z, nz - 6, false), &x), CG_ERR_FORMAT, "cut gzip", "cut.gz", "gzip");
    z[nz - 5] ^= 0x55; /* the length trailer */
    refused(cg_idx_read(put_file("bad.gz", z, nz, false), &x), CG_ERR_FORMAT, "bad trailer", "bad.gz", "gzip");
    refused(cg_idx_read(put_file("short.idx", img, hi + 5, false), &x), CG_ERR_FORMAT, "short file", "short.idx", "the 5 element bytes");
    char missing[512];
    snprintf(missing, sizeof missing, "%s/nothing.idx", tmpdir);
    refused(cg_idx_read(missing, &x), CG_ERR_IO, "missing", "nothing.idx", NULL);
    refused(cg_idx_read(tmpdir, &x), CG_ERR_IO, "directory", tmpdir, NULL);

    /* an image set in MNIST's layout, gzip images and raw labels */
    put_file("train-images-idx3-ubyte.gz", img, hi + 12, true);
    put_file("train-labels-idx1-ubyte", lab, hl + 3, false);
    put_file("t10k-images-idx3-ubyte", img, hi + 8, false); /* 3 images declared, 2 present */
    cg_image_set s = {0};
    CHECK(cg_image_set_load_dir(tmpdir, false, &s) == CG_OK, "load_dir: %s", cg_last_error());
    CHECK(s.n == 3 && s.h == 2 && s.w == 2 && s.num_classes == 8 && s.labels[0] == 2 && s.labels[2] == 7,
          "set %lld %lld %lld %d", (long long)s.n, (long long)s.h, (long long)s.w, (int)s.num_classes);
    refused(cg_image_set_load_dir(tmpdir, true, &(cg_image_set){0}), CG_ERR_IO, "no t10k labels", "t10k-labels", NULL);
    put_file("t10k-labels-idx1-ubyte", lab, hl + 3, false);
    refused(cg_image_set_load_dir(tmpdir, true, &(cg_image_set){0}), CG_ERR_FORMAT, "short t10k images", "t10k-images", "the 8 element bytes");
    /* ranks and counts must agree */
    uint8_t lab2[8 + 2];
    header(lab2, 1, (uint32_t[]){2});
    lab2[8] = lab2[9] = 1;
    const char *l2 = put_file("two-labels", lab2, 10, false);
    refused(cg_image_set_load(raw, l2, &(cg_image_set){0}), CG_ERR_FORMAT, "2 labels, 3 images", "2 labels", "3 images");
    refused(cg_image_set_load(l2, l2, &(cg_image_set){0}), CG_ERR_FORMAT, "labels as images", "3 dimensions", "has 1");

    /* rows: (byte / 255 - mean) / std, rows past the end ignored */
    cg_real px[4 * 4];
    int32_t lb[4];
    cg_image_rows(&s, 1, 4, 0.5, 0.25, px, lb);
    CHECK_NEAR(px[0], (80.0 / 255 - 0.5) / 0.25, 1e-6);
    CHECK_NEAR(px[7], (220.0 / 255 - 0.5) / 0.25, 1e-6);
    CHECK(lb[0] == 0 && lb[1] == 7 && lb[2] == -100 && lb[3] == -100 && px[8] == 0, "rows past the end");
    /* batches: an epoch is a permutation, and the same cursor gives the same batches */
    cg_data_cursor c, c2;
    cg_data_cursor_init(&c, 5);
    c2 = c;
    int seen[8] = {0};
    for (int k = 0; k < 3; k++) {
        CHECK(cg_image_batch(&s, &c, 1, 0.0, 1.0, px, lb) == CG_OK, "%s", cg_last_error());
        seen[lb[0]]++;
    }
    CHECK(seen[2] == 1 && seen[0] == 1 && seen[7] == 1 && c.epoch == 1 && c.pos == 0, "one epoch sees each image once");
    int32_t a[3], b[3];
    cg_real pa[12], pb[12];
    cg_image_batch(&s, &c2, 3, 0.0, 1.0, pa, a);
    cg_data_cursor_init(&c, 5);
    cg_image_batch(&s, &c, 3, 0.0, 1.0, pb, b);
    CHECK(!memcmp(a, b, sizeof a) && !memcmp(pa, pb, sizeof pa), "same seed, same batch");
    CHECK(cg_image_batch(&s, &c, 4, 0.0, 1.0, px, lb) == CG_ERR_ARG, "a batch larger than the set");
    cg_image_set_free(&s);
    CHECK(s.pixels == NULL && s.n == 0, "free zeroes");
}

/* The max |a - b| of a tensor against the fixture entry. */
static double max_diff(const cg_real *a, const cg_st *ref, const char *name, int64_t n) {
    cg_real *b = malloc((size_t)n * sizeof *b);
    double mx = INFINITY;
    if (b && !cg_st_read(ref, name, b, -1, NULL)) {
        mx = 0;
        for (int64_t i = 0; i < n; i++) mx = fmax(mx, fabs((double)a[i] - (double)b[i]));
    }
    free(b);
    return mx;
}

static void parity(const char *name, cg_arch arch) {
    char path[512];
    snprintf(path, sizeof path, FIX "%s/config.json", name);
    size_t len;
    char *cfg = test_slurp(path, &len);
    snprintf(path, sizeof path, FIX "%s/weights.safetensors", name);
    cg_st *w = cg_st_open(path);
    snprintf(path, sizeof path, FIX "%s/expected.safetensors", name);
    cg_st *ref = cg_st_open(path);
    cg_params *ps = cg_params_new();
    cg_model *m = cfg && ps ? cg_model_new(arch, cfg, 0.0, ps, 1) : NULL;
    CHECK(m && w && ref, "%s: %s", name, cg_last_error());
    if (!m || !w || !ref) goto out;
    CHECK(cg_model_load(m, w) == CG_OK, "%s: load: %s", name, cg_last_error());
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_model_graph mg;
    CHECK(cg_model_build(g, m, 3, 0, 0, &mg) == CG_OK, "%s: build: %s", name, cg_last_error());
    cg_tensor *px = cg_model_graph_input(&mg, "pixel_values"), *lb = cg_model_graph_input(&mg, "labels");
    cg_real labels[3];
    CHECK(px && lb && !cg_st_read(ref, "pixel_values", cg_data(px), -1, NULL) &&
          !cg_st_read(ref, "labels", labels, -1, NULL), "%s: inputs: %s", name, cg_last_error());
    for (int i = 0; i < 3; i++) cg_idata(lb)[i] = (int32_t)labels[i];
    cg_retain(mg.logits);
    cg_params_zero_grad(ps);
    CHECK(cg_graph_forward(g) == CG_OK && cg_graph_backward(g, mg.loss) == CG_OK, "%s: run: %s", name, cg_last_error());
    const double lt = max_diff(cg_data(mg.logits), ref, "logits", cg_numel(mg.logits)),
                 ls = max_diff(cg_data(mg.loss), ref, "loss", 1);
    CHECK(lt <= 1e-5, "%s logits max |diff| %g", name, lt);
    CHECK(ls <= 1e-5, "%s loss |diff| %g", name, ls);
    int n = 0;
    for (int i = 0; i < cg_params_count(ps); i++) {
        cg_tensor *p = cg_params_at(ps, i);
        char gname[300];
        snprintf(gname, sizeof gname, "grad.%s", cg_name(p));
        const double e = max_diff(cg_grad(p), ref, gname, cg_numel(p));
        CHECK(e <= 1e-5, "%s %s max |diff| %g", name, gname, e);
        n++;
    }
    CHECK(n == cg_st_count(w) && n >= 8, "%s: %d parameters, %d in the file", name, n, cg_st_count(w));
    /* the config round-trips and a wrong pixel shape is refused, naming the model */
    char *again = cg_model_config_json(m);
    cg_params *ps2 = cg_params_new();
    cg_model *m2 = again ? cg_model_new(arch, again, 0.0, ps2, 1) : NULL;
    CHECK(m2 && cg_params_numel(ps2) == cg_params_numel(ps), "%s: config round trip: %s", name, again ? again : "NULL");
    cg_graph *g2 = cg_graph_new(CG_EVAL);
    cg_tensor *wrong = cg_input(g2, "pixel_values", CG_REAL, 4, (int64_t[]){1, 3, 8, 8});
    CHECK(cg_model_class_logits(g2, m, wrong, NULL) == NULL && strstr(cg_last_error(), cg_arch_name(arch)),
          "%s: wrong shape accepted (%s)", name, cg_last_error());
    cg_graph_free(g2);
    cg_model_free(m2);
    cg_params_free(ps2);
    free(again);
    cg_graph_free(g);
out:
    cg_model_free(m);
    cg_params_free(ps);
    cg_st_close(w);
    cg_st_close(ref);
    free(cfg);
}

/* A CNN trained for 150 steps of 64 images (9,600 of the 60,000, seed 7) must classify at least
 * 80% of the first 2,000 test images right (it reaches about 84%; chance is 10%). */
static int train_part(void) {
    cg_set_threads(1); /* the check is the training, not the threads: one thread keeps it quick on a busy machine */
    if (access(FASHION_MNIST "/train-images-idx3-ubyte.gz", R_OK))
        return test_skip("test_vision train", FASHION_MNIST " is missing (Debian's dataset-fashion-mnist; ./setup.sh)");
    cg_image_set tr = {0}, te = {0};
    CHECK(cg_image_set_load_dir(FASHION_MNIST, false, &tr) == CG_OK && cg_image_set_load_dir(FASHION_MNIST, true, &te) == CG_OK,
          "%s", cg_last_error());
    CHECK(tr.n == 60000 && te.n == 10000 && tr.h == 28 && tr.num_classes == 10, "sizes %lld %lld", (long long)tr.n,
          (long long)te.n);
    const char *cfg = "{\"image_size\": 28, \"channels\": 16, \"n_layer\": 2, \"hidden\": 64, \"num_classes\": 10}";
    cg_params *ps = cg_params_new();
    cg_model *m = cg_model_new(CG_ARCH_CNN, cfg, 0.0, ps, 7);
    cg_graph *g = cg_graph_new(CG_TRAIN), *ge = cg_graph_new(CG_EVAL);
    cg_model_graph mg, me;
    const int64_t B = 64, EB = 500;
    CHECK(m && !cg_model_build(g, m, B, 0, 0, &mg) && !cg_model_build(ge, m, EB, 0, 0, &me), "%s", cg_last_error());
    cg_optim_config oc = cg_optim_defaults(CG_OPT_ADAMW);
    oc.weight_decay = 0.01;
    cg_optim *opt = cg_optim_new(ps, &oc);
    cg_data_cursor c;
    cg_data_cursor_init(&c, 7);
    const int steps = 150;
    cg_status st = CG_OK;
    for (int s = 0; !st && s < steps; s++) {
        const double lr = 2e-3 * (s < 10 ? (s + 1) / 10.0 : 0.5 * (1 + cos(3.14159265358979323846 * (s - 10) / (steps - 10))));
        st = cg_image_batch(&tr, &c, B, 0.2860, 0.3530, cg_data(cg_model_graph_input(&mg, "pixel_values")),
                            cg_idata(cg_model_graph_input(&mg, "labels")));
        if (!st) st = cg_graph_forward(g);
        cg_params_zero_grad(ps);
        if (!st) st = cg_graph_backward(g, mg.loss);
        if (!st) st = cg_optim_step(opt, lr);
    }
    CHECK(st == CG_OK, "training: %s", cg_last_error());
    int64_t right = 0, n = 0;
    for (int64_t i = 0; !st && i < 2000; i += EB) {
        cg_image_rows(&te, i, EB, 0.2860, 0.3530, cg_data(cg_model_graph_input(&me, "pixel_values")),
                      cg_idata(cg_model_graph_input(&me, "labels")));
        if ((st = cg_graph_forward(ge))) break;
        const cg_real *lg = cg_data(me.logits);
        const int32_t *y = cg_idata(cg_model_graph_input(&me, "labels"));
        for (int64_t b = 0; b < EB; b++, n++) {
            int best = 0;
            for (int k = 1; k < 10; k++)
                if (lg[b * 10 + k] > lg[b * 10 + best]) best = k;
            right += best == y[b];
        }
    }
    const double acc = n ? (double)right / (double)n : 0;
    printf("cnn after %d steps of %lld: test accuracy %.4f over %lld images\n", steps, (long long)B, acc, (long long)n);
    CHECK(st == CG_OK && acc >= 0.80, "accuracy %.4f < 0.80 (%s)", acc, cg_last_error());
    cg_optim_free(opt);
    cg_graph_free(g);
    cg_graph_free(ge);
    cg_model_free(m);
    cg_params_free(ps);
    cg_image_set_free(&tr);
    cg_image_set_free(&te);
    TEST_END();
}

int main(int argc, char **argv) {
    if (!strcmp(test_part(argc, argv), "train")) return train_part();
    snprintf(tmpdir, sizeof tmpdir, "/tmp/cgrad_test_vision_%d", (int)getpid());
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", tmpdir, tmpdir);
    if (system(cmd)) return 1;
    test_idx_parse();
    test_idx_files();
    parity("vit", CG_ARCH_VIT);
    parity("vit_mean", CG_ARCH_VIT);
    parity("cnn", CG_ARCH_CNN);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd)) return 1;
    TEST_END();
}
