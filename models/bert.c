/* SPDX-License-Identifier: MIT */
/* BERT, composed from ops. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/bert.h"
#include "models/config_json.h"
#include "models/layers.h"
#include "ops/ops.h"

typedef struct {
    cg_tensor *q_w, *q_b, *k_w, *k_b, *v_w, *v_b, *ao_w, *ao_b, *ln1_w, *ln1_b, *in_w, *in_b, *out_w, *out_b, *ln2_w,
        *ln2_b;
} bert_layer;

struct cg_bert {
    cg_bert_config cfg;
    cg_tensor *word, *pos, *type, *eln_w, *eln_b, *pool_w, *pool_b, *tr_w, *tr_b, *tln_w, *tln_b, *mlm_b, *nsp_w,
        *nsp_b, *cls_w, *cls_b;
    bert_layer *layer;
};

cg_status cg_bert_config_parse(const char *json, cg_bert_config *c) {
    const char *what = "bert config";
    if (!c) return cg_set_error(CG_ERR_ARG, "[%s] NULL config", what);
    cJSON *o = cgi_json_object(json, what);
    if (!o) return CG_ERR_FORMAT;
    memset(c, 0, sizeof *c);
    bool ok = cgi_json_int(o, "vocab_size", true, 0, &c->vocab_size, what) &&
              cgi_json_int(o, "hidden_size", true, 0, &c->hidden_size, what) &&
              cgi_json_int(o, "num_hidden_layers", true, 0, &c->num_hidden_layers, what) &&
              cgi_json_int(o, "num_attention_heads", true, 0, &c->num_attention_heads, what) &&
              cgi_json_int(o, "intermediate_size", true, 0, &c->intermediate_size, what) &&
              cgi_json_int(o, "max_position_embeddings", true, 0, &c->max_position_embeddings, what) &&
              cgi_json_int(o, "type_vocab_size", false, 2, &c->type_vocab_size, what) &&
              cgi_json_int(o, "num_labels", false, 0, &c->num_labels, what) &&
              cgi_json_num(o, "layer_norm_eps", false, 1e-12, &c->layer_norm_eps, what);
    const cJSON *labels = cJSON_GetObjectItemCaseSensitive(o, "id2label");
    if (ok && c->num_labels == 0 && cJSON_IsObject(labels)) c->num_labels = cJSON_GetArraySize(labels);
    cJSON_Delete(o);
    return ok ? CG_OK : CG_ERR_FORMAT;
}

char *cg_bert_config_json(const cg_bert_config *c) {
    char *s = malloc(640);
    if (!s) return NULL;
    snprintf(s, 640,
             "{\"model_type\": \"bert\", \"vocab_size\": %lld, \"hidden_size\": %lld, \"num_hidden_layers\": %lld, "
             "\"num_attention_heads\": %lld, \"intermediate_size\": %lld, \"max_position_embeddings\": %lld, "
             "\"type_vocab_size\": %lld, \"num_labels\": %lld, \"layer_norm_eps\": %.17g, \"hidden_act\": \"gelu\"}",
             (long long)c->vocab_size, (long long)c->hidden_size, (long long)c->num_hidden_layers,
             (long long)c->num_attention_heads, (long long)c->intermediate_size, (long long)c->max_position_embeddings,
             (long long)c->type_vocab_size, (long long)c->num_labels, c->layer_norm_eps);
    return s;
}

cg_bert *cg_bert_new(const cg_bert_config *cfg, cg_params *ps, uint64_t seed) {
    if (!cfg || !ps) {
        cg_set_error(CG_ERR_ARG, "[bert] NULL config or parameter set");
        return NULL;
    }
    const cg_bert_config *c = cfg;
    if (c->vocab_size <= 0 || c->hidden_size <= 0 || c->num_hidden_layers <= 0 || c->num_attention_heads <= 0 ||
        c->hidden_size % c->num_attention_heads || c->intermediate_size <= 0 || c->max_position_embeddings <= 0 ||
        c->type_vocab_size <= 0 || c->num_labels < 0 || !(c->dropout >= 0 && c->dropout < 1)) {
        cg_set_error(CG_ERR_ARG, "[bert] bad config: vocab %lld, hidden %lld, layers %lld, heads %lld (must divide hidden), "
                 "intermediate %lld, positions %lld, types %lld", (long long)c->vocab_size, (long long)c->hidden_size,
                 (long long)c->num_hidden_layers, (long long)c->num_attention_heads, (long long)c->intermediate_size,
                 (long long)c->max_position_embeddings, (long long)c->type_vocab_size);
        return NULL;
    }
    cg_bert *m = calloc(1, sizeof *m);
    bert_layer *L = calloc((size_t)c->num_hidden_layers, sizeof *L);
    if (!m || !L) {
        free(m);
        free(L);
        cg_set_error(CG_ERR_NOMEM, "[bert] out of memory");
        return NULL;
    }
    m->cfg = *c;
    if (m->cfg.layer_norm_eps <= 0) m->cfg.layer_norm_eps = 1e-12;
    m->layer = L;
    cg_rng r;
    cg_rng_seed(&r, seed);
    const double sd = 0.02;
    const int64_t d = c->hidden_size, f = c->intermediate_size, dd[2] = {d, d}, fd[2] = {f, d}, df[2] = {d, f};
    bool ok = (m->word = cg_param_normal(ps, &r, sd, 2, (int64_t[]){c->vocab_size, d}, "bert.embeddings.word_embeddings.weight")) &&
              (m->pos = cg_param_normal(ps, &r, sd, 2, (int64_t[]){c->max_position_embeddings, d}, "bert.embeddings.position_embeddings.weight")) &&
              (m->type = cg_param_normal(ps, &r, sd, 2, (int64_t[]){c->type_vocab_size, d}, "bert.embeddings.token_type_embeddings.weight")) &&
              (m->eln_w = cg_param_const(ps, 1, 1, &d, "bert.embeddings.LayerNorm.weight")) &&
              (m->eln_b = cg_param_const(ps, 0, 1, &d, "bert.embeddings.LayerNorm.bias"));
    for (int64_t i = 0; ok && i < c->num_hidden_layers; i++) {
        bert_layer *l = &L[i];
        const long long n = (long long)i;
        ok = (l->q_w = cg_param_normal(ps, &r, sd, 2, dd, "bert.encoder.layer.%lld.attention.self.query.weight", n)) &&
             (l->q_b = cg_param_const(ps, 0, 1, &d, "bert.encoder.layer.%lld.attention.self.query.bias", n)) &&
             (l->k_w = cg_param_normal(ps, &r, sd, 2, dd, "bert.encoder.layer.%lld.attention.self.key.weight", n)) &&
             (l->k_b = cg_param_const(ps, 0, 1, &d, "bert.encoder.layer.%lld.attention.self.key.bias", n)) &&
             (l->v_w = cg_param_normal(ps, &r, sd, 2, dd, "bert.encoder.layer.%lld.attention.self.value.weight", n)) &&
             (l->v_b = cg_param_const(ps, 0, 1, &d, "bert.encoder.layer.%lld.attention.self.value.bias", n)) &&
             (l->ao_w = cg_param_normal(ps, &r, sd, 2, dd, "bert.encoder.layer.%lld.attention.output.dense.weight", n)) &&
             (l->ao_b = cg_param_const(ps, 0, 1, &d, "bert.encoder.layer.%lld.attention.output.dense.bias", n)) &&
             (l->ln1_w = cg_param_const(ps, 1, 1, &d, "bert.encoder.layer.%lld.attention.output.LayerNorm.weight", n)) &&
             (l->ln1_b = cg_param_const(ps, 0, 1, &d, "bert.encoder.layer.%lld.attention.output.LayerNorm.bias", n)) &&
             (l->in_w = cg_param_normal(ps, &r, sd, 2, fd, "bert.encoder.layer.%lld.intermediate.dense.weight", n)) &&
             (l->in_b = cg_param_const(ps, 0, 1, &f, "bert.encoder.layer.%lld.intermediate.dense.bias", n)) &&
             (l->out_w = cg_param_normal(ps, &r, sd, 2, df, "bert.encoder.layer.%lld.output.dense.weight", n)) &&
             (l->out_b = cg_param_const(ps, 0, 1, &d, "bert.encoder.layer.%lld.output.dense.bias", n)) &&
             (l->ln2_w = cg_param_const(ps, 1, 1, &d, "bert.encoder.layer.%lld.output.LayerNorm.weight", n)) &&
             (l->ln2_b = cg_param_const(ps, 0, 1, &d, "bert.encoder.layer.%lld.output.LayerNorm.bias", n));
    }
    ok = ok && (m->pool_w = cg_param_normal(ps, &r, sd, 2, dd, "bert.pooler.dense.weight")) &&
         (m->pool_b = cg_param_const(ps, 0, 1, &d, "bert.pooler.dense.bias"));
    /* a classifier (BertForSequenceClassification) has no pretraining heads: nothing would train them */
    if (ok && c->num_labels == 0)
        ok = (m->tr_w = cg_param_normal(ps, &r, sd, 2, dd, "cls.predictions.transform.dense.weight")) &&
             (m->tr_b = cg_param_const(ps, 0, 1, &d, "cls.predictions.transform.dense.bias")) &&
             (m->tln_w = cg_param_const(ps, 1, 1, &d, "cls.predictions.transform.LayerNorm.weight")) &&
             (m->tln_b = cg_param_const(ps, 0, 1, &d, "cls.predictions.transform.LayerNorm.bias")) &&
             (m->mlm_b = cg_param_const(ps, 0, 1, &c->vocab_size, "cls.predictions.bias")) &&
             (m->nsp_w = cg_param_normal(ps, &r, sd, 2, (int64_t[]){2, d}, "cls.seq_relationship.weight")) &&
             (m->nsp_b = cg_param_const(ps, 0, 1, (int64_t[]){2}, "cls.seq_relationship.bias"));
    else if (ok)
        ok = (m->cls_w = cg_param_normal(ps, &r, sd, 2, (int64_t[]){c->num_labels, d}, "classifier.weight")) &&
             (m->cls_b = cg_param_const(ps, 0, 1, &c->num_labels, "classifier.bias"));
    if (!ok) {
        cg_bert_free(m);
        return NULL;
    }
    return m;
}

void cg_bert_free(cg_bert *m) {
    if (!m) return;
    free(m->layer);
    free(m);
}

const cg_bert_config *cg_bert_cfg(const cg_bert *m) { return m ? &m->cfg : NULL; }

cg_status cg_bert_forward(cg_graph *g, const cg_bert *m, cg_tensor *ids, cg_tensor *token_types,
                          cg_tensor *attention_mask, cg_bert_outputs *out) {
    return cg_bert_forward_ex(g, m, ids, token_types, attention_mask, NULL, out);
}

cg_status cg_bert_forward_ex(cg_graph *g, const cg_bert *m, cg_tensor *ids, cg_tensor *token_types,
                             cg_tensor *attention_mask, cg_tensor *mlm_labels, cg_bert_outputs *out) {
    if (!m || !out) return cg_set_error(CG_ERR_ARG, "[bert] NULL model or outputs");
    memset(out, 0, sizeof *out);
    if (!cg_graph_check_inputs(g, "bert", 1, &ids)) return CG_ERR_ARG;
    const cg_bert_config *c = &m->cfg;
    if (cg_tensor_dtype(ids) != CG_INT32 || cg_ndim(ids) != 2 || cg_shape(ids)[1] > c->max_position_embeddings)
        return cg_set_error(CG_ERR_SHAPE, "[bert] ids%s must be int32 [B, T] with T <= %lld", cg_shape_str(ids),
                        (long long)c->max_position_embeddings);
    const int64_t b = cg_shape(ids)[0], t = cg_shape(ids)[1], d = c->hidden_size;
    const double eps = c->layer_norm_eps, p = c->dropout;
    cg_tensor *x = cg_add(g, cg_embedding(g, m->word, ids), cg_embedding(g, m->pos, cg_position_ids(g, t, 0)));
    if (token_types) x = cg_add(g, x, cg_embedding(g, m->type, token_types));
    else x = cg_add(g, x, cg_slice(g, m->type, 0, 0, 1)); /* every token in segment 0 */
    x = cg_dropout(g, cg_layernorm(g, x, m->eln_w, m->eln_b, eps), p);
    for (int64_t i = 0; i < c->num_hidden_layers; i++) {
        const bert_layer *l = &m->layer[i];
        if (cg_checkpoint_begin(g)) return CG_ERR_STATE; /* each layer is a checkpoint segment */
        /* query, key and value as one product over their stacked weights (concatenating 3 d x d
         * matrices costs next to nothing; one [3d, d] product runs about 1.3x faster than three) */
        cg_tensor *qkv[3] = {NULL, NULL, NULL};
        cg_tensor *w3 = cg_concat(g, 3, (cg_tensor *[]){l->q_w, l->k_w, l->v_w}, 0);
        cg_tensor *b3 = cg_concat(g, 3, (cg_tensor *[]){l->q_b, l->k_b, l->v_b}, 0);
        cg_split(g, cg_linear(g, x, w3, b3), -1, 3, NULL, qkv);
        cg_tensor *a = cg_multi_head(g, qkv[0], qkv[1], qkv[2], (int)c->num_attention_heads, false, attention_mask, p);
        x = cg_post_ln_residual(g, x, cg_linear(g, a, l->ao_w, l->ao_b), p, l->ln1_w, l->ln1_b, eps);
        cg_tensor *f = cg_linear(g, cg_linear_gelu(g, x, l->in_w, l->in_b, false), l->out_w, l->out_b);
        x = cg_post_ln_residual(g, x, f, p, l->ln2_w, l->ln2_b, eps);
        if (cg_checkpoint_end(g)) return CG_ERR_STATE;
    }
    out->hidden = x;
    cg_tensor *cls = cg_reshape(g, cg_slice(g, x, 1, 0, 1), 2, (int64_t[]){b, d});
    cg_tensor *pooled = cg_tanh(g, cg_linear(g, cls, m->pool_w, m->pool_b));
    if (m->cls_w) {
        out->cls_logits = cg_linear(g, cg_dropout(g, pooled, p), m->cls_w, m->cls_b);
        return out->cls_logits ? CG_OK : CG_ERR_SHAPE;
    }
    cg_tensor *h = cg_layernorm(g, cg_linear_gelu(g, x, m->tr_w, m->tr_b, false), m->tln_w, m->tln_b, eps);
    /* the head runs only on the labelled rows (15% of the tokens), in chunks sized from them */
    if (mlm_labels) out->mlm_loss = cg_linear_cross_entropy(g, h, m->word, m->mlm_b, mlm_labels, -100);
    else out->mlm_logits = cg_linear(g, h, m->word, m->mlm_b); /* decoder tied to the word embeddings */
    out->nsp_logits = cg_linear(g, pooled, m->nsp_w, m->nsp_b);
    bool ok = (out->mlm_logits || out->mlm_loss) && out->nsp_logits;
    return ok ? CG_OK : CG_ERR_SHAPE;
}

cg_tensor *cg_bert_pretraining_loss(cg_graph *g, const cg_bert_outputs *o, cg_tensor *labels,
                                    cg_tensor *next_sentence_label, cg_tensor **mlm_loss, cg_tensor **nsp_loss) {
    if (!o) {
        cg_set_error(CG_ERR_ARG, "[bert loss] NULL outputs");
        return NULL;
    }
    cg_tensor *mlm = o->mlm_loss ? o->mlm_loss : cg_cross_entropy(g, o->mlm_logits, labels, -100);
    cg_tensor *nsp = next_sentence_label ? cg_cross_entropy(g, o->nsp_logits, next_sentence_label, -100) : NULL;
    if (mlm_loss) *mlm_loss = mlm;
    if (nsp_loss) *nsp_loss = nsp;
    return nsp ? cg_add(g, mlm, nsp) : mlm;
}

cg_status cg_bert_fill_mask(const cg_bert *m, const int32_t *ids, int64_t n, int32_t mask_id, int top_k,
                            int32_t *top_ids, double *top_probs) {
    if (!m || !ids || !top_ids || !top_probs || n <= 0 || top_k <= 0)
        return cg_set_error(CG_ERR_ARG, "[bert fill_mask] need a model, ids and output buffers");
    int64_t at = -1;
    for (int64_t i = 0; i < n && at < 0; i++)
        if (ids[i] == mask_id) at = i;
    if (m->cls_w)
        return cg_set_error(CG_ERR_ARG, "[bert fill_mask] a classifier (num_labels %lld) has no masked-LM head",
                        (long long)m->cfg.num_labels);
    if (at < 0) return cg_set_error(CG_ERR_ARG, "[bert fill_mask] no mask token (id %d) in the %lld ids", mask_id, (long long)n);
    const int64_t v = m->cfg.vocab_size;
    if (top_k > v) /* the caller's buffers hold top_k rows: filling fewer would leave garbage */
        return cg_set_error(CG_ERR_ARG, "[bert fill_mask] top_k %d exceeds the vocabulary of %lld", top_k, (long long)v);
    cg_graph *g = cg_graph_new(CG_EVAL);
    cg_tensor *in = g ? cg_input(g, "input_ids", CG_INT32, 2, (int64_t[]){1, n}) : NULL;
    if (!in) {
        cg_graph_free(g);
        return CG_ERR_NOMEM;
    }
    memcpy(cg_idata(in), ids, (size_t)n * sizeof *ids);
    cg_bert_outputs o;
    cg_status st = cg_bert_forward(g, m, in, NULL, NULL, &o);
    if (!st) st = cg_graph_forward(g);
    if (!st) {
        const cg_real *row = cg_data(o.mlm_logits) + at * v;
        double mx = row[0], sum = 0;
        for (int64_t j = 1; j < v; j++) mx = fmax(mx, row[j]);
        for (int64_t j = 0; j < v; j++) sum += exp(row[j] - mx);
        cg_top_k(row, v, top_k, top_ids);
        for (int k = 0; k < top_k; k++) top_probs[k] = exp(row[top_ids[k]] - mx) / sum;
    }
    cg_graph_free(g);
    return st;
}
