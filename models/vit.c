/* SPDX-License-Identifier: MIT */
/* The Vision Transformer, composed from ops. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/config_json.h"
#include "models/image_input.h"
#include "models/layers.h"
#include "models/vit.h"
#include "ops/ops.h"

typedef struct {
    cg_tensor *n1_w, *n1_b, *w[4], *b[4], *n2_w, *n2_b, *fc1_w, *fc1_b, *fc2_w, *fc2_b;
} vit_block;

struct cg_vit {
    cg_vit_config cfg;
    int64_t n_patches;
    cg_tensor *patch_w, *patch_b, *cls, *pos, *norm_w, *norm_b, *head_w, *head_b;
    vit_block *blocks;
};

cg_status cg_vit_config_parse(const char *json, cg_vit_config *c) {
    const char *what = "vit config";
    if (!c) return cg_set_error(CG_ERR_ARG, "[%s] NULL config", what);
    cJSON *o = cgi_json_object(json, what);
    if (!o) return CG_ERR_FORMAT;
    memset(c, 0, sizeof *c);
    bool ok = cgi_json_int(o, "image_size", true, 0, &c->image_size, what) &&
              cgi_json_int(o, "num_channels", false, 1, &c->num_channels, what) &&
              cgi_json_int(o, "patch_size", true, 0, &c->patch_size, what) &&
              cgi_json_int(o, "d_model", true, 0, &c->d_model, what) &&
              cgi_json_int(o, "n_head", true, 0, &c->n_head, what) &&
              cgi_json_int(o, "n_layer", true, 0, &c->n_layer, what) &&
              cgi_json_int(o, "mlp_dim", false, 0, &c->mlp_dim, what) &&
              cgi_json_int(o, "num_classes", true, 0, &c->num_classes, what) &&
              cgi_json_int(o, "cls_token", false, 1, &c->cls_token, what) &&
              cgi_json_num(o, "layer_norm_eps", false, 1e-6, &c->layer_norm_eps, what);
    cJSON_Delete(o);
    return ok ? CG_OK : CG_ERR_FORMAT;
}

char *cg_vit_config_json(const cg_vit_config *c) {
    char *s = malloc(1024);
    if (!s) return NULL;
    snprintf(s, 1024,
             "{\"model_type\": \"vit\", \"image_size\": %lld, \"num_channels\": %lld, \"patch_size\": %lld, "
             "\"d_model\": %lld, \"n_head\": %lld, \"n_layer\": %lld, \"mlp_dim\": %lld, \"num_classes\": %lld, "
             "\"cls_token\": %lld, \"layer_norm_eps\": %.17g}",
             (long long)c->image_size, (long long)c->num_channels, (long long)c->patch_size, (long long)c->d_model,
             (long long)c->n_head, (long long)c->n_layer, (long long)c->mlp_dim, (long long)c->num_classes,
             (long long)c->cls_token, c->layer_norm_eps);
    return s;
}

cg_vit *cg_vit_new(const cg_vit_config *cfg, cg_params *ps, uint64_t seed) {
    if (!cfg || !ps) {
        cg_set_error(CG_ERR_ARG, "[vit] NULL config or parameter set");
        return NULL;
    }
    cg_vit_config c = *cfg;
    if (c.mlp_dim == 0) c.mlp_dim = 4 * c.d_model;
    if (c.layer_norm_eps <= 0) c.layer_norm_eps = 1e-6;
    /* bounds that keep every size product far from overflow; a model past them is no small ViT */
    if (c.image_size <= 0 || c.image_size > (1 << 16) || c.num_channels <= 0 || c.num_channels > (1 << 16) ||
        c.patch_size <= 0 || c.image_size % c.patch_size || c.image_size / c.patch_size > (1 << 12) ||
        c.d_model <= 0 || c.d_model > (1 << 16) || c.n_head <= 0 || c.d_model % c.n_head || c.n_layer <= 0 ||
        c.n_layer > (1 << 10) || c.mlp_dim < 0 || c.mlp_dim > (1 << 20) || c.num_classes <= 1 || c.num_classes > (1 << 24) || (c.cls_token != 0 && c.cls_token != 1) || !(c.dropout >= 0 && c.dropout < 1)) {
        cg_set_error(CG_ERR_ARG, "[vit] bad config: image_size %lld, num_channels %lld, patch_size %lld (must divide "
                     "image_size, at most 4096 patches a side), d_model %lld, n_head %lld (must divide d_model), n_layer %lld, num_classes %lld "
                     "(>= 2), cls_token %lld (0 or 1)", (long long)c.image_size, (long long)c.num_channels,
                     (long long)c.patch_size, (long long)c.d_model, (long long)c.n_head, (long long)c.n_layer,
                     (long long)c.num_classes, (long long)c.cls_token);
        return NULL;
    }
    cg_vit *m = calloc(1, sizeof *m);
    vit_block *B = calloc((size_t)c.n_layer, sizeof *B);
    if (!m || !B) {
        free(m);
        free(B);
        cg_set_error(CG_ERR_NOMEM, "[vit] out of memory");
        return NULL;
    }
    m->cfg = c;
    m->blocks = B;
    const int64_t side = c.image_size / c.patch_size;
    m->n_patches = side * side;
    cg_rng r;
    cg_rng_seed(&r, seed);
    const int64_t d = c.d_model, f = c.mlp_dim, p = c.patch_size, dd[2] = {d, d}, fd[2] = {f, d}, df[2] = {d, f};
    const int64_t n_pos = m->n_patches + c.cls_token;
    const double sdd = 1.0 / sqrt((double)d), sdf = 1.0 / sqrt((double)f),
                 sdp = 1.0 / sqrt((double)(c.num_channels * p * p));
    bool ok = (m->patch_w = cg_param_normal(ps, &r, sdp, 4, (int64_t[]){d, c.num_channels, p, p}, "patch_embed.weight")) &&
              (m->patch_b = cg_param_const(ps, 0, 1, &d, "patch_embed.bias")) &&
              (!c.cls_token || (m->cls = cg_param_normal(ps, &r, 0.02, 3, (int64_t[]){1, 1, d}, "cls_token"))) &&
              (m->pos = cg_param_normal(ps, &r, 0.02, 3, (int64_t[]){1, n_pos, d}, "pos_embed"));
    static const char qkvo[4] = {'q', 'k', 'v', 'o'};
    for (int64_t i = 0; ok && i < c.n_layer; i++) {
        vit_block *b = &B[i];
        const long long n = (long long)i;
        ok = (b->n1_w = cg_param_const(ps, 1, 1, &d, "blocks.%lld.norm1.weight", n)) &&
             (b->n1_b = cg_param_const(ps, 0, 1, &d, "blocks.%lld.norm1.bias", n));
        for (int k = 0; ok && k < 4; k++)
            ok = (b->w[k] = cg_param_normal(ps, &r, sdd, 2, dd, "blocks.%lld.attn.%c.weight", n, qkvo[k])) &&
                 (b->b[k] = cg_param_const(ps, 0, 1, &d, "blocks.%lld.attn.%c.bias", n, qkvo[k]));
        ok = ok && (b->n2_w = cg_param_const(ps, 1, 1, &d, "blocks.%lld.norm2.weight", n)) &&
             (b->n2_b = cg_param_const(ps, 0, 1, &d, "blocks.%lld.norm2.bias", n)) &&
             (b->fc1_w = cg_param_normal(ps, &r, sdd, 2, fd, "blocks.%lld.mlp.fc1.weight", n)) &&
             (b->fc1_b = cg_param_const(ps, 0, 1, &f, "blocks.%lld.mlp.fc1.bias", n)) &&
             (b->fc2_w = cg_param_normal(ps, &r, sdf, 2, df, "blocks.%lld.mlp.fc2.weight", n)) &&
             (b->fc2_b = cg_param_const(ps, 0, 1, &d, "blocks.%lld.mlp.fc2.bias", n));
    }
    ok = ok && (m->norm_w = cg_param_const(ps, 1, 1, &d, "norm.weight")) &&
         (m->norm_b = cg_param_const(ps, 0, 1, &d, "norm.bias")) &&
         (m->head_w = cg_param_normal(ps, &r, sdd, 2, (int64_t[]){c.num_classes, d}, "head.weight")) &&
         (m->head_b = cg_param_const(ps, 0, 1, &c.num_classes, "head.bias"));
    if (!ok) {
        cg_vit_free(m);
        return NULL;
    }
    return m;
}

void cg_vit_free(cg_vit *m) {
    if (!m) return;
    free(m->blocks);
    free(m);
}

const cg_vit_config *cg_vit_cfg(const cg_vit *m) { return m ? &m->cfg : NULL; }

cg_tensor *cg_vit_logits(cg_graph *g, const cg_vit *m, cg_tensor *pixels) {
    if (!m) {
        cg_set_error(CG_ERR_ARG, "[vit] model is NULL");
        return NULL;
    }
    const cg_vit_config *c = &m->cfg;
    if (!cgi_image_input_ok(g, "vit", pixels, c->num_channels, c->image_size)) return NULL;
    const int64_t b = cg_shape(pixels)[0], d = c->d_model, np = m->n_patches;
    const double eps = c->layer_norm_eps, p = c->dropout;
    cg_conv_opts patches = {.stride = {c->patch_size, c->patch_size}};
    cg_tensor *x = cg_conv2d(g, pixels, m->patch_w, m->patch_b, &patches); /* [B, d, h, w] */
    x = cg_transpose(g, cg_reshape(g, x, 3, (int64_t[]){b, d, np}), 1, 2); /* [B, N, d] */
    if (c->cls_token) {
        cg_tensor *parts[2] = {cg_expand(g, m->cls, 3, (int64_t[]){b, 1, d}), x};
        x = cg_concat(g, 2, parts, 1);
    }
    x = cg_dropout(g, cg_add(g, x, m->pos), p);
    for (int64_t i = 0; i < c->n_layer; i++) {
        const vit_block *k = &m->blocks[i];
        if (cg_checkpoint_begin(g)) return NULL; /* each block is a checkpoint segment */
        cg_tensor *h = cg_layernorm(g, x, k->n1_w, k->n1_b, eps);
        cg_tensor *a = cg_multi_head(g, cg_linear(g, h, k->w[0], k->b[0]), cg_linear(g, h, k->w[1], k->b[1]),
                                     cg_linear(g, h, k->w[2], k->b[2]), (int)c->n_head, false, NULL, p);
        x = cg_add(g, x, cg_dropout(g, cg_linear(g, a, k->w[3], k->b[3]), p));
        h = cg_layernorm(g, x, k->n2_w, k->n2_b, eps);
        h = cg_linear(g, cg_linear_gelu(g, h, k->fc1_w, k->fc1_b, false), k->fc2_w, k->fc2_b);
        x = cg_add(g, x, cg_dropout(g, h, p));
        if (cg_checkpoint_end(g)) return NULL;
    }
    x = cg_layernorm(g, x, m->norm_w, m->norm_b, eps);
    cg_tensor *pooled = c->cls_token ? cg_reshape(g, cg_contiguous(g, cg_slice(g, x, 1, 0, 1)), 2, (int64_t[]){b, d})
                                     : cg_mean(g, x, 1, false);
    return cg_linear(g, pooled, m->head_w, m->head_b);
}
