/* SPDX-License-Identifier: MIT */
/* The one load step (cg_st_load) and the loaders built on it: a Hugging Face file read by
 * cg_model_load, a .ckpt read by cg_st_read_params, a LoRA adapter read by cg_lora_load. Each
 * hostile file is refused with its file, tensor and offending shape, range or value named, and a
 * refused load leaves the parameters of a loaded model bit-identical. Hand-made files: every
 * expected message and value is derived here from the bytes written. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../cgrad.h"
#include "cgrad_bin.h"
#include "check.h"

#include <cjson/cJSON.h>

#define FIX CGRAD_TEST_DIR "/fixtures/models/"

static char dir[] = "/tmp/cgrad_load_XXXXXX";

static const char *path_in(const char *name) {
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

/* A safetensors image from a header and data bytes, written to name in the scratch directory. */
static const char *write_image(const char *name, const char *header, const void *data, size_t nbytes) {
    const char *path = path_in(name);
    FILE *f = fopen(path, "wb");
    uint64_t h = strlen(header);
    fwrite(&h, 8, 1, f);
    fwrite(header, 1, h, f);
    if (nbytes) fwrite(data, 1, nbytes, f);
    fclose(f);
    return path;
}

/* Every parameter's values, copied (free it). */
static cg_real *snapshot(cg_params *ps) {
    const size_t n = (size_t)cg_params_numel(ps);
    cg_real *s = malloc(n * sizeof *s + 1);
    size_t at = 0;
    for (int i = 0; i < cg_params_count(ps); i++) {
        cg_tensor *p = cg_params_at(ps, i);
        memcpy(s + at, cg_data(p), (size_t)cg_numel(p) * sizeof *s);
        at += (size_t)cg_numel(p);
    }
    return s;
}

static bool unchanged(cg_params *ps, const cg_real *before) {
    cg_real *now = snapshot(ps);
    bool same = !memcmp(now, before, (size_t)cg_params_numel(ps) * sizeof *now);
    free(now);
    return same;
}

/* st is the expected status and every needle must be in the message. */
static void expect_refusal(cg_status got, cg_status want, const char *what, const char *n1, const char *n2, const char *n3) {
    const char *e = cg_last_error();
    CHECK(got == want, "%s: status %d, expected %d (%s)", what, got, want, e);
    const char *needles[3] = {n1, n2, n3};
    for (int i = 0; i < 3; i++)
        if (needles[i]) CHECK(strstr(e, needles[i]) != NULL, "%s: the message lacks '%s': %s", what, needles[i], e);
}

/* ---- the load step on its own ---- */

/* Two parameters a[2,3] and b[4] and files that fill them in every wrong way. */
static void load_step(void) {
    cg_params *ps = cg_params_new();
    cg_tensor *a = cg_params_add(ps, "a", 2, (int64_t[]){2, 3}), *b = cg_params_add(ps, "b", 1, (int64_t[]){4});
    float v[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    const char *good = write_image("good.safetensors",
                                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                                   "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[24,40]}}",
                                   v, sizeof v);
    cg_st *f = cg_st_open(good);
    CHECK(f && cg_st_read_params(f, ps) == CG_OK, "good file: %s", cg_last_error());
    CHECK(cg_data(a)[5] == 6 && cg_data(b)[3] == 10, "values %g %g", (double)cg_data(a)[5], (double)cg_data(b)[3]);
    cg_real *before = snapshot(ps);

    struct {
        const char *file, *header, *needle[3];
        cg_status st;
        int nan_at; /* the float to make NaN, or -1 */
    } bad[] = {
        {"shape.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[3,2],\"data_offsets\":[0,24]},"
                              "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[24,40]}}",
         {"'a'", "[3,2]", "[2,3]"}, CG_ERR_SHAPE, -1},
        {"dtype.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                              "\"b\":{\"dtype\":\"I32\",\"shape\":[4],\"data_offsets\":[24,40]}}",
         {"'b'", "I32", "floating"}, CG_ERR_ARG, -1},
        {"overlap.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                                "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,32]}}",
         {"'a' [0, 24)", "'b' [16, 32)", "overlap"}, CG_ERR_FORMAT, -1},
        {"nan.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                            "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[24,40]}}",
         {"'b'", "index 2", "finite"}, CG_ERR_FORMAT, 8},
        {"missing.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}",
         {"no tensor 'b'", "[4]", NULL}, CG_ERR_ARG, -1},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        float w[10];
        memcpy(w, v, sizeof w);
        for (int i = 0; i < 10; i++) w[i] += 100;
        if (bad[k].nan_at >= 0) w[bad[k].nan_at] = NAN;
        const char *path = write_image(bad[k].file, bad[k].header, w, sizeof w);
        cg_st *g = cg_st_open(path);
        CHECK(g != NULL, "%s: %s", bad[k].file, cg_last_error());
        expect_refusal(g ? cg_st_read_params(g, ps) : CG_ERR_IO, bad[k].st, bad[k].file, bad[k].needle[0],
                       bad[k].needle[1], bad[k].needle[2]);
        CHECK(strstr(cg_last_error(), bad[k].file) != NULL, "%s: the message does not name the file: %s", bad[k].file,
              cg_last_error());
        CHECK(unchanged(ps, before), "%s: a refused load changed the parameters", bad[k].file);
        cg_st_close(g);
    }

    /* ties: a twin equal to the source passes; a different or larger one is refused, naming both */
    cg_st_load *l = cg_st_load_new();
    cg_st_load_add(l, a, f, "a");
    cg_st_load_add(l, b, f, "b");
    cg_st_load_tie(l, a, f, "a");
    expect_refusal(cg_st_load_run(l), CG_ERR_FORMAT, "a twin sharing its source's bytes", "overlap", NULL, NULL);
    cg_st_load_free(l);
    const char *tied2 = write_image("tied2.safetensors",
                                    "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                                    "\"twin\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[24,48]},"
                                    "\"big\":{\"dtype\":\"F32\",\"shape\":[4,3],\"data_offsets\":[48,96]}}",
                                    (float[24]){1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 7}, 96);
    cg_st *h = cg_st_open(tied2);
    CHECK(h, "tied files: %s", cg_last_error());
    l = cg_st_load_new();
    cg_st_load_add(l, a, h, "a");
    cg_st_load_tie(l, a, h, "twin");
    expect_refusal(cg_st_load_run(l), CG_ERR_FORMAT, "a twin that differs", "tied tensor 'twin'", "index 5", "'a'");
    CHECK(unchanged(ps, before), "a refused tie changed the parameters");
    cg_st_load_free(l);
    l = cg_st_load_new();
    cg_st_load_add(l, a, h, "a");
    cg_st_load_tie(l, a, h, "big");
    expect_refusal(cg_st_load_run(l), CG_ERR_SHAPE, "a larger twin", "'big'", "[4,3]", "[2,3]");
    CHECK(unchanged(ps, before), "a refused tie changed the parameters");
    cg_st_load_free(l);
    l = cg_st_load_new();
    float same[12] = {1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6};
    const char *ok = write_image("tied_ok.safetensors",
                                 "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                                 "\"twin\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[24,48]}}",
                                 same, sizeof same);
    cg_st *o = cg_st_open(ok);
    cg_st_load_add(l, a, o, "a");
    cg_st_load_tie(l, a, o, "twin");
    CHECK(cg_st_load_run(l) == CG_OK && cg_data(a)[5] == 6, "an equal twin: %s", cg_last_error());
    cg_st_load_free(l);
    /* one parameter filled twice */
    l = cg_st_load_new();
    cg_st_load_add(l, a, o, "a");
    cg_st_load_add(l, a, o, "twin");
    expect_refusal(cg_st_load_run(l), CG_ERR_FORMAT, "a parameter filled twice", "'a'", "twice", NULL);
    cg_st_load_free(l);
    CHECK(cg_st_load_add(NULL, a, o, "a") == CG_ERR_ARG && cg_st_load_run(NULL) == CG_ERR_ARG, "NULL arguments");
    cg_st_load_free(NULL);
    cg_st_close(o), cg_st_close(h), cg_st_close(f);
    free(before);
    cg_params_free(ps);
}

/* ---- Hugging Face files through cg_model_load ---- */

/* The fixture config.json of arch with the first `from` replaced by `to` (NULL: unedited); malloc'd. */
static char *fixture_config(const char *arch, const char *from, const char *to) {
    char p[512];
    snprintf(p, sizeof p, FIX "%s/config.json", arch);
    char *c = test_slurp(p, NULL), *at = c && to ? strstr(c, from) : NULL;
    if (!at) return c;
    const size_t a = strlen(from), b = strlen(to), n = strlen(c);
    char *e = malloc(n - a + b + 1);
    memcpy(e, c, (size_t)(at - c));
    memcpy(e + (at - c), to, b);
    memcpy(e + (at - c) + b, at + a, n - (size_t)(at - c) - a + 1);
    free(c);
    return e;
}

/* The project's own GPT-2 files whose lm_head.weight is [97, 32], loaded into a model of 50 tokens:
 * the twin is larger than its parameter. It used to be read whole into a buffer sized for the
 * parameter (a heap overflow); now the shapes are refused, both named. */
static void tied_twin_larger(void) {
    char *cfg = fixture_config("gpt2", "\"vocab_size\": 97", "\"vocab_size\": 50");
    const char *files[] = {FIX "gpt2/weights_bad_tied.safetensors", FIX "gpt2/weights_hf_prefixed.safetensors"};
    for (int k = 0; k < 2; k++) {
        cg_params *ps = cg_params_new();
        cg_model *m = cg_model_new(CG_ARCH_GPT2, cfg, 0, ps, 1);
        cg_real *before = m ? snapshot(ps) : NULL;
        cg_st *f = cg_st_open(files[k]);
        CHECK(m && f, "%s", cg_last_error());
        expect_refusal(m && f ? cg_model_load(m, f) : CG_ERR_IO, CG_ERR_SHAPE, files[k], "lm_head.weight", "[97,32]", "[50,32]");
        CHECK(strstr(cg_last_error(), files[k]) != NULL, "the message does not name the file: %s", cg_last_error());
        CHECK(before && unchanged(ps, before), "a refused load changed the parameters");
        free(before);
        cg_st_close(f);
        cg_model_free(m);
        cg_params_free(ps);
    }
    free(cfg);
}

/* A model of the fixture config of arch with the fixture's weights (file under FIX arch/). */
static cg_model *fixture_model(const char *arch, cg_arch a, const char *file, cg_params **ps) {
    char *cfg = fixture_config(arch, "", NULL), p[512];
    snprintf(p, sizeof p, FIX "%s/%s", arch, file);
    *ps = cg_params_new();
    cg_model *m = cfg ? cg_model_new(a, cfg, 0, *ps, 1) : NULL;
    cg_st *f = cg_st_open(p);
    CHECK(m && f && cg_model_load(m, f) == CG_OK, "%s: %s", p, cg_last_error());
    cg_st_close(f);
    free(cfg);
    return m;
}

/* The model's parameters under prefix + their names, but for the one called skip (may be NULL). */
static cg_st_writer *hf_writer(cg_model *m, const char *prefix, const char *skip) {
    cg_st_writer *w = cg_st_writer_new();
    cg_params *ps = cg_model_params(m);
    for (int i = 0; i < cg_params_count(ps); i++) {
        if (skip && !strcmp(cg_name(cg_params_at(ps, i)), skip)) continue;
        char name[300];
        snprintf(name, sizeof name, "%s%s", prefix, cg_name(cg_params_at(ps, i)));
        cg_st_add_tensor(w, name, cg_params_at(ps, i));
    }
    return w;
}

/* Rewrites tensor `name`'s data_offsets in a safetensors file to those of tensor `like`. */
static void alias_tensor(const char *path, const char *name, const char *like) {
    size_t len;
    char *img = test_slurp(path, &len);
    uint64_t h;
    memcpy(&h, img, 8);
    cJSON *j = cJSON_ParseWithLength(img + 8, h);
    cJSON *src = cJSON_GetObjectItem(cJSON_GetObjectItem(j, like), "data_offsets");
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(j, name), "data_offsets", cJSON_Duplicate(src, 1));
    char *hdr = cJSON_PrintUnformatted(j);
    FILE *f = fopen(path, "wb");
    uint64_t n = strlen(hdr);
    fwrite(&n, 8, 1, f);
    fwrite(hdr, 1, n, f);
    fwrite(img + 8 + h, 1, len - 8 - h, f);
    fclose(f);
    free(hdr);
    cJSON_Delete(j);
    free(img);
}

/* A Hugging Face file gets the checks a checkpoint gets: overlapping byte ranges, NaN and inf
 * weights and a BERT decoder twin larger than the word embeddings are refused, each leaving a
 * loaded model's parameters as they were. */
static void hf_checks(void) {
    cg_params *ps;
    cg_model *m = fixture_model("gpt2", CG_ARCH_GPT2, "weights.safetensors", &ps);
    cg_real *before = snapshot(ps);
    /* two tensors of the same size on the same bytes */
    cg_st_writer *w = hf_writer(m, "transformer.", NULL);
    const char *path = path_in("overlap_hf.safetensors");
    CHECK(cg_st_write(w, path) == CG_OK, "%s", cg_last_error());
    cg_st_writer_free(w);
    alias_tensor(path, "transformer.h.0.ln_1.weight", "transformer.h.0.ln_1.bias");
    cg_st *f = cg_st_open(path);
    expect_refusal(f ? cg_model_load(m, f) : CG_ERR_IO, CG_ERR_FORMAT, "overlapping data_offsets", "overlap_hf.safetensors",
                   "'transformer.h.0.ln_1.bias'", "'transformer.h.0.ln_1.weight'");
    CHECK(unchanged(ps, before), "a refused load changed the parameters");
    cg_st_close(f);
    /* a NaN, an infinity */
    const double bad[2] = {NAN, -INFINITY};
    for (int k = 0; k < 2; k++) {
        w = hf_writer(m, "", "h.1.ln_2.bias");
        cg_real v[32];
        for (int i = 0; i < 32; i++) v[i] = (cg_real)i / 64;
        v[5] = (cg_real)bad[k];
        cg_st_add(w, "h.1.ln_2.bias", 1, (int64_t[]){32}, v); 
        path = path_in("nan_hf.safetensors");
        CHECK(cg_st_write(w, path) == CG_OK, "%s", cg_last_error());
        cg_st_writer_free(w);
        f = cg_st_open(path);
        expect_refusal(f ? cg_model_load(m, f) : CG_ERR_IO, CG_ERR_FORMAT, "a non-finite weight", "nan_hf.safetensors",
                       "'h.1.ln_2.bias'", "index 5");
        CHECK(unchanged(ps, before), "a refused load changed the parameters");
        cg_st_close(f);
    }
    free(before);
    cg_model_free(m);
    cg_params_free(ps);

    /* BERT's tied decoder, stored with more rows than the word embeddings it is tied to */
    m = fixture_model("bert", CG_ARCH_BERT, "weights.safetensors", &ps);
    before = snapshot(ps);
    w = hf_writer(m, "", NULL);
    cg_real *big = calloc(120 * 32, sizeof *big);
    cg_st_add(w, "cls.predictions.decoder.weight", 2, (int64_t[]){120, 32}, big);
    path = path_in("bert_big_decoder.safetensors");
    CHECK(cg_st_write(w, path) == CG_OK, "%s", cg_last_error());
    cg_st_writer_free(w);
    free(big);
    f = cg_st_open(path);
    expect_refusal(f ? cg_model_load(m, f) : CG_ERR_IO, CG_ERR_SHAPE, "a larger BERT decoder", "cls.predictions.decoder.weight",
                   "[120,32]", "[89,32]");
    CHECK(unchanged(ps, before), "a refused load changed the parameters");
    cg_st_close(f);
    free(before);
    cg_model_free(m);
    cg_params_free(ps);
}

/* A LoRA adapter file goes through the same step: a NaN adapter or a misshapen one is refused
 * and no adapter is added. */
static void lora_checks(void) {
    cg_params *ps;
    cg_model *m = fixture_model("gpt2", CG_ARCH_GPT2, "weights.safetensors", &ps);
    cg_rng r;
    cg_rng_seed(&r, 3);
    CHECK(cg_lora_apply(ps, "c_attn", 2, 4, &r) == 2, "%s", cg_last_error());
    const char *good = path_in("adapters.safetensors");
    CHECK(cg_lora_save(ps, NULL, good) == CG_OK, "%s", cg_last_error());
    cg_model_free(m);
    cg_params_free(ps);
    m = fixture_model("gpt2", CG_ARCH_GPT2, "weights.safetensors", &ps);
    cg_real *before = snapshot(ps);
    const int count = cg_params_count(ps);
    /* the saved file, with one value of an adapter made NaN (its data is after the header) */
    size_t len;
    unsigned char *img = (unsigned char *)test_slurp(good, &len);
    uint64_t h;
    memcpy(&h, img, 8);
    const float nan = NAN;
    memcpy(img + len - 4, &nan, 4); /* the last tensor's last value */
    const char *bad = path_in("adapters_nan.safetensors");
    FILE *fp = fopen(bad, "wb");
    fwrite(img, 1, len, fp);
    fclose(fp);
    free(img);
    expect_refusal(cg_lora_load(ps, bad), CG_ERR_FORMAT, "a NaN adapter", "adapters_nan.safetensors", "lora_", "finite");
    CHECK(cg_params_count(ps) == count && unchanged(ps, before), "a refused adapter load added adapters or changed values");
    /* adapters of the wrong shapes: both named, with the shapes they must have */
    cg_st_writer *w = cg_st_writer_new();
    cg_real *zeros = calloc(96 * 2, sizeof *zeros);
    cg_st_add(w, "h.0.attn.c_attn.weight.lora_A", 2, (int64_t[]){2, 16}, zeros);
    cg_st_add(w, "h.0.attn.c_attn.weight.lora_B", 2, (int64_t[]){96, 2}, zeros);
    cg_st_set_metadata(w, "format", "cgrad-lora");
    cg_st_set_metadata(w, "scale:h.0.attn.c_attn.weight", "2");
    const char *ft = path_in("ft.safetensors");
    CHECK(cg_st_write(w, ft) == CG_OK, "%s", cg_last_error());
    cg_st_writer_free(w);
    free(zeros);
    expect_refusal(cg_lora_load(ps, ft), CG_ERR_SHAPE, "misshapen adapters", "ft.safetensors", "lora_A is [2,16] and lora_B [96,2]",
                   "[r, 96] and [32, r]");
    CHECK(cg_params_count(ps) == count && unchanged(ps, before), "a refused adapter load added adapters or changed values");
    /* the good file loads */
    CHECK(cg_lora_load(ps, good) == CG_OK && cg_params_count(ps) == count + 4, "good adapters: %s", cg_last_error());
    free(before);
    cg_model_free(m);
    cg_params_free(ps);
}

/* Names and text with a NUL: a tensor name "a\u0000b" (cJSON cuts it to "a") and a vocab.txt line
 * holding a NUL byte (saved one token a line, it would come back as two tokens). */
static void nul_bytes(void) {
    float v[2] = {1, 2};
    const char *p = write_image("nul_name.safetensors", "{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                                v, sizeof v);
    cg_st *f = cg_st_open(p);
    CHECK(f == NULL, "a name holding \\u0000 opened");
    const char *e = cg_last_error();
    CHECK(strstr(e, "nul_name.safetensors") && strstr(e, "a\\u0000b") && strstr(e, "NUL"), "%s", e);
    cg_st_close(f);
    char raw[] = "{\"a?b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    raw[3] = 0;
    const char *rp = path_in("nul_raw.safetensors");
    FILE *fp = fopen(rp, "wb");
    uint64_t n = sizeof raw - 1;
    fwrite(&n, 8, 1, fp), fwrite(raw, 1, n, fp), fwrite(v, 1, 8, fp);
    fclose(fp);
    f = cg_st_open(rp);
    CHECK(f == NULL && strstr(cg_last_error(), "nul_raw.safetensors") && strstr(cg_last_error(), "a?b"), "raw NUL: %s",
          cg_last_error());
    cg_st_close(f);
    /* an escaped backslash before u0000 is no NUL */
    p = write_image("backslash.safetensors", "{\"a\\\\u0000b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", v,
                    sizeof v);
    f = cg_st_open(p);
    CHECK(f && cg_st_find(f, "a\\u0000b") == 0, "an escaped backslash: %s", cg_last_error());
    cg_st_close(f);

    static const char vocab[] = "[UNK]\n[CLS]\nab\0cd\nef\n";
    cg_tokenizer *t = cg_tokenizer_wordpiece_from_memory(vocab, sizeof vocab - 1, "dir/vocab.txt");
    CHECK(t == NULL && strstr(cg_last_error(), "dir/vocab.txt") && strstr(cg_last_error(), "line 3") &&
              strstr(cg_last_error(), "NUL"),
          "a NUL in vocab.txt: %s", cg_last_error());
    cg_tokenizer_free(t);
}

/* ---- through the command: what a user sees ---- */

static char bin[PATH_MAX + 16];

/* Runs `cgrad ARGS` in the scratch directory; its exit code, stderr into err (static). */
static int run(const char *args, const char **err) {
    char cmd[2 * PATH_MAX + 2048];
    snprintf(cmd, sizeof cmd, "cd '%s' && timeout -s KILL 120 '%s' %s < /dev/null > out.txt 2> err.txt", dir, bin, args);
    const int st = system(cmd);
    static char *e;
    free(e);
    e = test_slurp(path_in("err.txt"), NULL);
    *err = e ? e : "";
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void spit(const char *name, const char *text, size_t len) {
    FILE *f = fopen(path_in(name), "wb");
    if (f) fwrite(text, 1, len, f), fclose(f);
}

static void copy_file(const char *from, const char *to) {
    size_t n;
    char *s = test_slurp(from, &n);
    CHECK(s != NULL, "cannot read %s", from);
    if (s) spit(to, s, n);
    free(s);
}

/* A char tokenizer of n code points (from 32 up) as cg_tokenizer.json into directory d. */
static void char_tokenizer(const char *d, int n) {
    char json[8192] = "{\"kind\": \"char\", \"codepoints\": [", name[256];
    for (int i = 0; i < n; i++) snprintf(json + strlen(json), sizeof json - strlen(json), "%s%d", i ? ", " : "", 32 + i);
    strcat(json, "]}");
    snprintf(name, sizeof name, "%s/cg_tokenizer.json", d);
    spit(name, json, strlen(json));
}

/* A vocab.txt of n tokens ([UNK], [CLS], [SEP], [MASK], [PAD], then words) into directory d. */
static void vocab_txt(const char *d, int n) {
    static const char *const special[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "sea", "ship"};
    char text[8192] = "", name[256];
    for (int i = 0; i < n; i++)
        if (i < 8) snprintf(text + strlen(text), sizeof text - strlen(text), "%s\n", special[i]);
        else snprintf(text + strlen(text), sizeof text - strlen(text), "w%d\n", i);
    snprintf(name, sizeof name, "%s/vocab.txt", d);
    spit(name, text, strlen(text));
}

/* The model directory d: config.json (the fixture's, edited from -> to), weights, tokenizer. */
static void model_dir(const char *d, const char *arch, const char *from, const char *to, const char *weights) {
    char name[256], *cfg = fixture_config(arch, from ? from : "", to);
    mkdir(path_in(d), 0777);
    snprintf(name, sizeof name, "%s/config.json", d);
    spit(name, cfg, strlen(cfg));
    snprintf(name, sizeof name, "%s/model.safetensors", d);
    copy_file(weights, name);
    free(cfg);
}

static void expect_cli_refusal(const char *args, const char *what, const char *n1, const char *n2, const char *n3) {
    const char *err;
    const int rc = run(args, &err);
    CHECK(rc == 1, "%s: `cgrad %s` exited %d (1 expected): %s", what, args, rc, err);
    const char *needles[3] = {n1, n2, n3};
    for (int i = 0; i < 3; i++)
        if (needles[i]) CHECK(strstr(err, needles[i]) != NULL, "%s: stderr lacks '%s': %s", what, needles[i], err);
}

/* The heap overflow's four doors (info, sample, fill-mask, train --init-from), the vocabulary
 * checks of a Hugging Face directory and of a .ckpt, and a config.json key given twice. */
static void cli_checks(void) {
    if (!test_find_cgrad(bin, sizeof bin, "test_load")) {
        CHECK(false, "no cgrad binary");
        return;
    }
    const char *err;
    spit("text.txt", "the sea and the ship\n", 21);
    /* a good GPT-2 directory loads */
    model_dir("gdir", "gpt2", NULL, NULL, FIX "gpt2/weights.safetensors");
    char_tokenizer("gdir", 97);
    CHECK(run("info gdir", &err) == 0, "a good directory: %s", err);
    /* the project's own tied fixtures into a model of 50 tokens */
    const char *tied[2] = {"weights_bad_tied", "weights_hf_prefixed"};
    for (int k = 0; k < 2; k++) {
        char w[512];
        snprintf(w, sizeof w, FIX "gpt2/%s.safetensors", tied[k]);
        model_dir("small", "gpt2", "\"vocab_size\": 97", "\"vocab_size\": 50", w);
        char_tokenizer("small", 50);
        expect_cli_refusal("info small", tied[k], "small/model.safetensors", "lm_head.weight", "[97,32]");
        expect_cli_refusal("sample --checkpoint small --length 4", tied[k], "lm_head.weight", "[97,32]", "[50,32]");
        expect_cli_refusal("train --init-from small --data text.txt --steps 1", tied[k], "lm_head.weight", "[97,32]",
                           "[50,32]");
    }
    /* BERT: a decoder twin larger than the word embeddings, through fill-mask */
    cg_params *ps;
    cg_model *m = fixture_model("bert", CG_ARCH_BERT, "weights.safetensors", &ps);
    cg_st_writer *wr = hf_writer(m, "", NULL);
    cg_real *big = calloc(120 * 32, sizeof *big);
    cg_st_add(wr, "cls.predictions.decoder.weight", 2, (int64_t[]){120, 32}, big);
    free(big);
    model_dir("bdir", "bert", NULL, NULL, FIX "bert/weights.safetensors");
    vocab_txt("bdir", 89);
    CHECK(run("fill-mask --checkpoint bdir the [MASK] ship", &err) == 0, "a good BERT directory: %s", err);
    const char *out = test_slurp(path_in("out.txt"), NULL);
    CHECK(out && !strstr(out, "(null)"), "fill-mask printed a token without a spelling: %s", out ? out : "");
    free((void *)out);
    CHECK(cg_st_write(wr, path_in("bdir/model.safetensors")) == CG_OK, "%s", cg_last_error());
    cg_st_writer_free(wr);
    expect_cli_refusal("fill-mask --checkpoint bdir the [MASK] ship", "a larger BERT decoder", "bdir/model.safetensors",
                       "cls.predictions.decoder.weight", "[120,32]");
    /* a vocab.txt cut short (88 of 89 tokens): fill-mask used to print (null) rows at exit 0 */
    model_dir("bdir", "bert", NULL, NULL, FIX "bert/weights.safetensors");
    vocab_txt("bdir", 88);
    expect_cli_refusal("fill-mask --checkpoint bdir the [MASK] ship", "a trimmed vocab.txt", "bdir/vocab.txt", "88 tokens",
                       "89");
    /* a tokenizer with more tokens than the model embeds */
    char_tokenizer("gdir", 98);
    expect_cli_refusal("sample --checkpoint gdir --length 4", "a larger tokenizer", "gdir/cg_tokenizer.json", "98 tokens",
                       "97");
    char_tokenizer("gdir", 97);
    /* a .ckpt whose tokenizer metadata is cut short */
    for (int n = 97; n >= 96; n--) {
        cg_params *gps;
        cg_model *gm = fixture_model("gpt2", CG_ARCH_GPT2, "weights.safetensors", &gps);
        cg_st_writer *w = hf_writer(gm, "", NULL);
        char *cfg = fixture_config("gpt2", "", NULL), tok[8192] = "{\"kind\": \"char\", \"codepoints\": [";
        for (int i = 0; i < n; i++) snprintf(tok + strlen(tok), sizeof tok - strlen(tok), "%s%d", i ? ", " : "", 32 + i);
        strcat(tok, "]}");
        cg_st_set_metadata(w, "arch", "gpt2");
        cg_st_set_metadata(w, "config", cfg);
        cg_st_set_metadata(w, "tokenizer", tok);
        CHECK(cg_checkpoint_save(w, path_in("short.ckpt")) == CG_OK, "%s", cg_last_error());
        cg_st_writer_free(w);
        free(cfg);
        cg_model_free(gm);
        cg_params_free(gps);
        if (n == 97) CHECK(run("info short.ckpt", &err) == 0, "a whole tokenizer: %s", err);
        else expect_cli_refusal("info short.ckpt", "tokenizer metadata cut short", "short.ckpt", "96 tokens", "97");
    }
    /* a key twice in config.json: the first one (32) was read and the model loaded, silently */
    char *cfg = fixture_config("gpt2", "\"torch_dtype\": \"float32\"", "\"torch_dtype\": \"float32\",\n  \"n_embd\": 64");
    spit("gdir/config.json", cfg, strlen(cfg));
    free(cfg);
    expect_cli_refusal("info gdir", "a duplicate key", "gdir/config.json", "\"n_embd\"", "twice");
    cg_model_free(m);
    cg_params_free(ps);
}

int main(void) {
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    load_step();
    tied_twin_larger();
    hf_checks();
    lora_checks();
    nul_bytes();
    cli_checks();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) fprintf(stderr, "cannot remove %s\n", dir);
    TEST_END();
}
