/* SPDX-License-Identifier: MIT */
/* Checkpoints: round trip, the gzip stream is standard (zlib's own gz reader inflates it to the
 * safetensors image), damaged files are rejected with a message naming them, and a save killed
 * half way leaves the previous checkpoint intact. */
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "../cgrad.h"
#include "../io/checkpoint.h"
#include "check.h"

static char dir[64];

/* dir/name in one of 4 rotating buffers: only for short-lived uses, long-lived paths use PATH. */
static const char *in_dir(const char *name) {
    static char buf[4][512];
    static int k;
    char *b = buf[k++ & 3];
    snprintf(b, 512, "%s/%s", dir, name);
    return b;
}

#define PATH(var, name)  \
    char var[512];       \
    snprintf(var, sizeof var, "%s/%s", dir, name)

static void spit(const char *path, const void *p, size_t n) {
    FILE *fp = fopen(path, "wb");
    fwrite(p, 1, n, fp);
    fclose(fp);
}

/* gzip-compresses an arbitrary image with zlib's own writer (for hand-made bad checkpoints). */
static void gzip_to(const char *path, const void *p, size_t n) {
    gzFile gz = gzopen(path, "wb");
    gzwrite(gz, p, (unsigned)n);
    gzclose(gz);
}

/* The writer's image, gzip-compressed to path (a checkpoint with the writer's metadata as it is). */
static void gzip_writer_to(const char *path, cg_st_writer *w) {
    void *img;
    size_t n;
    cg_st_serialize(w, &img, &n);
    gzip_to(path, img, n);
    free(img);
}

/* Number of temp files ("<base>.tmp.*") in the test directory. */
static int count_temps(const char *base, char *found, size_t found_len) {
    DIR *d = opendir(dir);
    int n = 0;
    size_t bl = strlen(base);
    for (struct dirent *de; d && (de = readdir(d));)
        if (strncmp(de->d_name, base, bl) == 0 && strncmp(de->d_name + bl, ".tmp.", 5) == 0) {
            if (found) snprintf(found, found_len, "%s", de->d_name);
            n++;
        }
    if (d) closedir(d);
    return n;
}

static void expect_open_fails(const char *path, const char *what, const char *what2) {
    cg_st *f = cg_checkpoint_open(path);
    const char *e = cg_last_error();
    CHECK(f == NULL, "%s opened", path);
    CHECK(strstr(e, path) != NULL, "message does not name %s: %s", path, e);
    CHECK(strstr(e, what) || (what2 && strstr(e, what2)), "message lacks '%s': %s", what, e);
    cg_st_close(f);
}

static cg_st_writer *small_writer(cg_real base, const char *step) {
    cg_st_writer *w = cg_st_writer_new();
    cg_real v[12];
    for (int i = 0; i < 12; i++) v[i] = base + (cg_real)i / 7;
    cg_st_add(w, "w", 2, (int64_t[]){3, 4}, v);
    cg_st_add_ids(w, "rng", 1, (int64_t[]){2}, (int32_t[]){12345, -6789});
    cg_st_set_metadata(w, "step", step);
    return w;
}

static void check_small(const char *path, cg_real base, const char *step) {
    cg_st *f = cg_checkpoint_open(path);
    CHECK(f != NULL, "open %s: %s", path, cg_last_error());
    if (!f) return;
    cg_real v[12];
    CHECK(cg_st_read(f, "w", v, 2, (int64_t[]){3, 4}) == CG_OK, "read w: %s", cg_last_error());
    for (int i = 0; i < 12; i++) CHECK(v[i] == base + (cg_real)i / 7, "w[%d] = %.9g", i, (double)v[i]);
    int32_t ids[2];
    CHECK(cg_st_read_ids(f, "rng", ids, 1, (int64_t[]){2}) == CG_OK && ids[0] == 12345 && ids[1] == -6789, "rng");
    CHECK(cg_st_metadata(f, "step") && strcmp(cg_st_metadata(f, "step"), step) == 0, "step %s, want %s",
          cg_st_metadata(f, "step"), step);
    cg_st_close(f);
}

static void test_round_trip(void) {
    PATH(path, "model.ckpt");
    cg_rng r;
    cg_rng_seed(&r, 3);
    static cg_real big[4096];
    for (int i = 0; i < 4096; i++) big[i] = (cg_real)cg_rng_normal(&r);
    big[0] = (cg_real)NAN;
    big[1] = (cg_real)-INFINITY;
    big[2] = (cg_real)-0.0;
    cg_st_writer *w = small_writer(1, "100");
    cg_st_add(w, "big", 3, (int64_t[]){16, 16, 16}, big);
    CHECK(cg_checkpoint_save(w, path) == CG_OK, "save: %s", cg_last_error());
    check_small(path, 1, "100");
    cg_st *f = cg_checkpoint_open(path);
    if (f) {
        static cg_real back[4096];
        CHECK(cg_st_read(f, "big", back, 3, (int64_t[]){16, 16, 16}) == CG_OK && memcmp(back, big, sizeof big) == 0,
              "big differs");
        CHECK(strcmp(cg_st_metadata(f, "format"), "cgrad-checkpoint") == 0, "format");
        CHECK(strcmp(cg_st_metadata(f, "version"), "1") == 0, "version");
        /* a read error names the checkpoint */
        CHECK(cg_st_read(f, "big", back, 1, (int64_t[]){4096}) == CG_ERR_SHAPE && strstr(cg_last_error(), path), "%s",
              cg_last_error());
    }
    cg_st_close(f);

    /* the file is plain gzip holding exactly the writer's safetensors image */
    void *img;
    size_t img_len, disk_len;
    CHECK(cg_st_serialize(w, &img, &img_len) == CG_OK, "serialize");
    unsigned char *disk = (unsigned char *)test_slurp(path, &disk_len);
    CHECK(disk && disk_len > 18 && disk[0] == 0x1f && disk[1] == 0x8b, "gzip magic");
    gzFile gz = gzopen(path, "rb");
    unsigned char *plain = malloc(img_len + 64);
    int got = gzread(gz, plain, (unsigned)img_len + 64);
    gzclose(gz);
    CHECK(got == (int)img_len && memcmp(plain, img, img_len) == 0, "gunzipped %d bytes, image %zu", got, img_len);
    free(plain);
    free(img);
    free(disk);
    cg_st_writer_free(w);
}

static void test_damaged(void) {
    PATH(path, "good.ckpt");
    PATH(bad, "bad.ckpt");
    cg_st_writer *w = small_writer(2, "7");
    cg_rng r;
    cg_rng_seed(&r, 11);
    static cg_real noise[8192];
    for (int i = 0; i < 8192; i++) noise[i] = (cg_real)cg_rng_normal(&r);
    cg_st_add(w, "noise", 1, (int64_t[]){8192}, noise);
    CHECK(cg_checkpoint_save(w, path) == CG_OK, "save: %s", cg_last_error());
    size_t len;
    unsigned char *good = (unsigned char *)test_slurp(path, &len);
    CHECK(good != NULL, "read back");
    if (!good) return;

    /* truncated anywhere: header, deflate data, CRC, length */
    const size_t cuts[] = {0, 1, 2, 5, 10, 11, 100, len / 3, len / 2, len - 9, len - 8, len - 5, len - 4, len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
        spit(bad, good, cuts[i]);
        expect_open_fails(bad, cuts[i] < 2 ? "not a gzip file" : "truncated gzip stream", NULL);
    }
    /* a flipped bit anywhere past the gzip header: CRC, length or inflate error, never garbage */
    const size_t flips[] = {10, 12, 40, len / 3, len / 2, 2 * len / 3, len - 20, len - 8, len - 6, len - 3};
    for (size_t i = 0; i < sizeof flips / sizeof *flips; i++)
        for (int bit = 0; bit < 8; bit += 3) {
            good[flips[i]] ^= (unsigned char)(1 << bit);
            spit(bad, good, len);
            good[flips[i]] ^= (unsigned char)(1 << bit);
            cg_st *f = cg_checkpoint_open(bad);
            CHECK(f == NULL, "bit %d of byte %zu/%zu flipped and accepted", bit, flips[i], len);
            const char *e = cg_last_error();
            CHECK(strstr(e, bad) && (strstr(e, "CRC mismatch") || strstr(e, "length mismatch") ||
                                     strstr(e, "corrupt gzip data") || strstr(e, "truncated")),
                  "flip at %zu: %s", flips[i], e);
            cg_st_close(f);
        }
    /* the middle of the stream is stored/deflated data: only the CRC can catch a flip there */
    good[len / 2] ^= 0x10;
    spit(bad, good, len);
    good[len / 2] ^= 0x10;
    expect_open_fails(bad, "CRC mismatch", "corrupt gzip data");

    /* wrong magic: a plain safetensors file is not a checkpoint */
    CHECK(cg_st_write(w, bad) == CG_OK, "write plain");
    expect_open_fails(bad, "not a gzip file (starts with bytes", NULL);
    /* trailing garbage after the gzip member */
    unsigned char *more = malloc(len + 3);
    memcpy(more, good, len);
    memcpy(more + len, "xyz", 3);
    spit(bad, more, len + 3);
    expect_open_fails(bad, "trailing bytes after the gzip stream", NULL);
    free(more);
    /* valid gzip, wrong contents */
    gzip_to(bad, "hello", 5);
    expect_open_fails(bad, "corrupt safetensors image inside the gzip: file is 5 bytes", NULL);
    cg_st_writer *v = small_writer(0, "1");
    gzip_writer_to(bad, v);
    expect_open_fails(bad, "__metadata__ format is missing, expected 'cgrad-checkpoint'", NULL);
    cg_st_set_metadata(v, "format", "pytorch");
    cg_st_set_metadata(v, "version", "1");
    gzip_writer_to(bad, v);
    expect_open_fails(bad, "format is 'pytorch'", NULL);
    cg_st_set_metadata(v, "format", "cgrad-checkpoint");
    cg_st_set_metadata(v, "version", "2");
    gzip_writer_to(bad, v);
    expect_open_fails(bad, "version is '2'", NULL);
    cg_st_set_metadata(v, "version", "1");
    gzip_writer_to(bad, v);
    check_small(bad, 0, "1"); /* the same image with the right metadata is accepted */
    expect_open_fails(in_dir("missing.ckpt"), "cannot open", NULL);
    cg_st_writer_free(v);
    cg_st_writer_free(w);
    free(good);
}

static void nap_us(long us) {
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
}

static void test_atomic(void) {
    PATH(path, "run.ckpt");
    cg_st_writer *old = small_writer(5, "500");
    CHECK(cg_checkpoint_save(old, path) == CG_OK, "save old: %s", cg_last_error());
    size_t old_len;
    unsigned char *old_bytes = (unsigned char *)test_slurp(path, &old_len);

    /* 16 MB of noise takes the child long enough to be caught mid-write */
    const int64_t n = 4 << 20;
    cg_real *big = malloc((size_t)n * sizeof *big);
    cg_rng r;
    cg_rng_seed(&r, 5);
    for (int64_t i = 0; i < n; i++) big[i] = (cg_real)(int64_t)(cg_rng_next(&r) >> 40) * (cg_real)1e-3;
    cg_st_writer *w = cg_st_writer_new();
    cg_st_add(w, "big", 1, &n, big);
    free(big);

    pid_t child = fork();
    if (child == 0) {
        cg_checkpoint_save(w, path);
        _exit(0);
    }
    CHECK(child > 0, "fork");
    char temp[256] = "";
    bool caught = false;
    for (int i = 0; i < 200000 && !caught; i++) { /* at most ~20 s */
        if (count_temps("run.ckpt", temp, sizeof temp) > 0) {
            struct stat st;
            caught = stat(in_dir(temp), &st) == 0 && st.st_size > 0;
        }
        if (!caught) nap_us(100);
    }
    kill(child, SIGKILL);
    int status = 0;
    waitpid(child, &status, 0);
    CHECK(caught && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "child not killed mid-write (caught %d)",
          caught);

    /* the old checkpoint is byte-for-byte what it was, opens, and a partial temp file is left */
    size_t now_len;
    unsigned char *now = (unsigned char *)test_slurp(path, &now_len);
    CHECK(now && now_len == old_len && memcmp(now, old_bytes, old_len) == 0, "old checkpoint changed");
    free(now);
    check_small(path, 5, "500");
    CHECK(count_temps("run.ckpt", NULL, 0) == 1, "%d temp files after the crash", count_temps("run.ckpt", NULL, 0));

    /* a temp file of a live process (our parent) must survive the next save */
    char live[64];
    snprintf(live, sizeof live, "run.ckpt.tmp.%ld.0", (long)getppid());
    spit(in_dir(live), "x", 1);

    /* the next save succeeds, replaces the file and removes the dead child's temp file */
    cg_st_writer *next = small_writer(6, "600");
    CHECK(cg_checkpoint_save(next, path) == CG_OK, "save after crash: %s", cg_last_error());
    check_small(path, 6, "600");
    char left[256] = "";
    CHECK(count_temps("run.ckpt", left, sizeof left) == 1 && strcmp(left, live) == 0, "temps left: %d (%s)",
          count_temps("run.ckpt", NULL, 0), left);
    unlink(in_dir(live));

    /* rename fails (the path is a non-empty directory): error, no temp file left */
    PATH(blocked, "blocked.ckpt");
    mkdir(blocked, 0755);
    char inside[600];
    snprintf(inside, sizeof inside, "%s/keep", blocked);
    spit(inside, "k", 1);
    CHECK(cg_checkpoint_save(next, blocked) == CG_ERR_IO, "save over a directory succeeded");
    CHECK(strstr(cg_last_error(), blocked) && strstr(cg_last_error(), "rename"), "%s", cg_last_error());
    CHECK(count_temps("blocked.ckpt", NULL, 0) == 0, "temp file left after a failed rename");
    unlink(inside);
    rmdir(blocked);
    /* unwritable location */
    CHECK(cg_checkpoint_save(next, "/nonexistent-dir/x.ckpt") == CG_ERR_IO &&
              strstr(cg_last_error(), "/nonexistent-dir/x.ckpt") && strstr(cg_last_error(), "temp file"),
          "%s", cg_last_error());
    CHECK(cg_checkpoint_save(next, in_dir("")) == CG_ERR_ARG, "directory path accepted");
    CHECK(cg_checkpoint_save(NULL, path) == CG_ERR_ARG && cg_checkpoint_open(NULL) == NULL, "NULL arguments");

    free(old_bytes);
    cg_st_writer_free(old);
    cg_st_writer_free(next);
    cg_st_writer_free(w);
}

static void remove_dir(void) {
    DIR *d = opendir(dir);
    for (struct dirent *de; d && (de = readdir(d));)
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) unlink(in_dir(de->d_name));
    if (d) closedir(d);
    rmdir(dir);
}

/* A safetensors image from a header and raw data bytes. */
static size_t st_image(unsigned char *out, const char *header, const void *data, size_t data_len) {
    uint64_t h = strlen(header);
    memcpy(out, &h, 8);
    memcpy(out + 8, header, h);
    memcpy(out + 8 + h, data, data_len);
    return 8 + h + data_len;
}

/* Hostile contents behind a valid gzip stream: aliased tensors, non-finite weights, a parameter
 * count that overflows. Each is refused with the tensor (and the file) named; none hangs. */
static void test_hostile(void) {
    unsigned char img[1024];
    float data[6] = {1, 2, 3, 4, 5, 6};
    /* two tensors sharing bytes 8..16: writing one would change the other */
    size_t n = st_image(img,
                        "{\"__metadata__\":{\"format\":\"" CG_CHECKPOINT_FORMAT "\",\"version\":\"" CG_CHECKPOINT_VERSION "\"},"
                        "\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                        "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
                        data, sizeof data);
    PATH(alias, "alias.ckpt");
    gzip_to(alias, img, n);
    expect_open_fails(alias, "'a' [0, 16) and 'b' [8, 24) overlap", NULL);
    /* the same tensors side by side are fine, and so is an empty tensor anywhere */
    n = st_image(img,
                 "{\"__metadata__\":{\"format\":\"" CG_CHECKPOINT_FORMAT "\",\"version\":\"" CG_CHECKPOINT_VERSION "\"},"
                 "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
                 data, sizeof data);
    gzip_to(alias, img, n);
    cg_st *f = cg_checkpoint_open(alias);
    CHECK(f != NULL, "adjacent tensors refused: %s", cg_last_error());
    cg_st_close(f);

    /* A NaN or an infinity among the weights: the parameter load names the tensor, index and file. */
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    for (int k = 0; k < 3; k++) {
        cg_params *ps = cg_params_new();
        cg_tensor *p = cg_params_add(ps, "h.0.w", 2, (int64_t[]){3, 4});
        cg_real v[12];
        for (int i = 0; i < 12; i++) v[i] = (cg_real)i;
        cg_st_writer *w = cg_st_writer_new();
        cg_st_add(w, "h.0.w", 2, (int64_t[]){3, 4}, v);
        PATH(good, "finite.ckpt");
        CHECK(cg_checkpoint_save(w, good) == CG_OK, "%s", cg_last_error());
        cg_st_writer_free(w);
        v[7] = (cg_real)bad[k];
        w = cg_st_writer_new();
        cg_st_add(w, "h.0.w", 2, (int64_t[]){3, 4}, v);
        PATH(path, "nan.ckpt");
        CHECK(cg_checkpoint_save(w, path) == CG_OK, "%s", cg_last_error());
        cg_st_writer_free(w);
        cg_st *g = cg_checkpoint_open(good), *h = cg_checkpoint_open(path);
        CHECK(g && cg_st_read_params(g, ps) == CG_OK && cg_data(p)[7] == 7, "finite weights: %s", cg_last_error());
        cg_status st = h ? cg_st_read_params(h, ps) : CG_ERR_IO;
        const char *e = cg_last_error();
        CHECK(st == CG_ERR_FORMAT && strstr(e, "'h.0.w'") && strstr(e, "index 7") && strstr(e, "nan.ckpt") &&
                  strstr(e, "finite"),
              "weight %g: status %d, '%s'", (double)bad[k], st, e);
        CHECK(cg_data(p)[7] == 7, "a refused load changed the parameters (%g)", (double)cg_data(p)[7]);
        cg_st_close(g), cg_st_close(h);
        cg_params_free(ps);
    }

    /* Shapes whose element count wraps int64, or needs more than memory can address: an error, at once. */
    const int64_t shapes[3][2] = {{INT64_C(1) << 40, INT64_C(1) << 40}, {INT64_MAX / 2, 3}, {INT64_C(1) << 61, 1}};
    for (int k = 0; k < 3; k++) {
        cg_params *ps = cg_params_new();
        cg_tensor *ok = cg_params_add(ps, "small", 1, (int64_t[]){5});
        cg_tensor *p = cg_params_add(ps, "wte.weight", 2, shapes[k]);
        const char *e = cg_last_error();
        CHECK(ok && !p && strstr(e, "wte.weight") && strstr(e, "elements"), "shape [%lld, %lld]: %s", (long long)shapes[k][0],
              (long long)shapes[k][1], e);
        CHECK(cg_params_numel(ps) == 5 && cg_params_count(ps) == 1, "a refused add changed the set");
        cg_params_free(ps);
    }
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/cgrad_ckpt_XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_round_trip();
    test_damaged();
    test_atomic();
    test_hostile();
    remove_dir();
    TEST_END();
}
