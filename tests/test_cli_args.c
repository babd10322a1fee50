/* SPDX-License-Identifier: MIT */
/* Hostile command-line values: every subcommand x every flag x every kind of bad value, from the
 * CLI's own option tables (`cgrad flags`), so a new flag is swept without a line here. Each bad
 * value must end in a clean usage error: exit 2, a message naming the flag, no sanitizer report,
 * no signal, within seconds. A value the table says is in range is not bad and is not run; which
 * values are bad is decided here, independently of the CLI's parser (strtoll/strtod by hand).
 * Also: unknown flags, flags missing their value, missing input files and unwritable outputs. */
#define _DEFAULT_SOURCE /* realpath */
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "cgrad_bin.h"

extern char **environ;

static char bin[8192], dir[256];
static double limit = 20; /* seconds a run may take ($CGRAD_SWEEP_LIMIT): longer is a hang */

typedef struct {
    int rc;       /* exit code, or -signal */
    bool timeout; /* killed after the time limit */
    char err[2048];
} run_result;

/* One run of the sweep: `cgrad args...`, the flag its message must name, and its outcome. */
typedef struct {
    char *args[6];
    const char *flag, *value; /* value NULL: the flag is given without one */
    int kind;                 /* which kind of bad value (for the count) */
    run_result r;
} job;

enum { SLOTS = 4 }; /* runs in flight: a run mostly waits on process start-up, not on a core */

static double seconds_since(const struct timespec *t0) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - t0->tv_sec) + 1e-9 * (double)(now.tv_nsec - t0->tv_nsec);
}

/* Starts `args` with stdin /dev/null and stdout/stderr to dir/out<slot>.txt, err<slot>.txt. */
static pid_t start(char *const *args, int slot) {
    char out[300], err[300];
    snprintf(out, sizeof out, "%s/out%d.txt", dir, slot);
    snprintf(err, sizeof err, "%s/err%d.txt", dir, slot);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid;
    int bad = posix_spawn(&pid, args[0], &fa, NULL, args, environ);
    posix_spawn_file_actions_destroy(&fa);
    return bad ? -1 : pid;
}

/* Runs every job, SLOTS at a time, each for at most limit seconds (then it is killed: a hang). */
static void run_all(job *jobs, int n) {
    pid_t pid[SLOTS];
    int which[SLOTS];
    struct timespec t0[SLOTS], nap = {0, 1000000};
    for (int k = 0; k < SLOTS; k++) pid[k] = 0;
    for (int next = 0, busy = 0; next < n || busy;) {
        for (int k = 0; k < SLOTS && next < n; k++)
            if (!pid[k]) {
                clock_gettime(CLOCK_MONOTONIC, &t0[k]);
                which[k] = next;
                pid[k] = start(jobs[next++].args, k);
                if (pid[k] < 0) jobs[which[k]].r.rc = -1000, pid[k] = 0;
                else busy++;
            }
        bool reaped = false;
        for (int k = 0; k < SLOTS; k++) {
            if (!pid[k]) continue;
            int status = 0;
            run_result *r = &jobs[which[k]].r;
            pid_t w = waitpid(pid[k], &status, WNOHANG);
            if (w != pid[k] && seconds_since(&t0[k]) > limit) {
                kill(pid[k], SIGKILL);
                waitpid(pid[k], &status, 0);
                r->timeout = true, w = pid[k];
            }
            if (w != pid[k]) continue;
            r->rc = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
            char err[300];
            snprintf(err, sizeof err, "%s/err%d.txt", dir, k);
            char *e = test_slurp(err, NULL);
            snprintf(r->err, sizeof r->err, "%s", e ? e : "");
            free(e);
            pid[k] = 0, busy--, reaped = true;
        }
        if (!reaped) nanosleep(&nap, NULL);
    }
}

/* Runs one command to the end (the flag listing). */
static run_result run1(char *const *args) {
    job j = {.args = {args[0], args[1], NULL}};
    run_all(&j, 1);
    return j.r;
}

/* Writes text to dir/name. */
static void spit_file(const char *name, const char *text) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (f) fputs(text, f), fclose(f);
}

/* ---- which values are bad: decided here, not by the CLI ---- */

typedef struct {
    char cmd[32], flag[48], kind[16];
    double lo, hi;
} opt;

static bool whole(const char *v, const char *end) { return end != v && !*end; }

/* True when v is a value the option accepts. */
static bool acceptable(const opt *o, const char *v) {
    char *end;
    errno = 0;
    if (!strcmp(o->kind, "int")) {
        long long x = strtoll(v, &end, 10);
        return !errno && whole(v, end) && (double)x >= o->lo && (double)x <= o->hi;
    }
    if (!strcmp(o->kind, "number")) {
        double x = strtod(v, &end);
        return whole(v, end) && isfinite(x) && x >= o->lo && x <= o->hi;
    }
    if (!strcmp(o->kind, "u64")) {
        unsigned long long x = strtoull(v, &end, 10);
        (void)x;
        return !errno && whole(v, end) && v[0] != '-' && v[0] != '+';
    }
    if (!strcmp(o->kind, "in")) return *v && !access(v, R_OK);
    if (!strcmp(o->kind, "out")) return false; /* every output candidate below is unwritable */
    return true;                               /* a string: anything goes */
}

/* The kinds of bad value, per kind of option. */
static const char *const bad_numbers[] = {
    "-1", "0", "0.5", "1e-320", "1e308", "4611686018427387904", "9223372036854775808", "18446744073709551616",
    "1e999", "nan", "-inf", "abc", "12abc", "", NULL};
static const char *const bad_files[] = {"/nonexistent-cgrad-dir/missing.file", "", NULL};
static const char *const bad_outputs[] = {"/nonexistent-cgrad-dir/out.file", ".", "/", "", NULL};


/* ---- help and stray arguments ---- */

/* Runs `cgrad ARGS` (a shell line) in the scratch directory; stdout and stderr into *out, *err. */
static int sh(const char *args, char **out, char **err) {
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s < /dev/null > h_out.txt 2> h_err.txt", dir, bin, args);
    const int st = system(cmd);
    snprintf(cmd, sizeof cmd, "%s/h_out.txt", dir);
    *out = test_slurp(cmd, NULL);
    snprintf(cmd, sizeof cmd, "%s/h_err.txt", dir);
    *err = test_slurp(cmd, NULL);
    if (!*out) *out = calloc(1, 1);
    if (!*err) *err = calloc(1, 1);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Every command's --help, -h and `cgrad help CMD`: exit 0, the same text on stdout, nothing on
 * stderr, a first line "usage: cgrad CMD", and every flag of the command's table. */
static void test_help(const opt *opts, int n_opts) {
    char *out, *err, *list;
    int rc = sh("help", &list, &err);
    CHECK(rc == 0 && !*err && strstr(list, "usage: cgrad COMMAND"), "cgrad help: rc %d '%s'", rc, err);
    free(err);
    const char *extra[] = {"flags", "help"};
    const int n_cmds = n_opts + 2;
    int checked = 0;
    for (int i = 0; i < n_cmds; i++) {
        const char *cmd = i < n_opts ? opts[i].cmd : extra[i - n_opts];
        if (i > 0 && i < n_opts && !strcmp(cmd, opts[i - 1].cmd)) continue; /* one command at a time */
        char args[3][128], want[96], line[128];
        snprintf(args[0], sizeof args[0], "%.40s --help", cmd);
        snprintf(args[1], sizeof args[1], "%.40s -h", cmd);
        snprintf(args[2], sizeof args[2], "help %.40s", cmd);
        snprintf(want, sizeof want, "usage: cgrad %.40s", cmd);
        snprintf(line, sizeof line, "\n  %-10.40s ", cmd);
        CHECK(strstr(list, line), "cgrad help does not list %s", cmd);
        char *first = NULL;
        for (int k = 0; k < 3; k++) {
            rc = sh(args[k], &out, &err);
            const size_t wl = strlen(want);
            CHECK(rc == 0 && !*err && !strncmp(out, want, wl) && (out[wl] == ' ' || out[wl] == '\n'),
                  "cgrad %s: rc %d, stderr '%s', first line '%.80s'", args[k], rc, err, out);
            for (int j = 0; j < n_opts; j++)
                if (!strcmp(opts[j].cmd, cmd)) {
                    char flag[64];
                    snprintf(flag, sizeof flag, "\n  %s ", opts[j].flag);
                    CHECK(strstr(out, flag), "cgrad %s does not describe %s", args[k], opts[j].flag);
                }
            if (!first) first = strdup(out);
            else CHECK(!strcmp(first, out), "cgrad %s differs from cgrad %s", args[k], args[0]);
            free(out), free(err);
            checked++;
        }
        free(first);
    }
    free(list);
    CHECK(checked >= 3 * 11, "only %d help texts checked", checked);

    /* Stray words, unknown commands and values that look like -h are usage errors naming the word. */
    static const struct {
        const char *args, *named;
    } stray[] = {{"eval stray-word", "'stray-word'"},        {"sample --checkpoint a stray-word", "'stray-word'"},
                 {"train stray-word", "'stray-word'"},       {"bench stray-word", "'stray-word'"},
                 {"step stray-word", "'stray-word'"},        {"gradcheck stray-word", "'stray-word'"},
                 {"info a.ckpt b.ckpt", "'b.ckpt'"},         {"flags stray-word", "'stray-word'"},
                 {"step --weights a b c", "'b'"},            {"help no-such-command", "no-such-command"},
                 {"no-such-command", "no-such-command"},     {"sample --prompt -h", "--checkpoint"},
                 {"gradcheck --op no-such-op", "no-such-op"}, {"eval --no-such-flag", "--no-such-flag"}};
    for (size_t i = 0; i < sizeof stray / sizeof stray[0]; i++) {
        spit_file("a", "x"), spit_file("b", "x"), spit_file("c", "x");
        rc = sh(stray[i].args, &out, &err);
        CHECK(rc == 2 && strstr(err, stray[i].named) && (strstr(err, "help") || strstr(err, "gradcheck lists")) &&
                  !strstr(out, "usage:"),
              "cgrad %s: rc %d, stderr '%s', stdout '%.60s'", stray[i].args, rc, err, out);
        free(out), free(err);
    }

    /* docs/cli.md is `cgrad help --markdown`: tests/docs_check.sh (ctest docs_generated) holds it there. */
}

int main(void) {
    if (!test_find_cgrad(bin, sizeof bin, "test_cli_args")) return 1;
    if (getenv("CGRAD_SWEEP_LIMIT")) limit = atof(getenv("CGRAD_SWEEP_LIMIT"));
    char *abs = realpath(bin, NULL);
    if (abs) snprintf(bin, sizeof bin, "%s", abs), free(abs);
    snprintf(dir, sizeof dir, "/tmp/cgrad_test_cli_args.XXXXXX");
    /* Run where no default data lies, so a bad value that slipped through fails fast, not trains. */
    if (!mkdtemp(dir) || chdir(dir)) return 1;

    /* The tables, as the CLI prints them ($CGRAD_FLAGS_BIN: another build's tables, to sweep an
     * older binary that cannot list its own). */
    char flags_bin[8192];
    char *fb = getenv("CGRAD_FLAGS_BIN") ? realpath(getenv("CGRAD_FLAGS_BIN"), NULL) : NULL;
    snprintf(flags_bin, sizeof flags_bin, "%s", fb ? fb : bin);
    free(fb);
    char *list_args[] = {flags_bin, "flags", NULL};
    run_result fl = run1(list_args);
    char path[300];
    snprintf(path, sizeof path, "%s/out0.txt", dir);
    char *text = test_slurp(path, NULL);
    CHECK(fl.rc == 0 && text && *text, "cgrad flags: rc %d %s", fl.rc, fl.err);
    static opt opts[256];
    int n_opts = 0;
    for (char *line = text ? strtok(text, "\n") : NULL; line && n_opts < 256; line = strtok(NULL, "\n")) {
        opt *o = &opts[n_opts];
        o->lo = -INFINITY, o->hi = INFINITY;
        if (sscanf(line, "%31s %47s %15s %lf %lf", o->cmd, o->flag, o->kind, &o->lo, &o->hi) >= 3) n_opts++;
    }
    free(text);
    CHECK(n_opts >= 60, "cgrad flags lists %d options", n_opts);

    test_help(opts, n_opts);

    /* The runs: an unknown flag per command; per flag, its value missing and each bad value. */
    static job jobs[8192];
    int n = 0, cmds = 0;
    const char *prev_cmd = "";
    for (int i = 0; i < n_opts && n < 8000; i++) {
        opt *o = &opts[i];
        if (strcmp(prev_cmd, o->cmd)) {
            cmds++;
            prev_cmd = o->cmd;
            jobs[n++] = (job){.args = {bin, o->cmd, "--no-such-flag", "1", NULL}, .flag = "--no-such-flag", .value = "1", .kind = 62};
        }
        const char *const *values = !strcmp(o->kind, "int") || !strcmp(o->kind, "number") || !strcmp(o->kind, "u64")
                                        ? bad_numbers
                                    : !strcmp(o->kind, "in")  ? bad_files
                                    : !strcmp(o->kind, "out") ? bad_outputs
                                                              : NULL;
        const int base = values == bad_numbers ? 0 : values == bad_files ? 40 : 50;
        if (strcmp(o->kind, "bare")) jobs[n++] = (job){.args = {bin, o->cmd, o->flag, NULL}, .flag = o->flag, .kind = 63};
        for (int k = 0; values && values[k]; k++)
            if (!acceptable(o, values[k])) /* in range: not a bad value for this flag */
                jobs[n++] = (job){.args = {bin, o->cmd, o->flag, (char *)values[k], NULL}, .flag = o->flag,
                                  .value = values[k], .kind = base + k};
    }
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    run_all(jobs, n);
    const double took = seconds_since(&t0);

    int clean = 0, crashes = 0, hangs = 0, wrong = 0, kinds = 0;
    bool kind_seen[64] = {0};
    for (int i = 0; i < n; i++) {
        const job *j = &jobs[i];
        const run_result *r = &j->r;
        kind_seen[j->kind] = true;
        const bool ok = r->rc == 2 && strstr(r->err, j->flag) && (j->kind != 62 || strstr(r->err, "--help")) && !strstr(r->err, "Sanitizer") && !strstr(r->err, "runtime error");
        clean += ok, crashes += r->rc < 0 && !r->timeout, hangs += r->timeout, wrong += !ok && r->rc >= 0 && !r->timeout;
        CHECK(ok, "cgrad %s %s%s%s%s: rc %d%s, stderr '%s'", j->args[1], j->flag, j->value ? " '" : " (no value)",
              j->value ? j->value : "", j->value ? "'" : "", r->rc, r->timeout ? " (hung)" : "", r->err);
    }
    for (int k = 0; k < 64; k++) kinds += kind_seen[k];
    printf("cli sweep: %d commands, %d options, %d kinds of bad input, %d runs in %.1f s: %d clean errors (exit 2, flag "
           "named), %d crashes, %d hangs, %d other\n",
           cmds, n_opts, kinds, n, took, clean, crashes, hangs, wrong);
    CHECK(crashes == 0 && hangs == 0 && wrong == 0, "%d crashes, %d hangs, %d other outcomes", crashes, hangs, wrong);
    if (!test_failed) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "cd / && rm -rf '%s'", dir);
        if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
    }
    TEST_END();
}
