/* SPDX-License-Identifier: MIT */
/* What tests/test_cli.c drives the cgrad command with: a scratch directory, a runner that captures
 * the exit code, stdout and stderr, readers of the files a run leaves (final line, metrics CSV,
 * checkpoints), a checkpoint rewriter for damaged files, and the small data sets the tests train
 * on. Include after cgrad.h and check.h. */
#ifndef CGRAD_TEST_CLI_HARNESS_H
#define CGRAD_TEST_CLI_HARNESS_H
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cjson/cJSON.h>

static char bin[PATH_MAX + 16], dir[PATH_MAX]; /* the cgrad binary, the scratch directory */

/* ---- helpers ---- */

static void spit(const char *name, const char *text) {
    char p[PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (f) fputs(text, f), fclose(f);
}

static char *path_of(const char *name) {
    static char p[4][PATH_MAX + 64];
    static int k;
    k = (k + 1) % 4;
    if (snprintf(p[k], sizeof p[k], "%s/%s", dir, name) >= (int)sizeof p[k]) p[k][0] = 0; /* too long: no file */
    return p[k];
}

typedef struct {
    int rc;
    char *out, *err;
} result;

static void result_free(result *r) { free(r->out), free(r->err), r->out = r->err = NULL; }

/* Runs `cgrad ARGS` in the scratch directory with stdin from /dev/null (or input); seconds > 0 is
 * a time limit: a hang is a failure (rc 137), not a stuck test. */
static result cgrad_run(const char *args, const char *input, int seconds) {
    char cmd[3 * PATH_MAX + 4096], limit[32] = "";
    if (input) spit("stdin.txt", input);
    if (seconds > 0) snprintf(limit, sizeof limit, "timeout -s KILL %d ", seconds);
    snprintf(cmd, sizeof cmd, "cd '%s' && %s'%s' %s < %s > out.txt 2> err.txt", dir, limit, bin, args,
             input ? "stdin.txt" : "/dev/null");
    int st = system(cmd);
    result r = {WIFEXITED(st) ? WEXITSTATUS(st) : -1, test_slurp(path_of("out.txt"), NULL), test_slurp(path_of("err.txt"), NULL)};
    if (!r.out) r.out = calloc(1, 1);
    if (!r.err) r.err = calloc(1, 1);
    return r;
}

/* Runs `cgrad ARGS` in the scratch directory with stdin from /dev/null (or input). */
static result cgrad(const char *args, const char *input) { return cgrad_run(args, input, 0); }

/* cgrad ARGS with a time limit of seconds. */
static result cgrad_t(const char *args, int seconds) { return cgrad_run(args, NULL, seconds); }

/* The last non-empty line of s (static copy). */
static const char *last_line(const char *s) {
    static char line[1024];
    size_t n = strlen(s);
    while (n && s[n - 1] == '\n') n--;
    size_t b = n;
    while (b && s[b - 1] != '\n') b--;
    snprintf(line, sizeof line, "%.*s", (int)(n - b), s + b);
    return line;
}

/* Parses the documented last line; false unless it has exactly that form. */
static bool parse_final(const char *line, long long *step, double *train, double *val, double *tps) {
    int used = -1;
    if (sscanf(line, "final step=%lld train_loss=%lf val_loss=%lf tokens_per_s=%lf%n", step, train, val, tps, &used) != 4)
        return false;
    return used == (int)strlen(line);
}

/* Every tensor of two checkpoints is equal bit for bit, and so is the training state (but the clock). */
static bool same_checkpoints(const char *a, const char *b) {
    cg_st *x = cg_checkpoint_open(a), *y = cg_checkpoint_open(b);
    bool same = x && y && cg_st_count(x) == cg_st_count(y) && cg_st_count(x) > 2;
    for (int i = 0; same && i < cg_st_count(x); i++) {
        const char *name = cg_st_name(x, i);
        int nd1, nd2;
        int64_t s1[CG_MAX_DIMS], s2[CG_MAX_DIMS];
        same = cg_st_find(y, name) >= 0 && !cg_st_info(x, name, NULL, &nd1, s1) && !cg_st_info(y, name, NULL, &nd2, s2) &&
               nd1 == nd2 && !memcmp(s1, s2, (size_t)nd1 * sizeof *s1);
        int64_t n = 1;
        for (int k = 0; k < nd1; k++) n *= s1[k];
        cg_real *u = malloc((size_t)n * sizeof *u), *v = malloc((size_t)n * sizeof *v);
        same = same && u && v && !cg_st_read(x, name, u, -1, NULL) && !cg_st_read(y, name, v, -1, NULL) &&
               !memcmp(u, v, (size_t)n * sizeof *u);
        if (!same) fprintf(stderr, "  tensor %s differs between %s and %s\n", name, a, b);
        free(u), free(v);
    }
    if (same) {
        cJSON *s = cJSON_Parse(cg_st_metadata(x, "state")), *t = cJSON_Parse(cg_st_metadata(y, "state"));
        cJSON_DeleteItemFromObject(s, "elapsed_s"), cJSON_DeleteItemFromObject(t, "elapsed_s");
        char *p = cJSON_PrintUnformatted(s), *q = cJSON_PrintUnformatted(t);
        same = p && q && !strcmp(p, q);
        if (!same) fprintf(stderr, "  state differs:\n  %s\n  %s\n", p, q);
        free(p), free(q), cJSON_Delete(s), cJSON_Delete(t);
    }
    cg_st_close(x), cg_st_close(y);
    return same;
}

/* The metrics CSV without its timing columns. */
static char *csv_losses(const char *name) {
    char *s = test_slurp(path_of(name), NULL);
    if (!s) return calloc(1, 1);
    char *out = malloc(strlen(s) + 1), *w = out;
    for (char *line = strtok(s, "\n"); line; line = strtok(NULL, "\n")) {
        int commas = 0;
        for (char *p = line; *p && commas < 4; p++) commas += *p == ',', *w++ = *p;
        *w++ = '\n';
    }
    *w = 0;
    free(s);
    return out;
}

/* Rewrites checkpoint src as dst with edit applied to each tensor's values (name, values, count)
 * and metadata key (NULL: none) set to value. */
static void rewrite_ckpt(const char *src_name, const char *dst_name, void (*edit)(const char *, cg_real *, int64_t),
                         const char *key, const char *value) {
    cg_st *src = cg_checkpoint_open(path_of(src_name));
    cg_st_writer *w = cg_st_writer_new();
    for (int i = 0; src && i < cg_st_count(src); i++) {
        const char *name = cg_st_name(src, i);
        int nd;
        int64_t shape[CG_MAX_DIMS], n = 1;
        cg_st_info(src, name, NULL, &nd, shape);
        for (int k = 0; k < nd; k++) n *= shape[k];
        cg_real *buf = malloc((size_t)n * sizeof *buf + 1);
        if (buf && !cg_st_read(src, name, buf, nd, shape)) {
            if (edit) edit(name, buf, n);
            cg_st_add(w, name, nd, shape, buf);
        }
        free(buf);
    }
    const char *keys[] = {"arch", "tokenizer", "train", "state", "config"};
    for (int i = 0; src && i < 5; i++)
        cg_st_set_metadata(w, keys[i], key && !strcmp(key, keys[i]) ? value : cg_st_metadata(src, keys[i]));
    CHECK(src && !cg_checkpoint_save(w, path_of(dst_name)), "could not write %s: %s", dst_name, cg_last_error());
    cg_st_writer_free(w), cg_st_close(src);
}

/* ---- data the tests train on ---- */

static uint64_t lcg = 12345;
static unsigned next_u(unsigned n) {
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (unsigned)((lcg >> 33) % n);
}

static const char *words[] = {"the", "whale", "sea", "ship", "captain", "sailed", "white", "deep", "harpoon", "boat",
                              "crew", "waves", "storm", "night", "called", "ahab", "moby", "dick", "oil", "rope"};

static void make_data(void) {
    char *text = calloc(1, 1 << 16), *p = text;
    for (int doc = 0; doc < 8; doc++) {
        for (int s = 0; s < 8; s++) {
            int n = 4 + (int)next_u(5);
            for (int w = 0; w < n; w++) p += sprintf(p, "%s%s", w ? " " : "", words[next_u(20)]);
            p += sprintf(p, ". ");
        }
        p += sprintf(p, "\n\n");
    }
    spit("text.txt", text);
    p = text;
    p += sprintf(p, "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n.\n");
    for (int i = 0; i < 20; i++) p += sprintf(p, "%s\n", words[i]);
    spit("vocab.txt", text);
    p = text;
    for (int i = 0; i < 120; i++) {
        char d[16];
        int n = 2 + (int)next_u(5);
        for (int k = 0; k < n; k++) d[k] = (char)('0' + next_u(10));
        d[n] = 0;
        p += sprintf(p, "%s\t", d);
        for (int k = n - 1; k >= 0; k--) *p++ = d[k];
        *p++ = '\n';
    }
    *p = 0;
    spit("rev.tsv", text);
    static const char *pos[] = {"good", "great", "fine", "lovely"}, *neg[] = {"bad", "awful", "poor", "dull"};
    p = text;
    for (int i = 0; i < 120; i++) {
        bool y = next_u(2);
        p += sprintf(p, "%s\tthe %s %s film\n", y ? "pos" : "neg", (y ? pos : neg)[next_u(4)], words[next_u(20)]);
    }
    spit("cls.tsv", text);
    free(text);
}

#endif
