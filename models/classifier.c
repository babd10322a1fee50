/* SPDX-License-Identifier: MIT */
/* The classification transformer, composed from ops. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/classifier.h"
#include "models/config_json.h"
#include "models/layers.h"
#include "ops/ops.h"

typedef struct {
    cg_tensor *w[4], *b[4]; /* q, k, v, o */
    cg_tensor *n1_w, *n1_b, *f0_w, *f0_b, *f2_w, *f2_b, *n2_w, *n2_b;
} cls_block;

struct cg_classifier {
    cg_classifier_config cfg;
    cg_tensor *tok, *pos, *out_w, *out_b;
    cls_block *blocks;
};

cg_status cg_classifier_config_parse(const char *json, cg_classifier_config *c) {
    const char *what = "classifier config";
    if (!c) return cg_set_error(CG_ERR_ARG, "[%s] NULL config", what);
    cJSON *o = cgi_json_object(json, what);
    if (!o) return CG_ERR_FORMAT;
    memset(c, 0, sizeof *c);
    bool ok = cgi_json_int(o, "vocab_size", true, 0, &c->vocab_size, what) &&
              cgi_json_int(o, "d_model", true, 0, &c->d_model, what) &&
              cgi_json_int(o, "n_head", true, 0, &c->n_head, what) &&
              cgi_json_int(o, "n_layer", true, 0, &c->n_layer, what) &&
              cgi_json_int(o, "dim_feedforward", false, 0, &c->dim_feedforward, what) &&
              cgi_json_int(o, "max_len", true, 0, &c->max_len, what) &&
              cgi_json_int(o, "num_classes", true, 0, &c->num_classes, what) &&
              cgi_json_num(o, "layer_norm_eps", false, 1e-5, &c->layer_norm_eps, what);
    if (ok && c->dim_feedforward == 0) c->dim_feedforward = 4 * c->d_model;
    cJSON_Delete(o);
    return ok ? CG_OK : CG_ERR_FORMAT;
}

char *cg_classifier_config_json(const cg_classifier_config *c) {
    char *s = malloc(512);
    if (!s) return NULL;
    snprintf(s, 512,
             "{\"model_type\": \"classifier\", \"vocab_size\": %lld, \"d_model\": %lld, \"n_head\": %lld, "
             "\"n_layer\": %lld, \"dim_feedforward\": %lld, \"max_len\": %lld, \"num_classes\": %lld, "
             "\"layer_norm_eps\": %.17g}",
             (long long)c->vocab_size, (long long)c->d_model, (long long)c->n_head, (long long)c->n_layer,
             (long long)c->dim_feedforward, (long long)c->max_len, (long long)c->num_classes, c->layer_norm_eps);
    return s;
}

cg_classifier *cg_classifier_new(const cg_classifier_config *cfg, cg_params *ps, uint64_t seed) {
    if (!cfg || !ps) {
        cg_set_error(CG_ERR_ARG, "[classifier] NULL config or parameter set");
        return NULL;
    }
    cg_classifier_config c = *cfg;
    if (c.dim_feedforward == 0) c.dim_feedforward = 4 * c.d_model;
    if (c.layer_norm_eps <= 0) c.layer_norm_eps = 1e-5;
    if (c.vocab_size <= 0 || c.d_model <= 0 || c.n_head <= 0 || c.d_model % c.n_head || c.n_layer <= 0 ||
        c.dim_feedforward < 0 || c.max_len <= 0 || c.num_classes <= 1 || !(c.dropout >= 0 && c.dropout < 1)) {
        cg_set_error(CG_ERR_ARG, "[classifier] bad config: vocab %lld, d_model %lld, n_head %lld (must divide d_model), "
                 "n_layer %lld, max_len %lld, num_classes %lld (>= 2)", (long long)c.vocab_size, (long long)c.d_model,
                 (long long)c.n_head, (long long)c.n_layer, (long long)c.max_len, (long long)c.num_classes);
        return NULL;
    }
    cg_classifier *m = calloc(1, sizeof *m);
    cls_block *B = calloc((size_t)c.n_layer, sizeof *B);
    if (!m || !B) {
        free(m);
        free(B);
        cg_set_error(CG_ERR_NOMEM, "[classifier] out of memory");
        return NULL;
    }
    m->cfg = c;
    m->blocks = B;
    cg_rng r;
    cg_rng_seed(&r, seed);
    const int64_t d = c.d_model, f = c.dim_feedforward, dd[2] = {d, d}, fd[2] = {f, d}, df[2] = {d, f};
    const double sd = 0.02, sdd = 1.0 / sqrt((double)d), sdf = 1.0 / sqrt((double)f);
    bool ok = (m->tok = cg_param_normal(ps, &r, sd, 2, (int64_t[]){c.vocab_size, d}, "token_emb.weight")) &&
              (m->pos = cg_param_normal(ps, &r, sd, 2, (int64_t[]){c.max_len, d}, "pos_emb.weight"));
    static const char qkvo[4] = {'q', 'k', 'v', 'o'};
    for (int64_t i = 0; ok && i < c.n_layer; i++) {
        cls_block *b = &B[i];
        const long long n = (long long)i;
        for (int k = 0; ok && k < 4; k++)
            ok = (b->w[k] = cg_param_normal(ps, &r, sdd, 2, dd, "blocks.%lld.attn.%c.weight", n, qkvo[k])) &&
                 (b->b[k] = cg_param_const(ps, 0, 1, &d, "blocks.%lld.attn.%c.bias", n, qkvo[k]));
        ok = ok && (b->n1_w = cg_param_const(ps, 1, 1, &d, "blocks.%lld.norm1.weight", n)) &&
             (b->n1_b = cg_param_const(ps, 0, 1, &d, "blocks.%lld.norm1.bias", n)) &&
             (b->f0_w = cg_param_normal(ps, &r, sdd, 2, fd, "blocks.%lld.ff.0.weight", n)) &&
             (b->f0_b = cg_param_const(ps, 0, 1, &f, "blocks.%lld.ff.0.bias", n)) &&
             (b->f2_w = cg_param_normal(ps, &r, sdf, 2, df, "blocks.%lld.ff.2.weight", n)) &&
             (b->f2_b = cg_param_const(ps, 0, 1, &d, "blocks.%lld.ff.2.bias", n)) &&
             (b->n2_w = cg_param_const(ps, 1, 1, &d, "blocks.%lld.norm2.weight", n)) &&
             (b->n2_b = cg_param_const(ps, 0, 1, &d, "blocks.%lld.norm2.bias", n));
    }
    ok = ok && (m->out_w = cg_param_normal(ps, &r, sdd, 2, (int64_t[]){c.num_classes, d}, "toprobs.weight")) &&
         (m->out_b = cg_param_const(ps, 0, 1, &c.num_classes, "toprobs.bias"));
    if (!ok) {
        cg_classifier_free(m);
        return NULL;
    }
    return m;
}

void cg_classifier_free(cg_classifier *m) {
    if (!m) return;
    free(m->blocks);
    free(m);
}

const cg_classifier_config *cg_classifier_cfg(const cg_classifier *m) { return m ? &m->cfg : NULL; }

cg_tensor *cg_classifier_logits(cg_graph *g, const cg_classifier *m, cg_tensor *ids, cg_tensor *attention_mask) {
    if (!m) {
        cg_set_error(CG_ERR_ARG, "[classifier] model is NULL");
        return NULL;
    }
    if (!cg_graph_check_inputs(g, "classifier", 1, &ids)) return NULL;
    const cg_classifier_config *c = &m->cfg;
    if (cg_tensor_dtype(ids) != CG_INT32 || cg_ndim(ids) != 2 || cg_shape(ids)[1] > c->max_len) {
        cg_set_error(CG_ERR_SHAPE, "[classifier] ids%s must be int32 [B, T] with T <= max_len %lld", cg_shape_str(ids),
                 (long long)c->max_len);
        return NULL;
    }
    const int64_t b = cg_shape(ids)[0], t = cg_shape(ids)[1];
    const double eps = c->layer_norm_eps, p = c->dropout;
    cg_tensor *x = cg_add(g, cg_embedding(g, m->tok, ids), cg_embedding(g, m->pos, cg_position_ids(g, t, 0)));
    x = cg_dropout(g, x, p);
    for (int64_t i = 0; i < c->n_layer; i++) {
        const cls_block *k = &m->blocks[i];
        if (cg_checkpoint_begin(g)) return NULL; /* each block is a checkpoint segment */
        cg_tensor *a = cg_multi_head(g, cg_linear(g, x, k->w[0], k->b[0]), cg_linear(g, x, k->w[1], k->b[1]),
                                     cg_linear(g, x, k->w[2], k->b[2]), (int)c->n_head, false, attention_mask, p);
        x = cg_post_ln_residual(g, x, cg_linear(g, a, k->w[3], k->b[3]), p, k->n1_w, k->n1_b, eps);
        cg_tensor *f = cg_linear(g, cg_linear_relu(g, x, k->f0_w, k->f0_b), k->f2_w, k->f2_b);
        x = cg_post_ln_residual(g, x, f, p, k->n2_w, k->n2_b, eps);
        if (cg_checkpoint_end(g)) return NULL;
    }
    cg_tensor *pooled;
    if (attention_mask) { /* mean over the positions that are not padding */
        cg_tensor *w = cg_reshape(g, cg_cast(g, attention_mask), 3, (int64_t[]){b, t, 1});
        pooled = cg_div(g, cg_sum(g, cg_mul(g, x, w), 1, false), cg_sum(g, w, 1, false));
    } else {
        pooled = cg_mean(g, x, 1, false);
    }
    return cg_linear(g, pooled, m->out_w, m->out_b);
}
