/* SPDX-License-Identifier: MIT */
/* config.json of the LLaMA-style families (llama, mistral, qwen2, qwen3), read and written as
 * transformers' LlamaConfig, MistralConfig, Qwen2Config and Qwen3Config have them. Every field is in
 * one of three lists: the family's own (honoured), the ones every transformers config may carry
 * without effect on the numbers (accepted), and the rest, refused by name: a field cgrad does not
 * implement must not pass silently, since the model would then compute other numbers than the one
 * the file describes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/config_json.h"
#include "models/llama.h"

static const char *const family_names[] = {"llama", "mistral", "qwen2", "qwen3", "mixtral"};
static const char *const family_classes[] = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                                             "Qwen3ForCausalLM", "MixtralForCausalLM"};
#define N_FAMILIES (int)(sizeof family_names / sizeof family_names[0])

const char *cg_llama_family_name(cg_llama_family f) { return (unsigned)f < N_FAMILIES ? family_names[f] : "?"; }
const char *cg_llama_family_class(cg_llama_family f) { return (unsigned)f < N_FAMILIES ? family_classes[f] : "?"; }

/* Fields every family reads. */
static const char *const common_fields[] = {
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling",
    "tie_word_embeddings", "hidden_act", "attention_dropout", NULL};
/* Fields of one family only (honoured there, refused elsewhere). */
static const char *const family_fields[][8] = {
    {"attention_bias", "mlp_bias", NULL},
    {"sliding_window", NULL},
    {"sliding_window", "use_sliding_window", "max_window_layers", "layer_types", NULL},
    {"attention_bias", "sliding_window", "use_sliding_window", "max_window_layers", "layer_types", NULL},
    {"sliding_window", "num_local_experts", "num_experts_per_tok", "router_aux_loss_coef", "output_router_logits",
     "router_jitter_noise", "capacity_factor", NULL},
};
_Static_assert(sizeof family_fields / sizeof family_fields[0] == N_FAMILIES, "a field list per family");
/* PretrainedConfig's fields that name tokens, describe the file or steer generation and tooling:
 * none changes the logits. pretraining_tp splits LLaMA's products into slices whose sum is the same
 * product; _attn_implementation picks a kernel of the same attention. */
static const char *const inert_fields[] = {
    "architectures", "model_type", "transformers_version", "torch_dtype", "use_cache", "bos_token_id",
    "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id", "initializer_range",
    "_name_or_path", "_attn_implementation", "_commit_hash", "pretraining_tp", "tokenizer_class", "id2label",
    "label2id", "output_attentions", "output_hidden_states", "return_dict", "torchscript", "use_bfloat16",
    "is_decoder", "is_encoder_decoder", "add_cross_attention", "tie_encoder_decoder", "problem_type",
    "finetuning_task", "task_specific_params", "prefix", "chunk_size_feed_forward", "max_length", "min_length",
    "do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty", "temperature", "top_k",
    "top_p", "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "output_scores",
    "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens", "tf_legacy_loss",
    "is_llama_config", NULL};
/* Fields transformers' config classes keep without reading (nanotron's is_llama_config and
 * rope_interleaved in SmolLM's LLaMA configs; Qwen2.5's use_mrope), accepted while they say false,
 * refused when they would ask for something else: interleaved rotary pairs, Qwen2-VL's multimodal
 * rotary positions. */
static const char *const false_only_fields[] = {"rope_interleaved", "use_mrope", NULL};
/* Mixture-of-experts fields (Mixtral's, Qwen2-MoE's, Qwen3-MoE's): refused outside their family. */
static const char *const moe_fields[] = {"num_local_experts", "num_experts", "num_experts_per_tok",
                                         "moe_intermediate_size", "shared_expert_intermediate_size",
                                         "decoder_sparse_step", "router_aux_loss_coef", "router_jitter_noise",
                                         "output_router_logits", "mlp_only_layers", "norm_topk_prob", "capacity_factor",
                                         NULL};

static bool listed(const char *const *list, const char *key) {
    for (; *list; list++)
        if (!strcmp(*list, key)) return true;
    return false;
}

/* Every key of o is one the family honours or one without effect on the numbers. */
static bool fields_known(const cJSON *o, cg_llama_family f, const char *what) {
    const char *mt = family_names[f];
    for (const cJSON *v = o->child; v; v = v->next) {
        const char *k = v->string;
        if (listed(common_fields, k) || listed(family_fields[f], k) || listed(inert_fields, k)) continue;
        if (listed(false_only_fields, k)) {
            if (cJSON_IsFalse(v) || cJSON_IsNull(v)) continue;
            return cg_set_error(CG_ERR_FORMAT, "[%s] field \"%s\" other than false is not implemented (%s): it would "
                                "change the model's numbers, so it is refused", what, k,
                                !strcmp(k, "use_mrope") ? "Qwen2-VL's multimodal rotary positions"
                                                        : "cgrad rotates half-split pairs, as transformers does"), false;
        }
        if (listed(moe_fields, k))
            return cg_set_error(CG_ERR_FORMAT, "[%s] field \"%s\" belongs to a mixture-of-experts model (Mixtral, "
                                "Qwen-MoE): cgrad's MoE layer is Mixtral's, so model_type %s with it is refused", what,
                                k, mt), false;
        if (!strcmp(k, "sliding_window"))
            return cg_set_error(CG_ERR_FORMAT, "[%s] field \"sliding_window\" is not part of model_type %s, which attends "
                                "to every earlier key (a model with a sliding window is model_type mistral)", what, mt), false;
        return cg_set_error(CG_ERR_FORMAT, "[%s] field \"%s\" is not one cgrad implements for model_type %s: it may "
                            "change the model's numbers, so it is refused rather than ignored", what, k, mt), false;
    }
    return true;
}

/* The family config.json's model_type names ("llama" when absent). */
static bool family_of(const cJSON *o, cg_llama_family *f, const char *what) {
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(o, "model_type");
    *f = CG_LLAMA_FAMILY_LLAMA;
    if (!mt || cJSON_IsNull(mt)) return true;
    if (!cJSON_IsString(mt)) return cg_set_error(CG_ERR_FORMAT, "[%s] model_type must be a string", what), false;
    for (int i = 0; i < N_FAMILIES; i++)
        if (!strcmp(mt->valuestring, family_names[i])) return *f = (cg_llama_family)i, true;
    if (strstr(mt->valuestring, "moe"))
        return cg_set_error(CG_ERR_FORMAT, "[%s] model_type \"%s\" is a mixture-of-experts model cgrad does not have "
                            "(its MoE family is mixtral; llama, mistral, qwen2, qwen3, mixtral load)", what,
                            mt->valuestring), false;
    return cg_set_error(CG_ERR_FORMAT, "[%s] model_type \"%s\" is not a LLaMA-style family cgrad has (llama, mistral, "
                        "qwen2, qwen3, mixtral)", what, mt->valuestring), false;
}

/* architectures, when given, names the family's causal LM: another head (ForSequenceClassification,
 * ForTokenClassification, ...) holds other tensors and computes other outputs. */
static bool architectures_ok(const cJSON *o, cg_llama_family f, const char *what) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "architectures");
    if (!a || cJSON_IsNull(a)) return true;
    if (!cJSON_IsArray(a)) return cg_set_error(CG_ERR_FORMAT, "[%s] architectures must be an array of class names", what), false;
    for (const cJSON *v = a->child; v; v = v->next)
        if (!cJSON_IsString(v) || strcmp(v->valuestring, family_classes[f]))
            return cg_set_error(CG_ERR_FORMAT, "[%s] architectures names %s, but cgrad builds %s for model_type %s", what,
                                cJSON_IsString(v) ? v->valuestring : "a non-string", family_classes[f], family_names[f]), false;
    return true;
}

/* rope_scaling: null, or {"rope_type" (or the older "type"): "linear" | "llama3" | "default", ...}. */
static bool parse_rope_scaling(const cJSON *o, cg_rope_config *r, const char *what) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "rope_scaling");
    if (!s || cJSON_IsNull(s)) return true;
    if (!cJSON_IsObject(s)) return cg_set_error(CG_ERR_FORMAT, "[%s] rope_scaling must be an object or null", what), false;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(s, "rope_type");
    if (!ty) ty = cJSON_GetObjectItemCaseSensitive(s, "type");
    const char *t = cJSON_IsString(ty) ? ty->valuestring : NULL;
    double factor = 0, lo = 0, hi = 0;
    int64_t orig = 0;
    if (!t) return cg_set_error(CG_ERR_FORMAT, "[%s] rope_scaling needs a \"rope_type\" string", what), false;
    if (!strcmp(t, "default")) return true;
    if (strcmp(t, "linear") && strcmp(t, "llama3"))
        return cg_set_error(CG_ERR_FORMAT, "[%s] rope_scaling type \"%s\" is not supported (linear, llama3)", what, t), false;
    if (!cgi_json_num(s, "factor", true, 0, &factor, what)) return false;
    if (!strcmp(t, "linear")) {
        if (!(factor >= 1)) return cg_set_error(CG_ERR_FORMAT, "[%s] rope_scaling factor %g must be >= 1", what, factor), false;
        r->linear_factor = factor;
        return true;
    }
    if (!cgi_json_num(s, "low_freq_factor", true, 0, &lo, what) || !cgi_json_num(s, "high_freq_factor", true, 0, &hi, what) ||
        !cgi_json_int(s, "original_max_position_embeddings", true, 0, &orig, what))
        return false;
    if (!(factor >= 1 && lo > 0 && hi > lo && orig > 0))
        return cg_set_error(CG_ERR_FORMAT, "[%s] rope_scaling llama3 needs factor %g >= 1, 0 < low_freq_factor %g < "
                            "high_freq_factor %g and original_max_position_embeddings %lld > 0",
                            what, factor, lo, hi, (long long)orig), false;
    r->llama3_factor = factor, r->llama3_low_freq_factor = lo, r->llama3_high_freq_factor = hi;
    r->llama3_original_context = orig;
    return true;
}

/* A boolean field: absent or null gives dflt. */
static bool json_bool(const cJSON *o, const char *key, bool dflt, bool *out, const char *what) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = dflt;
    if (!f || cJSON_IsNull(f)) return true;
    if (!cJSON_IsBool(f)) return cg_set_error(CG_ERR_FORMAT, "[%s] field \"%s\" must be true or false", what, key), false;
    *out = cJSON_IsTrue(f);
    return true;
}

/* Qwen's layer_types, when given (it overrides max_window_layers): full attention on the first layers
 * and the window on the rest is what use_sliding_window and max_window_layers express (and
 * transformers derives when it is absent); another pattern is refused. */
static bool parse_layer_types(const cJSON *o, cg_llama_config *c, const char *what) {
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(o, "layer_types");
    if (!lt || cJSON_IsNull(lt)) return true;
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != c->num_hidden_layers)
        return cg_set_error(CG_ERR_FORMAT, "[%s] layer_types must be an array of num_hidden_layers = %lld strings", what,
                            (long long)c->num_hidden_layers), false;
    int64_t first_sliding = -1, i = 0;
    for (const cJSON *v = lt->child; v; v = v->next, i++) {
        const char *s = cJSON_GetStringValue(v);
        const bool sliding = s && !strcmp(s, "sliding_attention");
        if (!s || (!sliding && strcmp(s, "full_attention")))
            return cg_set_error(CG_ERR_FORMAT, "[%s] layer_types[%lld] must be \"full_attention\" or \"sliding_attention\"",
                                what, (long long)i), false;
        if (sliding && first_sliding < 0) first_sliding = i;
        if (!sliding && first_sliding >= 0)
            return cg_set_error(CG_ERR_FORMAT, "[%s] layer_types: full attention at layer %lld after a sliding layer; cgrad "
                                "implements full attention on the first layers and the window on the rest", what,
                                (long long)i), false;
    }
    /* transformers keeps sliding_window only with use_sliding_window: without it a "sliding_attention"
     * layer has no window */
    if (first_sliding >= 0 && c->use_sliding_window) c->max_window_layers = first_sliding;
    else if (first_sliding < 0 && c->use_sliding_window && c->sliding_window > 0 &&
             c->max_window_layers < c->num_hidden_layers)
        c->max_window_layers = c->num_hidden_layers; /* every layer full: none from max_window_layers on */
    /* without a window max_window_layers changes nothing and is kept as given, so a config written
     * back reads as the same config */
    return true;
}

/* Family defaults for absent fields, as transformers' config classes have them. */
static void family_defaults(cg_llama_family f, int64_t *kv_heads, int64_t *head_dim, int64_t *positions, int64_t *window,
                            double *eps, double *theta) {
    const bool mistral = f == CG_LLAMA_FAMILY_MISTRAL || f == CG_LLAMA_FAMILY_MIXTRAL;
    *kv_heads = mistral ? 8 : f == CG_LLAMA_FAMILY_LLAMA ? 0 : 32;
    *head_dim = f == CG_LLAMA_FAMILY_QWEN3 ? 128 : 0;
    *positions = f == CG_LLAMA_FAMILY_LLAMA ? 2048 : mistral ? 4096 * 32 : 32768;
    *window = f == CG_LLAMA_FAMILY_LLAMA || f == CG_LLAMA_FAMILY_MIXTRAL ? 0 : 4096; /* MixtralConfig: None */
    *eps = f == CG_LLAMA_FAMILY_MIXTRAL ? 1e-5 : 1e-6;
    *theta = f == CG_LLAMA_FAMILY_MIXTRAL ? 1e6 : 10000.0;
}

/* Mixtral's expert fields, with MixtralConfig's defaults (8 experts, 2 a token, coefficient 0.001);
 * router_jitter_noise (multiplicative noise on the router's input in training) is refused unless 0.
 * capacity_factor is cgrad's own (Switch Transformers' name; MixtralConfig has none): 0, dropless,
 * when absent. */
static bool parse_experts(const cJSON *o, cg_llama_config *c, const char *what) {
    double jitter = 0;
    if (c->family != CG_LLAMA_FAMILY_MIXTRAL) return true;
    if (!cgi_json_int(o, "num_local_experts", false, 8, &c->num_local_experts, what) ||
        !cgi_json_int(o, "num_experts_per_tok", false, 2, &c->num_experts_per_tok, what) ||
        !cgi_json_num(o, "router_aux_loss_coef", false, 0.001, &c->router_aux_loss_coef, what) ||
        !json_bool(o, "output_router_logits", false, &c->output_router_logits, what) ||
        !cgi_json_num(o, "router_jitter_noise", false, 0, &jitter, what) ||
        !cgi_json_num(o, "capacity_factor", false, 0, &c->capacity_factor, what))
        return false;
    if (!(c->capacity_factor >= 0))
        return cg_set_error(CG_ERR_FORMAT, "[%s] field \"capacity_factor\" %g must be >= 0 (0: dropless)", what,
                            c->capacity_factor), false;
    if (jitter != 0)
        return cg_set_error(CG_ERR_FORMAT, "[%s] field \"router_jitter_noise\" %g is not implemented (only 0): it "
                            "would change the model's numbers in training, so it is refused", what, jitter), false;
    if (c->num_local_experts < 1 || c->num_experts_per_tok < 1 || c->num_experts_per_tok > c->num_local_experts ||
        !(c->router_aux_loss_coef >= 0))
        return cg_set_error(CG_ERR_FORMAT, "[%s] num_local_experts %lld >= 1, num_experts_per_tok %lld in 1..experts and "
                            "router_aux_loss_coef %g >= 0 are needed", what, (long long)c->num_local_experts,
                            (long long)c->num_experts_per_tok, c->router_aux_loss_coef), false;
    return true;
}

cg_status cg_llama_config_parse(const char *json, cg_llama_config *c) {
    const char *what = "llama config";
    if (!c) return cg_set_error(CG_ERR_ARG, "[%s] NULL config", what);
    cJSON *o = cgi_json_object(json, what);
    if (!o) return CG_ERR_FORMAT;
    memset(c, 0, sizeof *c);
    cg_llama_family f;
    bool ok = family_of(o, &f, what);
    int64_t d_kv = 0, d_hd = 0, d_pos = 0, d_win = 0;
    double d_eps = 1e-6, d_theta = 10000.0;
    if (ok) family_defaults(f, &d_kv, &d_hd, &d_pos, &d_win, &d_eps, &d_theta);
    const bool qwen = f == CG_LLAMA_FAMILY_QWEN2 || f == CG_LLAMA_FAMILY_QWEN3;
    bool attn_bias = false, mlp_bias = false;
    const cJSON *win = cJSON_GetObjectItemCaseSensitive(o, "sliding_window");
    c->family = f;
    ok = ok && architectures_ok(o, f, what) && fields_known(o, f, what) &&
         cgi_json_int(o, "vocab_size", true, 0, &c->vocab_size, what) &&
         cgi_json_int(o, "hidden_size", true, 0, &c->hidden_size, what) &&
         cgi_json_int(o, "intermediate_size", true, 0, &c->intermediate_size, what) &&
         cgi_json_int(o, "num_hidden_layers", true, 0, &c->num_hidden_layers, what) &&
         cgi_json_int(o, "num_attention_heads", true, 0, &c->num_attention_heads, what) &&
         cgi_json_int(o, "num_key_value_heads", false, d_kv, &c->num_key_value_heads, what) &&
         cgi_json_int(o, "head_dim", false, d_hd, &c->head_dim, what) &&
         cgi_json_int(o, "max_position_embeddings", false, d_pos, &c->max_position_embeddings, what) &&
         cgi_json_num(o, "rms_norm_eps", false, d_eps, &c->rms_norm_eps, what) &&
         cgi_json_num(o, "rope_theta", false, d_theta, &c->rope.theta, what) && parse_rope_scaling(o, &c->rope, what) &&
         json_bool(o, "tie_word_embeddings", false, &c->tie_word_embeddings, what) &&
         cgi_json_num(o, "attention_dropout", false, 0, &c->attention_dropout, what) &&
         json_bool(o, "attention_bias", false, &attn_bias, what) && json_bool(o, "mlp_bias", false, &mlp_bias, what) &&
         /* null: no window (Mistral v0.2 on); absent: the family's default */
         cgi_json_int(o, "sliding_window", false, win && cJSON_IsNull(win) ? 0 : d_win, &c->sliding_window, what) &&
         json_bool(o, "use_sliding_window", false, &c->use_sliding_window, what) &&
         cgi_json_int(o, "max_window_layers", false, 28, &c->max_window_layers, what) && parse_experts(o, c, what);
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(o, "hidden_act");
    if (ok && act && !cJSON_IsNull(act) && !(cJSON_IsString(act) && !strcmp(act->valuestring, "silu")))
        ok = !cg_set_error(CG_ERR_FORMAT, "[%s] hidden_act must be \"silu\" (SwiGLU), got %s", what,
                           cJSON_IsString(act) ? act->valuestring : "a non-string");
    if (ok && win && !cJSON_IsNull(win) && c->sliding_window <= 0)
        ok = !cg_set_error(CG_ERR_FORMAT, "[%s] sliding_window %lld must be >= 1 (or null: no window)", what,
                           (long long)c->sliding_window);
    if (ok && !(c->attention_dropout >= 0 && c->attention_dropout < 1))
        ok = !cg_set_error(CG_ERR_FORMAT, "[%s] attention_dropout %g must be in [0, 1)", what, c->attention_dropout);
    if (ok && qwen && c->sliding_window <= 0) c->use_sliding_window = false; /* transformers: no window, none used */
    if (ok && qwen) ok = parse_layer_types(o, c, what);
    if (ok && !qwen) c->max_window_layers = 0;
    if (ok && qwen && !c->use_sliding_window) c->sliding_window = win ? c->sliding_window : 0;
    c->qkv_bias = f == CG_LLAMA_FAMILY_QWEN2 || attn_bias;
    c->o_bias = attn_bias;
    c->mlp_bias = mlp_bias;
    c->qk_norm = f == CG_LLAMA_FAMILY_QWEN3;
    cJSON_Delete(o);
    return ok ? CG_OK : CG_ERR_FORMAT;
}

int64_t cg_llama_layer_window(const cg_llama_config *c, int64_t layer) {
    if (!c || c->sliding_window <= 0) return 0;
    if (c->family == CG_LLAMA_FAMILY_MISTRAL || c->family == CG_LLAMA_FAMILY_MIXTRAL) return c->sliding_window;
    if ((c->family == CG_LLAMA_FAMILY_QWEN2 || c->family == CG_LLAMA_FAMILY_QWEN3) && c->use_sliding_window &&
        layer >= c->max_window_layers)
        return c->sliding_window;
    return 0;
}

static void add_int(cJSON *o, const char *key, int64_t v) { cJSON_AddNumberToObject(o, key, (double)v); }

/* rope_scaling as transformers writes it, or null. */
static cJSON *rope_scaling_json(const cg_rope_config *r) {
    if (r->llama3_factor > 0) {
        cJSON *s = cJSON_CreateObject();
        cJSON_AddStringToObject(s, "rope_type", "llama3");
        cJSON_AddNumberToObject(s, "factor", r->llama3_factor);
        cJSON_AddNumberToObject(s, "low_freq_factor", r->llama3_low_freq_factor);
        cJSON_AddNumberToObject(s, "high_freq_factor", r->llama3_high_freq_factor);
        add_int(s, "original_max_position_embeddings", r->llama3_original_context);
        return s;
    }
    if (r->linear_factor > 0) {
        cJSON *s = cJSON_CreateObject();
        cJSON_AddStringToObject(s, "rope_type", "linear");
        cJSON_AddNumberToObject(s, "factor", r->linear_factor);
        return s;
    }
    return cJSON_CreateNull();
}

/* Appends v to buf[*n] as JSON with a space after each ':' and ',' (the house style of config texts);
 * false when it does not fit. */
static bool print_spaced(const cJSON *v, char *buf, size_t cap, size_t *n) {
    if (!cJSON_IsObject(v)) {
        char *s = cJSON_PrintUnformatted(v);
        const bool fits = s && *n + strlen(s) < cap;
        if (fits) *n += (size_t)snprintf(buf + *n, cap - *n, "%s", s);
        free(s);
        return fits;
    }
    bool ok = *n + 1 < cap;
    if (ok) buf[(*n)++] = '{';
    for (const cJSON *e = v->child; ok && e; e = e->next) {
        const int w = snprintf(buf + *n, cap - *n, "%s\"%s\": ", e == v->child ? "" : ", ", e->string);
        ok = w > 0 && *n + (size_t)w < cap;
        if (ok) *n += (size_t)w, ok = print_spaced(e, buf, cap, n);
    }
    ok = ok && *n + 2 < cap;
    if (ok) buf[(*n)++] = '}', buf[*n] = 0;
    return ok;
}

char *cg_llama_config_json(const cg_llama_config *c) {
    if (!c || (unsigned)c->family >= N_FAMILIES) return NULL;
    const cg_llama_family f = c->family;
    const int64_t kv = c->num_key_value_heads > 0 ? c->num_key_value_heads : c->num_attention_heads,
                  hd = c->head_dim > 0 ? c->head_dim : c->num_attention_heads > 0 ? c->hidden_size / c->num_attention_heads : 0;
    cJSON *o = cJSON_CreateObject(), *archs = cJSON_AddArrayToObject(o, "architectures");
    cJSON_AddItemToArray(archs, cJSON_CreateString(family_classes[f]));
    cJSON_AddStringToObject(o, "model_type", family_names[f]);
    add_int(o, "vocab_size", c->vocab_size);
    add_int(o, "hidden_size", c->hidden_size);
    add_int(o, "intermediate_size", c->intermediate_size);
    add_int(o, "num_hidden_layers", c->num_hidden_layers);
    add_int(o, "num_attention_heads", c->num_attention_heads);
    add_int(o, "num_key_value_heads", kv);
    add_int(o, "head_dim", hd);
    add_int(o, "max_position_embeddings", c->max_position_embeddings);
    cJSON_AddNumberToObject(o, "rms_norm_eps", c->rms_norm_eps);
    cJSON_AddNumberToObject(o, "rope_theta", c->rope.theta);
    cJSON_AddItemToObject(o, "rope_scaling", rope_scaling_json(&c->rope));
    cJSON_AddBoolToObject(o, "tie_word_embeddings", c->tie_word_embeddings);
    cJSON_AddStringToObject(o, "hidden_act", "silu");
    cJSON_AddNumberToObject(o, "attention_dropout", c->attention_dropout);
    if (f == CG_LLAMA_FAMILY_LLAMA || f == CG_LLAMA_FAMILY_QWEN3) cJSON_AddBoolToObject(o, "attention_bias", c->o_bias);
    if (f == CG_LLAMA_FAMILY_LLAMA) cJSON_AddBoolToObject(o, "mlp_bias", c->mlp_bias);
    if (f != CG_LLAMA_FAMILY_LLAMA) {
        if (c->sliding_window > 0) add_int(o, "sliding_window", c->sliding_window);
        else cJSON_AddNullToObject(o, "sliding_window");
    }
    if (f == CG_LLAMA_FAMILY_MIXTRAL) {
        add_int(o, "num_local_experts", c->num_local_experts);
        add_int(o, "num_experts_per_tok", c->num_experts_per_tok);
        cJSON_AddNumberToObject(o, "router_aux_loss_coef", c->router_aux_loss_coef);
        cJSON_AddBoolToObject(o, "output_router_logits", c->output_router_logits);
        cJSON_AddNumberToObject(o, "router_jitter_noise", 0);
        if (c->capacity_factor > 0) cJSON_AddNumberToObject(o, "capacity_factor", c->capacity_factor); /* cgrad's own */
    }
    if (f == CG_LLAMA_FAMILY_QWEN2 || f == CG_LLAMA_FAMILY_QWEN3) {
        cJSON_AddBoolToObject(o, "use_sliding_window", c->use_sliding_window);
        add_int(o, "max_window_layers", c->max_window_layers);
        cJSON *types = cJSON_AddArrayToObject(o, "layer_types"); /* as transformers saves it */
        for (int64_t i = 0; types && i < c->num_hidden_layers && i < 1 << 20; i++)
            cJSON_AddItemToArray(types, cJSON_CreateString(cg_llama_layer_window(c, i) ? "sliding_attention" : "full_attention"));
    }
    /* the longest config, every number at its widest, is about 1300 bytes and 21 a layer type */
    const size_t cap = 2048 + 24 * (size_t)(c->num_hidden_layers > 0 && c->num_hidden_layers < 1 << 20 ? c->num_hidden_layers : 0);
    size_t n = 0;
    char *s = malloc(cap);
    if (s && !print_spaced(o, s, cap, &n)) free(s), s = NULL;
    cJSON_Delete(o);
    if (!s) cg_set_error(CG_ERR_NOMEM, "[llama config] out of memory writing the config");
    return s;
}
