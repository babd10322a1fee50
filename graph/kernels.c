/* SPDX-License-Identifier: MIT */
/* BLIS's kernel set, chosen once before BLIS's first use.
 *
 * Debian's BLIS 0.9 is a fat build (skx, haswell, zen3, ..., generic) that picks a set from cpuid
 * at its first use, unless BLIS_ARCH_TYPE names one. It does not know every CPU it meets: on AMD
 * family 0x19 models past Zen 3 and on family 0x1A (Zen 4, Zen 5) it runs `generic`, a fifth of
 * the machine's speed, and on Intel AVX-512 CPUs whose FMA-unit count it cannot read from the
 * brand string it runs `haswell`. So before BLIS starts, a child process asks BLIS what it would
 * pick (with its own log on, which says why); cgrad keeps that choice unless it is one of those two
 * cases, and then sets BLIS_ARCH_TYPE to the id that BLIS itself gives the wanted set's name. */
#include <blis.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "graph/internal.h"

/* BLIS's id for a configuration name, or -1 if this BLIS has no such name. */
static int arch_id(const char *name) {
    for (int id = 0; id < BLIS_NUM_ARCHS; id++)
        if (!strcmp(bli_arch_string((arch_t)id), name)) return id;
    return -1;
}

unsigned cgi_cpu_features(void) {
    unsigned f = 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) f |= CGI_CPU_AVX2_FMA;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
        f |= CGI_CPU_AVX512;
    if (__builtin_cpu_is("amd")) f |= CGI_CPU_AMD;
#endif
    return f;
}

const char *cgi_pick_kernels(const char *blis_pick, const char *blis_log, unsigned features, const char **why) {
    const bool avx512 = features & CGI_CPU_AVX512, avx2 = features & CGI_CPU_AVX2_FMA;
    /* The set measured fastest per feature level (docs/performance.md, "Kernel sets and threads"):
     * skx wherever AVX-512 is whole; with AVX2 + FMA, zen3 on AMD and haswell elsewhere. */
    const char *best = avx512 ? "skx" : avx2 ? (features & CGI_CPU_AMD ? "zen3" : "haswell") : NULL;
    if (!blis_pick) {
        *why = best ? "cgrad's pick for this CPU's features (BLIS's own choice could not be read)"
                    : "BLIS's choice (it could not be read ahead)";
        return best;
    }
    if (best && !strcmp(blis_pick, "generic")) {
        *why = avx512 ? "cgrad: BLIS does not know this CPU and would run 'generic'; skx for AVX-512"
                      : "cgrad: BLIS does not know this CPU and would run 'generic'; the AVX2+FMA set";
        return best;
    }
    if (avx512 && !strcmp(blis_pick, "haswell") && blis_log && strstr(blis_log, "FMA units unknown")) {
        *why = "cgrad: BLIS cannot count this CPU's FMA units and would run 'haswell'; skx measured 1.6-1.9x faster";
        return "skx";
    }
    *why = "BLIS's choice for this CPU";
    return blis_pick;
}

/* What BLIS alone would pick, asked in a child so this process's BLIS is still unset: the set's
 * name (static storage) and BLIS's log in log[]; NULL if the child failed. */
static const char *probe_blis(char *log, size_t cap) {
    int fds[2];
    log[0] = 0;
    if (pipe(fds)) return NULL;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]), close(fds[1]);
        return NULL;
    }
    if (pid == 0) {
        dup2(fds[1], 1), dup2(fds[1], 2);
        setenv("BLIS_ARCH_DEBUG", "1", 1);
        unsetenv("BLIS_ARCH_TYPE");
        printf("\nid=%d\n", (int)bli_arch_query_id());
        fflush(stdout);
        _exit(0);
    }
    close(fds[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(fds[0], log + n, cap - 1 - n)) > 0) n += (size_t)r;
    log[n] = 0;
    close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {}
    const char *at = strstr(log, "\nid=");
    if (!WIFEXITED(status) || WEXITSTATUS(status) || !at) return NULL;
    int id = atoi(at + 4);
    return id >= 0 && id < BLIS_NUM_ARCHS ? bli_arch_string((arch_t)id) : NULL;
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static const char *reason = "BLIS's choice", *wanted;

static void choose(void) {
    const char *env = getenv("BLIS_ARCH_TYPE");
    if (env && *env) {
        reason = "set by BLIS_ARCH_TYPE";
        return;
    }
    char log[2048];
    const char *pick = probe_blis(log, sizeof log);
    const char *want = cgi_pick_kernels(pick, log, cgi_cpu_features(), &reason);
    int id = want && (!pick || strcmp(want, pick)) ? arch_id(want) : -1;
    if (id >= 0) {
        char num[16];
        snprintf(num, sizeof num, "%d", id);
        setenv("BLIS_ARCH_TYPE", num, 1);
        wanted = want;
    }
}

/* bli_init registers every set's kernels; BLIS checks BLIS_ARCH_TYPE against them, so asking for
 * the set in use before it would abort. */
void cgi_blis_init(void) {
    pthread_once(&once, choose);
    bli_init();
}

const char *cg_blas_kernels(void) {
    cgi_blis_init();
    return bli_arch_string(bli_arch_query_id());
}

const char *cg_blas_kernels_reason(void) {
    if (wanted && strcmp(cg_blas_kernels(), wanted)) return "BLIS's choice (BLIS was in use before cgrad could set it)";
    cgi_blis_init();
    return reason;
}
