/* SPDX-License-Identifier: MIT */
/* The convolutional classifier, composed from ops. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/cnn.h"
#include "models/config_json.h"
#include "models/image_input.h"
#include "models/layers.h"
#include "ops/ops.h"

#define CNN_MAX_LAYERS 8

struct cg_cnn {
    cg_cnn_config cfg;
    cg_tensor *conv_w[CNN_MAX_LAYERS], *conv_b[CNN_MAX_LAYERS], *fc_w, *fc_b, *head_w, *head_b;
    int64_t flat; /* features entering the linear layers */
};

cg_status cg_cnn_config_parse(const char *json, cg_cnn_config *c) {
    const char *what = "cnn config";
    if (!c) return cg_set_error(CG_ERR_ARG, "[%s] NULL config", what);
    cJSON *o = cgi_json_object(json, what);
    if (!o) return CG_ERR_FORMAT;
    memset(c, 0, sizeof *c);
    bool ok = cgi_json_int(o, "image_size", true, 0, &c->image_size, what) &&
              cgi_json_int(o, "num_channels", false, 1, &c->num_channels, what) &&
              cgi_json_int(o, "channels", true, 0, &c->channels, what) &&
              cgi_json_int(o, "n_layer", true, 0, &c->n_layer, what) &&
              cgi_json_int(o, "hidden", false, 0, &c->hidden, what) &&
              cgi_json_int(o, "num_classes", true, 0, &c->num_classes, what);
    cJSON_Delete(o);
    return ok ? CG_OK : CG_ERR_FORMAT;
}

char *cg_cnn_config_json(const cg_cnn_config *c) {
    char *s = malloc(1024);
    if (!s) return NULL;
    snprintf(s, 1024,
             "{\"model_type\": \"cnn\", \"image_size\": %lld, \"num_channels\": %lld, \"channels\": %lld, "
             "\"n_layer\": %lld, \"hidden\": %lld, \"num_classes\": %lld}",
             (long long)c->image_size, (long long)c->num_channels, (long long)c->channels, (long long)c->n_layer,
             (long long)c->hidden, (long long)c->num_classes);
    return s;
}

cg_cnn *cg_cnn_new(const cg_cnn_config *cfg, cg_params *ps, uint64_t seed) {
    if (!cfg || !ps) {
        cg_set_error(CG_ERR_ARG, "[cnn] NULL config or parameter set");
        return NULL;
    }
    const cg_cnn_config c = *cfg;
    /* bounds that keep every size product far from overflow */
    if (c.image_size <= 0 || c.image_size > (1 << 16) || c.num_channels <= 0 || c.num_channels > (1 << 16) ||
        c.channels <= 0 || c.channels > (1 << 16) || c.n_layer <= 0 || c.n_layer > CNN_MAX_LAYERS ||
        c.image_size % ((int64_t)1 << c.n_layer) || c.hidden < 0 || c.hidden > (1 << 20) || c.num_classes <= 1 ||
        c.num_classes > (1 << 24) ||
        !(c.dropout >= 0 && c.dropout < 1)) {
        cg_set_error(CG_ERR_ARG, "[cnn] bad config: image_size %lld (divisible by 2^n_layer), num_channels %lld, "
                     "channels %lld, n_layer %lld (1 .. %d), hidden %lld, num_classes %lld (>= 2)",
                     (long long)c.image_size, (long long)c.num_channels, (long long)c.channels, (long long)c.n_layer,
                     CNN_MAX_LAYERS, (long long)c.hidden, (long long)c.num_classes);
        return NULL;
    }
    cg_cnn *m = calloc(1, sizeof *m);
    if (!m) {
        cg_set_error(CG_ERR_NOMEM, "[cnn] out of memory");
        return NULL;
    }
    m->cfg = c;
    cg_rng r;
    cg_rng_seed(&r, seed);
    bool ok = true;
    int64_t in = c.num_channels, out = c.channels, side = c.image_size;
    for (int64_t i = 0; ok && i < c.n_layer; i++, in = out, out *= 2, side /= 2)
        ok = (m->conv_w[i] = cg_param_normal(ps, &r, sqrt(2.0 / (double)(in * 9)), 4, (int64_t[]){out, in, 3, 3},
                                             "convs.%lld.weight", (long long)i)) &&
             (m->conv_b[i] = cg_param_const(ps, 0, 1, &out, "convs.%lld.bias", (long long)i));
    m->flat = in * side * side;
    int64_t feat = m->flat;
    if (ok && c.hidden > 0) {
        ok = (m->fc_w = cg_param_normal(ps, &r, sqrt(2.0 / (double)feat), 2, (int64_t[]){c.hidden, feat}, "fc.weight")) &&
             (m->fc_b = cg_param_const(ps, 0, 1, &c.hidden, "fc.bias"));
        feat = c.hidden;
    }
    ok = ok && (m->head_w = cg_param_normal(ps, &r, 1.0 / sqrt((double)feat), 2, (int64_t[]){c.num_classes, feat}, "head.weight")) &&
         (m->head_b = cg_param_const(ps, 0, 1, &c.num_classes, "head.bias"));
    if (!ok) {
        cg_cnn_free(m);
        return NULL;
    }
    return m;
}

bool cgi_image_input_ok(cg_graph *g, const char *model, cg_tensor *pixels, int64_t channels, int64_t size) {
    if (!cg_graph_check_inputs(g, model, 1, &pixels)) return false;
    if (cg_tensor_dtype(pixels) == CG_INT32 || cg_ndim(pixels) != 4 || cg_shape(pixels)[1] != channels ||
        cg_shape(pixels)[2] != size || cg_shape(pixels)[3] != size) {
        cg_set_error(CG_ERR_SHAPE, "[%s] pixels%s must be real [B, %lld, %lld, %lld]", model, cg_shape_str(pixels),
                     (long long)channels, (long long)size, (long long)size);
        return false;
    }
    return true;
}

void cg_cnn_free(cg_cnn *m) { free(m); }

const cg_cnn_config *cg_cnn_cfg(const cg_cnn *m) { return m ? &m->cfg : NULL; }

cg_tensor *cg_cnn_logits(cg_graph *g, const cg_cnn *m, cg_tensor *pixels) {
    if (!m) {
        cg_set_error(CG_ERR_ARG, "[cnn] model is NULL");
        return NULL;
    }
    const cg_cnn_config *c = &m->cfg;
    if (!cgi_image_input_ok(g, "cnn", pixels, c->num_channels, c->image_size)) return NULL;
    const int64_t b = cg_shape(pixels)[0], pool[2] = {2, 2};
    const cg_conv_opts same_relu = {.padding = {1, 1}, .relu = true};
    cg_tensor *x = pixels;
    for (int64_t i = 0; i < c->n_layer; i++)
        x = cg_max_pool2d(g, cg_conv2d(g, x, m->conv_w[i], m->conv_b[i], &same_relu), pool, NULL, NULL);
    x = cg_reshape(g, x, 2, (int64_t[]){b, m->flat});
    if (c->hidden > 0) x = cg_linear_relu(g, x, m->fc_w, m->fc_b);
    return cg_linear(g, cg_dropout(g, x, c->dropout), m->head_w, m->head_b);
}
