/* SPDX-License-Identifier: MIT */
/* cgrad train's run file (--config run.json): the reader that checks every key as its flag's value
 * would be checked. Oracles: a refused file leaves a message (on stderr, which the CLI prints);
 * an accepted one, with the per-arch defaults filled in, is written back as cgrad writes
 * NAME_run.json, and that file must read back to the very same options (booleans as booleans,
 * numbers unchanged). */
#define FUZZ_MAX_ALLOC_MB "64"
#include "fuzz.h"

#include "cli/train.h"

static FILE *real_stderr; /* the CLI's refusals go to /dev/null; the harness's own findings here */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    cg_set_threads(1);
    int fd = dup(2);
    real_stderr = fd >= 0 ? fdopen(fd, "w") : NULL;
    FILE *null = fopen("/dev/null", "w");
    if (null && real_stderr) stderr = null; /* sanitizer reports still go to fd 2 */
    return 0;
}

#define RUN_CHECK(cond, ...)                                                                    \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            FILE *e = real_stderr ? real_stderr : stderr;                                       \
            fprintf(e, "%s:%d: FUZZ_CHECK(%s) failed: ", __FILE__, __LINE__, #cond);            \
            fprintf(e, __VA_ARGS__);                                                            \
            fprintf(e, "\n");                                                                   \
            fflush(e);                                                                          \
            abort();                                                                            \
        }                                                                                       \
    } while (0)

/* train_parse on `--config path`; 0 when the file was accepted. */
static int parse(const char *path, topts *o, bool *set, cJSON **doc) {
    char flag[] = "--config", value[64];
    snprintf(value, sizeof value, "%s", path);
    char *argv[] = {flag, value};
    const char *resume = NULL;
    memset(set, 0, N_DEFS * sizeof *set);
    return train_parse(2, argv, o, set, &resume, doc);
}

/* The options as cgrad writes them to NAME_run.json, keeping only the keys the file set (the rest
 * are per-arch defaults, which the second read fills in the same way). */
static char *written(topts *o, const bool *set) {
    cJSON *j = train_opts_json(o);
    RUN_CHECK(j, "train_opts_json failed");
    cJSON *keep = cJSON_CreateObject();
    int i = 0;
    for (cJSON *v = j->child; v; v = v->next, i++)
        if (i < N_DEFS && set[i]) cJSON_AddItemToObject(keep, v->string, cJSON_Duplicate(v, true));
    char *text = cJSON_Print(keep);
    cJSON_Delete(keep);
    cJSON_Delete(j);
    return text;
}

/* Every option after the defaults, as one JSON text. */
static char *resolved(topts *o, const bool *set) {
    train_defaults(o, set);
    cJSON *j = train_opts_json(o);
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return text;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(0, data, size);
    topts o, o2;
    bool set[N_DEFS], set2[N_DEFS];
    cJSON *doc = NULL, *doc2 = NULL;
    if (parse(path, &o, set, &doc)) {
        RUN_CHECK(!doc, "a refused run file left its document");
        return 0;
    }
    char *file = written(&o, set);
    char *first = resolved(&o, set);
    const char *path2 = fuzz_file(1, file, strlen(file));
    RUN_CHECK(parse(path2, &o2, set2, &doc2) == 0, "the run file cgrad writes is refused:\n%s", file);
    for (int i = 0; i < N_DEFS; i++) RUN_CHECK(set[i] == set2[i], "key %d set %d, then %d", i, set[i], set2[i]);
    char *second = resolved(&o2, set2);
    RUN_CHECK(!strcmp(first, second), "options changed through the written run file:\n  %s\n  %s", first, second);
    free(file);
    free(first);
    free(second);
    cJSON_Delete(doc);
    cJSON_Delete(doc2);
    return 0;
}
