/* SPDX-License-Identifier: MIT */
/* Encoder-decoder transformer, composed from ops. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/config_json.h"
#include "models/encdec.h"
#include "models/layers.h"
#include "ops/ops.h"

typedef struct {
    cg_tensor *in_w, *in_b, *out_w, *out_b;
} mha_params;

typedef struct {
    mha_params self, cross;
    cg_tensor *l1_w, *l1_b, *l2_w, *l2_b, *n1_w, *n1_b, *n2_w, *n2_b, *n3_w, *n3_b;
} tf_layer;

struct cg_encdec {
    cg_encdec_config cfg;
    cg_tensor *src_emb, *tgt_emb, *enc_norm_w, *enc_norm_b, *dec_norm_w, *dec_norm_b, *gen_w, *gen_b;
    tf_layer *enc, *dec;
};

cg_status cg_encdec_config_parse(const char *json, cg_encdec_config *c) {
    const char *what = "encdec config";
    if (!c) return cg_set_error(CG_ERR_ARG, "[%s] NULL config", what);
    cJSON *o = cgi_json_object(json, what);
    if (!o) return CG_ERR_FORMAT;
    memset(c, 0, sizeof *c);
    bool ok = cgi_json_int(o, "src_vocab_size", true, 0, &c->src_vocab_size, what) &&
              cgi_json_int(o, "tgt_vocab_size", true, 0, &c->tgt_vocab_size, what) &&
              cgi_json_int(o, "d_model", true, 0, &c->d_model, what) &&
              cgi_json_int(o, "n_head", true, 0, &c->n_head, what) &&
              cgi_json_int(o, "num_encoder_layers", true, 0, &c->num_encoder_layers, what) &&
              cgi_json_int(o, "num_decoder_layers", true, 0, &c->num_decoder_layers, what) &&
              cgi_json_int(o, "dim_feedforward", true, 0, &c->dim_feedforward, what) &&
              cgi_json_int(o, "max_len", true, 0, &c->max_len, what) &&
              cgi_json_int(o, "pad_id", true, 0, &c->pad_id, what) &&
              cgi_json_int(o, "bos_id", true, 0, &c->bos_id, what) &&
              cgi_json_int(o, "eos_id", true, 0, &c->eos_id, what) &&
              cgi_json_num(o, "layer_norm_eps", false, 1e-5, &c->layer_norm_eps, what);
    cJSON_Delete(o);
    return ok ? CG_OK : CG_ERR_FORMAT;
}

char *cg_encdec_config_json(const cg_encdec_config *c) {
    char *s = malloc(640);
    if (!s) return NULL;
    snprintf(s, 640,
             "{\"model_type\": \"encdec\", \"src_vocab_size\": %lld, \"tgt_vocab_size\": %lld, \"d_model\": %lld, "
             "\"n_head\": %lld, \"num_encoder_layers\": %lld, \"num_decoder_layers\": %lld, \"dim_feedforward\": %lld, "
             "\"layer_norm_eps\": %.17g, \"max_len\": %lld, \"pad_id\": %lld, \"bos_id\": %lld, \"eos_id\": %lld}",
             (long long)c->src_vocab_size, (long long)c->tgt_vocab_size, (long long)c->d_model, (long long)c->n_head,
             (long long)c->num_encoder_layers, (long long)c->num_decoder_layers, (long long)c->dim_feedforward,
             c->layer_norm_eps, (long long)c->max_len, (long long)c->pad_id, (long long)c->bos_id, (long long)c->eos_id);
    return s;
}

static cg_tensor *xavier(cg_params *ps, cg_rng *r, int64_t rows, int64_t cols, const char *name) {
    int64_t s[2] = {rows, cols};
    cg_tensor *t = cg_params_add(ps, name, 2, s);
    double a = sqrt(6.0 / (double)(rows + cols));
    if (t) cg_fill_uniform(t, r, -a, a);
    return t;
}

static bool declare_mha(cg_params *ps, cg_rng *r, int64_t d, const char *prefix, mha_params *p) {
    char n[256];
    snprintf(n, sizeof n, "%s.in_proj_weight", prefix);
    p->in_w = xavier(ps, r, 3 * d, d, n);
    p->in_b = cg_param_const(ps, 0, 1, (int64_t[]){3 * d}, "%s.in_proj_bias", prefix);
    snprintf(n, sizeof n, "%s.out_proj.weight", prefix);
    p->out_w = xavier(ps, r, d, d, n);
    p->out_b = cg_param_const(ps, 0, 1, &d, "%s.out_proj.bias", prefix);
    return p->in_w && p->in_b && p->out_w && p->out_b;
}

static bool declare_layer(cg_params *ps, cg_rng *r, const cg_encdec_config *c, const char *stack, int64_t i,
                          tf_layer *l, bool decoder) {
    const int64_t d = c->d_model, f = c->dim_feedforward;
    char pre[128], n[256];
    snprintf(pre, sizeof pre, "transformer.%s.layers.%lld", stack, (long long)i);
    snprintf(n, sizeof n, "%s.self_attn", pre);
    bool ok = declare_mha(ps, r, d, n, &l->self);
    if (decoder) {
        snprintf(n, sizeof n, "%s.multihead_attn", pre);
        ok = ok && declare_mha(ps, r, d, n, &l->cross);
    }
    snprintf(n, sizeof n, "%s.linear1.weight", pre);
    ok = ok && (l->l1_w = xavier(ps, r, f, d, n)) && (l->l1_b = cg_param_const(ps, 0, 1, &f, "%s.linear1.bias", pre));
    snprintf(n, sizeof n, "%s.linear2.weight", pre);
    ok = ok && (l->l2_w = xavier(ps, r, d, f, n)) && (l->l2_b = cg_param_const(ps, 0, 1, &d, "%s.linear2.bias", pre));
    cg_tensor **norms[3][2] = {{&l->n1_w, &l->n1_b}, {&l->n2_w, &l->n2_b}, {&l->n3_w, &l->n3_b}};
    for (int k = 0; ok && k < (decoder ? 3 : 2); k++)
        ok = (*norms[k][0] = cg_param_const(ps, 1, 1, &d, "%s.norm%d.weight", pre, k + 1)) &&
             (*norms[k][1] = cg_param_const(ps, 0, 1, &d, "%s.norm%d.bias", pre, k + 1));
    return ok;
}

cg_encdec *cg_encdec_new(const cg_encdec_config *cfg, cg_params *ps, uint64_t seed) {
    if (!cfg || !ps) {
        cg_set_error(CG_ERR_ARG, "[encdec] NULL config or parameter set");
        return NULL;
    }
    const cg_encdec_config *c = cfg;
    if (c->src_vocab_size <= 0 || c->tgt_vocab_size <= 0 || c->d_model <= 0 || c->n_head <= 0 ||
        c->d_model % c->n_head || c->num_encoder_layers <= 0 || c->num_decoder_layers <= 0 || c->dim_feedforward <= 0 ||
        c->max_len <= 0 || c->bos_id < 0 || c->bos_id >= c->tgt_vocab_size || c->eos_id < 0 ||
        c->eos_id >= c->tgt_vocab_size || !(c->dropout >= 0 && c->dropout < 1)) {
        cg_set_error(CG_ERR_ARG, "[encdec] bad config: vocab %lld/%lld, d_model %lld, n_head %lld (must divide d_model), "
                 "layers %lld/%lld, ff %lld, max_len %lld, bos %lld, eos %lld", (long long)c->src_vocab_size,
                 (long long)c->tgt_vocab_size, (long long)c->d_model, (long long)c->n_head,
                 (long long)c->num_encoder_layers, (long long)c->num_decoder_layers, (long long)c->dim_feedforward,
                 (long long)c->max_len, (long long)c->bos_id, (long long)c->eos_id);
        return NULL;
    }
    cg_encdec *m = calloc(1, sizeof *m);
    if (m) {
        m->enc = calloc((size_t)c->num_encoder_layers, sizeof *m->enc);
        m->dec = calloc((size_t)c->num_decoder_layers, sizeof *m->dec);
    }
    if (!m || !m->enc || !m->dec) {
        cg_encdec_free(m);
        cg_set_error(CG_ERR_NOMEM, "[encdec] out of memory");
        return NULL;
    }
    m->cfg = *c;
    if (m->cfg.layer_norm_eps <= 0) m->cfg.layer_norm_eps = 1e-5;
    cg_rng r;
    cg_rng_seed(&r, seed);
    const int64_t d = c->d_model;
    bool ok = (m->src_emb = xavier(ps, &r, c->src_vocab_size, d, "src_emb.weight")) &&
              (m->tgt_emb = xavier(ps, &r, c->tgt_vocab_size, d, "tgt_emb.weight"));
    for (int64_t i = 0; ok && i < c->num_encoder_layers; i++) ok = declare_layer(ps, &r, c, "encoder", i, &m->enc[i], false);
    ok = ok && (m->enc_norm_w = cg_param_const(ps, 1, 1, &d, "transformer.encoder.norm.weight")) &&
         (m->enc_norm_b = cg_param_const(ps, 0, 1, &d, "transformer.encoder.norm.bias"));
    for (int64_t i = 0; ok && i < c->num_decoder_layers; i++) ok = declare_layer(ps, &r, c, "decoder", i, &m->dec[i], true);
    ok = ok && (m->dec_norm_w = cg_param_const(ps, 1, 1, &d, "transformer.decoder.norm.weight")) &&
         (m->dec_norm_b = cg_param_const(ps, 0, 1, &d, "transformer.decoder.norm.bias")) &&
         (m->gen_w = xavier(ps, &r, c->tgt_vocab_size, d, "generator.weight")) &&
         (m->gen_b = cg_param_const(ps, 0, 1, &c->tgt_vocab_size, "generator.bias"));
    if (!ok) {
        cg_encdec_free(m);
        return NULL;
    }
    return m;
}

void cg_encdec_free(cg_encdec *m) {
    if (!m) return;
    free(m->enc);
    free(m->dec);
    free(m);
}

const cg_encdec_config *cg_encdec_cfg(const cg_encdec *m) { return m ? &m->cfg : NULL; }

/* nn.MultiheadAttention: in_proj rows [0, d) project queries, [d, 2d) keys, [2d, 3d) values. */
static cg_tensor *mha(cg_graph *g, const cg_encdec *m, const mha_params *p, cg_tensor *x, cg_tensor *kv, bool causal,
                      cg_tensor *key_padding) {
    const int64_t d = m->cfg.d_model;
    cg_tensor *q, *k, *v;
    if (kv == x) { /* self-attention: one product for all three */
        cg_tensor *qkv[3];
        cg_split(g, cg_linear(g, x, p->in_w, p->in_b), -1, 3, NULL, qkv);
        q = qkv[0], k = qkv[1], v = qkv[2];
    } else {
        q = cg_linear(g, x, cg_slice(g, p->in_w, 0, 0, d), cg_slice(g, p->in_b, 0, 0, d));
        cg_tensor *both[2];
        cg_split(g, cg_linear(g, kv, cg_slice(g, p->in_w, 0, d, 3 * d), cg_slice(g, p->in_b, 0, d, 3 * d)), -1, 2,
                 NULL, both);
        k = both[0], v = both[1];
    }
    cg_tensor *o = cg_multi_head(g, q, k, v, (int)m->cfg.n_head, causal, key_padding, m->cfg.dropout);
    return cg_linear(g, o, p->out_w, p->out_b);
}

static cg_tensor *feed_forward(cg_graph *g, const tf_layer *l, cg_tensor *x, double p) {
    return cg_linear(g, cg_dropout(g, cg_linear_relu(g, x, l->l1_w, l->l1_b), p), l->l2_w, l->l2_b);
}

/* tokens * sqrt(d) + sinusoidal positions */
static cg_tensor *embed(cg_graph *g, const cg_encdec *m, cg_tensor *emb, cg_tensor *ids) {
    if (!cg_graph_check_inputs(g, "encdec", 1, &ids)) return NULL;
    if (cg_tensor_dtype(ids) != CG_INT32 || cg_ndim(ids) != 2 || cg_shape(ids)[1] > m->cfg.max_len) {
        cg_set_error(CG_ERR_SHAPE, "[encdec] ids%s must be int32 [B, T] with T <= max_len %lld", cg_shape_str(ids),
                 (long long)m->cfg.max_len);
        return NULL;
    }
    const int64_t d = m->cfg.d_model;
    cg_tensor *x = cg_scale(g, cg_embedding(g, emb, ids), sqrt((double)d));
    return cg_dropout(g, cg_add(g, x, cg_sinusoidal(g, cg_shape(ids)[1], d, 0)), m->cfg.dropout);
}

cg_tensor *cg_encdec_encode(cg_graph *g, const cg_encdec *m, cg_tensor *src, cg_tensor *src_mask) {
    if (!m) {
        cg_set_error(CG_ERR_ARG, "[encdec] model is NULL");
        return NULL;
    }
    const double eps = m->cfg.layer_norm_eps, p = m->cfg.dropout;
    cg_tensor *x = embed(g, m, m->src_emb, src);
    for (int64_t i = 0; i < m->cfg.num_encoder_layers; i++) {
        const tf_layer *l = &m->enc[i];
        if (cg_checkpoint_begin(g)) return NULL; /* each layer is a checkpoint segment */
        x = cg_post_ln_residual(g, x, mha(g, m, &l->self, x, x, false, src_mask), p, l->n1_w, l->n1_b, eps);
        x = cg_post_ln_residual(g, x, feed_forward(g, l, x, p), p, l->n2_w, l->n2_b, eps);
        if (cg_checkpoint_end(g)) return NULL;
    }
    return cg_layernorm(g, x, m->enc_norm_w, m->enc_norm_b, eps);
}

/* The decoder's final hidden states [B, T, d], before the generator. */
static cg_tensor *decode_hidden(cg_graph *g, const cg_encdec *m, cg_tensor *memory, cg_tensor *src_mask, cg_tensor *tgt_in) {
    if (!m) {
        cg_set_error(CG_ERR_ARG, "[encdec] model is NULL");
        return NULL;
    }
    const double eps = m->cfg.layer_norm_eps, p = m->cfg.dropout;
    cg_tensor *x = embed(g, m, m->tgt_emb, tgt_in);
    for (int64_t i = 0; i < m->cfg.num_decoder_layers; i++) {
        const tf_layer *l = &m->dec[i];
        if (cg_checkpoint_begin(g)) return NULL; /* each layer is a checkpoint segment */
        x = cg_post_ln_residual(g, x, mha(g, m, &l->self, x, x, true, NULL), p, l->n1_w, l->n1_b, eps);
        x = cg_post_ln_residual(g, x, mha(g, m, &l->cross, x, memory, false, src_mask), p, l->n2_w, l->n2_b, eps);
        x = cg_post_ln_residual(g, x, feed_forward(g, l, x, p), p, l->n3_w, l->n3_b, eps);
        if (cg_checkpoint_end(g)) return NULL;
    }
    return cg_layernorm(g, x, m->dec_norm_w, m->dec_norm_b, eps);
}

cg_tensor *cg_encdec_decode(cg_graph *g, const cg_encdec *m, cg_tensor *memory, cg_tensor *src_mask, cg_tensor *tgt_in) {
    cg_tensor *h = decode_hidden(g, m, memory, src_mask, tgt_in);
    return h ? cg_linear(g, h, m->gen_w, m->gen_b) : NULL;
}

/* The generator and the loss as one fused op (cg_linear_cross_entropy): logits exist one chunk of
 * rows at a time, never as [B*T, tgt_vocab] beside their gradient. */
cg_tensor *cg_encdec_loss(cg_graph *g, const cg_encdec *m, cg_tensor *src, cg_tensor *src_mask, cg_tensor *tgt_in,
                          cg_tensor *tgt_out, int ignore_index) {
    cg_tensor *h = decode_hidden(g, m, cg_encdec_encode(g, m, src, src_mask), src_mask, tgt_in);
    return h ? cg_linear_cross_entropy(g, h, m->gen_w, m->gen_b, tgt_out, ignore_index) : NULL;
}

cg_tensor *cg_encdec_logits(cg_graph *g, const cg_encdec *m, cg_tensor *src, cg_tensor *src_mask, cg_tensor *tgt_in) {
    return cg_encdec_decode(g, m, cg_encdec_encode(g, m, src, src_mask), src_mask, tgt_in);
}

/* ---- decoding ---- */

typedef struct {
    int32_t tok[512];
    int64_t len;
    double logp;
    bool done;
} hyp;

static double norm_score(const hyp *h) { return h->logp / (double)(h->len ? h->len : 1); }

cg_status cg_encdec_translate(const cg_encdec *m, const int32_t *src, int64_t n_src, int beam, int64_t max_len,
                              int32_t *out, int64_t *n_out) {
    if (!m || !src || !out || !n_out || n_src <= 0 || max_len <= 0)
        return cg_set_error(CG_ERR_ARG, "[encdec translate] need a model, a non-empty source and an output buffer");
    const cg_encdec_config *c = &m->cfg;
    if (n_src > c->max_len) return cg_set_error(CG_ERR_ARG, "[encdec translate] source of %lld tokens exceeds max_len %lld",
                                            (long long)n_src, (long long)c->max_len);
    if (max_len > c->max_len - 1) max_len = c->max_len - 1;
    if (max_len > 511) max_len = 511;
    if (beam < 1) beam = 1;
    if (beam > 64) beam = 64;
    const int64_t d = c->d_model, v = c->tgt_vocab_size;
    cg_graph *g = cg_graph_new(CG_EVAL);
    hyp *hs = calloc((size_t)beam, sizeof *hs), *next = calloc((size_t)beam * (size_t)beam + 1, sizeof *next);
    cg_real *mem = malloc((size_t)(n_src * d) * sizeof *mem);
    cg_status st = g && hs && next && mem ? CG_OK : cg_set_error(CG_ERR_NOMEM, "[encdec translate] out of memory");
    if (!st) { /* encode once; each decoding step reads the memory in place */
        cg_tensor *s = cg_input(g, "src", CG_INT32, 2, (int64_t[]){1, n_src});
        if (s) memcpy(cg_idata(s), src, (size_t)n_src * sizeof(int32_t));
        cg_tensor *memory = cg_encdec_encode(g, m, s, NULL);
        st = memory ? cg_graph_forward(g) : CG_ERR_SHAPE;
        if (!st) st = cg_read(memory, mem);
    }
    int live = 1;
    hs[0].len = 0;
    for (int64_t step = 0; !st && step < max_len; step++) {
        int active = 0;
        for (int b = 0; b < live; b++) active += !hs[b].done;
        if (!active) break;
        cg_graph_reset(g);
        const int64_t t = step + 1;
        cg_tensor *tgt = cg_input(g, "tgt", CG_INT32, 2, (int64_t[]){live, t});
        cg_tensor *memory = cg_wrap(g, "memory", CG_REAL, 3, (int64_t[]){live, n_src, d}, (int64_t[]){0, d, 1}, mem);
        if (!tgt || !memory) {
            st = CG_ERR_NOMEM;
            break;
        }
        for (int b = 0; b < live; b++) {
            cg_idata(tgt)[b * t] = (int32_t)c->bos_id;
            for (int64_t j = 0; j < step; j++) cg_idata(tgt)[b * t + 1 + j] = hs[b].tok[j < hs[b].len ? j : hs[b].len - 1];
        }
        cg_tensor *logits = cg_encdec_decode(g, m, memory, NULL, tgt);
        if (!logits || (st = cg_graph_forward(g))) {
            if (!st) st = CG_ERR_SHAPE;
            break;
        }
        int n_next = 0;
        for (int b = 0; b < live; b++) {
            if (hs[b].done) {
                next[n_next++] = hs[b];
                continue;
            }
            const cg_real *row = cg_data(logits) + (b * t + step) * v;
            double mx = row[0], sum = 0;
            for (int64_t j = 1; j < v; j++) mx = row[j] > mx ? row[j] : mx;
            for (int64_t j = 0; j < v; j++) sum += exp((double)row[j] - mx);
            double lse = mx + log(sum);
            int32_t chosen[64];
            /* the beam best extensions of this hypothesis; a vocabulary smaller than the beam has fewer */
            const int64_t n_chosen = cg_top_k(row, v, beam, chosen);
            for (int64_t k = 0; k < n_chosen; k++) {
                hyp h = hs[b];
                h.tok[h.len++] = chosen[k];
                h.logp += (double)row[chosen[k]] - lse;
                h.done = chosen[k] == c->eos_id;
                next[n_next++] = h;
            }
        }
        /* keep the beam best by length-normalised score */
        for (int i = 0; i < n_next; i++)
            for (int j = i + 1; j < n_next; j++)
                if (norm_score(&next[j]) > norm_score(&next[i])) {
                    hyp tmp = next[i];
                    next[i] = next[j];
                    next[j] = tmp;
                }
        live = n_next < beam ? n_next : beam;
        memcpy(hs, next, (size_t)live * sizeof *hs);
    }
    if (!st) {
        const hyp *h = &hs[0];
        int64_t n = h->len;
        if (n > 0 && h->tok[n - 1] == c->eos_id) n--;
        memcpy(out, h->tok, (size_t)n * sizeof *out);
        *n_out = n;
    }
    free(hs);
    free(next);
    free(mem);
    cg_graph_free(g);
    return st;
}
