/* SPDX-License-Identifier: MIT */
/* LoRA adapters in PEFT's layout, so that a fine-tune moves between cgrad and the Hugging Face
 * tools: a directory with adapter_model.safetensors, whose tensors are named
 * "base_model.model.<module>.lora_A.weight" and "...lora_B.weight" for the nn.Linear <module>
 * whose weight is the parameter "<module>.weight", and adapter_config.json with peft_type "LORA",
 * r, lora_alpha (scale alpha / r, or alpha / sqrt(r) with use_rslora), target_modules and
 * base_model_name_or_path. lora_A is [r, in] and lora_B [out, r], as cgrad's for an [out, in] weight.
 * GPT-2's Conv1D weights are stored [in, out] (cgrad's too), under "transformer.": PEFT adapts them
 * with fan_in_fan_out, its lora_A still [r, in] and lora_B [out, r] and the delta (B A)^T, where
 * cgrad's adapter on P[in, out] is B[in, r] A[r, out] with delta B A: PEFT's lora_A is cgrad's B^T
 * and its lora_B cgrad's A^T, transposed on the way in and out. Settings that change the numbers and
 * that this reader does not implement (DoRA, per-module ranks or alphas, bias training,
 * modules_to_save, embedding adapters) are refused by name. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "graph/internal.h"
#include "io/data.h"
#include "io/safetensors.h"
#include "optim/lora.h"

#define PREFIX "base_model.model."

static bool ends_with(const char *s, const char *suffix) {
    const size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* The module of a parameter name "<module>.weight" into buf; false otherwise. */
static bool module_of(const char *param, char *buf, size_t n) {
    const size_t len = strlen(param);
    if (!ends_with(param, ".weight") || len - 7 >= n) return false;
    memcpy(buf, param, len - 7);
    buf[len - 7] = 0;
    return true;
}

/* GPT-2's Conv1D modules, cgrad's names: h.<N>.attn.c_attn, h.<N>.attn.c_proj, h.<N>.mlp.c_fc,
 * h.<N>.mlp.c_proj. Their weights are [in, out]; transformers keeps them under "transformer.". */
static bool conv1d_module(const char *module) {
    if (strncmp(module, "h.", 2)) return false;
    const char *s = module + 2;
    if (*s < '0' || *s > '9') return false;
    while (*s >= '0' && *s <= '9') s++;
    return !strcmp(s, ".attn.c_attn") || !strcmp(s, ".attn.c_proj") || !strcmp(s, ".mlp.c_fc") || !strcmp(s, ".mlp.c_proj");
}
#define CONV1D_PREFIX "transformer."

/* Adds tensor p[R, C]'s transpose [C, R] to w as key (PEFT's view of a Conv1D adapter). */
static cg_status add_transposed(cg_st_writer *w, const char *key, cg_tensor *p) {
    const int64_t R = p->shape[0], C = p->shape[1];
    cg_real *v = malloc((size_t)(2 * R * C) * sizeof *v);
    if (!v) return cgi_fail(CG_ERR_NOMEM, "[lora peft] out of memory for %s", key);
    cg_real *t = v + R * C;
    cg_status st = cg_read(p, v);
    for (int64_t i = 0; !st && i < R; i++)
        for (int64_t j = 0; j < C; j++) t[j * R + i] = v[i * C + j];
    if (!st) st = cg_st_add(w, key, 2, (int64_t[]){C, R}, t);
    free(v);
    return st;
}

static cg_status write_text(const char *path, const char *text) {
    char tmp[4400];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) return cgi_fail(CG_ERR_IO, "[lora peft] cannot write %s: %s", tmp, strerror(errno));
    const bool ok = fputs(text, f) >= 0;
    if (fclose(f) || !ok || rename(tmp, path)) {
        remove(tmp);
        return cgi_fail(CG_ERR_IO, "[lora peft] cannot write %s", path);
    }
    return CG_OK;
}

cg_status cg_lora_save_peft(cg_params *ps, const char *dir, const char *base_model) {
    if (!ps || !dir) return cgi_fail(CG_ERR_ARG, "[lora peft] NULL argument");
    int rank = 0;
    double alpha = 0;
    cJSON *targets = cJSON_CreateArray();
    cg_st_writer *w = cg_st_writer_new();
    cg_status st = targets && w ? CG_OK : cgi_fail(CG_ERR_NOMEM, "[lora peft] out of memory");
    char module[512], key[700];
    int conv1d = 0, linear = 0; /* PEFT's config has one fan_in_fan_out */
    for (int i = 0; !st && i < cg_params_count(ps); i++) {
        cg_tensor *p = cg_params_at(ps, i);
        if (!p->lora_a) continue;
        const int r = (int)p->lora_a->shape[0];
        const double a = p->lora_scale * r;
        if (!module_of(p->name, module, sizeof module)) {
            st = cgi_fail(CG_ERR_STATE, "[lora peft] %s: PEFT adapts modules' '.weight' parameters", p->name);
            break;
        }
        if (!rank) rank = r, alpha = a;
        if (r != rank || fabs(a - alpha) > 1e-9 * fabs(alpha)) {
            st = cgi_fail(CG_ERR_STATE, "[lora peft] %s: rank %d alpha %g, others rank %d alpha %g: one rank and alpha for all",
                          p->name, r, a, rank, alpha);
            break;
        }
        const char *leaf = strrchr(module, '.') ? strrchr(module, '.') + 1 : module;
        bool listed = false;
        for (cJSON *t = targets->child; t; t = t->next) listed |= !strcmp(t->valuestring, leaf);
        if (!listed) cJSON_AddItemToArray(targets, cJSON_CreateString(leaf));
        if (conv1d_module(module)) { /* PEFT's lora_A = B^T [r, in], lora_B = A^T [out, r] */
            conv1d++;
            snprintf(key, sizeof key, PREFIX CONV1D_PREFIX "%s.lora_A.weight", module);
            st = add_transposed(w, key, p->lora_b);
            snprintf(key, sizeof key, PREFIX CONV1D_PREFIX "%s.lora_B.weight", module);
            if (!st) st = add_transposed(w, key, p->lora_a);
            continue;
        }
        linear++;
        snprintf(key, sizeof key, PREFIX "%s.lora_A.weight", module);
        st = cg_st_add_tensor(w, key, p->lora_a);
        snprintf(key, sizeof key, PREFIX "%s.lora_B.weight", module);
        if (!st) st = cg_st_add_tensor(w, key, p->lora_b);
    }
    if (!st && conv1d && linear)
        st = cgi_fail(CG_ERR_STATE, "[lora peft] %s: adapters on both Conv1D ([in, out]) and Linear weights: PEFT's config "
                      "has one fan_in_fan_out", dir);
    if (!st && !rank) st = cgi_fail(CG_ERR_STATE, "[lora peft] %s: the parameter set has no adapters", dir);
    if (!st && mkdir(dir, 0777) && errno != EEXIST) st = cgi_fail(CG_ERR_IO, "[lora peft] cannot create %s: %s", dir, strerror(errno));
    char path[4300];
    if (!st) {
        st = cg_st_set_metadata(w, "format", "pt");
        snprintf(path, sizeof path, "%s/adapter_model.safetensors.tmp.%ld", dir, (long)getpid());
        char final[4300];
        snprintf(final, sizeof final, "%s/adapter_model.safetensors", dir);
        if (!st) st = cg_st_write(w, path);
        if (!st && rename(path, final)) st = cgi_fail(CG_ERR_IO, "[lora peft] cannot rename %s to %s", path, final);
        if (st) remove(path);
    }
    cJSON *c = st ? NULL : cJSON_CreateObject();
    if (c) {
        cJSON_AddStringToObject(c, "peft_type", "LORA");
        cJSON_AddStringToObject(c, "task_type", "CAUSAL_LM");
        cJSON_AddNumberToObject(c, "r", rank);
        cJSON_AddNumberToObject(c, "lora_alpha", alpha);
        cJSON_AddNumberToObject(c, "lora_dropout", 0.0);
        cJSON_AddItemToObject(c, "target_modules", targets);
        targets = NULL;
        if (base_model) cJSON_AddStringToObject(c, "base_model_name_or_path", base_model);
        else cJSON_AddNullToObject(c, "base_model_name_or_path");
        cJSON_AddStringToObject(c, "bias", "none");
        cJSON_AddBoolToObject(c, "fan_in_fan_out", conv1d > 0);
        cJSON_AddTrueToObject(c, "inference_mode");
        cJSON_AddFalseToObject(c, "use_rslora");
        cJSON_AddFalseToObject(c, "use_dora");
        cJSON_AddNullToObject(c, "modules_to_save");
        cJSON_AddObjectToObject(c, "rank_pattern");
        cJSON_AddObjectToObject(c, "alpha_pattern");
        char *text = cJSON_Print(c);
        snprintf(path, sizeof path, "%s/adapter_config.json", dir);
        st = text ? write_text(path, text) : cgi_fail(CG_ERR_NOMEM, "[lora peft] out of memory");
        free(text);
        cJSON_Delete(c);
    }
    cJSON_Delete(targets);
    cg_st_writer_free(w);
    return st;
}

/* Fails naming a config field whose value changes the numbers and is not implemented here. */
static cg_status refuse(const char *path, const cJSON *c, const char *field, bool (*allowed)(const cJSON *)) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c, field);
    if (!v || allowed(v)) return CG_OK;
    char *text = cJSON_PrintUnformatted(v);
    cg_status st = cgi_fail(CG_ERR_FORMAT, "[lora peft] %s: \"%s\": %s is not supported", path, field, text ? text : "?");
    free(text);
    return st;
}
static bool is_false_or_null(const cJSON *v) { return cJSON_IsFalse(v) || cJSON_IsNull(v); }
static bool is_empty(const cJSON *v) { return cJSON_IsNull(v) || (cJSON_IsObject(v) && !v->child) || (cJSON_IsArray(v) && !v->child); }
static bool is_none(const cJSON *v) { return cJSON_IsNull(v) || (cJSON_IsString(v) && !strcmp(v->valuestring, "none")); }
static bool is_lora(const cJSON *v) { return cJSON_IsString(v) && !strcmp(v->valuestring, "LORA"); }

/* The parameter PEFT's module adapts, "<module>.weight", its name into param; a GPT-2 Conv1D module
 * (under "transformer." or not) sets *conv. NULL when there is none. */
static cg_tensor *adapted_param(cg_params *ps, const char *module, char *param, size_t n, bool *conv) {
    const size_t pre = strlen(CONV1D_PREFIX);
    const char *m = !strncmp(module, CONV1D_PREFIX, pre) && conv1d_module(module + pre) ? module + pre : module;
    *conv = conv1d_module(m);
    snprintf(param, n, "%s.weight", m);
    return cg_params_find(ps, param);
}

/* The parameter adapted by a lora_A tensor named name (checked by the first pass: PREFIX<module>.lora_A.weight,
 * module shorter than its buffer), its name to param, its module to module; NULL when name is a lora_B. */
static cg_tensor *lora_a_param(cg_params *ps, const char *name, char *module, char *param, size_t nparam, bool *conv) {
    if (!ends_with(name, ".lora_A.weight")) return NULL;
    const size_t n = strlen(name), pre = strlen(PREFIX);
    memcpy(module, name + pre, n - pre - 14);
    module[n - pre - 14] = 0;
    return adapted_param(ps, module, param, nparam, conv);
}


/* A Conv1D adapter as cgrad holds it: A = PEFT's lora_B^T [r, out], B = PEFT's lora_A^T [in, r]. */
typedef struct {
    cg_tensor *p;
    cg_real *a, *b;
} conv_adapter;

/* Reads src[R, C] of f (checked: shape, finite values) transposed into dst [C, R]. */
static cg_status read_transposed(const cg_st *f, const char *path, const char *name, int64_t R, int64_t C, cg_real *dst) {
    cg_real *v = malloc((size_t)(R * C) * sizeof *v);
    if (!v) return cgi_fail(CG_ERR_NOMEM, "[lora peft] out of memory for %s", name);
    cg_status st = cg_st_read(f, name, v, 2, (int64_t[]){R, C});
    for (int64_t i = 0; !st && i < R * C; i++)
        if (!isfinite(v[i]))
            st = cgi_fail(CG_ERR_FORMAT, "[lora peft] %s: tensor '%s' holds %g at flat index %lld: adapters must be finite",
                          path, name, (double)v[i], (long long)i);
    for (int64_t i = 0; !st && i < R; i++)
        for (int64_t j = 0; j < C; j++) dst[j * R + i] = v[i * C + j];
    free(v);
    return st;
}

/* PEFT's lora_A [r, in] (name) and lora_B [out, r] (key) of Conv1D weight p [in, out], into c. */
static cg_status read_conv1d(const cg_st *f, const char *path, const char *name, const char *key, cg_tensor *p, int64_t r,
                             conv_adapter *c) {
    const int64_t in = p->shape[0], out = p->shape[1];
    c->p = p;
    c->a = malloc((size_t)(r * out) * sizeof *c->a);
    c->b = malloc((size_t)(in * r) * sizeof *c->b);
    if (!c->a || !c->b) return cgi_fail(CG_ERR_NOMEM, "[lora peft] out of memory for %s", name);
    cg_status st = read_transposed(f, path, name, r, in, c->b);
    return st ? st : read_transposed(f, path, key, out, r, c->a);
}

cg_status cg_lora_load_peft(cg_params *ps, const char *dir) {
    if (!ps || !dir) return cgi_fail(CG_ERR_ARG, "[lora peft] NULL argument");
    char path[4300];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    char *text = NULL;
    size_t len = 0;
    if (cg_read_text_file(path, &text, &len)) return cg_last_status();
    cJSON *c = cJSON_ParseWithLength(text, len);
    free(text);
    cg_status st = cJSON_IsObject(c) ? CG_OK : cgi_fail(CG_ERR_FORMAT, "[lora peft] %s: not a JSON object", path);
    if (!st && !is_lora(cJSON_GetObjectItemCaseSensitive(c, "peft_type")))
        st = cgi_fail(CG_ERR_FORMAT, "[lora peft] %s: \"peft_type\" must be \"LORA\"", path);
    const double r = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(c, "r"));
    const double alpha = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(c, "lora_alpha"));
    if (!st && !(r >= 1 && r <= 65536 && r == floor(r)))
        st = cgi_fail(CG_ERR_FORMAT, "[lora peft] %s: \"r\" must be a whole number >= 1", path);
    if (!st && !(isfinite(alpha) && alpha != 0))
        st = cgi_fail(CG_ERR_FORMAT, "[lora peft] %s: \"lora_alpha\" must be finite and nonzero", path);
    if (!st) st = refuse(path, c, "use_dora", is_false_or_null);
    /* fan_in_fan_out follows the module, as in PEFT (which sets it true for Conv1D, false for Linear,
     * whatever the config says): a Conv1D module's tensors are transposed, a Linear's are not */
    if (!st) st = refuse(path, c, "rank_pattern", is_empty);
    if (!st) st = refuse(path, c, "alpha_pattern", is_empty);
    if (!st) st = refuse(path, c, "modules_to_save", is_empty);
    if (!st) st = refuse(path, c, "bias", is_none);
    const bool rs = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "use_rslora"));
    cJSON_Delete(c);
    if (st) return st;
    /* cg_lora_add's scale is alpha / rank: rsLoRA's alpha / sqrt(r) is that of alpha * sqrt(r) */
    const double add_alpha = rs ? alpha * sqrt(r) : alpha;
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    cg_st *f = cg_st_open(path);
    if (!f) return cg_last_status();
    /* every tensor checked against its base before anything changes */
    char module[512], param[600], key[700];
    int found = 0, conv1d = 0;
    for (int i = 0; !st && i < cg_st_count(f); i++) {
        const char *name = cg_st_name(f, i);
        const size_t n = strlen(name), pre = strlen(PREFIX);
        const bool is_a = ends_with(name, ".lora_A.weight"), is_b = ends_with(name, ".lora_B.weight");
        if (strncmp(name, PREFIX, pre) || (!is_a && !is_b) || n - pre - 14 >= sizeof module) {
            st = cgi_fail(CG_ERR_FORMAT, "[lora peft] %s: tensor '%s' is not " PREFIX "<module>.lora_A.weight or .lora_B.weight",
                          path, name);
            break;
        }
        memcpy(module, name + pre, n - pre - 14);
        module[n - pre - 14] = 0;
        bool conv;
        cg_tensor *p = adapted_param(ps, module, param, sizeof param, &conv);
        snprintf(key, sizeof key, PREFIX "%s.lora_%c.weight", module, is_a ? 'B' : 'A');
        int na = 0, nb = 0;
        int64_t sa[CG_MAX_DIMS], sb[CG_MAX_DIMS];
        const int64_t in = p ? p->shape[conv ? 0 : 1] : 0, out = p ? p->shape[conv ? 1 : 0] : 0;
        if (!p || p->ndim != 2 || p->lora_a)
            st = cgi_fail(CG_ERR_FORMAT, "[lora peft] %s: '%s' adapts '%s', which is not a 2-D parameter without an adapter",
                          path, name, param);
        else if (cg_st_find(f, key) < 0)
            st = cgi_fail(CG_ERR_FORMAT, "[lora peft] %s: '%s' has no partner '%s'", path, name, key);
        else if (is_a && (cg_st_info(f, name, NULL, &na, sa) || cg_st_info(f, key, NULL, &nb, sb) || na != 2 || nb != 2 ||
                          sa[0] != (int64_t)r || sa[1] != in || sb[0] != out || sb[1] != (int64_t)r))
            st = cgi_fail(CG_ERR_FORMAT, "[lora peft] %s: adapter of '%s'%s%s: lora_A %s and lora_B %s, want [%d, %lld] and "
                          "[%lld, %d]", path, param, cgi_shp(p), conv ? " (Conv1D, [in, out])" : "", cg_dims_str(na, sa),
                          cg_dims_str(nb, sb), (int)r, (long long)in, (long long)out, (int)r);
        found += is_a;
        conv1d += is_a && conv;
    }
    /* Conv1D adapters are read (and checked finite) before anything changes, transposed into cgrad's */
    conv_adapter *cv = !st && conv1d ? calloc((size_t)conv1d, sizeof *cv) : NULL;
    if (!st && conv1d && !cv) st = cgi_fail(CG_ERR_NOMEM, "[lora peft] out of memory");
    for (int i = 0, k = 0; !st && i < cg_st_count(f); i++) {
        const char *name = cg_st_name(f, i);
        bool conv = false;
        cg_tensor *p = lora_a_param(ps, name, module, param, sizeof param, &conv);
        if (!p || !conv) continue;
        snprintf(key, sizeof key, PREFIX "%s.lora_B.weight", module);
        st = read_conv1d(f, path, name, key, p, (int64_t)r, &cv[k++]);
    }
    if (!st && !found) st = cgi_fail(CG_ERR_FORMAT, "[lora peft] %s: holds no adapters", path);
    cg_st_load *l = st ? NULL : cg_st_load_new(); /* Linear adapters' values through the checks every load takes */
    if (!st && !l) st = CG_ERR_NOMEM;
    for (int i = 0; !st && i < cg_st_count(f); i++) {
        const char *name = cg_st_name(f, i);
        bool conv = false;
        cg_tensor *p = lora_a_param(ps, name, module, param, sizeof param, &conv);
        if (!p) continue;
        cg_rng rng;
        cg_rng_seed(&rng, 0);
        if ((st = cg_lora_add(ps, p, (int)r, add_alpha, &rng))) break;
        if (conv) continue; /* written below */
        snprintf(key, sizeof key, PREFIX "%s.lora_B.weight", module);
        if (!(st = cg_st_load_add(l, p->lora_a, f, name))) st = cg_st_load_add(l, p->lora_b, f, key);
    }
    if (!st) st = cg_st_load_run(l);
    for (int k = 0; !st && k < conv1d; k++)
        if (!(st = cg_write(cv[k].p->lora_a, cv[k].a))) st = cg_write(cv[k].p->lora_b, cv[k].b);
    for (int k = 0; cv && k < conv1d; k++) free(cv[k].a), free(cv[k].b);
    free(cv);
    cg_st_load_free(l);
    if (!st) /* as cg_lora_load: the fine-tune trains its adapters alone */
        for (int i = 0; i < cg_params_count(ps); i++)
            if (!cg_lora_is_adapter(cg_params_at(ps, i))) cg_param_set_trainable(cg_params_at(ps, i), false);
    cg_st_close(f);
    return st;
}
