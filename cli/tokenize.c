/* SPDX-License-Identifier: MIT */
/* cgrad tokenize: text on stdin -> its ids as one JSON array (or, with --decode, a JSON array of ids
 * -> the text), with any tokenizer cgrad reads: a tokenizer.json, a directory holding one (or
 * another format cg_tokenizer_load reads), or a checkpoint (its stored tokenizer). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "cgrad.h"
#include "cli/commands.h"

#define TOKENIZE_MAX_INPUT ((size_t)1 << 31) /* stdin is read whole: refuse more than 2 GiB */

const cli_opt cli_tokenize_opts[] = {
    {"--tokenizer", CLI_STR, 0, 0, "tokenizer.json, a directory holding a tokenizer, or a checkpoint"},
    {"--decode", CLI_BARE, 0, 0, "read a JSON array of ids, print their text"},
    {"--no-special", CLI_BARE, 0, 0, "leave out the post-processor's special tokens (LLaMA-2's BOS <s>)"},
    {"--lines", CLI_BARE, 0, 0, "encode each line alone (without its line end): one JSON array a line"},
    {"--time", CLI_BARE, 0, 0, "print load_s=... encode_s=... (wall seconds) to stderr"},
    {NULL, CLI_BARE, 0, 0, NULL}};

/* All of stdin, NUL-terminated; NULL with a message. */
static char *read_stdin(size_t *len) {
    size_t n = 0, cap = 1 << 16;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, stdin);
        n += got;
        if (got == 0) break;
        if (n == cap) {
            if (cap >= TOKENIZE_MAX_INPUT) {
                fprintf(stderr, "cgrad tokenize: stdin holds more than %zu bytes\n", TOKENIZE_MAX_INPUT);
                free(buf);
                return NULL;
            }
            char *b = realloc(buf, 2 * cap + 1);
            if (!b) free(buf);
            buf = b;
            cap *= 2;
        }
    }
    if (!buf || ferror(stdin)) {
        fprintf(stderr, "cgrad tokenize: cannot read stdin%s\n", buf ? "" : ": out of memory");
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

/* The tokenizer at path: a checkpoint file holds it in its metadata; a Hugging Face model's
 * .safetensors file has it beside it; anything else is for cg_tokenizer_load. */
static cg_tokenizer *open_tokenizer(const char *path) {
    struct stat sb;
    size_t n = strlen(path);
    if (n > 12 && !strcmp(path + n - 12, ".safetensors")) {
        char *dir = strdup(path);
        if (!dir) return NULL;
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        cg_tokenizer *t = cg_tokenizer_load(slash ? (*dir ? dir : "/") : ".");
        free(dir);
        return t;
    }
    bool plain = stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && !(n > 5 && !strcmp(path + n - 5, ".json")) &&
                 !(n > 4 && (!strcmp(path + n - 4, ".txt") || !strcmp(path + n - 4, ".bpe")));
    if (!plain) return cg_tokenizer_load(path);
    cg_st *st = cg_checkpoint_open(path);
    if (!st) return NULL;
    const char *json = cg_st_metadata(st, "tokenizer");
    cg_tokenizer *t = json ? cg_tokenizer_deserialize(json) : NULL;
    if (!json) cg_set_error(CG_ERR_FORMAT, "[tokenize] %s: the checkpoint stores no tokenizer", path);
    cg_st_close(st);
    return t;
}

static bool print_ids(const int32_t *ids, int64_t n) {
    putchar('[');
    for (int64_t i = 0; i < n; i++) printf(i ? ",%d" : "%d", (int)ids[i]);
    return printf("]\n") > 0;
}

static int encode_text(const cg_tokenizer *t, const char *s, size_t len, bool special) {
    int32_t *ids = NULL;
    int64_t n = 0;
    cg_status st = special ? cg_tokenizer_encode_special(t, s, len, &ids, &n) : cg_tokenizer_encode(t, s, len, &ids, &n);
    if (st) {
        fprintf(stderr, "cgrad tokenize: %s\n", cg_last_error());
        return 1;
    }
    print_ids(ids, n);
    free(ids);
    return 0;
}

static int decode_json(const cg_tokenizer *t, const char *s, size_t len) {
    cJSON *a = cJSON_ParseWithLength(s, len);
    if (!cJSON_IsArray(a)) {
        fprintf(stderr, "cgrad tokenize --decode: stdin is not a JSON array of ids\n");
        cJSON_Delete(a);
        return 1;
    }
    int n = cJSON_GetArraySize(a), i = 0;
    int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
    int rc = ids ? 0 : 1;
    for (const cJSON *v = a->child; v && !rc; v = v->next, i++) {
        if (!cJSON_IsNumber(v) || v->valuedouble != (double)(int32_t)v->valuedouble) {
            fprintf(stderr, "cgrad tokenize --decode: element %d is not an integer id\n", i);
            rc = 1;
        } else ids[i] = (int32_t)v->valuedouble;
    }
    char *text = NULL;
    size_t tl = 0;
    if (!rc && cg_tokenizer_decode(t, ids, n, &text, &tl)) {
        fprintf(stderr, "cgrad tokenize --decode: %s\n", cg_last_error());
        rc = 1;
    }
    if (!rc && fwrite(text, 1, tl, stdout) != tl) rc = 1;
    free(text);
    free(ids);
    cJSON_Delete(a);
    return rc;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int cmd_tokenize(int argc, char **argv) {
    cli_args a;
    if (!cli_parse("tokenize", cli_tokenize_opts, argc, argv, &a) || !cli_words(&a, 0, 0, NULL) ||
        !cli_require(&a, "--tokenizer", "PATH"))
        return 2;
    double t0 = now();
    cg_tokenizer *t = open_tokenizer(cli_str(&a, "--tokenizer", NULL));
    double t1 = now();
    if (!t) {
        fprintf(stderr, "cgrad tokenize: %s\n", cg_last_error());
        return 1;
    }
    size_t len = 0;
    char *in = read_stdin(&len);
    int rc = in ? 0 : 1;
    double t2 = now();
    bool special = !cli_has(&a, "--no-special");
    if (in && cli_has(&a, "--decode")) rc = decode_json(t, in, len);
    else if (in && cli_has(&a, "--lines"))
        for (size_t i = 0; i < len && !rc;) {
            const char *nl = memchr(in + i, '\n', len - i);
            size_t e = nl ? (size_t)(nl - in) : len;
            rc = encode_text(t, in + i, e - i, special);
            i = e + 1;
        }
    else if (in) rc = encode_text(t, in, len, special);
    if (!rc && fflush(stdout)) rc = 1;
    if (!rc && cli_has(&a, "--time")) /* encode_s holds writing the ids, as the reference's does */
        fprintf(stderr, "load_s=%.6f encode_s=%.6f\n", t1 - t0, now() - t2);
    free(in);
    cg_tokenizer_free(t);
    return rc;
}
