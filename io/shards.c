/* SPDX-License-Identifier: MIT */
/* Sharded safetensors, as transformers' save_pretrained writes a large model: model-0000N-of-0000M
 * .safetensors files and model.safetensors.index.json, whose "weight_map" names the file of every
 * tensor. The shards open mapped, and one view over them answers every cg_st call as a single
 * file would. The index and the files must agree exactly: a tensor the index places in a file that
 * does not hold it, a tensor a file holds that the index does not place there, a tensor in two
 * files, a missing file, or a file name that leaves the directory, fails naming both. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "io/data.h"
#include "io/safetensors_internal.h"

#define MAX_SHARDS 4096

static cg_status fail(const char *index, cg_status s, const char *fmt, const char *a, const char *b) {
    char msg[9000];
    snprintf(msg, sizeof msg, fmt, a, b);
    return cg_set_error(s, "[safetensors] %s: %s", index, msg);
}

/* Index of name in files[0..n), appending it when new; -1 when full. */
static int file_slot(const char **files, int *n, const char *name) {
    for (int i = 0; i < *n; i++)
        if (!strcmp(files[i], name)) return i;
    if (*n == MAX_SHARDS) return -1;
    files[*n] = name;
    return (*n)++;
}

cg_st *cg_st_open_index(const char *index) {
    if (!index) {
        cg_set_error(CG_ERR_ARG, "[safetensors] open_index: NULL path");
        return NULL;
    }
    char *text = NULL;
    size_t len = 0;
    if (cg_read_text_file(index, &text, &len)) return NULL;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    cg_status st = CG_OK;
    if (!cJSON_IsObject(map) || !map->child)
        st = fail(index, CG_ERR_FORMAT, "%s%sexpected a JSON object with a non-empty \"weight_map\" {tensor: file}", "", "");
    const char **files = calloc(MAX_SHARDS, sizeof *files);
    cg_st **parts = calloc(MAX_SHARDS, sizeof *parts);
    int nfiles = 0;
    if (!st && (!files || !parts)) st = cg_set_error(CG_ERR_NOMEM, "[safetensors] %s: out of memory", index);
    /* the directory the shards sit in */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", index);
    char *slash = strrchr(dir, '/');
    if (slash) slash[1] = 0;
    else dir[0] = 0;
    for (const cJSON *e = st ? NULL : map->child; e && !st; e = e->next) {
        const char *file = cJSON_GetStringValue(e);
        if (!file || !*file || strchr(file, '/') || !strcmp(file, "..") || !strcmp(file, "."))
            st = fail(index, CG_ERR_FORMAT, "tensor '%s': the file '%s' is not a file name beside the index", e->string,
                      file ? file : "(not a string)");
        else if (cJSON_GetObjectItemCaseSensitive(map, e->string) != e)
            st = fail(index, CG_ERR_FORMAT, "tensor '%s' is listed twice in the weight_map (%s)", e->string, file);
        else if (file_slot(files, &nfiles, file) < 0)
            st = fail(index, CG_ERR_FORMAT, "more than %s shard files%s", "4096", "");
    }
    for (int k = 0; !st && k < nfiles; k++) {
        char path[8192];
        snprintf(path, sizeof path, "%s%s", dir, files[k]);
        struct stat sb;
        if (stat(path, &sb)) {
            st = fail(index, CG_ERR_IO, "shard %s is missing (the index lists tensors in it)%s", path, "");
            break;
        }
        if (!(parts[k] = cg_st_open(path))) st = cg_last_status() ? cg_last_status() : CG_ERR_FORMAT;
    }
    /* the index and the files agree, both ways */
    for (const cJSON *e = st ? NULL : map->child; e && !st; e = e->next) {
        int k = file_slot(files, &nfiles, cJSON_GetStringValue(e));
        if (cg_st_find(parts[k], e->string) < 0)
            st = fail(index, CG_ERR_FORMAT, "tensor '%s' is not in %s, the shard the index names for it", e->string, files[k]);
    }
    for (int k = 0; !st && k < nfiles; k++)
        for (int i = 0; !st && i < cg_st_count(parts[k]); i++) {
            const char *name = cg_st_name(parts[k], i);
            const char *listed = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(map, name));
            if (!listed || strcmp(listed, files[k])) {
                char where[600];
                snprintf(where, sizeof where, "%s, but the index %s%s", files[k], listed ? "places it in " : "does not list it",
                         listed ? listed : "");
                st = fail(index, CG_ERR_FORMAT, "tensor '%s' is stored in %s", name, where);
            }
        }
    cg_st *f = NULL;
    if (!st) {
        int n = nfiles;
        nfiles = 0; /* the merge owns them now, failing or not */
        f = cgi_st_merge(parts, n, index);
    }
    for (int k = 0; k < nfiles; k++) cg_st_close(parts[k]);
    free(parts);
    free(files);
    cJSON_Delete(root);
    return f;
}

cg_st *cg_st_open_model(const char *dir) {
    if (!dir) {
        cg_set_error(CG_ERR_ARG, "[safetensors] open_model: NULL path");
        return NULL;
    }
    char one[4200], index[4200];
    snprintf(one, sizeof one, "%s/model.safetensors", dir);
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
    struct stat sb;
    if (!stat(one, &sb)) return cg_st_open(one);
    if (!stat(index, &sb)) return cg_st_open_index(index);
    cg_set_error(CG_ERR_IO, "[safetensors] %s: neither model.safetensors nor model.safetensors.index.json", dir);
    return NULL;
}
