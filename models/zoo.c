/* SPDX-License-Identifier: MIT */
/* The zoo's common interface: dispatch by arch, and the weight-name rules of each family. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/zoo.h"
#include "optim/lora.h"
#include "ops/ops.h"

struct cg_model {
    cg_arch arch;
    bool full_logits; /* training graphs keep every position's logits (no fused loss head) */
    cg_params *ps;
    void *impl;
};

static const char *arch_names[] = {"gpt2", "bert", "encdec", "classifier", "llama", "vit", "cnn"};
#define N_ARCH (int)(sizeof arch_names / sizeof arch_names[0])

cg_status cg_arch_parse(const char *name, cg_arch *arch) {
    for (int i = 0; name && i < N_ARCH; i++)
        if (!strcmp(name, arch_names[i])) {
            *arch = (cg_arch)i;
            return CG_OK;
        }
    return cg_set_error(CG_ERR_ARG, "[arch] unknown architecture '%s' (gpt2, bert, encdec, classifier, llama, vit, cnn)", name ? name : "(null)");
}

const char *cg_arch_name(cg_arch arch) { return (unsigned)arch < N_ARCH ? arch_names[arch] : "?"; }

cg_model *cg_model_new(cg_arch arch, const char *config_json, double dropout, cg_params *ps, uint64_t seed) {
    cg_model *m = calloc(1, sizeof *m);
    if (!m) {
        cg_set_error(CG_ERR_NOMEM, "[model] out of memory");
        return NULL;
    }
    m->arch = arch;
    m->ps = ps;
    cg_status s = CG_ERR_ARG;
    switch (arch) {
    case CG_ARCH_GPT2: {
        cg_gpt_config c;
        if (!(s = cg_gpt_config_parse(config_json, &c))) c.dropout = dropout, m->impl = cg_gpt_new(&c, ps, seed);
        break;
    }
    case CG_ARCH_BERT: {
        cg_bert_config c;
        if (!(s = cg_bert_config_parse(config_json, &c))) c.dropout = dropout, m->impl = cg_bert_new(&c, ps, seed);
        break;
    }
    case CG_ARCH_ENCDEC: {
        cg_encdec_config c;
        if (!(s = cg_encdec_config_parse(config_json, &c))) c.dropout = dropout, m->impl = cg_encdec_new(&c, ps, seed);
        break;
    }
    case CG_ARCH_CLASSIFIER: {
        cg_classifier_config c;
        if (!(s = cg_classifier_config_parse(config_json, &c)))
            c.dropout = dropout, m->impl = cg_classifier_new(&c, ps, seed);
        break;
    }
    case CG_ARCH_LLAMA: {
        cg_llama_config c;
        if (!(s = cg_llama_config_parse(config_json, &c))) c.dropout = dropout, m->impl = cg_llama_new(&c, ps, seed);
        break;
    }
    case CG_ARCH_VIT: {
        cg_vit_config c;
        if (!(s = cg_vit_config_parse(config_json, &c))) c.dropout = dropout, m->impl = cg_vit_new(&c, ps, seed);
        break;
    }
    case CG_ARCH_CNN: {
        cg_cnn_config c;
        if (!(s = cg_cnn_config_parse(config_json, &c))) c.dropout = dropout, m->impl = cg_cnn_new(&c, ps, seed);
        break;
    }
    default: cg_set_error(CG_ERR_ARG, "[model] unknown arch %d", (int)arch);
    }
    if (!m->impl) {
        free(m);
        return NULL;
    }
    return m;
}

void cg_model_free(cg_model *m) {
    if (!m) return;
    switch (m->arch) {
    case CG_ARCH_GPT2: cg_gpt_free(m->impl); break;
    case CG_ARCH_BERT: cg_bert_free(m->impl); break;
    case CG_ARCH_ENCDEC: cg_encdec_free(m->impl); break;
    case CG_ARCH_CLASSIFIER: cg_classifier_free(m->impl); break;
    case CG_ARCH_LLAMA: cg_llama_free(m->impl); break;
    case CG_ARCH_VIT: cg_vit_free(m->impl); break;
    case CG_ARCH_CNN: cg_cnn_free(m->impl); break;
    }
    free(m);
}

cg_arch cg_model_arch(const cg_model *m) { return m ? m->arch : CG_ARCH_GPT2; }
void cg_model_set_full_logits(cg_model *m, bool on) {
    if (m) m->full_logits = on;
}
cg_params *cg_model_params(const cg_model *m) { return m ? m->ps : NULL; }
cg_gpt *cg_model_gpt(cg_model *m) { return m && m->arch == CG_ARCH_GPT2 ? m->impl : NULL; }
cg_bert *cg_model_bert(cg_model *m) { return m && m->arch == CG_ARCH_BERT ? m->impl : NULL; }
cg_encdec *cg_model_encdec(cg_model *m) { return m && m->arch == CG_ARCH_ENCDEC ? m->impl : NULL; }
cg_classifier *cg_model_classifier(cg_model *m) { return m && m->arch == CG_ARCH_CLASSIFIER ? m->impl : NULL; }
cg_llama *cg_model_llama(cg_model *m) { return m && m->arch == CG_ARCH_LLAMA ? m->impl : NULL; }
cg_vit *cg_model_vit(cg_model *m) { return m && m->arch == CG_ARCH_VIT ? m->impl : NULL; }
cg_cnn *cg_model_cnn(cg_model *m) { return m && m->arch == CG_ARCH_CNN ? m->impl : NULL; }
bool cg_model_is_image(const cg_model *m) { return m && (m->arch == CG_ARCH_VIT || m->arch == CG_ARCH_CNN); }

bool cg_model_image_shape(const cg_model *m, int64_t chw[3]) {
    if (!cg_model_is_image(m)) return false;
    if (m->arch == CG_ARCH_VIT) {
        const cg_vit_config *c = cg_vit_cfg(m->impl);
        chw[0] = c->num_channels, chw[1] = chw[2] = c->image_size;
    } else {
        const cg_cnn_config *c = cg_cnn_cfg(m->impl);
        chw[0] = c->num_channels, chw[1] = chw[2] = c->image_size;
    }
    return true;
}
bool cg_model_is_decoder(const cg_model *m) { return m && (m->arch == CG_ARCH_GPT2 || m->arch == CG_ARCH_LLAMA); }

int64_t cg_model_context(const cg_model *m) {
    if (!m) return 0;
    if (m->arch == CG_ARCH_GPT2) return cg_gpt_cfg(m->impl)->n_positions;
    if (m->arch == CG_ARCH_LLAMA) return cg_llama_cfg(m->impl)->max_position_embeddings;
    return 0;
}

cg_status cg_model_generate(const cg_model *m, const int32_t *prompt, int64_t n_prompt, int64_t n_new,
                            const cg_sampling *s, uint64_t seed, bool use_cache, int32_t *out) {
    if (m && m->arch == CG_ARCH_GPT2) return cg_gpt_generate(m->impl, prompt, n_prompt, n_new, s, seed, use_cache, out);
    if (m && m->arch == CG_ARCH_LLAMA) return cg_llama_generate(m->impl, prompt, n_prompt, n_new, s, seed, use_cache, out);
    return cg_set_error(CG_ERR_ARG, "[generate] a %s model does not generate text (gpt2, llama do)",
                    m ? cg_arch_name(m->arch) : "NULL");
}

char *cg_model_config_json(const cg_model *m) {
    if (!m) return NULL;
    switch (m->arch) {
    case CG_ARCH_GPT2: return cg_gpt_config_json(cg_gpt_cfg(m->impl));
    case CG_ARCH_BERT: return cg_bert_config_json(cg_bert_cfg(m->impl));
    case CG_ARCH_ENCDEC: return cg_encdec_config_json(cg_encdec_cfg(m->impl));
    case CG_ARCH_CLASSIFIER: return cg_classifier_config_json(cg_classifier_cfg(m->impl));
    case CG_ARCH_LLAMA: return cg_llama_config_json(cg_llama_cfg(m->impl));
    case CG_ARCH_VIT: return cg_vit_config_json(cg_vit_cfg(m->impl));
    case CG_ARCH_CNN: return cg_cnn_config_json(cg_cnn_cfg(m->impl));
    }
    return NULL;
}

/* ---- weights by name ---- */

typedef struct {
    const char *prefix;            /* optional prefix on every stored name */
    const char *tied[2][2];        /* {duplicate, twin}: the duplicate must equal the twin */
    const char *skip_suffix[3];    /* buffers that are not parameters */
} name_rules;

static const name_rules rules[] = {
    [CG_ARCH_GPT2] = {"transformer.", {{"lm_head.weight", "wte.weight"}}, {".attn.bias", ".attn.masked_bias"}},
    [CG_ARCH_BERT] = {NULL,
                      {{"cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight"},
                       {"cls.predictions.decoder.bias", "cls.predictions.bias"}},
                      {"embeddings.position_ids"}},
    [CG_ARCH_ENCDEC] = {NULL, {{0}}, {0}},
    [CG_ARCH_CLASSIFIER] = {NULL, {{0}}, {0}},
    /* lm_head.weight is a parameter of its own unless tie_word_embeddings; the tie applies only then */
    [CG_ARCH_LLAMA] = {NULL, {{"lm_head.weight", "model.embed_tokens.weight"}}, {".rotary_emb.inv_freq"}},
    [CG_ARCH_VIT] = {NULL, {{0}}, {0}},
    [CG_ARCH_CNN] = {NULL, {{0}}, {0}},
};
_Static_assert(sizeof rules / sizeof rules[0] == sizeof arch_names / sizeof arch_names[0], "a name rule per arch");

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* The parameter a stored name refers to, without the optional prefix. */
static const char *strip(const name_rules *r, const char *name) {
    if (r->prefix && !strncmp(name, r->prefix, strlen(r->prefix))) return name + strlen(r->prefix);
    return name;
}

/* Appends ", name" (or "name" first) to a malloc'd list; false when out of memory. */
static bool list_add(char **list, const char *name) {
    size_t a = *list ? strlen(*list) : 0, b = strlen(name);
    char *s = realloc(*list, a + b + 3);
    if (!s) return false;
    snprintf(s + a, b + 3, "%s%s", a ? ", " : "", name);
    *list = s;
    return true;
}

/* The parameter a stored name refers to. BERT files converted from Google's TensorFlow release (as
 * bert-base-uncased's on the hub) name LayerNorm's weight and bias "gamma" and "beta", which
 * transformers renames when it loads them; so does this. */
static cg_tensor *find_param(cg_params *ps, const char *name) {
    cg_tensor *p = cg_params_find(ps, name);
    const size_t n = strlen(name);
    const bool gamma = ends_with(name, "LayerNorm.gamma"), beta = ends_with(name, "LayerNorm.beta");
    if (p || (!gamma && !beta) || n > 500) return p;
    char renamed[512];
    snprintf(renamed, sizeof renamed, "%.*s%s", (int)(n - (gamma ? 5 : 4)), name, gamma ? "weight" : "bias");
    return cg_params_find(ps, renamed);
}

/* The stored name of a tied duplicate's twin in f (with or without the arch's prefix), or NULL. */
static const char *stored_twin(const name_rules *r, const cg_st *f, const char *twin) {
    int j = cg_st_find(f, twin);
    if (j < 0 && r->prefix) {
        char full[256];
        snprintf(full, sizeof full, "%s%s", r->prefix, twin);
        j = cg_st_find(f, full);
    }
    return j < 0 ? NULL : cg_st_name(f, j);
}

/* strict: every parameter must be in f and every tensor of f a parameter (or a known buffer or
 * tied twin). Otherwise missing parameters keep their values and unknown tensors are listed in
 * *skipped, missing parameters in *kept (both malloc'd, NULL when none). Names are mapped here;
 * every check on the values (shapes, dtypes, byte ranges, finite values, tied twins) is the one
 * load step of io/safetensors_load.c, which writes nothing unless all pass. */
static cg_status load_named(cg_model *m, const cg_st *f, bool strict, char **kept, char **skipped) {
    if (!m || !f) return cg_set_error(CG_ERR_ARG, "[model load] NULL model or file");
    const name_rules *r = &rules[m->arch];
    cg_params *ps = m->ps;
    const int np = cg_params_count(ps);
    bool *filled = calloc((size_t)np + 1, sizeof *filled);
    cg_st_load *l = cg_st_load_new();
    cg_status st = filled && l ? CG_OK : cg_set_error(CG_ERR_NOMEM, "[model load] out of memory");
    for (int i = 0; !st && i < cg_st_count(f); i++) {
        const char *stored = cg_st_name(f, i), *name = strip(r, stored);
        bool skip = false;
        for (int k = 0; k < 3 && r->skip_suffix[k]; k++) skip |= ends_with(name, r->skip_suffix[k]);
        if (skip) continue;
        const char *twin = NULL;
        for (int k = 0; k < 2 && r->tied[k][0]; k++)
            if (!strcmp(name, r->tied[k][0]) && !cg_params_find(ps, name)) twin = r->tied[k][1];
        if (twin) {
            const char *twin_stored = stored_twin(r, f, twin);
            cg_tensor *p = cg_params_find(ps, twin);
            if (!strict && !p) { /* the model has no such head (a classifier from a pretrained file) */
                if (!list_add(skipped, stored)) st = cg_set_error(CG_ERR_NOMEM, "[model load] out of memory");
                continue;
            }
            if (!twin_stored && !strict) continue; /* the twin is missing too: it keeps its value */
            if (!p || !twin_stored)
                st = cg_set_error(CG_ERR_FORMAT, "[model load] tied tensor '%s' has no twin '%s' %s", stored, twin,
                                  p ? "in the file" : "among the model's parameters");
            else st = cg_st_load_tie(l, p, f, stored);
            continue;
        }
        cg_tensor *p = find_param(ps, name);
        if (!p && !strict) {
            if (!list_add(skipped, stored)) st = cg_set_error(CG_ERR_NOMEM, "[model load] out of memory");
            continue;
        }
        if (!p) {
            st = cg_set_error(CG_ERR_FORMAT, "[model load] tensor '%s' matches no %s parameter (is the config right?)",
                              stored, cg_arch_name(m->arch));
            break;
        }
        for (int k = 0; k < np; k++)
            if (cg_params_at(ps, k) == p) filled[k] = true;
        st = cg_st_load_add(l, p, f, stored);
    }
    for (int k = 0; !st && k < np; k++)
        if (!filled[k] && (strict || !cg_lora_is_adapter(cg_params_at(ps, k)))) {
            if (strict)
                st = cg_set_error(CG_ERR_FORMAT, "[model load] parameter '%s' %s is missing from the file",
                                  cg_name(cg_params_at(ps, k)), cg_shape_str(cg_params_at(ps, k)));
            else if (!list_add(kept, cg_name(cg_params_at(ps, k))))
                st = cg_set_error(CG_ERR_NOMEM, "[model load] out of memory");
        }
    if (!st) st = cg_st_load_run(l);
    cg_st_load_free(l);
    free(filled);
    return st;
}

cg_status cg_model_load(cg_model *m, const cg_st *f) { return load_named(m, f, true, NULL, NULL); }

cg_status cg_model_load_partial(cg_model *m, const cg_st *f, char **kept, char **skipped) {
    char *k = NULL, *s = NULL;
    cg_status st = load_named(m, f, false, &k, &s);
    if (st) {
        free(k);
        free(s);
        k = s = NULL;
    }
    if (kept) *kept = k;
    else free(k);
    if (skipped) *skipped = s;
    else free(s);
    return st;
}

cg_status cg_model_save(cg_model *m, const char *path) {
    if (!m || !path) return cg_set_error(CG_ERR_ARG, "[model save] NULL argument");
    cg_st_writer *w = cg_st_writer_new();
    if (!w) return CG_ERR_NOMEM;
    char *cfg = cg_model_config_json(m);
    cg_status st = CG_OK; /* the model's own weights: LoRA adapters go to their own file (cg_lora_save) */
    for (int i = 0; !st && i < cg_params_count(m->ps); i++)
        if (!cg_lora_is_adapter(cg_params_at(m->ps, i)))
            st = cg_st_add_tensor(w, cg_name(cg_params_at(m->ps, i)), cg_params_at(m->ps, i));
    if (!st && cfg) st = cg_st_set_metadata(w, "config", cfg);
    if (!st) st = cg_st_set_metadata(w, "arch", cg_arch_name(m->arch));
    if (!st) st = cg_st_write(w, path);
    free(cfg);
    cg_st_writer_free(w);
    return st;
}

/* transformers' own files: GPT2LMHeadModel's tensors live under "transformer.", its lm_head is the
 * tied word embedding and not stored; BertForPreTraining stores its names as they are, without the
 * tied decoder. The "format" metadata is what from_pretrained checks before it reads a file. */
cg_status cg_model_save_hf(cg_model *m, const char *path) {
    if (!m || !path) return cg_set_error(CG_ERR_ARG, "[model save] NULL argument");
    cg_st_writer *w = cg_st_writer_new();
    if (!w) return CG_ERR_NOMEM;
    const char *prefix = m->arch == CG_ARCH_GPT2 ? rules[m->arch].prefix : "";
    cg_status st = cg_st_set_metadata(w, "format", "pt");
    for (int i = 0; !st && i < cg_params_count(m->ps); i++) {
        cg_tensor *p = cg_params_at(m->ps, i);
        if (cg_lora_is_adapter(p)) continue;
        char name[512];
        snprintf(name, sizeof name, "%s%s", prefix, cg_name(p));
        st = cg_st_add_tensor(w, name, p);
    }
    if (!st) st = cg_st_write(w, path);
    cg_st_writer_free(w);
    return st;
}

/* ---- training graphs ---- */

static cg_tensor *add_input(cg_graph *g, cg_model_graph *o, const char *name, int ndim, int64_t a, int64_t b) {
    int64_t s[2] = {a, b};
    cg_tensor *t = cg_input(g, name, CG_INT32, ndim, s);
    if (t && o->n_inputs < 5) o->inputs[o->n_inputs++] = t;
    return t;
}

cg_status cg_model_build(cg_graph *g, cg_model *m, int64_t batch, int64_t t, int64_t s, cg_model_graph *o) {
    if (!g || !m || !o) return cg_set_error(CG_ERR_ARG, "[model build] NULL argument");
    memset(o, 0, sizeof *o);
    switch (m->arch) {
    case CG_ARCH_GPT2:
    case CG_ARCH_LLAMA: {
        cg_tensor *ids = add_input(g, o, "input_ids", 2, batch, t), *tg = add_input(g, o, "targets", 2, batch, t);
        /* Training graphs fuse the LM head with its loss: the [B*T, vocab] logits and their gradient
         * never exist whole (gpt-small: 2 x 206 MB), only a chunk of rows at a time. */
        if (cg_graph_mode(g) == CG_TRAIN && !m->full_logits) {
            o->loss = m->arch == CG_ARCH_LLAMA ? cg_llama_loss(g, m->impl, ids, tg, -100)
                                               : cg_gpt_loss(g, m->impl, ids, tg, -100);
            break;
        }
        cg_tensor *aux = NULL; /* Mixtral's load-balancing loss */
        o->logits = m->arch == CG_ARCH_LLAMA ? cg_llama_logits_aux(g, m->impl, ids, &aux) : cg_gpt_logits(g, m->impl, ids);
        o->loss = cg_cross_entropy(g, o->logits, tg, -100);
        if (m->arch == CG_ARCH_LLAMA) o->loss = cg_llama_add_aux_loss(g, m->impl, o->loss, aux);
        break;
    }
    case CG_ARCH_BERT: {
        if (cg_bert_cfg(m->impl)->num_labels > 0) { /* a classifier: the classifier arch's inputs */
            cg_tensor *ids = add_input(g, o, "input_ids", 2, batch, t),
                      *am = add_input(g, o, "attention_mask", 2, batch, t), *lb = add_input(g, o, "labels", 1, batch, 0);
            o->logits = cg_model_class_logits(g, m, ids, am);
            o->loss = cg_cross_entropy(g, o->logits, lb, -100);
            break;
        }
        cg_tensor *ids = add_input(g, o, "input_ids", 2, batch, t), *tt = add_input(g, o, "token_type_ids", 2, batch, t),
                  *am = add_input(g, o, "attention_mask", 2, batch, t), *lb = add_input(g, o, "labels", 2, batch, t),
                  *ns = add_input(g, o, "next_sentence_label", 1, batch, 0);
        cg_bert_outputs bo;
        const bool fused = cg_graph_mode(g) == CG_TRAIN && !m->full_logits;
        cg_status st = cg_bert_forward_ex(g, m->impl, ids, tt, am, fused ? lb : NULL, &bo);
        if (st) return st;
        o->logits = bo.mlm_logits;
        o->nsp_logits = bo.nsp_logits;
        o->loss = cg_bert_pretraining_loss(g, &bo, lb, ns, &o->mlm_loss, &o->nsp_loss);
        break;
    }
    case CG_ARCH_ENCDEC: {
        cg_tensor *src = add_input(g, o, "src", 2, batch, s), *sm = add_input(g, o, "src_mask", 2, batch, s),
                  *ti = add_input(g, o, "tgt_in", 2, batch, t), *to = add_input(g, o, "tgt_out", 2, batch, t);
        /* Training graphs fuse the generator with the loss: no [B*T, vocab] logits (encdec-base:
         * 33 MB), a chunk of rows at a time, recomputed in backward but for the last. */
        if (cg_graph_mode(g) == CG_TRAIN && !m->full_logits)
            o->loss = cg_encdec_loss(g, m->impl, src, sm, ti, to, -100);
        else o->loss = cg_cross_entropy(g, o->logits = cg_encdec_logits(g, m->impl, src, sm, ti), to, -100);
        break;
    }
    case CG_ARCH_CLASSIFIER: {
        cg_tensor *ids = add_input(g, o, "input_ids", 2, batch, t), *am = add_input(g, o, "attention_mask", 2, batch, t),
                  *lb = add_input(g, o, "labels", 1, batch, 0);
        o->logits = cg_classifier_logits(g, m->impl, ids, am);
        o->loss = cg_cross_entropy(g, o->logits, lb, -100);
        break;
    }
    case CG_ARCH_VIT:
    case CG_ARCH_CNN: {
        int64_t chw[3];
        cg_model_image_shape(m, chw);
        cg_tensor *px = cg_input(g, "pixel_values", CG_REAL, 4, (int64_t[]){batch, chw[0], chw[1], chw[2]});
        if (px) o->inputs[o->n_inputs++] = px;
        cg_tensor *lb = add_input(g, o, "labels", 1, batch, 0);
        o->logits = m->arch == CG_ARCH_VIT ? cg_vit_logits(g, m->impl, px) : cg_cnn_logits(g, m->impl, px);
        o->loss = cg_cross_entropy(g, o->logits, lb, -100);
        break;
    }
    }
    /* The caller reads these after the run; the planner would otherwise recycle them. Large
     * logits are kept only in eval graphs: in training their memory is the gradient's. */
    if (cg_graph_mode(g) == CG_EVAL || cg_model_num_classes(m) > 0) cg_retain(o->logits);
    cg_retain(o->nsp_logits);
    cg_retain(o->mlm_loss);
    cg_retain(o->nsp_loss);
    cg_retain(o->loss);
    return o->loss ? CG_OK : CG_ERR_SHAPE;
}

cg_tensor *cg_model_graph_input(const cg_model_graph *mg, const char *name) {
    for (int i = 0; mg && name && i < mg->n_inputs; i++)
        if (!strcmp(cg_name(mg->inputs[i]), name)) return mg->inputs[i];
    return NULL;
}

int64_t cg_model_num_classes(const cg_model *m) {
    if (m && m->arch == CG_ARCH_CLASSIFIER) return cg_classifier_cfg(m->impl)->num_classes;
    if (m && m->arch == CG_ARCH_BERT) return cg_bert_cfg(m->impl)->num_labels;
    if (m && m->arch == CG_ARCH_VIT) return cg_vit_cfg(m->impl)->num_classes;
    if (m && m->arch == CG_ARCH_CNN) return cg_cnn_cfg(m->impl)->num_classes;
    return 0;
}

int64_t cg_model_max_len(const cg_model *m) {
    if (cg_model_is_decoder(m)) return cg_model_context(m);
    if (m && m->arch == CG_ARCH_BERT) return cg_bert_cfg(m->impl)->max_position_embeddings;
    if (m && m->arch == CG_ARCH_ENCDEC) return cg_encdec_cfg(m->impl)->max_len;
    if (m && m->arch == CG_ARCH_CLASSIFIER) return cg_classifier_cfg(m->impl)->max_len;
    return 0;
}

cg_tensor *cg_model_class_logits(cg_graph *g, cg_model *m, cg_tensor *ids, cg_tensor *attention_mask) {
    if (m && m->arch == CG_ARCH_CLASSIFIER) return cg_classifier_logits(g, m->impl, ids, attention_mask);
    if (m && m->arch == CG_ARCH_VIT) return cg_vit_logits(g, m->impl, ids); /* ids: the pixels */
    if (m && m->arch == CG_ARCH_CNN) return cg_cnn_logits(g, m->impl, ids);
    if (cg_model_num_classes(m) <= 0) {
        cg_set_error(CG_ERR_ARG, "[model] a %s model without a classification head has no class logits",
                 m ? cg_arch_name(m->arch) : "NULL");
        return NULL;
    }
    cg_bert_outputs bo;
    return cg_bert_forward(g, m->impl, ids, NULL, attention_mask, &bo) ? NULL : bo.cls_logits;
}
