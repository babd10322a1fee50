/* SPDX-License-Identifier: MIT */
/* The checkpoint of a cgrad train run: the model it starts from, and everything a resumed run
 * needs to continue bit for bit (parameters, optimizer moments and step, data and dropout streams,
 * options, timings). */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli/train.h"

char *train_model_config(run *r) {
    const topts *o = &r->o;
    char buf[1024];
    const int64_t v = cg_tokenizer_vocab_size(r->tok);
    switch (r->arch) {
    case CG_ARCH_GPT2:
        snprintf(buf, sizeof buf,
                 "{\"vocab_size\": %" PRId64 ", \"n_positions\": %" PRId64 ", \"n_embd\": %" PRId64 ", \"n_layer\": %" PRId64
                 ", \"n_head\": %" PRId64 ", \"n_inner\": %" PRId64 "}",
                 (int64_t)v, o->context, o->dim, o->layers, o->heads, o->ffn);
        break;
    case CG_ARCH_BERT:
        snprintf(buf, sizeof buf,
                 "{\"vocab_size\": %" PRId64 ", \"hidden_size\": %" PRId64 ", \"num_hidden_layers\": %" PRId64
                 ", \"num_attention_heads\": %" PRId64 ", \"intermediate_size\": %" PRId64
                 ", \"max_position_embeddings\": %" PRId64 ", \"type_vocab_size\": 2, \"num_labels\": %d}",
                 (int64_t)v, o->dim, o->layers, o->heads, o->ffn, o->context,
                 r->task.cls ? (int)cg_textcls_num_labels(r->task.cls) : 0);
        break;
    case CG_ARCH_ENCDEC:
        snprintf(buf, sizeof buf,
                 "{\"src_vocab_size\": %" PRId64 ", \"tgt_vocab_size\": %" PRId64 ", \"d_model\": %" PRId64
                 ", \"n_head\": %" PRId64 ", \"num_encoder_layers\": %" PRId64 ", \"num_decoder_layers\": %" PRId64
                 ", \"dim_feedforward\": %" PRId64 ", \"max_len\": %" PRId64 ", \"pad_id\": %d, \"bos_id\": %d, \"eos_id\": %d}",
                 (int64_t)v + 3, (int64_t)v + 3, o->dim, o->heads, o->layers, o->layers, o->ffn, o->context,
                 r->task.pad_id, r->task.bos_id, r->task.eos_id);
        break;
    case CG_ARCH_CLASSIFIER:
        snprintf(buf, sizeof buf,
                 "{\"vocab_size\": %" PRId64 ", \"d_model\": %" PRId64 ", \"n_head\": %" PRId64 ", \"n_layer\": %" PRId64
                 ", \"dim_feedforward\": %" PRId64 ", \"max_len\": %" PRId64 ", \"num_classes\": %d}",
                 (int64_t)v, o->dim, o->heads, o->layers, o->ffn, o->context, (int)cg_textcls_num_labels(r->task.cls));
        break;
    case CG_ARCH_LLAMA:
        snprintf(buf, sizeof buf,
                 "{\"model_type\": \"llama\", \"vocab_size\": %" PRId64 ", \"hidden_size\": %" PRId64
                 ", \"intermediate_size\": %" PRId64 ", \"num_hidden_layers\": %" PRId64 ", \"num_attention_heads\": %" PRId64
                 ", \"num_key_value_heads\": %" PRId64 ", \"max_position_embeddings\": %" PRId64 ", \"rms_norm_eps\": 1e-6}",
                 (int64_t)v, o->dim, o->ffn, o->layers, o->heads, o->kv_heads ? o->kv_heads : o->heads, o->context);
        break;
    case CG_ARCH_VIT:
        snprintf(buf, sizeof buf,
                 "{\"image_size\": %" PRId64 ", \"num_channels\": 1, \"patch_size\": %" PRId64 ", \"d_model\": %" PRId64
                 ", \"n_head\": %" PRId64 ", \"n_layer\": %" PRId64 ", \"mlp_dim\": %" PRId64 ", \"num_classes\": %d}",
                 r->task.img[0].h, o->patch, o->dim, o->heads, o->layers, o->ffn, (int)r->task.img[0].num_classes);
        break;
    case CG_ARCH_CNN:
        snprintf(buf, sizeof buf,
                 "{\"image_size\": %" PRId64 ", \"num_channels\": 1, \"channels\": %" PRId64 ", \"n_layer\": %" PRId64
                 ", \"hidden\": %" PRId64 ", \"num_classes\": %d}",
                 r->task.img[0].h, o->dim, o->layers, o->ffn, (int)r->task.img[0].num_classes);
        break;
    }
    return strdup(buf);
}

/* --head classify on a pretrained BERT: the same encoder with a classification head for the task's
 * labels (BertForSequenceClassification). The encoder's weights come from the --init-from file,
 * the head is initialised; both lists are printed. The new model replaces ck's. */
bool train_new_head(cli_ckpt *ck, run *r, uint64_t seed) {
    char *own = cg_model_config_json(ck->model);
    cJSON *c = own ? cJSON_Parse(own) : NULL;
    free(own);
    if (c) cJSON_DeleteItemFromObjectCaseSensitive(c, "num_labels");
    if (c) cJSON_AddNumberToObject(c, "num_labels", cg_textcls_num_labels(r->task.cls));
    char *cfg = c ? cJSON_PrintUnformatted(c) : NULL;
    cJSON_Delete(c);
    cg_params *ps = cg_params_new();
    cg_model *m = cfg && ps ? cg_model_new(CG_ARCH_BERT, cfg, r->o.dropout, ps, seed) : NULL;
    free(cfg);
    char *kept = NULL, *skipped = NULL;
    if (!m || cg_model_load_partial(m, ck->st, &kept, &skipped)) {
        cli_fail("train", "--head classify: cannot start the classifier from --init-from");
        cg_model_free(m);
        cg_params_free(ps);
        return false;
    }
    printf("  --head classify: %d labels; initialised: %s\n  not used (the pretraining heads): %s\n",
           (int)cg_textcls_num_labels(r->task.cls), kept ? kept : "none", skipped ? skipped : "none");
    free(kept);
    free(skipped);
    cg_model_free(ck->model);
    cg_params_free(ck->ps);
    ck->model = m, ck->ps = ps;
    return true;
}

static void add_str(cJSON *j, const char *k, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void add_str(cJSON *j, const char *k, const char *fmt, ...) {
    char buf[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    cJSON_AddStringToObject(j, k, buf);
}

/* The first parameter (registration order) whose values (grads: gradients) hold a value that is
 * not finite, with the flat index and the value; NULL when all are finite. */
const char *train_nonfinite_param(cg_params *ps, bool grads, int64_t *at, double *value) {
    for (int i = 0; i < cg_params_count(ps); i++) {
        cg_tensor *p = cg_params_at(ps, i);
        if (!cg_param_trainable(p)) continue; /* unchanged since they loaded (and checked), perhaps read in place */
        const cg_real *x = grads ? cg_grad(p) : cg_data(p);
        const int64_t n = cg_numel(p);
        for (int64_t k = 0; x && k < n; k++)
            if (!isfinite(x[k])) {
                *at = k, *value = (double)x[k];
                return cg_name(p);
            }
    }
    return NULL;
}

/* Index of the first value of x[0..n) that is not finite, or -1. */
static int64_t first_nonfinite(const cg_real *x, int64_t n) {
    for (int64_t k = 0; x && k < n; k++)
        if (!isfinite(x[k])) return k;
    return -1;
}

static cg_status save_file(run *r, cg_real *m1, cg_real *m2);

/* Every rank holds the same parameters; rank 0 writes them. With --zero the moments are gathered
 * to rank 0 first, so the file is the same as without sharding. */
cg_status train_save(run *r) {
    const bool gather = r->o.zero && r->world > 1;
    if (r->rank > 0 && !gather) return CG_OK;
    const int64_t span = cg_params_span(r->ps);
    cg_real *full[2] = {NULL, NULL}, *m[2] = {cg_optim_moment1(r->opt), cg_optim_moment2(r->opt)};
    cg_status st = CG_OK;
    for (int k = 0; gather && k < 2 && !st; k++) {
        if (r->rank == 0 && !(full[k] = malloc((size_t)span * sizeof(cg_real))))
            st = cg_set_error(CG_ERR_NOMEM, "[train] out of memory for the optimizer state"); /* the others then time out */
        if (!st) st = cg_dist_gather(r->d, m[k], full[k], span);
        m[k] = full[k];
    }
    if (!st && r->rank == 0) st = save_file(r, m[0], m[1]);
    free(full[0]), free(full[1]);
    return st;
}

/* Writes the checkpoint with the whole moments m1, m2 (rank 0). */
static cg_status save_file(run *r, cg_real *m1, cg_real *m2) {
    /* Never replace a checkpoint with one that cannot be trained or sampled from. */
    int64_t at;
    double v;
    const char *bad = train_nonfinite_param(r->ps, false, &at, &v);
    if (bad)
        return cg_set_error(CG_ERR_RANGE, "[train] %s not written: parameter '%s' holds %g at flat index %lld (step %lld); the "
                                      "file keeps its last good state", r->o.checkpoint, bad, v, (long long)at, (long long)r->step);
    const int64_t span_all = cg_params_span(r->ps);
    for (int m = 0; m < 2; m++)
        if ((at = first_nonfinite(m ? m2 : m1, span_all)) >= 0)
            return cg_set_error(CG_ERR_RANGE, "[train] %s not written: optimizer moment %d is not finite at %lld (step %lld); the "
                                          "file keeps its last good state", r->o.checkpoint, m + 1, (long long)at, (long long)r->step);
    cg_st_writer *w = cg_st_writer_new();
    if (!w) return cg_set_error(CG_ERR_NOMEM, "[train] out of memory");
    const int64_t span = cg_params_span(r->ps);
    cg_status st = CG_OK;
    if (r->o.lora_rank > 0) /* a fine-tune saves what it trains: the adapters and their moments */
        for (int i = 0; !st && i < cg_params_count(r->ps); i++) {
            cg_tensor *t = cg_params_at(r->ps, i);
            if (!cg_lora_is_adapter(t)) continue;
            char name[600];
            const int64_t off = cg_data(t) - cg_params_values(r->ps);
            st = cg_st_add_tensor(w, cg_name(t), t);
            snprintf(name, sizeof name, "optim.m1.%s", cg_name(t));
            if (!st) st = cg_st_add(w, name, cg_ndim(t), cg_shape(t), m1 + off);
            snprintf(name, sizeof name, "optim.m2.%s", cg_name(t));
            if (!st) st = cg_st_add(w, name, cg_ndim(t), cg_shape(t), m2 + off);
        }
    else {
        st = cg_st_add_params(w, r->ps);
        if (!st) st = cg_st_add(w, "optim.m1", 1, &span, m1);
        if (!st) st = cg_st_add(w, "optim.m2", 1, &span, m2);
    }
    char *cfg = cg_model_config_json(r->model);
    cJSON *train = train_opts_json(&r->o), *state = cJSON_CreateObject(), *labels = NULL;
    cJSON_AddNumberToObject(state, "step", (double)r->step);
    cJSON_AddNumberToObject(state, "optim_steps", (double)cg_optim_steps(r->opt));
    add_str(state, "rng", "%" PRIu64, r->task.rng.state);
    add_str(state, "cursor_rng", "%" PRIu64, r->task.cur.rng.state);
    cJSON_AddNumberToObject(state, "cursor_epoch", (double)r->task.cur.epoch);
    cJSON_AddNumberToObject(state, "cursor_pos", (double)r->task.cur.pos);
    add_str(state, "dropout_seed", "%" PRIu64, r->dropout_seed);
    add_str(state, "dropout_step", "%" PRIu64, r->drop_step);
    cJSON_AddNumberToObject(state, "world_size", r->world); /* the data streams below are global: see shard_step */
    add_str(state, "eval_seed", "%" PRIu64, r->task.eval_seed);
    add_str(state, "elapsed_s", "%.17g", r->elapsed0 + (train_now_s() - r->t_start));
    add_str(state, "window_loss_sum", "%.17g", r->win_sum);
    cJSON_AddNumberToObject(state, "window_steps", (double)r->win_n);
    add_str(state, "train_loss", "%.17g", r->last_train);
    add_str(state, "val_loss", "%.17g", r->last_val);
    cJSON_AddNumberToObject(state, "threads", cg_threads());
    add_str(state, "data_crc32", "%" PRIu32, r->data_crc);
    cJSON_AddNumberToObject(state, "data_bytes", (double)r->data_bytes);
    add_str(state, "val_data_crc32", "%" PRIu32, r->val_crc);
    cJSON_AddNumberToObject(state, "graph_t", (double)r->task.t);
    cJSON_AddNumberToObject(state, "graph_s", (double)r->task.s);
    if (r->task.cls) {
        labels = cJSON_CreateArray();
        for (int32_t i = 0; i < cg_textcls_num_labels(r->task.cls); i++)
            cJSON_AddItemToArray(labels, cJSON_CreateString(cg_textcls_label_name(r->task.cls, i)));
    }
    char *tj = cJSON_PrintUnformatted(train), *sj = cJSON_PrintUnformatted(state),
         *lj = labels ? cJSON_PrintUnformatted(labels) : NULL;
    if (!st) st = cg_st_set_metadata(w, "arch", cg_arch_name(r->arch));
    if (!st) st = cg_st_set_metadata(w, "config", cfg ? cfg : "{}");
    if (!st) st = cg_st_set_metadata(w, "tokenizer", r->tok_json);
    if (!st) st = cg_st_set_metadata(w, "train", tj ? tj : "{}");
    if (!st) st = cg_st_set_metadata(w, "state", sj ? sj : "{}");
    if (!st && lj) st = cg_st_set_metadata(w, "labels", lj);
    if (!st) st = cg_checkpoint_save(w, r->o.checkpoint);
    free(cfg);
    free(tj);
    free(sj);
    free(lj);
    cJSON_Delete(train);
    cJSON_Delete(state);
    cJSON_Delete(labels);
    cg_st_writer_free(w);
    return st;
}

/* Restores the optimizer, data position and dropout stream saved by train_save(). */
cg_status train_restore(run *r, const cli_ckpt *ck, const char *path) {
    const cJSON *s = ck->state;
    const int64_t span = cg_params_span(r->ps);
    cg_status st = CG_OK;
    if (r->o.lora_rank > 0) {
        for (int i = 0; !st && i < cg_params_count(r->ps); i++) {
            cg_tensor *t = cg_params_at(r->ps, i);
            if (!cg_lora_is_adapter(t)) continue;
            char name[600];
            const int64_t off = cg_data(t) - cg_params_values(r->ps);
            snprintf(name, sizeof name, "optim.m1.%s", cg_name(t));
            st = cg_st_read(ck->st, name, cg_optim_moment1(r->opt) + off, cg_ndim(t), cg_shape(t));
            snprintf(name, sizeof name, "optim.m2.%s", cg_name(t));
            if (!st) st = cg_st_read(ck->st, name, cg_optim_moment2(r->opt) + off, cg_ndim(t), cg_shape(t));
        }
        if (st) return st;
    } else if (cg_st_find(ck->st, "optim.m1") < 0 || cg_st_find(ck->st, "optim.m2") < 0)
        return cg_set_error(CG_ERR_FORMAT, "[checkpoint] %s: no optimizer state (optim.m1, optim.m2)", path);
    else if ((st = cg_st_read(ck->st, "optim.m1", cg_optim_moment1(r->opt), 1, &span)) ||
             (st = cg_st_read(ck->st, "optim.m2", cg_optim_moment2(r->opt), 1, &span)))
        return st;
    if ((st = cg_optim_set_steps(r->opt, cli_json_i64(s, "optim_steps", 0)))) return st;
    r->step = cli_json_i64(s, "step", 0);
    r->task.rng.state = cli_json_u64(s, "rng", 0);
    r->task.cur.rng.state = cli_json_u64(s, "cursor_rng", 0);
    r->task.cur.epoch = cli_json_i64(s, "cursor_epoch", 0);
    r->task.cur.pos = cli_json_i64(s, "cursor_pos", 0);
    r->dropout_seed = cli_json_u64(s, "dropout_seed", 0);
    r->task.eval_seed = cli_json_u64(s, "eval_seed", 0);
    r->drop_step = cli_json_u64(s, "dropout_step", 0);
    cg_graph_set_rng(r->g, r->dropout_seed, r->drop_step);
    r->elapsed0 = cli_json_num(s, "elapsed_s", 0);
    r->win_sum = cli_json_num(s, "window_loss_sum", 0);
    r->win_n = cli_json_i64(s, "window_steps", 0);
    r->last_train = cli_json_num(s, "train_loss", NAN);
    r->last_val = cli_json_num(s, "val_loss", NAN);
    int threads = (int)cli_json_i64(s, "threads", 0);
    if (threads && threads != cg_threads())
        fprintf(stderr, "cgrad train: note: the checkpoint ran on %d threads, this run on %d: the numbers will not be "
                        "bit-identical to an uninterrupted run\n", threads, cg_threads());
    return CG_OK;
}
