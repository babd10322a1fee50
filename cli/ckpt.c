/* SPDX-License-Identifier: MIT */
/* Loading what `cgrad train` saves: a gzip safetensors image whose metadata holds the arch, the
 * model config, the tokenizer, the training options and position, and whose tensors are the
 * parameters (by their own names) and the optimizer moments ("optim.m1", "optim.m2"). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/session.h"

/* Re-raises the current message with the checkpoint's path in front, unless it names it already. */
static cg_status with_path(const char *path, cg_status st, const char *what) {
    char msg[900];
    snprintf(msg, sizeof msg, "%s", cg_last_error());
    if (strstr(msg, path)) return cg_set_error(st, "%s%s%s", what, *what ? ": " : "", msg);
    return cg_set_error(st, "[checkpoint] %s: %s%s%s", path, what, *msg ? ": " : "", msg);
}

static cJSON *meta_json(const cg_st *st, const char *key) {
    const char *s = cg_st_metadata(st, key);
    cJSON *j = s ? cJSON_Parse(s) : NULL;
    return j ? j : cJSON_CreateObject();
}

/* A LoRA fine-tune's checkpoint holds its adapters alone: the weights come from the checkpoint
 * it started from (--init-from, saved as an absolute path), then the same adapters are added and
 * read from this file. */
static cg_status load_lora(cli_ckpt *ck, const char *path) {
    const char *base = cli_json_str(ck->train, "init_from", "");
    if (!*base) return cg_set_error(CG_ERR_FORMAT, "[checkpoint] %s: a LoRA checkpoint without its base (init_from)", path);
    cg_status st = CG_OK;
    if (cli_hf_layout(base)) { /* a Hugging Face-layout base: weights by transformers' names */
        if (cli_hf_read_weights(base, ck->model))
            return cg_set_error(CG_ERR_IO, "[checkpoint] %s: cannot read its base %s: %s", path, base, cg_last_error());
    } else {
        cg_st *bf = cg_checkpoint_open(base);
        if (!bf) return cg_set_error(CG_ERR_IO, "[checkpoint] %s: cannot open its base %s: %s", path, base, cg_last_error());
        st = cg_st_read_params(bf, ck->ps);
        cg_st_close(bf);
        if (st) return with_path(path, st, "base parameters");
    }
    cg_rng r;
    cg_rng_seed(&r, 0);
    if (cg_lora_apply(ck->ps, cli_json_str(ck->train, "lora_targets", ""), (int)cli_json_i64(ck->train, "lora_rank", 0),
                      cli_json_num(ck->train, "lora_alpha", 1), &r) < 0)
        return with_path(path, CG_ERR_FORMAT, "LoRA settings");
    cg_st_load *l = cg_st_load_new(); /* the checks of every weight load, then the values */
    st = l ? CG_OK : CG_ERR_NOMEM;
    for (int i = 0; !st && i < cg_params_count(ck->ps); i++) {
        cg_tensor *t = cg_params_at(ck->ps, i);
        if (cg_lora_is_adapter(t)) st = cg_st_load_add(l, t, ck->st, cg_name(t));
    }
    if (!st) st = cg_st_load_run(l);
    cg_st_load_free(l);
    return st ? with_path(path, st, "adapters") : CG_OK;
}

cg_status cli_ckpt_load_frozen(const char *path, double dropout, cli_ckpt *ck) {
    cli_lora frozen = {0};
    if (!cli_hf_layout(path)) return cli_ckpt_load(path, dropout, ck);
    memset(ck, 0, sizeof *ck);
    return cli_hf_load_adapted(path, dropout, false, &frozen, ck);
}

cg_status cli_ckpt_load(const char *path, double dropout, cli_ckpt *ck) {
    memset(ck, 0, sizeof *ck);
    struct stat sb;
    if (stat(path, &sb)) return cg_set_error(CG_ERR_IO, "[checkpoint] %s: cannot open: %s", path, strerror(errno));
    ck->file_bytes = (long long)sb.st_size;
    if (cli_hf_layout(path)) return cli_hf_load(path, dropout, false, ck); /* model.safetensors + config.json */
    if (!(ck->st = cg_checkpoint_open(path))) return with_path(path, CG_ERR_FORMAT, "");
    const char *arch = cg_st_metadata(ck->st, "arch"), *cfg = cg_st_metadata(ck->st, "config"),
               *tok = cg_st_metadata(ck->st, "tokenizer");
    cg_status st = CG_OK;
    if (!arch || !cfg || !tok)
        st = cg_set_error(CG_ERR_FORMAT, "[checkpoint] %s: no %s in the metadata (not written by cgrad train?)", path,
                      !arch ? "arch" : !cfg ? "config" : "tokenizer");
    else if (cg_arch_parse(arch, &ck->arch)) st = with_path(path, CG_ERR_FORMAT, "metadata arch");
    else if (!(ck->tok = cg_tokenizer_deserialize(tok))) st = with_path(path, CG_ERR_FORMAT, "metadata tokenizer");
    if (!st) {
        ck->train = meta_json(ck->st, "train");
        ck->state = meta_json(ck->st, "state");
        if (dropout < 0) dropout = cli_json_num(ck->train, "dropout", 0.0);
        ck->ps = cg_params_new();
        /* the file overwrites them: no fill of a model the file may yet refuse (a config of
         * billions of parameters over a few bytes took seconds to fill before its refusal) */
        cg_params_defer_init(ck->ps, true);
        ck->model = ck->ps ? cg_model_new(ck->arch, cfg, dropout, ck->ps, 0) : NULL;
        char tok_file[4200];
        snprintf(tok_file, sizeof tok_file, "%s (metadata \"tokenizer\")", path);
        if (!ck->model) st = with_path(path, CG_ERR_FORMAT, "metadata config");
        else if (!cg_model_is_image(ck->model)) st = cli_check_vocab(ck->model, ck->tok, tok_file, "its metadata \"config\"");
        if (!st && cli_json_i64(ck->train, "lora_rank", 0) > 0) st = load_lora(ck, path);
        else if (!st && (st = cg_st_read_params(ck->st, ck->ps))) st = with_path(path, st, "parameters");
        if (!st) cg_params_defer_init(ck->ps, false); /* what the file lacks (new adapters) is drawn now */
    }
    const char *labels = st ? NULL : cg_st_metadata(ck->st, "labels");
    cJSON *lj = labels ? cJSON_Parse(labels) : NULL;
    if (lj && cJSON_IsArray(lj)) {
        ck->n_labels = cJSON_GetArraySize(lj);
        ck->labels = calloc((size_t)ck->n_labels + 1, sizeof *ck->labels);
        for (int i = 0; ck->labels && i < ck->n_labels; i++) {
            const char *s = cJSON_GetStringValue(cJSON_GetArrayItem(lj, i));
            ck->labels[i] = strdup(s ? s : "?");
        }
    }
    cJSON_Delete(lj);
    return st ? cli_ckpt_fail(ck, st) : st;
}

cg_status cli_ckpt_fail(cli_ckpt *ck, cg_status st) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", cg_last_error()); /* freeing may overwrite it */
    cli_ckpt_free(ck);
    return cg_set_error(st, "%s", msg);
}

void cli_ckpt_free(cli_ckpt *ck) {
    cg_model_free(ck->model);
    cg_params_free(ck->ps);
    cg_tokenizer_free(ck->tok);
    cg_st_close(ck->st);
    cJSON_Delete(ck->train);
    cJSON_Delete(ck->state);
    for (int i = 0; ck->labels && i < ck->n_labels; i++) free(ck->labels[i]);
    free(ck->labels);
    memset(ck, 0, sizeof *ck);
}

/* A saved number outside the integer type is unusable, like a missing one (converting it is
 * undefined: a checkpoint with "step": 1e300 made `cgrad info` do that). 2^63 and 2^64 are exact. */
int64_t cli_json_i64(const cJSON *o, const char *key, int64_t dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsNumber(v))
        return v->valuedouble >= -9223372036854775808.0 && v->valuedouble < 9223372036854775808.0
                   ? (int64_t)v->valuedouble : dflt;
    if (cJSON_IsString(v)) return strtoll(v->valuestring, NULL, 10);
    return dflt;
}

uint64_t cli_json_u64(const cJSON *o, const char *key, uint64_t dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsString(v)) return strtoull(v->valuestring, NULL, 10);
    if (cJSON_IsNumber(v))
        return v->valuedouble >= 0 && v->valuedouble < 18446744073709551616.0 ? (uint64_t)v->valuedouble : dflt;
    return dflt;
}

double cli_json_num(const cJSON *o, const char *key, double dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsNumber(v)) return v->valuedouble;
    if (cJSON_IsString(v)) return strtod(v->valuestring, NULL); /* "nan" and exact %.17g values */
    return dflt;
}

const char *cli_json_str(const cJSON *o, const char *key, const char *dflt) {
    const char *s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, key));
    return s ? s : dflt;
}
