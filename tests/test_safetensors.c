/* SPDX-License-Identifier: MIT */
/* safetensors: fixtures written by tests/make_safetensors_fixtures.py (torch does the f16/bf16
 * rounding), every kind of corrupt header, the writer's layout, and byte-exact round trips. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../cgrad.h"
#include "../io/safetensors.h"
#include "check.h"

#define FX(name) CGRAD_TEST_DIR "/fixtures/safetensors/" name

#ifdef CGRAD_DOUBLE
#define REAL_DT "F64"
#else
#define REAL_DT "F32"
#endif

/* Same value, bit for bit (any NaN matches any NaN). */
static int same_real(double a, double b) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    return a == b && signbit(a) == signbit(b);
}

static void expect_open_fails(const char *path, const char *base, const char *what) {
    cg_clear_error();
    cg_st *f = cg_st_open(path);
    const char *e = cg_last_error();
    CHECK(f == NULL, "%s opened", base);
    CHECK(strstr(e, base) != NULL, "message for %s does not name the file: %s", base, e);
    CHECK(strstr(e, what) != NULL, "message for %s lacks '%s': %s", base, what, e);
    cg_st_close(f);
}

static void test_f32_fixture(void) {
    cg_st *f = cg_st_open(FX("f32.safetensors"));
    CHECK(f != NULL, "open: %s", cg_last_error());
    if (!f) return;
    const char *names[] = {"bias", "double", "double_as_f32", "empty", "scalar", "weight"};
    CHECK(cg_st_count(f) == 6, "count %d", cg_st_count(f));
    for (int i = 0; i < 6; i++)
        CHECK(cg_st_name(f, i) && strcmp(cg_st_name(f, i), names[i]) == 0, "name %d = %s", i, cg_st_name(f, i));
    CHECK(cg_st_name(f, 6) == NULL && cg_st_name(f, -1) == NULL, "out-of-range names");
    CHECK(cg_st_find(f, "weight") == 5 && cg_st_find(f, "bias") == 0 && cg_st_find(f, "nope") == -1, "find");
    CHECK(cg_st_find(f, "__metadata__") == -1, "metadata is not a tensor");
    CHECK(cg_st_metadata(f, "format") && strcmp(cg_st_metadata(f, "format"), "pt") == 0, "format metadata");
    CHECK(cg_st_metadata(f, "note") && strcmp(cg_st_metadata(f, "note"), "hello \"world\"") == 0, "note %s",
          cg_st_metadata(f, "note"));
    CHECK(cg_st_metadata(f, "missing") == NULL, "missing metadata");

    const char *dt = NULL;
    int nd = -1;
    int64_t sh[CG_MAX_DIMS] = {0};
    CHECK(cg_st_info(f, "weight", &dt, &nd, sh) == CG_OK, "info: %s", cg_last_error());
    CHECK(dt && strcmp(dt, "F32") == 0 && nd == 2 && sh[0] == 2 && sh[1] == 3, "weight info %s %d [%lld,%lld]",
          dt, nd, (long long)sh[0], (long long)sh[1]);
    CHECK(cg_st_info(f, "scalar", &dt, &nd, sh) == CG_OK && nd == 0, "scalar ndim %d", nd);
    CHECK(cg_st_info(f, "double", &dt, NULL, NULL) == CG_OK && strcmp(dt, "F64") == 0, "double dtype %s", dt);
    CHECK(cg_st_info(f, "nope", &dt, &nd, sh) == CG_ERR_ARG, "info of a missing tensor");
    CHECK(strstr(cg_last_error(), "'nope'") && strstr(cg_last_error(), "f32.safetensors"), "%s", cg_last_error());

    cg_real w[6];
    const int64_t ws[2] = {2, 3};
    const float want[6] = {1.5f, -2.25f, 3.0f, 0.1f, 1e-30f, -7e20f};
    CHECK(cg_st_read(f, "weight", w, 2, ws) == CG_OK, "read weight: %s", cg_last_error());
    for (int i = 0; i < 6; i++) CHECK(w[i] == (cg_real)want[i], "weight[%d] = %.9g, want %.9g", i, (double)w[i], want[i]);
    cg_real b[2], s = 0;
    CHECK(cg_st_read(f, "bias", b, -1, NULL) == CG_OK && b[0] == 0.5 && b[1] == -0.5, "bias");
    CHECK(cg_st_read(f, "scalar", &s, 0, NULL) == CG_OK && s == 42, "scalar %g", (double)s);
    const int64_t es[2] = {2, 0};
    CHECK(cg_st_read(f, "empty", NULL, 2, es) == CG_OK, "empty: %s", cg_last_error());

    /* F64 converts to cg_real: torch's own float() rounding in the float build, exact in f64 */
    cg_real d[3], d32[3];
    CHECK(cg_st_read(f, "double", d, 1, (int64_t[]){3}) == CG_OK, "double: %s", cg_last_error());
    CHECK(cg_st_read(f, "double_as_f32", d32, 1, (int64_t[]){3}) == CG_OK, "double_as_f32");
#ifdef CGRAD_DOUBLE
    const double dw[3] = {1.0 / 3.0, -2.5e-300, 123456789.125};
    for (int i = 0; i < 3; i++) CHECK(d[i] == dw[i], "double[%d] = %.17g", i, d[i]);
#else
    for (int i = 0; i < 3; i++) CHECK(same_real(d[i], d32[i]), "double[%d] = %.9g, torch %.9g", i, d[i], d32[i]);
#endif

    /* wrong expected shape: both shapes, the tensor and the file in the message */
    cg_real junk[6];
    CHECK(cg_st_read(f, "weight", junk, 2, (int64_t[]){3, 2}) == CG_ERR_SHAPE, "wrong shape accepted");
    const char *e = cg_last_error();
    CHECK(strstr(e, "[2,3]") && strstr(e, "[3,2]") && strstr(e, "'weight'") && strstr(e, "f32.safetensors"), "%s", e);
    CHECK(cg_st_read(f, "weight", junk, 1, (int64_t[]){6}) == CG_ERR_SHAPE, "wrong ndim accepted");
    CHECK(strstr(cg_last_error(), "[2,3]") && strstr(cg_last_error(), "[6]"), "%s", cg_last_error());
    CHECK(cg_st_read(f, "missing", junk, -1, NULL) == CG_ERR_ARG, "missing tensor read");
    CHECK(strstr(cg_last_error(), "'missing'") != NULL, "%s", cg_last_error());
    int32_t ids[6];
    CHECK(cg_st_read_ids(f, "weight", ids, -1, NULL) == CG_ERR_ARG, "read_ids of F32 accepted");
    CHECK(strstr(cg_last_error(), "F32") != NULL, "%s", cg_last_error());
    cg_st_close(f);
}

/* x holds the low-precision values, x_f32 torch's conversion of them to float32. */
static void check_lowp(const char *path, const char *label, int n) {
    cg_st *f = cg_st_open(path);
    CHECK(f != NULL, "open %s: %s", label, cg_last_error());
    if (!f) return;
    cg_real x[32], ref[32];
    const int64_t shape[1] = {n};
    CHECK(cg_st_read(f, "x", x, 1, shape) == CG_OK, "%s x: %s", label, cg_last_error());
    CHECK(cg_st_read(f, "x_f32", ref, 1, shape) == CG_OK, "%s x_f32: %s", label, cg_last_error());
    for (int i = 0; i < n; i++)
        CHECK(same_real(x[i], ref[i]), "%s x[%d] = %.9g, torch says %.9g", label, i, (double)x[i], (double)ref[i]);
    cg_st_close(f);
}

static void test_f16_bf16(void) {
    check_lowp(FX("f16.safetensors"), "f16", 14);
    check_lowp(FX("bf16.safetensors"), "bf16", 13);
    /* hand-derived, in case torch and we agree on something wrong */
    cg_st *f = cg_st_open(FX("f16.safetensors"));
    cg_real x[14], m[12], mref[12];
    if (f && cg_st_read(f, "x", x, -1, NULL) == CG_OK) {
        CHECK(x[2] == 65504 && x[3] == ldexp(1, -14), "max %g, min normal %g", (double)x[2], (double)x[3]);
        CHECK(x[4] == ldexp(1, -24) && x[5] == ldexp(3, -24) && x[6] == ldexp(1023, -24), "subnormals %g %g %g",
              (double)x[4], (double)x[5], (double)x[6]);
        CHECK(x[7] == 0 && signbit(x[7]), "-0 = %g", (double)x[7]);
        CHECK(isinf(x[8]) && x[8] > 0 && isinf(x[9]) && x[9] < 0 && isnan(x[10]), "inf -inf nan");
        CHECK(x[11] == ldexp(1638, -14), "0.1 in f16 = %.9g", (double)x[11]);
    }
    const char *dt = NULL;
    CHECK(f && cg_st_info(f, "m", &dt, NULL, NULL) == CG_OK && strcmp(dt, "F16") == 0, "f16 dtype");
    CHECK(f && cg_st_read(f, "m", m, 2, (int64_t[]){3, 4}) == CG_OK, "f16 m");
    CHECK(f && cg_st_read(f, "m_f32", mref, 2, (int64_t[]){3, 4}) == CG_OK, "f16 m_f32");
    for (int i = 0; f && i < 12; i++) CHECK(same_real(m[i], mref[i]), "m[%d]", i);
    cg_st_close(f);
    f = cg_st_open(FX("bf16.safetensors"));
    if (f && cg_st_read(f, "x", x, -1, NULL) == CG_OK) {
        CHECK(x[3] == ldexp(1, -126) && x[4] == ldexp(1, -133) && x[5] == ldexp(5, -133), "bf16 min normal/subnormals");
        CHECK(x[6] == 0 && signbit(x[6]) && isinf(x[7]) && isinf(x[8]) && x[8] < 0 && isnan(x[9]), "bf16 specials");
        CHECK(x[11] == 1.0, "bf16(1+2^-8) ties to even: %.9g", (double)x[11]);
    }
    cg_st_close(f);
}

static void test_ids(void) {
    cg_st *f = cg_st_open(FX("ids.safetensors"));
    CHECK(f != NULL, "open ids: %s", cg_last_error());
    if (!f) return;
    int32_t ids[6];
    const int32_t want[6] = {0, 5, 50256, -3, INT32_MAX, INT32_MIN};
    CHECK(cg_st_read_ids(f, "ids", ids, 2, (int64_t[]){2, 3}) == CG_OK, "I64: %s", cg_last_error());
    for (int i = 0; i < 6; i++) CHECK(ids[i] == want[i], "ids[%d] = %d, want %d", i, ids[i], want[i]);
    int32_t v[3];
    CHECK(cg_st_read_ids(f, "i32", v, 1, (int64_t[]){3}) == CG_OK && v[0] == 7 && v[1] == -8 && v[2] == 9, "I32");
    CHECK(cg_st_read_ids(f, "i16", v, -1, NULL) == CG_OK && v[0] == -32768 && v[1] == 32767, "I16");
    CHECK(cg_st_read_ids(f, "i8", v, -1, NULL) == CG_OK && v[0] == -128 && v[1] == 127, "I8");
    CHECK(cg_st_read_ids(f, "u8", v, -1, NULL) == CG_OK && v[0] == 0 && v[1] == 255, "U8");
    CHECK(cg_st_read_ids(f, "mask", v, -1, NULL) == CG_OK && v[0] == 1 && v[1] == 0 && v[2] == 1, "BOOL");
    CHECK(cg_st_read_ids(f, "too_big", v, -1, NULL) == CG_ERR_RANGE, "2^31 accepted as int32");
    const char *e = cg_last_error();
    CHECK(strstr(e, "'too_big'") && strstr(e, "2147483648") && strstr(e, "ids.safetensors"), "%s", e);
    CHECK(cg_st_read_ids(f, "ids", ids, 2, (int64_t[]){3, 2}) == CG_ERR_SHAPE, "ids wrong shape");
    cg_real r[6];
    CHECK(cg_st_read(f, "ids", r, -1, NULL) == CG_ERR_ARG, "cg_st_read of I64 accepted");
    CHECK(strstr(cg_last_error(), "I64") != NULL, "%s", cg_last_error());
    cg_st_close(f);
}

static void test_overlap(void) {
    cg_st *f = cg_st_open(FX("overlap.safetensors"));
    CHECK(f != NULL, "overlapping tensors rejected: %s", cg_last_error());
    if (!f) return;
    cg_real all[6], tail[4];
    CHECK(cg_st_read(f, "all", all, 1, (int64_t[]){6}) == CG_OK && all[5] == 5, "all");
    CHECK(cg_st_read(f, "tail", tail, 2, (int64_t[]){2, 2}) == CG_OK, "tail");
    for (int i = 0; i < 4; i++) CHECK(tail[i] == i + 2, "tail[%d] = %g", i, (double)tail[i]);
    cg_st_close(f);
}

static void test_bad_files(void) {
    static const struct { const char *file, *what; } bad[] = {
        {"bad_truncated.safetensors", "shorter than the 8-byte header length"},
        {"bad_header_len.safetensors", "header length 1000 is larger than the file"},
        {"bad_json.safetensors", "not valid JSON"},
        {"bad_not_object.safetensors", "not a JSON object"},
        {"bad_offsets_past_end.safetensors", "[0, 16] go past the end of the 8-byte data buffer"},
        {"bad_size.safetensors", "hold 8 bytes but F32[3] needs 12"},
        {"bad_dtype.safetensors", "unknown dtype 'F12'"},
        {"bad_no_dtype.safetensors", "'t' has no dtype"},
        {"bad_no_shape.safetensors", "'t' has no shape"},
        {"bad_no_offsets.safetensors", "'t' has no data_offsets"},
        {"bad_end_before_begin.safetensors", "[8, 4] end before begin"},
        {"bad_negative_dim.safetensors", "negative dim -2"},
        {"bad_duplicate.safetensors", "duplicate tensor name 't'"},
        {"bad_metadata.safetensors", "__metadata__ value of 'k' is not a string"},
    };
    char path[4096];
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(path, sizeof path, "%s/fixtures/safetensors/%s", CGRAD_TEST_DIR, bad[i].file);
        expect_open_fails(path, bad[i].file, bad[i].what);
    }
    expect_open_fails(FX("no_such_file.safetensors"), "no_such_file.safetensors", "cannot open");
    expect_open_fails(CGRAD_TEST_DIR "/fixtures", "fixtures", "is a directory");
}

/* In-memory images with a hand-written header, for cases the fixtures do not cover. */
static void *image(const char *header, const void *data, size_t nbytes, size_t *len) {
    size_t h = strlen(header);
    unsigned char *p = malloc(8 + h + nbytes + 1);
    uint64_t hl = h;
    memcpy(p, &hl, 8);
    memcpy(p + 8, header, h);
    if (nbytes) memcpy(p + 8 + h, data, nbytes);
    *len = 8 + h + nbytes;
    return p;
}

static void expect_memory_fails(const char *header, size_t nbytes, const char *what) {
    static const unsigned char zeros[64];
    size_t len;
    void *img = image(header, zeros, nbytes, &len);
    cg_st *f = cg_st_open_memory(img, len, "mem-label");
    CHECK(f == NULL, "header %s accepted", header);
    CHECK(strstr(cg_last_error(), "mem-label") && strstr(cg_last_error(), what), "header %s: %s", header,
          cg_last_error());
    cg_st_close(f);
    free(img);
}

static void test_memory_images(void) {
    /* F8 formats, hand-derived: e4m3fn bias 7 (no inf, S.1111.111 is NaN), e5m2 bias 15 */
    const unsigned char f8[8] = {0x38, 0x01, 0x7f, 0xfe, 0x3c, 0x7c, 0x01, 0x7f};
    size_t len;
    void *img = image("{\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[0,4]},"
                      "\"b\":{\"dtype\":\"F8_E5M2\",\"shape\":[4],\"data_offsets\":[4,8]}}   ",
                      f8, 8, &len);
    cg_st *f = cg_st_open_memory(img, len, NULL);
    free(img); /* open_memory copies */
    CHECK(f != NULL, "f8 image: %s", cg_last_error());
    cg_real a[4], b[4];
    if (f && cg_st_read(f, "a", a, -1, NULL) == CG_OK && cg_st_read(f, "b", b, -1, NULL) == CG_OK) {
        CHECK(a[0] == 1 && a[1] == ldexp(1, -9) && isnan(a[2]) && a[3] == -448, "e4m3 %g %g %g %g", (double)a[0],
              (double)a[1], (double)a[2], (double)a[3]);
        CHECK(b[0] == 1 && isinf(b[1]) && b[2] == ldexp(1, -16) && isnan(b[3]), "e5m2 %g %g %g %g", (double)b[0],
              (double)b[1], (double)b[2], (double)b[3]);
    }
    cg_st_close(f);

    /* empty header and no tensors is a valid file */
    img = image("{}      ", NULL, 0, &len);
    f = cg_st_open_memory(img, len, "empty");
    free(img);
    CHECK(f && cg_st_count(f) == 0, "empty file: %s", cg_last_error());
    cg_st_close(f);

    expect_memory_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}xyz", 4, "bytes after the object");
    expect_memory_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.5]}}", 8, "data_offsets is not");
    expect_memory_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 8, "data_offsets is not");
    expect_memory_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 8, "not an integer");
    expect_memory_fails("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", 8,
                        "needs more than");
    expect_memory_fails("{\"a\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 8, "dtype is not a string");
    expect_memory_fails("{\"a\":[1]}", 8, "entry 'a' is not a JSON object");
    expect_memory_fails("{\"__metadata__\":[]}", 0, "__metadata__ is not a JSON object");
    expect_memory_fails("", 0, "not valid JSON");

    /* a tensor with more dims than cgrad supports opens, but info says why it cannot be used */
    img = image("{\"big\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", "\x07", 1, &len);
    f = cg_st_open_memory(img, len, "sevendims");
    free(img);
    CHECK(f != NULL, "7-dim tensor: %s", cg_last_error());
    int64_t sh[CG_MAX_DIMS];
    CHECK(f && cg_st_info(f, "big", NULL, NULL, sh) == CG_ERR_SHAPE && strstr(cg_last_error(), "7 dims"), "%s",
          cg_last_error());
    int32_t v = 0;
    CHECK(f && cg_st_read_ids(f, "big", &v, -1, NULL) == CG_OK && v == 7, "7-dim read %d", v);
    cg_st_close(f);
}

static void check_header_sorted(const unsigned char *img, size_t len, const char *const *names, int n) {
    uint64_t hl;
    memcpy(&hl, img, 8);
    CHECK(hl % 8 == 0 && 8 + hl <= len, "header length %llu", (unsigned long long)hl);
    char *h = malloc(hl + 1);
    memcpy(h, img + 8, hl);
    h[hl] = 0;
    CHECK(strncmp(h, "{\"__metadata__\":{", 17) == 0, "header starts %.40s", h);
    const char *prev = h;
    for (int i = 0; i < n; i++) { /* each name appears after the previous one */
        char key[64];
        snprintf(key, sizeof key, "\"%s\":{\"dtype\"", names[i]);
        const char *at = strstr(h, key);
        CHECK(at && at > prev, "name %s out of order in header %s", names[i], h);
        if (at) prev = at;
    }
    size_t end = strlen(h);
    while (end && h[end - 1] == ' ') end--;
    CHECK(end && h[end - 1] == '}' && hl - end < 8, "padding: %zu spaces", (size_t)(hl - end));
    free(h);
}

static void test_round_trip(void) {
    cg_rng r;
    cg_rng_seed(&r, 7);
    cg_real a[24], c = (cg_real)-3.25;
    for (int i = 0; i < 24; i++) a[i] = (cg_real)cg_rng_normal(&r);
    a[3] = (cg_real)INFINITY;
    a[4] = (cg_real)-0.0;
    a[5] = (cg_real)1e-40; /* float subnormal */
    const int32_t ids[5] = {1, -2, INT32_MAX, INT32_MIN, 0};
    const int64_t s234[3] = {2, 3, 4}, s5[1] = {5}, s0[2] = {3, 0};

    /* a transposed view must be written in its logical (row-major) order */
    cg_graph *g = cg_graph_new(CG_EVAL);
    cg_tensor *x = cg_input(g, "x", CG_REAL, 2, (int64_t[]){2, 3});
    for (int i = 0; i < 6; i++) cg_data(x)[i] = (cg_real)(i + 1);
    cg_tensor *xt = cg_transpose(g, x, 0, 1);
    cg_tensor *tok = cg_input(g, "tok", CG_INT32, 1, (int64_t[]){3});
    for (int i = 0; i < 3; i++) cg_idata(tok)[i] = 10 * i;
    CHECK(cg_graph_forward(g) == CG_OK, "forward: %s", cg_last_error());

    cg_params *ps = cg_params_new();
    cg_tensor *p1 = cg_params_add(ps, "layer.0.weight", 2, (int64_t[]){3, 5});
    cg_tensor *p2 = cg_params_add(ps, "layer.0.bias", 1, (int64_t[]){5});
    cg_fill_normal(p1, &r, 0, 1);
    cg_fill_normal(p2, &r, 0, 1);

    cg_st_writer *w = cg_st_writer_new();
    CHECK(cg_st_add(w, "zeta", 3, s234, a) == CG_OK, "add: %s", cg_last_error());
    CHECK(cg_st_add(w, "alpha", 0, NULL, &c) == CG_OK, "add scalar: %s", cg_last_error());
    CHECK(cg_st_add(w, "empty", 2, s0, NULL) == CG_OK, "add empty: %s", cg_last_error());
    CHECK(cg_st_add_ids(w, "ids", 1, s5, ids) == CG_OK, "add_ids: %s", cg_last_error());
    CHECK(cg_st_add_tensor(w, "xt", xt) == CG_OK, "add_tensor view: %s", cg_last_error());
    CHECK(cg_st_add_tensor(w, "tok", tok) == CG_OK, "add_tensor ids: %s", cg_last_error());
    CHECK(cg_st_add(w, "q\"uote\\d\n", 1, s5, a) == CG_OK, "odd name: %s", cg_last_error());
    CHECK(cg_st_add_params(w, ps) == CG_OK, "add_params: %s", cg_last_error());
    CHECK(cg_st_set_metadata(w, "step", "12") == CG_OK && cg_st_set_metadata(w, "a key", "x\ty") == CG_OK &&
              cg_st_set_metadata(w, "step", "13") == CG_OK, "metadata");
    /* writer errors */
    CHECK(cg_st_add(w, "alpha", 1, s5, a) == CG_ERR_ARG && strstr(cg_last_error(), "'alpha' added twice"), "dup: %s",
          cg_last_error());
    CHECK(cg_st_add(w, "__metadata__", 1, s5, a) == CG_ERR_ARG, "reserved name accepted");
    CHECK(cg_st_add(w, "neg", 1, (int64_t[]){-1}, a) != CG_OK, "negative dim accepted");
    CHECK(cg_st_add(w, "nulldata", 1, s5, NULL) == CG_ERR_ARG, "NULL data accepted");
    CHECK(cg_st_add(w, "nulldata", 1, s5, a) == CG_OK, "name free again after a failed add");

    void *bytes = NULL;
    size_t len = 0;
    CHECK(cg_st_serialize(w, &bytes, &len) == CG_OK, "serialize: %s", cg_last_error());
    const char *order[] = {"alpha", "empty", "ids", "layer.0.bias", "layer.0.weight", "nulldata", "tok", "xt", "zeta"};
    check_header_sorted(bytes, len, order, 9);
    /* data starts 8-byte aligned and the first tensor (alpha) sits at offset 0 */
    uint64_t hl;
    memcpy(&hl, bytes, 8);
    cg_real first;
    memcpy(&first, (unsigned char *)bytes + 8 + hl, sizeof first);
    CHECK(first == c, "first tensor in data is alpha: %g", (double)first);

    cg_st *f = cg_st_open_memory(bytes, len, "roundtrip");
    CHECK(f != NULL, "reopen: %s", cg_last_error());
    if (f) {
        cg_real back[24];
        const char *dt;
        CHECK(cg_st_info(f, "zeta", &dt, NULL, NULL) == CG_OK && strcmp(dt, REAL_DT) == 0, "dtype %s", dt);
        CHECK(cg_st_read(f, "zeta", back, 3, s234) == CG_OK && memcmp(back, a, sizeof a) == 0, "zeta bytes differ");
        CHECK(cg_st_read(f, "alpha", back, 0, NULL) == CG_OK && memcmp(back, &c, sizeof c) == 0, "alpha");
        CHECK(cg_st_read(f, "empty", back, 2, s0) == CG_OK, "empty");
        CHECK(cg_st_read(f, "q\"uote\\d\n", back, 1, s5) == CG_OK && memcmp(back, a, 5 * sizeof *a) == 0, "odd name");
        int32_t ib[5];
        CHECK(cg_st_info(f, "ids", &dt, NULL, NULL) == CG_OK && strcmp(dt, "I32") == 0, "ids dtype %s", dt);
        CHECK(cg_st_read_ids(f, "ids", ib, 1, s5) == CG_OK && memcmp(ib, ids, sizeof ids) == 0, "ids differ");
        CHECK(cg_st_read_ids(f, "tok", ib, 1, (int64_t[]){3}) == CG_OK && ib[0] == 0 && ib[1] == 10 && ib[2] == 20,
              "tok");
        const cg_real xtw[6] = {1, 4, 2, 5, 3, 6};
        CHECK(cg_st_read(f, "xt", back, 2, (int64_t[]){3, 2}) == CG_OK && memcmp(back, xtw, sizeof xtw) == 0,
              "transposed view %g %g %g", (double)back[0], (double)back[1], (double)back[2]);
        CHECK(cg_st_metadata(f, "step") && strcmp(cg_st_metadata(f, "step"), "13") == 0, "metadata replaced");
        CHECK(cg_st_metadata(f, "a key") && strcmp(cg_st_metadata(f, "a key"), "x\ty") == 0, "metadata escape");

        /* read_params: a fresh set with the same names gets identical values */
        cg_params *ps2 = cg_params_new();
        cg_tensor *q1 = cg_params_add(ps2, "layer.0.weight", 2, (int64_t[]){3, 5});
        cg_tensor *q2 = cg_params_add(ps2, "layer.0.bias", 1, (int64_t[]){5});
        CHECK(cg_st_read_params(f, ps2) == CG_OK, "read_params: %s", cg_last_error());
        CHECK(memcmp(cg_data(q1), cg_data(p1), 15 * sizeof(cg_real)) == 0, "weight differs");
        CHECK(memcmp(cg_data(q2), cg_data(p2), 5 * sizeof(cg_real)) == 0, "bias differs");
        /* a missing or misshapen parameter fails before anything is written */
        cg_params *ps3 = cg_params_new();
        cg_tensor *r1 = cg_params_add(ps3, "layer.0.bias", 1, (int64_t[]){5});
        cg_params_add(ps3, "layer.1.bias", 1, (int64_t[]){5});
        CHECK(cg_st_read_params(f, ps3) == CG_ERR_ARG && strstr(cg_last_error(), "'layer.1.bias'"), "%s",
              cg_last_error());
        CHECK(cg_data(r1)[0] == 0, "read_params wrote before failing");
        cg_params *ps4 = cg_params_new();
        cg_params_add(ps4, "layer.0.weight", 2, (int64_t[]){5, 3});
        CHECK(cg_st_read_params(f, ps4) == CG_ERR_SHAPE && strstr(cg_last_error(), "[3,5]") &&
                  strstr(cg_last_error(), "[5,3]"), "%s", cg_last_error());
        cg_params *ps5 = cg_params_new();
        cg_params_add(ps5, "ids", 1, s5);
        CHECK(cg_st_read_params(f, ps5) == CG_ERR_ARG && strstr(cg_last_error(), "I32"), "%s", cg_last_error());
        cg_params_free(ps2);
        cg_params_free(ps3);
        cg_params_free(ps4);
        cg_params_free(ps5);
    }
    cg_st_close(f);

    /* cg_st_write produces the same bytes, and the file opens */
    char path[] = "/tmp/cgrad_st_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    close(fd);
    CHECK(cg_st_write(w, path) == CG_OK, "write: %s", cg_last_error());
    FILE *fp = fopen(path, "rb");
    unsigned char *disk = malloc(len + 16);
    size_t got = fp ? fread(disk, 1, len + 16, fp) : 0;
    if (fp) fclose(fp);
    CHECK(got == len && memcmp(disk, bytes, len) == 0, "file (%zu bytes) differs from image (%zu)", got, len);
    f = cg_st_open(path);
    cg_real back[24];
    CHECK(f && cg_st_read(f, "zeta", back, 3, s234) == CG_OK && memcmp(back, a, sizeof a) == 0, "file round trip");
    cg_st_close(f);
    unlink(path);
    CHECK(cg_st_write(w, "/nonexistent-dir/x.safetensors") == CG_ERR_IO &&
              strstr(cg_last_error(), "/nonexistent-dir/x.safetensors"), "%s", cg_last_error());

    /* every truncation and every single-byte corruption of the header is rejected or read safely
     * (this is the sanitizer build's job: no reads outside the image) */
    int accepted_trunc = 0;
    for (size_t cut = 0; cut < len; cut++) {
        cg_st *t = cg_st_open_memory(bytes, cut, "cut");
        accepted_trunc += t != NULL;
        cg_st_close(t);
    }
    CHECK(accepted_trunc == 0, "%d truncated images accepted", accepted_trunc);
    unsigned char *mut = malloc(len);
    for (size_t i = 0; i < 8 + hl; i++) {
        memcpy(mut, bytes, len);
        mut[i] ^= 0x5a;
        cg_st *t = cg_st_open_memory(mut, len, "flip");
        for (int k = 0; t && k < cg_st_count(t); k++) {
            int nd;
            int64_t sh[CG_MAX_DIMS];
            if (cg_st_info(t, cg_st_name(t, k), NULL, &nd, sh) != CG_OK) continue;
            int64_t n = 1;
            for (int d = 0; d < nd; d++) n *= sh[d];
            if (n > 1000) continue;
            cg_real buf[1000];
            int32_t ib[1000];
            if (cg_st_read(t, cg_st_name(t, k), buf, -1, NULL) != CG_OK) cg_st_read_ids(t, cg_st_name(t, k), ib, -1, NULL);
        }
        cg_st_close(t);
    }
    free(mut);
    free(disk);
    free(bytes);
    cg_st_writer_free(w);
    cg_params_free(ps);
    cg_graph_free(g);
}

int main(void) {
    test_f32_fixture();
    test_f16_bf16();
    test_ids();
    test_overlap();
    test_bad_files();
    test_memory_images();
    test_round_trip();
    TEST_END();
}
