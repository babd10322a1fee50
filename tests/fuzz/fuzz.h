/* SPDX-License-Identifier: MIT */
/* Shared by the libFuzzer harnesses (one per loader, tests/fuzz/fuzz_*.c): fuzz input as a file,
 * the sanitizer settings and the oracles every loader must satisfy beyond "no crash":
 *   - a failed load leaves a message (cg_last_error) that names the file or label it read;
 *   - a successful load gives values the documented promises hold for (checked per harness).
 * A broken promise aborts, which libFuzzer reports as a finding with the input saved. */
#ifndef CGRAD_FUZZ_H
#define CGRAD_FUZZ_H

#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../../cgrad.h"

/* Allocations above this size fail (return NULL) instead of reaching the RSS limit, so a file that
 * claims gigabytes exercises the loaders' out-of-memory paths in microseconds. */
#ifndef FUZZ_MAX_ALLOC_MB
#define FUZZ_MAX_ALLOC_MB "256"
#endif
const char *__asan_default_options(void);
const char *__asan_default_options(void) {
    return "allocator_may_return_null=1:max_allocation_size_mb=" FUZZ_MAX_ALLOC_MB ":detect_leaks=1";
}
const char *__ubsan_default_options(void);
const char *__ubsan_default_options(void) { return "print_stacktrace=1:halt_on_error=1"; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* Prints why and aborts: libFuzzer saves the input as a crash. */
#define FUZZ_CHECK(cond, ...)                                                          \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                              \
            fprintf(stderr, "\n");                                                     \
            abort();                                                                   \
        }                                                                              \
    } while (0)

/* The input as a file: slot k (0..3) is one memfd, rewritten each run; returns "/proc/self/fd/N".
 * memfd keeps the disk out of the loop and needs no cleanup. */
static inline const char *fuzz_file(int k, const void *data, size_t size) {
    static int fd[4] = {-1, -1, -1, -1};
    static char path[4][32];
    if (fd[k] < 0) {
        fd[k] = memfd_create("cgrad-fuzz", 0);
        FUZZ_CHECK(fd[k] >= 0, "memfd_create failed");
        snprintf(path[k], sizeof path[k], "/proc/self/fd/%d", fd[k]);
    }
    FUZZ_CHECK(ftruncate(fd[k], 0) == 0, "ftruncate failed");
    size_t done = 0;
    while (done < size) {
        ssize_t w = pwrite(fd[k], (const char *)data + done, size - done, (off_t)done);
        FUZZ_CHECK(w > 0, "pwrite failed");
        done += (size_t)w;
    }
    return path[k];
}

/* After a failed load: a message must say what failed and, unless memory ran out, name label. */
static inline void fuzz_expect_message(const char *label) {
    const char *m = cg_last_error();
    FUZZ_CHECK(m[0], "a failed load left no message");
    bool oom = strstr(m, "out of memory") || strstr(m, "cannot allocate") || strstr(m, "cannot copy");
    FUZZ_CHECK(!label || oom || strstr(m, label), "message does not name '%s': %s", label, m);
}

/* Splits data at the first occurrence of sep: part 0 before, part 1 after (size 0 if absent). */
static inline void fuzz_split(const uint8_t *data, size_t size, const char *sep, const uint8_t **p1,
                              size_t *n0, size_t *n1) {
    size_t ls = strlen(sep);
    const uint8_t *at = ls && size >= ls ? memmem(data, size, sep, ls) : NULL;
    *n0 = at ? (size_t)(at - data) : size;
    *p1 = at ? at + ls : data + size;
    *n1 = at ? size - *n0 - ls : 0;
}

/* A NUL-terminated malloc'd copy (loaders that take C strings). */
static inline char *fuzz_strndup(const uint8_t *p, size_t n) {
    char *s = malloc(n + 1);
    FUZZ_CHECK(s, "out of memory in the harness");
    memcpy(s, p, n);
    s[n] = 0;
    return s;
}

/* Encodes text with t: ids stay in the vocabulary, only invalid UTF-8 may fail (with a message
 * naming it), and decoding works; with exact, decoding gives back the very bytes (BPE's promise;
 * WordPiece lowercases and drops accents, so it only has to decode). */
static inline void fuzz_encode_decode(const cg_tokenizer *t, const char *text, size_t len, bool exact) {
    int32_t *ids = NULL;
    int64_t n = 0;
    cg_clear_error();
    if (cg_tokenizer_encode(t, text, len, &ids, &n) != CG_OK) {
        FUZZ_CHECK(strstr(cg_last_error(), "UTF-8"), "encode failed on valid input? %s", cg_last_error());
        return;
    }
    int32_t v = cg_tokenizer_vocab_size(t);
    for (int64_t i = 0; i < n; i++) FUZZ_CHECK(ids[i] >= 0 && ids[i] < v, "encode gave id %d of %d", (int)ids[i], (int)v);
    char *back = NULL;
    size_t blen = 0;
    FUZZ_CHECK(cg_tokenizer_decode(t, ids, n, &back, &blen) == CG_OK, "decode of encode failed: %s", cg_last_error());
    if (exact)
        FUZZ_CHECK(blen == len && !memcmp(back, text, len), "decode(encode(s)) != s (%zu vs %zu bytes)", blen, len);
    free(back);
    free(ids);
}

/* Path of a file under the source tree's tests/fixtures (or data/ when fixture is NULL). */
static inline const char *fuzz_src_path(const char *rel) {
    static char buf[4][1024];
    static int k;
    char *b = buf[k++ & 3];
    snprintf(b, 1024, "%s/%s", CGRAD_SOURCE_DIR, rel);
    return b;
}

#endif
