/* SPDX-License-Identifier: MIT */
/* Command-line values: every subcommand declares its flags in a table (kind and range), and one
 * parser checks each value in full before any work starts: a number must be the whole argument,
 * finite and in range; an input file must exist; an output path must be writable. A bad value is
 * a usage error (exit 2) whose message names the flag, the value and what was wanted. */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cgrad.h"
#include "cli/commands.h"

const char *cli_arg(int argc, char **argv, const char *name) {
    const size_t n = strlen(name);
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--")) break;
        if (!strncmp(argv[i], name, n) && argv[i][n] == '=') return argv[i] + n + 1;
        if (i + 1 < argc && !strcmp(argv[i], name)) return argv[i + 1];
    }
    return NULL;
}

bool cli_flag(int argc, char **argv, const char *name) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], name)) return true;
    return false;
}

/* "in [lo, hi]", "in [lo, 1)", "greater than 0" or "at least lo", as the table's bounds say. */
static void range_str(const cli_opt *o, char *buf, size_t n) {
    if (o->hi >= DBL_MAX && o->lo == DBL_TRUE_MIN) snprintf(buf, n, "greater than 0");
    else if (o->hi >= DBL_MAX) snprintf(buf, n, "at least %.17g", o->lo);
    else if (o->hi == CLI_BELOW_1) snprintf(buf, n, "in [%.17g, 1)", o->lo);
    else snprintf(buf, n, "in [%.17g, %.17g]", o->lo, o->hi);
}

/* The directory part of path ("." when it has none), into buf. */
static void dir_of(const char *path, char *buf, size_t n) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(buf, n, ".");
    else if (slash == path) snprintf(buf, n, "/");
    else snprintf(buf, n, "%.*s", (int)(slash - path), path);
}

bool cli_decimal(const char *v, bool whole) {
    const char *p = v;
    if (*p == '+' || *p == '-') p++;
    size_t digits = strspn(p, "0123456789");
    p += digits;
    if (!whole && *p == '.') {
        const size_t frac = strspn(p + 1, "0123456789");
        p += 1 + frac;
        digits += frac;
    }
    if (!digits) return false;
    if (!whole && (*p == 'e' || *p == 'E')) {
        p++;
        if (*p == '+' || *p == '-') p++;
        const size_t exp = strspn(p, "0123456789");
        if (!exp) return false;
        p += exp;
    }
    return *p == 0;
}

bool cli_check_value(const char *cmd, const cli_opt *o, const char *v, cli_value *out) {
    char *end = NULL, range[96];
    struct stat sb;
    errno = 0;
    switch (o->kind) {
    case CLI_BARE: /* present: on (a value is never read for it) */
        out->i = 1;
        return true;
    case CLI_STR:
        out->s = v;
        return true;
    case CLI_IN:
        out->s = v;
        if (!strcmp(o->flag, "--data") && !strcmp(v, "fashion-mnist")) return true; /* a named data set (cli_image_dir) */
        if (!*v || stat(v, &sb) || access(v, R_OK)) {
            fprintf(stderr, "cgrad %s: %s '%s': cannot read it: %s\n", cmd, o->flag, v, *v ? strerror(errno) : "empty path");
            return false;
        }
        return true;
    case CLI_OUT: {
        out->s = v;
        char dir[4096];
        dir_of(v, dir, sizeof dir);
        const char *why = NULL;
        if (!*v || v[strlen(v) - 1] == '/') why = "not a file name";
        else if (!stat(v, &sb) && S_ISDIR(sb.st_mode)) why = "is a directory";
        else if (stat(dir, &sb) || !S_ISDIR(sb.st_mode)) why = "its directory does not exist";
        else if (access(dir, W_OK | X_OK)) why = "its directory is not writable";
        else if (!access(v, F_OK) && access(v, W_OK)) why = "the file is not writable";
        if (why) {
            fprintf(stderr, "cgrad %s: %s '%s': cannot write it: %s\n", cmd, o->flag, v, why);
            return false;
        }
        return true;
    }
    case CLI_INT: {
        long long x = strtoll(v, &end, 10);
        if (cli_decimal(v, true) && !errno && end != v && !*end && (double)x >= o->lo && (double)x <= o->hi) {
            out->i = x;
            return true;
        }
        range_str(o, range, sizeof range);
        fprintf(stderr, "cgrad %s: %s wants a whole number %s, got '%s'\n", cmd, o->flag, range, v);
        return false;
    }
    case CLI_U64: {
        const char *p = v;
        unsigned long long x = strtoull(p, &end, 10);
        if (*p != '-' && *p != '+' && cli_decimal(p, true) && !errno && end != p && !*end) {
            out->u = x;
            return true;
        }
        fprintf(stderr, "cgrad %s: %s wants a whole number in [0, 18446744073709551615], got '%s'\n", cmd, o->flag, v);
        return false;
    }
    case CLI_NUM: {
        double x = strtod(v, &end);
        if (cli_decimal(v, false) && end != v && !*end && isfinite(x) && x >= o->lo && x <= o->hi) {
            out->d = x;
            return true;
        }
        range_str(o, range, sizeof range);
        fprintf(stderr, "cgrad %s: %s wants a finite decimal number %s, got '%s'\n", cmd, o->flag, range, v);
        return false;
    }
    }
    return false;
}

bool cli_parse(const char *cmd, const cli_opt *opts, int argc, char **argv, cli_args *a) {
    memset(a, 0, sizeof *a);
    a->cmd = cmd;
    a->opts = opts;
    while (opts[a->n].flag) a->n++;
    if (a->n > CLI_MAX_OPTS) {
        fprintf(stderr, "cgrad %s: internal: %d options, at most %d\n", cmd, a->n, CLI_MAX_OPTS);
        return false;
    }
    a->words = (const char **)argv;
    for (int i = 0; i < argc; i++) {
        const char *w = argv[i];
        if (!strcmp(w, "--")) { /* everything after is text, even if it starts with "--" */
            while (++i < argc) a->words[a->n_words++] = argv[i];
            break;
        }
        if (strncmp(w, "--", 2)) {
            a->words[a->n_words++] = w; /* never ahead of i: argv doubles as the word list */
            continue;
        }
        int k = 0;
        while (k < a->n && strcmp(w, opts[k].flag)) k++;
        if (k == a->n) {
            cli_unknown_option(cmd, opts, w);
            return false;
        }
        if (a->set[k]) {
            fprintf(stderr, "cgrad %s: %s is given twice\n", cmd, w);
            return false;
        }
        a->set[k] = true;
        if (opts[k].kind == CLI_BARE) continue;
        if (i + 1 >= argc) {
            fprintf(stderr, "cgrad %s: %s needs a value (cgrad %s --help)\n", cmd, w, cmd);
            return false;
        }
        if (!cli_check_value(cmd, &opts[k], argv[++i], &a->v[k])) return false;
    }
    return true;
}

/* Optimal string alignment distance (edits, with adjacent swaps) between a and b, stopping at 9. */
static int edit_distance(const char *a, const char *b) {
    enum { MAX = 64 };
    size_t n = strlen(a), m = strlen(b);
    if (n >= MAX || m >= MAX) return 9;
    int d[MAX][MAX];
    for (size_t i = 0; i <= n; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            int best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[n][m] < 9 ? d[n][m] : 9;
}

const char *cli_closest(const char *word, const char *const *names, int n) {
    /* at most a third of the word's letters (and at least one) may differ: "--lr" for "--rl",
     * "train" for "trian", but nothing for a word that only shares its dashes */
    const int len = (int)strlen(word), limit = len / 3 > 1 ? len / 3 : 1;
    const char *best = NULL;
    int best_d = limit + 1;
    for (int i = 0; i < n; i++) {
        const int d = edit_distance(word, names[i]);
        if (d < best_d) best = names[i], best_d = d;
    }
    return best;
}

void cli_unknown_option(const char *cmd, const cli_opt *opts, const char *w) {
    const char *names[CLI_MAX_OPTS + 4];
    int n = 0;
    for (; opts[n].flag && n < CLI_MAX_OPTS + 4; n++) names[n] = opts[n].flag;
    const char *near = cli_closest(w, names, n);
    if (near) fprintf(stderr, "cgrad %s: unknown option %s: did you mean %s? (cgrad %s --help lists the options)\n", cmd, w, near, cmd);
    else fprintf(stderr, "cgrad %s: unknown option %s (cgrad %s --help lists the options)\n", cmd, w, cmd);
}

bool cli_split_equals(const char *cmd, const cli_opt *opts, int *argc, char ***argv) {
    static char **split; /* kept for the process's life: the words point into it */
    int n = *argc, extra = 0;
    for (int i = 0; i < n; i++) {
        if (!strcmp((*argv)[i], "--")) break;
        if (!strncmp((*argv)[i], "--", 2) && strchr((*argv)[i], '=')) extra++;
    }
    if (!extra) return true;
    char **out = malloc(sizeof *out * (size_t)(n + extra + 1));
    if (!out) {
        fprintf(stderr, "cgrad %s: out of memory reading the command line\n", cmd);
        return false;
    }
    int k = 0;
    bool value_next = false, rest = false;
    for (int i = 0; i < n; i++) {
        char *w = (*argv)[i], *eq = strchr(w, '=');
        if (rest || value_next || strncmp(w, "--", 2) || !eq) { /* a value, a word, or text after "--" */
            rest |= !value_next && !strcmp(w, "--");
            if (value_next) value_next = false;
            else {
                const cli_opt *o = opts;
                while (o->flag && strcmp(o->flag, w)) o++;
                value_next = !rest && o->flag && o->kind != CLI_BARE && strcmp(w, "--resume");
            }
            out[k++] = w;
            continue;
        }
        const cli_opt *o = opts; /* --flag=value: the flag must be a known one that takes a value */
        while (o->flag && (strncmp(o->flag, w, (size_t)(eq - w)) || o->flag[eq - w])) o++;
        if (!o->flag) {
            *eq = 0;
            cli_unknown_option(cmd, opts, w);
            *eq = '=';
            free(out);
            return false;
        }
        if (o->kind == CLI_BARE) {
            fprintf(stderr, "cgrad %s: %s takes no value, got '%s' (cgrad %s --help)\n", cmd, o->flag, w, cmd);
            free(out);
            return false;
        }
        out[k++] = (char *)o->flag; /* the table's own string: argv's stays whole for messages */
        out[k++] = eq + 1;
    }
    out[k] = NULL;
    free(split);
    split = out;
    *argc = k;
    *argv = out;
    return true;
}

bool cli_make_dirs(const char *cmd, const char *flag, const char *path) {
    char buf[4096];
    struct stat sb;
    if (!*path || strlen(path) >= sizeof buf) {
        fprintf(stderr, "cgrad %s: %s '%s': not a directory name\n", cmd, flag, path);
        return false;
    }
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1;; p++) { /* each parent in turn, then the path itself */
        const char c = *p;
        if (c && c != '/') continue;
        *p = 0;
        if (mkdir(buf, 0777) && errno != EEXIST) {
            fprintf(stderr, "cgrad %s: %s '%s': cannot create %s: %s\n", cmd, flag, path, buf, strerror(errno));
            return false;
        }
        *p = c;
        if (!c) break;
    }
    if (stat(path, &sb) || !S_ISDIR(sb.st_mode) || access(path, W_OK | X_OK)) {
        fprintf(stderr, "cgrad %s: %s '%s': not a writable directory\n", cmd, flag, path);
        return false;
    }
    return true;
}

bool cli_words(const cli_args *a, int lo, int hi, const char *what) {
    if (a->n_words > hi) {
        fprintf(stderr, "cgrad %s: unexpected argument '%s' (", a->cmd, a->words[hi]);
        if (hi == 0) fprintf(stderr, "%s takes no positional arguments", a->cmd);
        else fprintf(stderr, "%s takes at most %d: %s", a->cmd, hi, what);
        fprintf(stderr, "; cgrad %s --help lists the options)\n", a->cmd);
        return false;
    }
    if (a->n_words < lo) {
        fprintf(stderr, "cgrad %s: missing %s (cgrad %s --help)\n", a->cmd, what, a->cmd);
        return false;
    }
    return true;
}

bool cli_require(const cli_args *a, const char *flag, const char *value) {
    if (cli_has(a, flag)) return true;
    fprintf(stderr, "cgrad %s: %s %s is required (cgrad %s --help)\n", a->cmd, flag, value, a->cmd);
    return false;
}

bool cli_wants_help(const cli_opt *opts, int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        const char *w = argv[i];
        if (!strcmp(w, "--")) return false;
        if (!strcmp(w, "--help") || !strcmp(w, "-h")) return true;
        const cli_opt *o = opts;
        while (o->flag && strcmp(o->flag, w)) o++;
        /* a flag's value is never a request for help (--prompt -h); --resume's value is optional */
        if (o->flag && o->kind != CLI_BARE && i + 1 < argc && (strcmp(w, "--resume") || strncmp(argv[i + 1], "-", 1))) i++;
    }
    return false;
}

static int find(const cli_args *a, const char *flag) {
    for (int k = 0; k < a->n; k++)
        if (!strcmp(a->opts[k].flag, flag)) return k;
    fprintf(stderr, "cgrad %s: internal: no option %s in the table\n", a->cmd, flag);
    return -1;
}

bool cli_has(const cli_args *a, const char *flag) {
    int k = find(a, flag);
    return k >= 0 && a->set[k];
}
const char *cli_str(const cli_args *a, const char *flag, const char *dflt) {
    int k = find(a, flag);
    return k >= 0 && a->set[k] ? a->v[k].s : dflt;
}
int64_t cli_int(const cli_args *a, const char *flag, int64_t dflt) {
    int k = find(a, flag);
    return k >= 0 && a->set[k] ? a->v[k].i : dflt;
}
uint64_t cli_u64(const cli_args *a, const char *flag, uint64_t dflt) {
    int k = find(a, flag);
    return k >= 0 && a->set[k] ? a->v[k].u : dflt;
}
double cli_num(const cli_args *a, const char *flag, double dflt) {
    int k = find(a, flag);
    return k >= 0 && a->set[k] ? a->v[k].d : dflt;
}

bool cli_too_big(const char *cmd, const char *flags, double bytes) {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    const double have = pages > 0 && page > 0 ? (double)pages * (double)page : 0x1p40;
    if (!(bytes > have)) return false;
    fprintf(stderr, "cgrad %s: %s: needs at least %.3g GB of memory, this machine has %.3g GB\n", cmd, flags, bytes / 1e9,
            have / 1e9);
    return true;
}

int cli_set_precision(const cli_args *a, const char *dflt) {
    const char *v = cli_str(a, "--precision", dflt);
    cg_precision p;
    if (cg_precision_parse(v, &p) != CG_OK) {
        fprintf(stderr, "cgrad %s: --precision takes fp32 or bf16, got '%s'\n", a->cmd, v);
        return 2;
    }
    if (cg_set_precision(p) != CG_OK) {
        fprintf(stderr, "cgrad %s: --precision %s: %s\n", a->cmd, v, cg_last_error());
        return 1;
    }
    return 0;
}

void cli_print_bf16_kernel(const char *prefix) {
    const char *kn = cg_bf16_kernel();
    if (!kn) {
        printf("%sbf16 products: unavailable (%s)\n", prefix, cg_bf16_unavailable());
        return;
    }
    const double amx = cg_bf16_amx_ratio();
    printf("%sbf16 products: %s (%s; vdpbf16ps rate / fp32 FMA rate %.2f", prefix,
           strcmp(kn, "onednn")  ? "the fp32 FMA units, operands widened as packed"
           : isfinite(amx) && amx >= 1 ? "oneDNN's matmul on AMX tiles"
                                  : "oneDNN's vdpbf16ps matmul",
           cg_bf16_kernel_why(), cg_bf16_dot_ratio());
    if (isfinite(amx)) printf(", AMX tdpbf16ps / fp32 FMA %.2f", amx);
    printf(")\n");
}

void cli_print_opts(FILE *f, const char *cmd, const cli_opt *o) {
    static const char *const kinds[] = {"bare", "string", "int", "number", "u64", "in", "out"};
    for (; o->flag; o++) {
        fprintf(f, "%s\t%s\t%s", cmd, o->flag, kinds[o->kind]);
        if (o->kind == CLI_INT || o->kind == CLI_NUM) fprintf(f, "\t%.17g\t%.17g", o->lo, o->hi);
        fprintf(f, "\n");
    }
}

const char *cli_default_data(const char *rel, const char *flag) {
    static char found[4][4096];
    static int k;
    char *out = found[k = (k + 1) % 4];
    const char *env = getenv("CGRAD_DATA");
    char first[4096] = "", cwd[4096];
    if (env && *env) {
        snprintf(out, sizeof found[0], "%s/%s", env, rel);
        if (!access(out, R_OK)) return out;
        snprintf(first, sizeof first, "%s (CGRAD_DATA) and ", out);
    }
    snprintf(out, sizeof found[0], "data/%s", rel);
    if (!access(out, R_OK)) return out;
    cg_set_error(CG_ERR_IO,
             "[data] the default %s is not there: looked for %sdata/%s (in %s)%s; give %s, or set CGRAD_DATA to a folder "
             "that holds %s (./setup.sh puts the default data in the source tree's data/)",
             rel, first, rel, getcwd(cwd, sizeof cwd) ? cwd : ".",
             env && *env ? "" : " (CGRAD_DATA is not set)", flag, rel);
    return NULL;
}
