/* SPDX-License-Identifier: MIT */
/* The Hugging Face layout, in and out: `cgrad export CKPT DIR` writes model.safetensors (weights
 * only, transformers' names), config.json and the tokenizer files, the way save_pretrained lays
 * out a model; and every command that takes a checkpoint also takes such a directory (or its
 * .safetensors file with config.json beside it), so `--init-from DIR` fine-tunes from one. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/session.h"
#include "io/file_internal.h"
#include "optim/lora.h"

static bool is_dir(const char *p) {
    struct stat sb;
    return !stat(p, &sb) && S_ISDIR(sb.st_mode);
}

static bool is_file(const char *p) {
    struct stat sb;
    return !stat(p, &sb) && S_ISREG(sb.st_mode);
}

static void path_join(char *out, size_t n, const char *dir, const char *name) {
    snprintf(out, n, "%s%s%s", dir, *dir && dir[strlen(dir) - 1] == '/' ? "" : "/", name);
}

/* Fails with "[hf] file: " before the current message (copied first: it is the buffer written),
 * unless the message names the file already. */
static cg_status with_file(cg_status st, const char *file) {
    char msg[900];
    snprintf(msg, sizeof msg, "%s", cg_last_error());
    if (strstr(msg, file)) return cg_set_error(st, "%s", msg);
    return cg_set_error(st, "[hf] %s: %s", file, msg);
}

/* The directory part of path ("." without one). */
static void dir_of(const char *path, char *out, size_t n) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(out, n, ".");
    else snprintf(out, n, "%.*s", slash == path ? 1 : (int)(slash - path), path);
}

bool cli_hf_layout(const char *path) {
    if (is_dir(path)) return true;
    FILE *f = cgi_fopen_bounded(path, CGI_LIMIT_WEIGHTS, "checkpoint", NULL);
    if (!f) return false; /* a device or a pipe: the checkpoint reader refuses it, naming it */
    unsigned char b[2] = {0, 0};
    const size_t n = fread(b, 1, 2, f);
    fclose(f);
    return !(n == 2 && b[0] == 0x1f && b[1] == 0x8b); /* gzip: a cgrad checkpoint */
}

/* Architecture a config.json describes: model_type gpt2, bert, llama or one of LLaMA's families
 * (mistral, qwen2, qwen3, mixtral: the llama arch reads which), or a cgrad arch name. */
static cg_status arch_of(const cJSON *cfg, const char *path, cg_arch *arch) {
    const char *mt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(cfg, "model_type"));
    static const char *const have = "gpt2, bert, encdec, classifier, llama, mistral, qwen2, qwen3, mixtral";
    if (!mt) return cg_set_error(CG_ERR_FORMAT, "[hf] %s: no \"model_type\" (%s)", path, have);
    if (!strcmp(mt, "mistral") || !strcmp(mt, "qwen2") || !strcmp(mt, "qwen3") || !strcmp(mt, "mixtral"))
        return *arch = CG_ARCH_LLAMA, CG_OK;
    if (strstr(mt, "_moe"))
        return cg_set_error(CG_ERR_FORMAT, "[hf] %s: model_type \"%s\" is a mixture-of-experts model cgrad does not "
                            "have (its MoE family is mixtral; %s load)", path, mt, have);
    if (cg_arch_parse(mt, arch))
        return cg_set_error(CG_ERR_FORMAT, "[hf] %s: model_type \"%s\" is not one cgrad has (%s)", path, mt, have);
    return CG_OK;
}

/* config.json of a BertForSequenceClassification without num_labels or id2label means 2 labels,
 * as transformers reads it. */
static void default_labels(cJSON *cfg) {
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(cfg, "architectures");
    const char *a0 = cJSON_GetStringValue(cJSON_GetArrayItem(archs, 0));
    if (a0 && strstr(a0, "ForSequenceClassification") && !cJSON_GetObjectItemCaseSensitive(cfg, "num_labels") &&
        !cJSON_GetObjectItemCaseSensitive(cfg, "id2label"))
        cJSON_AddNumberToObject(cfg, "num_labels", 2);
}

/* The training shape of a model, as `cgrad train` names its options, so --init-from takes it. */
static cJSON *shape_json(cg_model *m, const cg_tokenizer *tok, const char *tok_dir) {
    static const char *const kinds[] = {"char", "bpe", "wordpiece", "hf"};
    long long l = 0, h = 0, d = 0, f = 0, t = 0;
    const cg_gpt_config *g = cg_gpt_cfg(cg_model_gpt(m));
    const cg_bert_config *b = cg_bert_cfg(cg_model_bert(m));
    const cg_encdec_config *e = cg_encdec_cfg(cg_model_encdec(m));
    const cg_classifier_config *c = cg_classifier_cfg(cg_model_classifier(m));
    const cg_llama_config *q = cg_llama_cfg(cg_model_llama(m));
    if (g) l = g->n_layer, h = g->n_head, d = g->n_embd, f = g->n_inner > 0 ? g->n_inner : 4 * g->n_embd, t = g->n_positions;
    if (b) l = b->num_hidden_layers, h = b->num_attention_heads, d = b->hidden_size, f = b->intermediate_size, t = b->max_position_embeddings;
    if (e) l = e->num_encoder_layers, h = e->n_head, d = e->d_model, f = e->dim_feedforward, t = e->max_len;
    if (c) l = c->n_layer, h = c->n_head, d = c->d_model, f = c->dim_feedforward, t = c->max_len;
    if (q) l = q->num_hidden_layers, h = q->num_attention_heads, d = q->hidden_size, f = q->intermediate_size,
        t = q->max_position_embeddings;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "arch", cg_arch_name(cg_model_arch(m)));
    cJSON_AddStringToObject(j, "tokenizer", kinds[cg_tokenizer_kind(tok)]);
    cJSON_AddStringToObject(j, "tokenizer_path", tok_dir);
    cJSON_AddNumberToObject(j, "layers", (double)l);
    cJSON_AddNumberToObject(j, "heads", (double)h);
    if (q) cJSON_AddNumberToObject(j, "kv_heads", (double)q->num_key_value_heads);
    cJSON_AddNumberToObject(j, "dim", (double)d);
    cJSON_AddNumberToObject(j, "ffn", (double)f);
    cJSON_AddNumberToObject(j, "context", (double)t);
    return j;
}

/* Reads the labels of an id2label object {"0": "neg", ...} into ck. */
static void read_labels(const cJSON *cfg, cli_ckpt *ck) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(cfg, "id2label");
    const int n = cJSON_IsObject(m) ? cJSON_GetArraySize(m) : 0;
    if (n <= 0 || !(ck->labels = calloc((size_t)n + 1, sizeof *ck->labels))) return;
    ck->n_labels = n;
    for (int i = 0; i < n; i++) {
        char key[24];
        snprintf(key, sizeof key, "%d", i);
        const char *s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, key));
        ck->labels[i] = strdup(s ? s : "?");
    }
}

/* Token ids the model embeds (encdec: source and target; cgrad's encdec puts its three special
 * ids after the tokenizer's, so it embeds 3 more). */
static void model_vocab(const cg_model *m, int64_t *src, int64_t *tgt) {
    cg_model *mm = (cg_model *)m;
    const cg_gpt_config *g = cg_gpt_cfg(cg_model_gpt(mm));
    const cg_bert_config *b = cg_bert_cfg(cg_model_bert(mm));
    const cg_encdec_config *e = cg_encdec_cfg(cg_model_encdec(mm));
    const cg_classifier_config *c = cg_classifier_cfg(cg_model_classifier(mm));
    const cg_llama_config *q = cg_llama_cfg(cg_model_llama(mm));
    *src = *tgt = g ? g->vocab_size : b ? b->vocab_size : c ? c->vocab_size : q ? q->vocab_size : 0;
    if (e) *src = e->src_vocab_size - 3, *tgt = e->tgt_vocab_size - 3;
}

cg_status cli_check_vocab(const cg_model *m, const cg_tokenizer *tok, const char *tok_file, const char *config) {
    int64_t src, tgt;
    model_vocab(m, &src, &tgt);
    const int64_t n = cg_tokenizer_vocab_size(tok);
    if (src == n && tgt == n) return CG_OK;
    /* a tokenizer.json may leave rows of the embedding unused: Qwen pads its 151,669 ids to 151,936
     * rows, and a generated id past the tokenizer's is dropped when the text is decoded */
    if (cg_tokenizer_kind(tok) == CG_TOK_HF && n > 0 && n <= src && n <= tgt) return CG_OK;
    const bool ed = cg_model_arch(m) == CG_ARCH_ENCDEC;
    return cg_set_error(CG_ERR_FORMAT,
                        "[load] %s: the tokenizer has %lld tokens but %s says the model's vocabulary has %lld%s: the "
                        "two belong to different models (or one was cut short)",
                        tok_file, (long long)n, config, (long long)(src != n ? src : tgt) + (ed ? 3 : 0),
                        ed ? " (the tokenizer's plus 3 special ids)" : "");
}

/* The file the tokenizer of dir was read from, as cg_tokenizer_load chooses it. */
static void tokenizer_file(const char *dir, const cg_tokenizer *tok, char *out, size_t n) {
    static const char *const names[] = {"cg_tokenizer.json", "encoder.json", "vocab.json", "vocab.txt"};
    path_join(out, n, dir, "tokenizer.json"); /* read first when it is there (cg_tokenizer_load) */
    if (cg_tokenizer_kind(tok) == CG_TOK_HF && is_file(out)) return;
    for (int k = 0; k < 4; k++) {
        path_join(out, n, dir, names[k]);
        if (is_file(out) && (k == 0 || (k < 3) == (cg_tokenizer_kind(tok) == CG_TOK_BPE))) return;
    }
    snprintf(out, n, "%s", dir);
}

static int cmp_key(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* A key that appears twice in one object of j (depth-first), its object's path in where; NULL when
 * none. cJSON keeps both and answers with the first, so "n_embd": 32, "n_embd": 64 would silently
 * read 32. Keys are sorted per object, so a config with many labels costs n log n, not n^2. */
static const char *duplicate_key(const cJSON *j, char *where, size_t n) {
    const int count = cJSON_GetArraySize(j);
    if (cJSON_IsObject(j) && count > 1) {
        const char **keys = malloc((size_t)count * sizeof *keys);
        int k = 0;
        for (const cJSON *a = j->child; keys && a; a = a->next) keys[k++] = a->string ? a->string : "";
        if (keys) qsort(keys, (size_t)k, sizeof *keys, cmp_key);
        const char *dup = NULL;
        for (int i = 1; keys && !dup && i < k; i++)
            if (!strcmp(keys[i - 1], keys[i])) dup = keys[i];
        free(keys);
        if (dup) return dup;
    }
    for (const cJSON *a = j ? j->child : NULL; a; a = a->next)
        if (cJSON_IsObject(a) || cJSON_IsArray(a)) {
            const size_t at = strlen(where);
            if (a->string) snprintf(where + at, n - at, "%s%s", at ? "." : "", a->string);
            const char *d = duplicate_key(a, where, n);
            if (d) return d;
            where[at] = 0;
        }
    return NULL;
}

/* Where the weights, config and tokenizer of path are: path a directory holding model.safetensors
 * and config.json, or a .safetensors file with config.json (and the tokenizer) beside it. */
static cg_status locate(const char *path, char *weights, char *config, char *dir, size_t n) {
    if (is_dir(path)) {
        snprintf(dir, n, "%s", path);
        path_join(weights, n, path, "model.safetensors");
        if (!is_file(weights)) { /* a sharded model: the index names the shards */
            path_join(weights, n, path, "model.safetensors.index.json");
            if (!is_file(weights))
                return cg_set_error(CG_ERR_IO, "[hf] %s: no model.safetensors (or model.safetensors.index.json) in this "
                                "directory (a Hugging Face model directory holds them + config.json)", path);
        }
    } else {
        snprintf(weights, n, "%s", path);
        dir_of(path, dir, n);
    }
    path_join(config, n, dir, "config.json");
    return CG_OK;
}

static bool ends_with_index(const char *path) {
    const size_t n = strlen(path), k = strlen(".index.json");
    return n >= k && !strcmp(path + n - k, ".index.json");
}

cg_status cli_hf_load(const char *path, double dropout, bool partial, cli_ckpt *ck) {
    return cli_hf_load_adapted(path, dropout, partial, NULL, ck);
}

/* True when dir holds PEFT's adapter_config.json and no config.json: adapters, not a model. */
static bool peft_dir(const char *dir) {
    char p[4200];
    path_join(p, sizeof p, dir, "adapter_config.json");
    if (!is_dir(dir) || !is_file(p)) return false;
    path_join(p, sizeof p, dir, "config.json");
    return !is_file(p);
}

/* A PEFT adapter directory as a model: its base (base_model_name_or_path, a directory: as given, or
 * relative to the adapters' directory) loaded as lora asks (rank 0: frozen, read in place), then the
 * adapters on it (cg_lora_load_peft). The result is a LoRA fine-tune: sample and eval run it, export
 * merges it; training on it starts from its merged export. */
static cg_status load_peft(const char *path, double dropout, bool partial, cli_lora *lora, cli_ckpt *ck) {
    char cfg_path[4200], base[4200];
    path_join(cfg_path, sizeof cfg_path, path, "adapter_config.json");
    if (lora && lora->rank > 0)
        return cg_set_error(CG_ERR_ARG, "[hf] %s holds PEFT adapters: new ones go on its merged export (cgrad export %s DIR)",
                            path, path);
    char *text = NULL;
    size_t len = 0;
    if (cgi_read_text_bounded(cfg_path, CGI_LIMIT_JSON, "hf", &text, &len)) return CG_ERR_FORMAT;
    cJSON *c = cJSON_ParseWithLength(text, len);
    free(text);
    const char *b = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(c, "base_model_name_or_path"));
    if (!b || !*b) {
        cJSON_Delete(c);
        return cg_set_error(CG_ERR_FORMAT, "[hf] %s: no \"base_model_name_or_path\" naming the base model's directory", cfg_path);
    }
    if (b[0] != '/' && !is_dir(b)) path_join(base, sizeof base, path, b);
    else snprintf(base, sizeof base, "%s", b);
    cJSON_Delete(c);
    if (!is_dir(base))
        return cg_set_error(CG_ERR_IO, "[hf] %s: base_model_name_or_path '%s' is not a directory here (give the base model's "
                            "directory)", cfg_path, base);
    cg_status st = cli_hf_load_adapted(base, dropout, partial, lora, ck);
    if (st) return st;
    if ((st = cg_lora_load_peft(ck->ps, path))) return cli_ckpt_fail(ck, st);
    int64_t rank = 0;
    for (int i = 0; i < cg_params_count(ck->ps) && !rank; i++) { /* lora_A is [r, in] */
        const char *name = cg_name(cg_params_at(ck->ps, i));
        const size_t n = strlen(name);
        if (n > 7 && !strcmp(name + n - 7, ".lora_A")) rank = cg_shape(cg_params_at(ck->ps, i))[0];
    }
    cJSON_AddNumberToObject(ck->train, "lora_rank", (double)rank); /* a fine-tune: cgrad train does not build on it */
    cJSON_AddStringToObject(ck->train, "init_from", base);
    return CG_OK;
}

cg_status cli_hf_load_adapted(const char *path, double dropout, bool partial, cli_lora *lora, cli_ckpt *ck) {
    memset(ck, 0, sizeof *ck);
    if (peft_dir(path)) return load_peft(path, dropout, partial, lora, ck);
    char weights[4200], config[4200], dir[4200];
    cg_status st = locate(path, weights, config, dir, sizeof weights);
    if (st) return st;
    struct stat sb;
    if (!stat(weights, &sb)) ck->file_bytes = (long long)sb.st_size;
    if (!(ck->st = ends_with_index(weights) ? cg_st_open_index(weights) : cg_st_open(weights))) {
        char msg[900];
        snprintf(msg, sizeof msg, "%s", cg_last_error());
        return cg_set_error(CG_ERR_FORMAT, "[checkpoint] %s: neither a cgrad checkpoint (gzip, written by cgrad train) nor a "
                        "safetensors file: %s", weights, msg);
    }
    /* config.json beside the weights; a file cg_model_save wrote carries its config in the metadata */
    char *text = NULL;
    size_t text_len = 0;
    if (is_file(config) && cgi_read_text_bounded(config, CGI_LIMIT_JSON, "hf", &text, &text_len)) return cli_ckpt_fail(ck, CG_ERR_FORMAT);
    const char *meta_cfg = cg_st_metadata(ck->st, "config");
    cJSON *cfg = text ? cJSON_Parse(text) : meta_cfg ? cJSON_Parse(meta_cfg) : NULL;
    const char *cfg_name = text || !meta_cfg ? config : weights;
    free(text);
    if (!cfg || !cJSON_IsObject(cfg)) {
        cJSON_Delete(cfg);
        cli_ckpt_free(ck);
        return cg_set_error(CG_ERR_FORMAT,
                        is_file(config) ? "[hf] %s: not a JSON object" : "[hf] %s is a safetensors file, not a cgrad "
                        "checkpoint (gzip): put the model's config.json beside it (the Hugging Face layout: "
                        "model.safetensors + config.json + tokenizer files, as cgrad export writes), then pass the "
                        "directory or the file",
                        is_file(config) ? config : weights);
    }
    char where[256] = "";
    const char *dup = duplicate_key(cfg, where, sizeof where);
    if (dup) {
        st = cg_set_error(CG_ERR_FORMAT, "[hf] %s: key \"%s\" appears twice in %s%s%s", cfg_name, dup,
                          *where ? "object \"" : "the top-level object", where, *where ? "\"" : "");
        cJSON_Delete(cfg);
        return cli_ckpt_fail(ck, st);
    }
    if (!cJSON_GetObjectItemCaseSensitive(cfg, "model_type") && cg_st_metadata(ck->st, "arch"))
        cJSON_AddStringToObject(cfg, "model_type", cg_st_metadata(ck->st, "arch"));
    default_labels(cfg);
    if (!(st = arch_of(cfg, cfg_name, &ck->arch))) {
        char *cfg_text = cJSON_PrintUnformatted(cfg);
        ck->ps = cg_params_new();
        cg_params_defer_init(ck->ps, true); /* the file overwrites them: draw only what it lacks, at the end */
        ck->model = ck->ps && cfg_text ? cg_model_new(ck->arch, cfg_text, dropout < 0 ? 0 : dropout, ck->ps, 0) : NULL;
        free(cfg_text);
        if (!ck->model) st = with_file(CG_ERR_FORMAT, cfg_name);
    }
    if (!st && lora && lora->rank == 0) /* inference: every weight frozen, so all are read in place */
        for (int i = 0; i < cg_params_count(ck->ps); i++) cg_param_set_trainable(cg_params_at(ck->ps, i), false);
    else if (!st && lora) { /* adapters first: the weights they freeze are then read in place, not copied */
        cg_rng r;
        cg_rng_seed(&r, lora->seed);
        char dflt[256] = ""; /* the arch's default targets, as cgrad train would take them */
        if (!lora->targets && lora->default_targets) lora->default_targets(ck->arch, dflt, sizeof dflt);
        lora->added = cg_lora_apply(ck->ps, lora->targets ? lora->targets : dflt, lora->rank, lora->alpha, &r);
        if (lora->added < 0) st = CG_ERR_ARG;
    }
    char *kept = NULL, *skipped = NULL;
    if (!st) {
        st = partial ? cg_model_load_partial(ck->model, ck->st, &kept, &skipped) : cg_model_load(ck->model, ck->st);
        if (st) st = with_file(st, weights);
        else cg_params_defer_init(ck->ps, false); /* a refused file's model is freed unfilled */
    }
    if (!st && !(ck->tok = cg_tokenizer_load(dir)))
        st = cg_set_error(CG_ERR_FORMAT, "[hf] %s: no tokenizer beside the weights: %s (cgrad export writes one)", dir,
                      cg_last_error());
    if (!st) {
        char tok_file[4200];
        tokenizer_file(dir, ck->tok, tok_file, sizeof tok_file);
        st = cli_check_vocab(ck->model, ck->tok, tok_file, cfg_name);
    }
    if (!st) {
        ck->train = shape_json(ck->model, ck->tok, dir);
        ck->state = cJSON_CreateObject();
        read_labels(cfg, ck);
        if (kept) printf("  %s: initialised (not in the file): %s\n", weights, kept);
        if (skipped) printf("  %s: skipped (no such parameter): %s\n", weights, skipped);
    }
    free(kept);
    free(skipped);
    cJSON_Delete(cfg);
    return st ? cli_ckpt_fail(ck, st) : st;
}

cg_status cli_hf_read_weights(const char *path, cg_model *m) {
    char weights[4200], config[4200], dir[4200];
    cg_status st = locate(path, weights, config, dir, sizeof weights);
    if (st) return st;
    cg_st *f = ends_with_index(weights) ? cg_st_open_index(weights) : cg_st_open(weights);
    if (!f) return CG_ERR_FORMAT;
    st = cg_model_load(m, f);
    cg_st_close(f);
    return st ? with_file(st, weights) : CG_OK;
}

/* ---- export ---- */

const cli_opt cli_export_opts[] = {
    {"--peft", CLI_BARE, 0, 0, "a LoRA fine-tune's adapters alone, in PEFT's layout (adapter_model.safetensors + adapter_config.json)"},
    {NULL, CLI_BARE, 0, 0, NULL}};

/* config.json as transformers reads it: the model's own config plus the class and the fields the
 * class needs that cgrad does not keep (activation, tied embeddings, special token ids, dtype). */
static cJSON *hf_config(cli_ckpt *ck) {
    char *own = cg_model_config_json(ck->model);
    cJSON *c = own ? cJSON_Parse(own) : NULL;
    free(own);
    if (!c) return NULL;
    const double drop = cli_json_num(ck->train, "dropout", 0);
    const char *dtype = sizeof(cg_real) == 8 ? "float64" : "float32";
    const cg_tokenizer *tok = ck->tok;
    cJSON *archs = cJSON_CreateArray();
    cJSON_DeleteItemFromObjectCaseSensitive(c, "architectures"); /* a model's own config may name it */
    cJSON_AddItemToObject(c, "architectures", archs);
    if (ck->arch == CG_ARCH_GPT2) {
        cJSON_AddItemToArray(archs, cJSON_CreateString("GPT2LMHeadModel"));
        cJSON_AddNumberToObject(c, "n_ctx", cJSON_GetObjectItemCaseSensitive(c, "n_positions")->valuedouble);
        cJSON_AddStringToObject(c, "activation_function", "gelu_new");
        cJSON_AddNumberToObject(c, "resid_pdrop", drop);
        cJSON_AddNumberToObject(c, "embd_pdrop", drop);
        cJSON_AddNumberToObject(c, "attn_pdrop", drop);
        const int32_t eot = cg_tokenizer_token_id(tok, "<|endoftext|>");
        if (eot >= 0) {
            cJSON_AddNumberToObject(c, "bos_token_id", eot);
            cJSON_AddNumberToObject(c, "eos_token_id", eot);
        } else { /* transformers' defaults (50256) would lie outside a smaller vocabulary */
            cJSON_AddNullToObject(c, "bos_token_id");
            cJSON_AddNullToObject(c, "eos_token_id");
        }
    } else if (ck->arch == CG_ARCH_BERT) {
        const bool cls = cJSON_GetObjectItemCaseSensitive(c, "num_labels")->valuedouble > 0;
        cJSON_AddItemToArray(archs, cJSON_CreateString(cls ? "BertForSequenceClassification" : "BertForPreTraining"));
        if (!cls) cJSON_DeleteItemFromObjectCaseSensitive(c, "num_labels"); /* 0 would break transformers' id2label */
        cJSON_AddNumberToObject(c, "hidden_dropout_prob", drop);
        cJSON_AddNumberToObject(c, "attention_probs_dropout_prob", drop);
        cJSON_AddStringToObject(c, "position_embedding_type", "absolute");
        const int32_t pad = cg_tokenizer_token_id(tok, "[PAD]");
        cJSON_AddNumberToObject(c, "pad_token_id", pad >= 0 ? pad : 0);
    } else if (ck->arch == CG_ARCH_LLAMA) { /* its config has the rest, tie_word_embeddings included */
        const cJSON *ad = cJSON_GetObjectItemCaseSensitive(c, "attention_dropout");
        if (cJSON_IsNumber(ad) && ad->valuedouble == 0) /* the config's own, else the run's dropout */
            cJSON_SetNumberValue(cJSON_GetObjectItemCaseSensitive(c, "attention_dropout"), drop);
        cJSON_AddNullToObject(c, "bos_token_id"); /* LlamaConfig's 1 and 2 name no token of a cgrad vocabulary */
        cJSON_AddNullToObject(c, "eos_token_id");
    }
    /* The LLaMA families' configs and names are transformers' already (LlamaForCausalLM,
     * MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM); classifier and encdec are cgrad's own
     * (torch nn.Transformer names): no transformers class */
    if (ck->arch == CG_ARCH_LLAMA)
        cJSON_AddItemToArray(archs, cJSON_CreateString(cg_llama_family_class(cg_llama_cfg(cg_model_llama(ck->model))->family)));
    cJSON_AddNumberToObject(c, "initializer_range", 0.02);
    if (!cJSON_GetObjectItemCaseSensitive(c, "tie_word_embeddings"))
        cJSON_AddBoolToObject(c, "tie_word_embeddings", ck->arch == CG_ARCH_GPT2 || ck->arch == CG_ARCH_BERT);
    cJSON_AddStringToObject(c, "torch_dtype", dtype);
    if (ck->n_labels > 0) {
        cJSON *i2l = cJSON_CreateObject(), *l2i = cJSON_CreateObject();
        for (int i = 0; i < ck->n_labels; i++) {
            char k[24];
            snprintf(k, sizeof k, "%d", i);
            cJSON_AddStringToObject(i2l, k, ck->labels[i]);
            cJSON_AddNumberToObject(l2i, ck->labels[i], i);
        }
        cJSON_AddItemToObject(c, "id2label", i2l);
        cJSON_AddItemToObject(c, "label2id", l2i);
    }
    return c;
}

static cg_status write_json(const char *dir, const char *name, cJSON *j) {
    char path[4200];
    path_join(path, sizeof path, dir, name);
    char *s = j ? cJSON_Print(j) : NULL;
    FILE *f = s ? fopen(path, "wb") : NULL;
    bool ok = f && fputs(s, f) >= 0 && fputc('\n', f) != EOF;
    if (f && fclose(f)) ok = false;
    free(s);
    return ok ? CG_OK : cg_set_error(CG_ERR_IO, "[export] %s: cannot write: %s", path, strerror(errno));
}

/* tokenizer_config.json: which transformers class reads the tokenizer files. */
static cJSON *tokenizer_config(const cli_ckpt *ck) {
    cJSON *t = cJSON_CreateObject();
    const cJSON *ctx = cJSON_GetObjectItemCaseSensitive(ck->train, "context");
    if (cg_tokenizer_kind(ck->tok) == CG_TOK_BPE) {
        cJSON_AddStringToObject(t, "tokenizer_class", "GPT2Tokenizer");
        if (cg_tokenizer_token_id(ck->tok, "<|endoftext|>") >= 0) {
            cJSON_AddStringToObject(t, "bos_token", "<|endoftext|>");
            cJSON_AddStringToObject(t, "eos_token", "<|endoftext|>");
            cJSON_AddStringToObject(t, "unk_token", "<|endoftext|>");
        }
    } else if (cg_tokenizer_kind(ck->tok) == CG_TOK_WORDPIECE) {
        cJSON_AddStringToObject(t, "tokenizer_class", "BertTokenizer");
        cJSON_AddBoolToObject(t, "do_lower_case", true);
    } else if (cg_tokenizer_kind(ck->tok) == CG_TOK_HF) {
        cJSON_AddStringToObject(t, "tokenizer_class", "PreTrainedTokenizerFast");
    } /* a char tokenizer has no transformers class: no tokenizer_class rather than an invalid one
       * (cg_tokenizer.json beside it is cgrad's own file) */
    if (cJSON_IsNumber(ctx)) cJSON_AddNumberToObject(t, "model_max_length", ctx->valuedouble);
    return t;
}

/* True when dir is a writable directory, or can be made in a writable one; else says why. */
static bool export_dir_usable(const char *dir) {
    char parent[4096];
    const char *slash = strrchr(dir, '/');
    while (slash && slash > dir && !slash[1]) /* "out/": the slash ends the name */
        for (slash--; slash > dir && *slash != '/'; slash--) {}
    if (!slash || *slash != '/') snprintf(parent, sizeof parent, ".");
    else snprintf(parent, sizeof parent, "%.*s", slash == dir ? 1 : (int)(slash - dir), dir);
    const char *why = NULL;
    if (!*dir) why = "empty name";
    else if (is_dir(dir)) why = access(dir, W_OK | X_OK) ? "not writable" : NULL;
    else if (!access(dir, F_OK)) why = "exists and is not a directory";
    else if (!is_dir(parent)) why = "its parent directory does not exist";
    else if (access(parent, W_OK | X_OK)) why = "its parent directory is not writable";
    if (why) fprintf(stderr, "cgrad export: DIR '%s': cannot write it: %s\n", dir, why);
    return !why;
}

int cmd_export(int argc, char **argv) {
    cli_args a;
    if (!cli_parse("export", cli_export_opts, argc, argv, &a) || !cli_words(&a, 2, 2, "CKPT and DIR")) return 2;
    const char *ckpt = a.words[0], *dir = a.words[1];
    if (!export_dir_usable(dir)) return 2; /* an output that cannot be made is a usage error, as for --out */
    cli_ckpt ck;
    if (cli_ckpt_load(ckpt, 0.0, &ck)) return cli_fail("export", "cannot load the checkpoint");
    int rc = 1;
    bool lora = false;
    for (int i = 0; i < cg_params_count(ck.ps); i++) lora |= cg_lora_is_adapter(cg_params_at(ck.ps, i));
    if (cli_has(&a, "--peft")) { /* the adapters as PEFT saves them; the base stays where it is */
        const char *base = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(ck.train, "init_from"));
        if (!lora) fprintf(stderr, "cgrad export --peft: %s holds no LoRA adapters (train with --lora-rank)\n", ckpt);
        else if (cg_lora_save_peft(ck.ps, dir, base)) cli_fail("export", dir);
        else {
            printf("exported the LoRA adapters of %s to %s: adapter_model.safetensors, adapter_config.json (base %s)\n", ckpt,
                   dir, base ? base : "unknown");
            rc = 0;
        }
        goto done;
    }
    if (lora && cg_lora_merge(ck.ps)) {
        cli_fail("export", "cannot merge the LoRA adapters");
        goto done;
    }
    char stage[4400], path[4500]; /* written into stage, beside dir, then swapped in whole */
    if (!cli_export_stage(dir, stage, sizeof stage)) goto done;
    path_join(path, sizeof path, stage, "model.safetensors");
    cJSON *cfg = hf_config(&ck), *tcfg = tokenizer_config(&ck);
    cg_status st = cg_model_save_hf(ck.model, path);
    if (!st) st = write_json(stage, "config.json", cfg);
    if (!st) st = cg_tokenizer_save_hf(ck.tok, stage);
    if (!st) st = write_json(stage, "tokenizer_config.json", tcfg);
    cJSON_Delete(cfg);
    cJSON_Delete(tcfg);
    if (st) {
        cli_fail("export", dir);
        cli_export_discard(stage);
        goto done;
    }
    if (!cli_export_commit(stage, dir)) goto done;
    static const char *const tok_files[] = {"cg_tokenizer.json (cgrad's own: transformers has no char tokenizer)",
                                            "vocab.json + merges.txt", "vocab.txt", "tokenizer.json"};
    printf("exported %s (%s, %lld parameters%s) to %s: model.safetensors, config.json, %s, tokenizer_config.json\n",
           ckpt, cg_model_llama(ck.model) ? cg_llama_family_class(cg_llama_cfg(cg_model_llama(ck.model))->family)
                                           : cg_arch_name(ck.arch),
           (long long)cg_params_numel(ck.ps), lora ? ", LoRA merged" : "", dir,
           tok_files[cg_tokenizer_kind(ck.tok)]);
    rc = 0;
done:
    cli_ckpt_free(&ck);
    return rc;
}
