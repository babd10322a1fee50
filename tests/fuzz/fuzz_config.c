/* SPDX-License-Identifier: MIT */
/* Model config parser (config.json, and the "config" a checkpoint stores): every architecture's
 * parser on the same text. A config one of them accepts must survive the library's own save and
 * load (config -> JSON -> config gives the same JSON), since checkpoints store it that way; then
 * the model is built from it, which either works or fails with a message. */
#define FUZZ_MAX_ALLOC_MB "64"
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    cg_set_threads(1);
    return 0;
}

/* Parses text as arch; on success checks that writing and re-reading the config is stable. */
#define ROUND_TRIP(type, parse, to_json)                                                         \
    do {                                                                                         \
        type c1, c2;                                                                             \
        cg_clear_error();                                                                        \
        if (parse(text, &c1) != CG_OK) {                                                         \
            fuzz_expect_message("config");                                                       \
            break;                                                                               \
        }                                                                                        \
        char *j1 = to_json(&c1);                                                                 \
        FUZZ_CHECK(j1, "%s failed", #to_json);                                                   \
        FUZZ_CHECK(parse(j1, &c2) == CG_OK, "%s wrote a config its parser rejects: %s\n  -> %s", \
                   #to_json, j1, cg_last_error());                                               \
        char *j2 = to_json(&c2);                                                                 \
        FUZZ_CHECK(j2 && !strcmp(j1, j2), "config changed in a round trip:\n  %s\n  %s", j1, j2); \
        free(j1);                                                                                \
        free(j2);                                                                                \
        ok = true;                                                                               \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_strndup(data, size);
    for (int a = 0; a <= CG_ARCH_CNN; a++) {
        bool ok = false;
        switch (a) {
        case CG_ARCH_GPT2: ROUND_TRIP(cg_gpt_config, cg_gpt_config_parse, cg_gpt_config_json); break;
        case CG_ARCH_BERT: ROUND_TRIP(cg_bert_config, cg_bert_config_parse, cg_bert_config_json); break;
        case CG_ARCH_ENCDEC: ROUND_TRIP(cg_encdec_config, cg_encdec_config_parse, cg_encdec_config_json); break;
        case CG_ARCH_CLASSIFIER:
            ROUND_TRIP(cg_classifier_config, cg_classifier_config_parse, cg_classifier_config_json);
            break;
        case CG_ARCH_LLAMA: ROUND_TRIP(cg_llama_config, cg_llama_config_parse, cg_llama_config_json); break;
        case CG_ARCH_VIT: ROUND_TRIP(cg_vit_config, cg_vit_config_parse, cg_vit_config_json); break;
        case CG_ARCH_CNN: ROUND_TRIP(cg_cnn_config, cg_cnn_config_parse, cg_cnn_config_json); break;
        }
        if (!ok) continue;
        cg_params *ps = cg_params_new();
        FUZZ_CHECK(ps, "out of memory in the harness");
        /* a valid config may describe a model of billions of parameters: building it checks every
         * shape, but filling its values would only time the random fill (corpus: huge_model.json) */
        cg_params_defer_init(ps, true);
        cg_clear_error();
        cg_model *m = cg_model_new((cg_arch)a, text, 0.0, ps, 1);
        if (!m) fuzz_expect_message(NULL);
        else FUZZ_CHECK(cg_params_count(ps) > 0, "a model without parameters");
        cg_model_free(m);
        cg_params_free(ps);
    }
    free(text);
    return 0;
}
