/* SPDX-License-Identifier: MIT */
/* The cgrad command at its limits: devices and oversized files refused before a byte is read,
 * run.json booleans and decimal numbers, a whole-or-nothing export under kill -9, writes that
 * fail (a file-size limit) stopping the run with the path and the reason, an eval batch capped by
 * the data, a step on an empty batch refused, and plot's too-long lines and empty files. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#include <cgrad/cgrad.h>
#include "check.h"
#include "cgrad_bin.h"
#pragma GCC diagnostic ignored "-Wunused-function" /* the harness serves several test files */
#include "cli_harness.h"

/* Runs `prefix; cgrad ARGS` through the shell in the scratch directory (prefix: ulimit and the
 * like); stdout to out.txt unless args redirects it. */
static result sh_run(const char *prefix, const char *args, int seconds) {
    char cmd[3 * PATH_MAX + 4096];
    snprintf(cmd, sizeof cmd, "cd '%s' && %s timeout -s KILL %d '%s' %s < /dev/null > out.txt 2> err.txt", dir,
             prefix ? prefix : "", seconds, bin, args);
    int st = system(cmd);
    result r = {WIFEXITED(st) ? WEXITSTATUS(st) : -1, test_slurp(path_of("out.txt"), NULL), test_slurp(path_of("err.txt"), NULL)};
    if (!r.out) r.out = calloc(1, 1);
    if (!r.err) r.err = calloc(1, 1);
    return r;
}

/* Files in the scratch directory whose name contains part. */
static int count_named(const char *sub, const char *part) {
    DIR *d = opendir(*sub ? path_of(sub) : dir);
    int n = 0;
    for (struct dirent *de; d && (de = readdir(d));) n += strstr(de->d_name, part) != NULL;
    if (d) closedir(d);
    return n;
}

/* A cap on the address space, so an unbounded read fails instead of taking the machine; none
 * under AddressSanitizer, whose shadow memory needs terabytes of address space. */
#if defined(__SANITIZE_ADDRESS__)
#define VMEM_CAP ""
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define VMEM_CAP ""
#endif
#endif
#ifndef VMEM_CAP
#define VMEM_CAP "ulimit -v 2000000;"
#endif

static const char *tiny = "--layers 1 --dim 16 --heads 2 --context 16 --batch 2 --eval-every 0 --save-every 0 --log-every 0";

/* ---- 1. run files and numbers ---- */

static void test_run_json_booleans(void) {
    static const char *const bad[] = {"0", "1", "2", "\"no\"", "\"off\"", "\"yes\"", "\"true\"", "null", NULL};
    char json[256], args[512];
    for (int i = 0; bad[i]; i++) {
        snprintf(json, sizeof json, "{\"checkpoint_activations\": %s, \"steps\": 0}\n", bad[i]);
        spit("bool.json", json);
        snprintf(args, sizeof args, "train --config bool.json %s --data text.txt --checkpoint b.ckpt", tiny);
        result r = cgrad_t(args, 60);
        CHECK(r.rc == 2 && strstr(r.err, "bool.json") && strstr(r.err, "checkpoint_activations") &&
                  strstr(r.err, "true or false"),
              "checkpoint_activations = %s: rc %d, stderr '%s'", bad[i], r.rc, r.err);
        result_free(&r);
    }
    /* true and false are taken, and the run file written says which, as a JSON boolean */
    for (int on = 0; on < 2; on++) {
        snprintf(json, sizeof json, "{\"checkpoint_activations\": %s, \"steps\": 1}\n", on ? "true" : "false");
        spit("bool.json", json);
        snprintf(args, sizeof args, "train --config bool.json %s --data text.txt --checkpoint b%d.ckpt", tiny, on);
        result r = cgrad_t(args, 120);
        char name[32];
        snprintf(name, sizeof name, "b%d_run.json", on);
        char *text = test_slurp(path_of(name), NULL);
        cJSON *j = text ? cJSON_Parse(text) : NULL;
        free(text);
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "checkpoint_activations");
        CHECK(r.rc == 0 && cJSON_IsBool(v) && cJSON_IsTrue(v) == on, "checkpoint_activations %d: rc %d, run file %s, '%s'",
              on, r.rc, v ? (cJSON_IsBool(v) ? "bool" : "not bool") : "missing", r.err);
        cJSON_Delete(j);
        result_free(&r);
    }
    /* the run file a run wrote is a --config that reads back */
    snprintf(args, sizeof args, "train --config b1_run.json --steps 1 --checkpoint b2.ckpt");
    result r = cgrad_t(args, 120);
    CHECK(r.rc == 0, "--config of a written run file: rc %d '%s'", r.rc, r.err);
    result_free(&r);
}

static void test_decimal_numbers(void) {
    static const struct { const char *flag, *value; } bad[] = {
        {"--lr", "0x10"}, {"--lr", "0x1p-4"}, {"--lr", "infinity"}, {"--lr", " 1e-3"}, {"--lr", "1e-3 "},
        {"--steps", "0x10"}, {"--steps", " 5"}, {"--seed", " 5"}, {"--seed", "0x10"}, {"--dropout", "nan"},
        {"--clip", "1.5x"}, {"--batch", "+0x2"}, {NULL, NULL}};
    char args[256];
    for (int i = 0; bad[i].flag; i++) {
        snprintf(args, sizeof args, "train %s '%s' --steps 0", bad[i].flag, bad[i].value);
        if (!strcmp(bad[i].flag, "--steps")) snprintf(args, sizeof args, "train --steps '%s'", bad[i].value);
        result r = cgrad_t(args, 30);
        CHECK(r.rc == 2 && strstr(r.err, bad[i].flag), "%s '%s': rc %d, stderr '%s'", bad[i].flag, bad[i].value, r.rc,
              r.err);
        result_free(&r);
    }
    /* in a run file too: a string value is read as the flag's would be */
    spit("hex.json", "{\"lr\": \"0x10\"}\n");
    result r = cgrad_t("train --config hex.json --steps 0", 30);
    CHECK(r.rc == 2 && strstr(r.err, "--lr") && strstr(r.err, "hex.json"), "run file lr 0x10: rc %d '%s'", r.rc, r.err);
    result_free(&r);
    /* decimal forms stay: exponent, sign, leading dot */
    snprintf(args, sizeof args, "train --lr 1E-3 --beta1 .9 --weight-decay +0.5 --steps 1 %s --data text.txt --checkpoint d.ckpt", tiny);
    r = cgrad_t(args, 120);
    CHECK(r.rc == 0, "decimal numbers refused: rc %d '%s'", r.rc, r.err);
    result_free(&r);
}

/* ---- 2. bounded reading ---- */

static void test_devices(void) {
    static const char *const cmds[] = {
        "info /dev/zero", "info /dev/urandom", "train --config /dev/zero", "train --data /dev/zero --steps 1",
        "eval --checkpoint small.ckpt --data /dev/zero", "plot /dev/zero --out z.svg",
        "train --arch classifier --data cls.tsv --val-data /dev/zero --steps 1", "sample --checkpoint /dev/zero", NULL};
    for (int i = 0; cmds[i]; i++) {
        /* 2 GB of address space: an unbounded read fails or is killed instead of taking the machine */
        result r = sh_run(VMEM_CAP, cmds[i], 60);
        CHECK(r.rc != 0 && r.rc != 137 && strstr(r.err, "/dev/") && strstr(r.err, "character device"),
              "%s: rc %d, stderr '%s'", cmds[i], r.rc, r.err);
        result_free(&r);
    }
    /* a pipe with nobody writing: refused or read to its end, never a hang */
    char fifo[PATH_MAX + 64];
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    mkfifo(fifo, 0600);
    result r = sh_run(NULL, "info fifo", 30);
    CHECK(r.rc != 0 && r.rc != 137 && strstr(r.err, "fifo"), "info on a fifo: rc %d '%s'", r.rc, r.err);
    result_free(&r);
}

/* Sparse files just over a limit: refused from their size, before reading (so at once). */
static void test_size_limits(void) {
    static const struct { const char *name; long long bytes; const char *cmd; } big[] = {
        {"big.json", (64ll << 20) + 1, "train --config big.json"},
        {"big.txt", (2ll << 30) + 1, "train --data big.txt --steps 1"},
        {"big.csv", (256ll << 20) + 1, "plot big.csv --out big.svg"},
        {NULL, 0, NULL}};
    for (int i = 0; big[i].name; i++) {
        int fd = open(path_of(big[i].name), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        CHECK(fd >= 0 && ftruncate(fd, big[i].bytes) == 0, "cannot make %s", big[i].name);
        if (fd >= 0) close(fd);
        result r = sh_run(VMEM_CAP, big[i].cmd, 60);
        CHECK(r.rc != 0 && r.rc != 137 && strstr(r.err, big[i].name) && strstr(r.err, "limit"), "%s: rc %d '%s'",
              big[i].cmd, r.rc, r.err);
        result_free(&r);
        unlink(path_of(big[i].name));
    }
}

/* ---- 3. atomic export ---- */

/* Whether directory a holds exactly the files of reference directory b, byte for byte. */
static bool same_dir(const char *a, const char *b) {
    DIR *d = opendir(path_of(b));
    int n = 0;
    bool same = d != NULL;
    for (struct dirent *de; same && (de = readdir(d));) {
        if (de->d_name[0] == '.') continue;
        char pa[PATH_MAX + 600], pb[PATH_MAX + 600];
        snprintf(pa, sizeof pa, "%s/%s/%s", dir, a, de->d_name);
        snprintf(pb, sizeof pb, "%s/%s/%s", dir, b, de->d_name);
        size_t la = 0, lb = 0;
        char *x = test_slurp(pa, &la), *y = test_slurp(pb, &lb);
        same = x && y && la == lb && !memcmp(x, y, la);
        free(x), free(y);
        n++;
    }
    if (d) closedir(d);
    return same && n > 0 && count_named(a, "") - 2 == n; /* no file more than the reference ('.' and '..') */
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_atomic_export(void) {
    /* two models of a few MB, so a kill lands mid-write */
    const char *model = "--layers 4 --dim 256 --heads 4 --context 32 --batch 2 --eval-every 0 --save-every 0 "
                        "--steps 1 --data text.txt";
    char args[512];
    double export_s = 0;
    for (int k = 0; k < 2; k++) {
        snprintf(args, sizeof args, "train %s --seed %d --checkpoint exp%d.ckpt", model, k + 1, k);
        result r = cgrad_t(args, 120);
        CHECK(r.rc == 0, "train exp%d: rc %d '%s'", k, r.rc, r.err);
        result_free(&r);
        snprintf(args, sizeof args, "export exp%d.ckpt ref%d", k, k);
        const double t0 = now_s();
        r = cgrad_t(args, 120);
        CHECK(r.rc == 0, "export ref%d: rc %d '%s'", k, r.rc, r.err);
        if (k == 0) export_s = now_s() - t0;
        result_free(&r);
    }
    result r = cgrad_t("export exp0.ckpt out", 120);
    CHECK(r.rc == 0 && same_dir("out", "ref0"), "first export: rc %d '%s'", r.rc, r.err);
    result_free(&r);
    /* 25 exports, alternating models, each killed after a random delay up to about its length */
    uint64_t seed = 20261128;
    int whole_old = 0, whole_new = 0, finished = 0, killed = 0;
    int state = 0; /* which reference the directory holds */
    for (int i = 0; i < 25; i++) {
        const int next = 1 - state;
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        const double u = (double)(seed >> 11) * 0x1p-53;
        /* even runs: any moment of the export; odd ones: within 20 ms of its first write */
        unsigned delay_us = i % 2 ? (unsigned)(u * 2e4) : (unsigned)(u * 1.2e6 * export_s);
        char exp[PATH_MAX + 32], to[PATH_MAX + 32];
        snprintf(exp, sizeof exp, "%s/exp%d.ckpt", dir, next);
        snprintf(to, sizeof to, "%s/out", dir);
        pid_t pid = fork();
        if (pid == 0) {
            int devnull = open("/dev/null", O_WRONLY);
            dup2(devnull, 1), dup2(devnull, 2);
            execl(bin, bin, "export", exp, to, (char *)NULL);
            _exit(127);
        }
        int st = 0;
        bool reaped = false;
        if (i % 2) { /* the first write: a temporary directory beside out, or out's model file changing */
            struct stat sb;
            char model[PATH_MAX + 64];
            snprintf(model, sizeof model, "%s/model.safetensors", to);
            stat(model, &sb);
            const off_t size0 = sb.st_size;
            const struct timespec m0 = sb.st_mtim;
            for (int k = 0; k < 20000; k++) {
                if (count_named("", "out.tmp.") > 0 || stat(model, &sb) || sb.st_size != size0 ||
                    sb.st_mtim.tv_nsec != m0.tv_nsec || sb.st_mtim.tv_sec != m0.tv_sec || (reaped = waitpid(pid, &st, WNOHANG) == pid))
                    break;
                nanosleep(&(struct timespec){0, 100000}, NULL);
            }
        }
        struct timespec ts = {(time_t)(delay_us / 1000000), (long)(delay_us % 1000000) * 1000};
        nanosleep(&ts, NULL);
        if (!reaped) kill(pid, SIGKILL), waitpid(pid, &st, 0);
        if (WIFSIGNALED(st)) killed++;
        else finished += WIFEXITED(st) && WEXITSTATUS(st) == 0;
        char old_ref[8], new_ref[8];
        snprintf(old_ref, sizeof old_ref, "ref%d", state);
        snprintf(new_ref, sizeof new_ref, "ref%d", next);
        const bool is_old = same_dir("out", old_ref), is_new = same_dir("out", new_ref);
        CHECK(is_old || is_new, "export %d killed after %u us: out is neither the old export nor the new one", i, delay_us);
        whole_old += is_old, whole_new += is_new;
        if (is_new) state = next;
        if (!is_old && !is_new) break;
    }
    fprintf(stderr, "  an export takes %.0f ms; 25 exports killed at random: %d killed (%d left the old export, %d the new), %d finished\n", 1e3 * export_s, killed,
            whole_old, whole_new, finished);
    CHECK(killed >= 5, "only %d of 25 exports were killed mid-way: the delays are too long to test anything", killed);
    /* the next export removes what killed ones left beside the directory, and replaces the export */
    snprintf(args, sizeof args, "export exp%d.ckpt out", 1 - state);
    r = cgrad_t(args, 120);
    char ref[8];
    snprintf(ref, sizeof ref, "ref%d", 1 - state);
    CHECK(r.rc == 0 && same_dir("out", ref) && count_named("", "out.tmp.") == 0, "export after kills: rc %d, %d temp dirs '%s'",
          r.rc, count_named("", "out.tmp."), r.err);
    result_free(&r);
    /* a directory holding a file of the user's is not replaced */
    mkdir(path_of("mine"), 0755);
    spit("mine/notes.txt", "mine");
    r = cgrad_t("export exp0.ckpt mine", 120);
    char *kept = test_slurp(path_of("mine/notes.txt"), NULL);
    CHECK(r.rc == 1 && strstr(r.err, "notes.txt") && kept && !strcmp(kept, "mine"), "export over a user's file: rc %d '%s'",
          r.rc, r.err);
    free(kept);
    result_free(&r);
}

/* ---- 4. failed writes ---- */

static void test_failed_writes(void) {
    char args[512];
    /* a file-size limit (ulimit -f, KiB) the checkpoint fits in but the metrics outgrow: the run
     * stops with the metrics path and the reason, exit 1, instead of losing rows silently */
    snprintf(args, sizeof args, "train %s --steps 3001 --data text.txt --checkpoint fw.ckpt --metrics fw.csv", tiny);
    result r = sh_run("ulimit -f 120;", args, 300);
    CHECK(r.rc == 1 && strstr(r.err, "fw.") && strstr(r.err, "File too large") && strstr(r.err, "stopping at step"),
          "metrics past ulimit -f: rc %d, stderr '%s'", r.rc, r.err);
    result_free(&r);
    /* a limit the checkpoint does not fit in: the save fails with EFBIG (not SIGXFSZ's kill), its
     * temporary file is removed */
    snprintf(args, sizeof args, "train %s --dim 64 --steps 2 --data text.txt --checkpoint xf.ckpt --metrics xf.csv", tiny);
    r = sh_run("ulimit -f 16;", args, 300);
    CHECK(r.rc == 1 && strstr(r.err, "xf.ckpt") && strstr(r.err, "File too large") && count_named("", "xf.ckpt.tmp.") == 0,
          "checkpoint past ulimit -f: rc %d, %d temp files, stderr '%s'", r.rc, count_named("", "xf.ckpt.tmp."), r.err);
    result_free(&r);
    /* the plot past the limit: an error naming it, and no temporary file left */
    spit("long_run.csv", "step,lr,train_loss,val_loss\n");
    {
        FILE *f = fopen(path_of("long_run.csv"), "a");
        for (int i = 1; f && i <= 3000; i++) fprintf(f, "%d,0.001,%g,\n", i, 3.0 / i);
        if (f) fclose(f);
    }
    r = sh_run("ulimit -f 8;", "plot long_run.csv --out lr.svg", 60);
    CHECK(r.rc == 1 && strstr(r.err, "lr.svg") && strstr(r.err, "File too large") && count_named("", "lr.svg") == 0,
          "plot past ulimit -f: rc %d '%s'", r.rc, r.err);
    result_free(&r);
    /* what a command prints is its result: stdout on a full disk is a failure */
    char cmd[PATH_MAX * 2 + 256];
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' info small.ckpt > /dev/full 2> full_err.txt", dir, bin);
    int st = system(cmd);
    char *err = test_slurp(path_of("full_err.txt"), NULL);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1 && err && strstr(err, "No space left"), "info > /dev/full: rc %d '%s'",
          WIFEXITED(st) ? WEXITSTATUS(st) : -1, err ? err : "");
    free(err);
}

/* ---- 5. resource blow-ups ---- */

static void test_eval_batch_cap(void) {
    spit("few.txt", "the whale sailed the deep sea and the ship\n");
    /* 2 GB of address space: an uncapped 2^20-row batch needs gigabytes and fails */
    result r = sh_run(VMEM_CAP, "eval --checkpoint small.ckpt --data few.txt --batch 1048576", 120);
    CHECK(r.rc == 0 && strstr(r.err, "capped at 3") && strstr(r.out, "tokens scored"), "eval --batch 2^20: rc %d '%s' '%s'",
          r.rc, r.out, r.err);
    result_free(&r);
}

static void test_empty_step_batch(void) {
    const char *fx = CGRAD_TEST_DIR "/fixtures/models/gpt2";
    cg_st_writer *w = cg_st_writer_new();
    const int64_t shape[2] = {0, 9};
    int32_t none[1] = {0};
    CHECK(cg_st_add_ids(w, "input_ids", 2, shape, none) == CG_OK && cg_st_add_ids(w, "targets", 2, shape, none) == CG_OK &&
              cg_st_write(w, path_of("empty_batch.safetensors")) == CG_OK,
          "cannot write the empty batch: %s", cg_last_error());
    cg_st_writer_free(w);
    char args[2048];
    snprintf(args, sizeof args, "step --arch gpt2 --config %s/config.json --weights %s/weights.safetensors --batch "
             "empty_batch.safetensors --out step_out.safetensors", fx, fx);
    result r = cgrad_t(args, 60);
    CHECK(r.rc == 1 && strstr(r.err, "empty_batch.safetensors") && strstr(r.err, "[0, 9]"), "step on 0 rows: rc %d '%s'",
          r.rc, r.err);
    result_free(&r);
}

/* ---- 6. plot ---- */

static void test_plot_input(void) {
    /* a line of 5000 bytes: an error naming the file and the line, never two rows */
    char *line = malloc(6000);
    snprintf(line, 6000, "step,lr,train_loss,val_loss\n1,0.1,2.0,");
    size_t n = strlen(line);
    memset(line + n, '5', 5000);
    snprintf(line + n + 5000, 6000 - n - 5000, "\n2,0.1,1.5,\n");
    spit("long.csv", line);
    free(line);
    result r = cgrad_t("plot long.csv --out long.svg", 30);
    CHECK(r.rc == 1 && strstr(r.err, "long.csv line 2") && strstr(r.err, "longer than"), "long line: rc %d '%s'", r.rc, r.err);
    result_free(&r);
    /* exactly at the limit: 4096 bytes with the newline, a row like any other */
    char *ok = malloc(6000);
    const size_t head = strlen("step,lr,train_loss,val_loss,note\n");
    snprintf(ok, 6000, "step,lr,train_loss,val_loss,note\n1,0.1,2.0,1.9,");
    n = strlen(ok);
    memset(ok + n, 'x', head + 4095 - n);
    snprintf(ok + head + 4095, 100, "\n2,0.1,1.5,,\n");
    spit("edge.csv", ok);
    free(ok);
    r = cgrad_t("plot edge.csv --out edge.svg", 30);
    CHECK(r.rc == 0, "a 4096-byte line: rc %d '%s'", r.rc, r.err);
    result_free(&r);
    /* an empty file, and a value that is no decimal number */
    spit("empty.csv", "");
    r = cgrad_t("plot empty.csv --out empty.svg", 30);
    CHECK(r.rc == 1 && strstr(r.err, "empty.csv") && strstr(r.err, "empty"), "empty plot input: rc %d '%s'", r.rc, r.err);
    result_free(&r);
    spit("hex.csv", "step,lr,train_loss,val_loss\n1,0.1,0x10,\n");
    r = cgrad_t("plot hex.csv --out hex.svg", 30);
    CHECK(r.rc == 1 && strstr(r.err, "hex.csv line 2"), "hex in a metrics file: rc %d '%s'", r.rc, r.err);
    result_free(&r);
    /* a diverged run's inf and nan are values the CSV holds, drawn as gaps */
    spit("div.csv", "step,lr,train_loss,val_loss\n1,0.1,2.0,\n2,0.1,inf,\n3,0.1,nan,-nan\n");
    r = cgrad_t("plot div.csv --out div.svg", 30);
    CHECK(r.rc == 0, "inf and nan in a metrics file: rc %d '%s'", r.rc, r.err);
    result_free(&r);
}

int main(void) {
    if (!test_find_cgrad(bin, sizeof bin, "test_cli_limits")) return 1;
    snprintf(dir, sizeof dir, "/tmp/cgrad_test_cli_limits.XXXXXX");
    if (!mkdtemp(dir)) return 1;
    make_data();
    char args[512];
    snprintf(args, sizeof args, "train %s --steps 1 --data text.txt --checkpoint small.ckpt", tiny);
    result r = cgrad_t(args, 120);
    CHECK(r.rc == 0, "train small.ckpt: rc %d '%s'", r.rc, r.err);
    result_free(&r);
    test_run_json_booleans();
    test_decimal_numbers();
    test_devices();
    test_size_limits();
    test_atomic_export();
    test_failed_writes();
    test_eval_batch_cap();
    test_empty_step_batch();
    test_plot_input();
    if (!test_failed) {
        char cmd[PATH_MAX + 16];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
    } else fprintf(stderr, "scratch files kept in %s\n", dir);
    TEST_END();
}
