/* One check for every decoder's generation (GPT-2, LLaMA): with and without the KV cache, in four
 * sampling modes, the tokens are the same and sampling does not collapse to a constant; a request
 * past the context and a prompt id outside the vocabulary (13 must be one) fail. Include after
 * cgrad.h and check.h. */
#ifndef CGRAD_TEST_DECODER_CHECK_H
#define CGRAD_TEST_DECODER_CHECK_H
#include <string.h>

/* A decoder's generate call on its model. */
typedef cg_status (*decoder_generate_fn)(const void *model, const int32_t *prompt, int64_t n_prompt, int64_t n_new,
                                         const cg_sampling *s, uint64_t seed, bool use_cache, int32_t *out);

/* The model's context must be under 100 tokens; what names the model in the error message. */
static void check_cached_generation(decoder_generate_fn gen, const void *m, const char *what) {
    int32_t prompt[5] = {1, 4, 2, 9, 3}, a[40], b[40];
    cg_sampling modes[4] = {{0, 0, 0}, {1.0, 0, 0}, {0.8, 5, 0}, {1.2, 0, 0.9}};
    for (int k = 0; k < 4; k++) {
        CHECK(gen(m, prompt, 5, 35, &modes[k], 42 + k, false, a) == CG_OK, "%s", cg_last_error());
        CHECK(gen(m, prompt, 5, 35, &modes[k], 42 + k, true, b) == CG_OK, "%s", cg_last_error());
        int same = 0, distinct = 0;
        for (int i = 0; i < 40; i++) same += a[i] == b[i];
        for (int i = 6; i < 40; i++) distinct += a[i] != a[i - 1];
        CHECK(same == 40, "mode %d: %d of 40 tokens equal with and without cache", k, same);
        CHECK(k == 0 || distinct > 5, "mode %d: sampling produced a near-constant sequence", k);
    }
    CHECK(gen(m, prompt, 5, 100, &modes[0], 1, true, a) == CG_ERR_ARG && strstr(cg_last_error(), what),
          "too long must fail naming %s: %s", what, cg_last_error());
    prompt[2] = 13;
    CHECK(gen(m, prompt, 5, 3, &modes[0], 1, true, a) == CG_ERR_RANGE, "bad prompt id must fail");
}
#endif
