/* SPDX-License-Identifier: MIT */
/* GPT-2 LoRA adapters in PEFT's layout for Conv1D weights (fan_in_fan_out): a committed fixture
 * written by tests/make_peft_gpt2_fixture.py (a tiny GPT-2 in transformers' layout, PEFT's adapters
 * on c_attn, c_proj and c_fc, PyTorch's logits of the adapted model and PEFT's merged weights)
 * loads and computes PyTorch's logits; merging gives PEFT's merged weights, which export writes;
 * training moves the loss, and saving gives PEFT's layout back (fan_in_fan_out, the transposed
 * tensors), which loads to the same model. A wrong adapter shape is refused naming the file. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cgrad/cgrad.h>
#include "check.h"
#include "io/safetensors.h"

#define FIX CGRAD_TEST_DIR "/fixtures/peft_gpt2"
enum { B = 2, T = 7, V = 29 };

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL, "cannot open %s", path);
    if (!f) return NULL;
    static char buf[1 << 14];
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

/* The fixture's base GPT-2, its weights loaded (float copies: every parameter trainable). */
static cg_model *base_model(cg_params **ps) {
    *ps = cg_params_new();
    cg_model *m = cg_model_new(CG_ARCH_GPT2, slurp(FIX "/base/config.json"), 0, *ps, 0);
    CHECK(m != NULL, "%s", cg_last_error());
    cg_st *f = cg_st_open(FIX "/base/model.safetensors");
    CHECK(f && m && cg_model_load(m, f) == CG_OK, "%s", cg_last_error());
    cg_st_close(f);
    return m;
}

static void fixture_ids(int32_t *ids) {
    cg_st *f = cg_st_open(FIX "/expected.safetensors");
    CHECK(f && cg_st_read_ids(f, "input_ids", ids, 2, (int64_t[]){B, T}) == CG_OK, "%s", cg_last_error());
    cg_st_close(f);
}

/* Every position's logits of the fixture's ids into out [B, T, V]. */
static void logits(cg_model *m, cg_real *out) {
    cg_graph *g = cg_graph_new(CG_EVAL);
    cg_model_set_full_logits(m, true);
    cg_model_graph mg;
    CHECK(cg_model_build(g, m, B, T, 0, &mg) == CG_OK, "%s", cg_last_error());
    fixture_ids(cg_idata(cg_model_graph_input(&mg, "input_ids")));
    CHECK(cg_graph_forward(g) == CG_OK && cg_read(mg.logits, out) == CG_OK, "%s", cg_last_error());
    cg_model_set_full_logits(m, false);
    cg_graph_free(g);
}

static double max_diff(const cg_real *a, const cg_real *b, int64_t n) {
    double w = 0;
    for (int64_t i = 0; i < n; i++) w = fmax(w, fabs((double)a[i] - (double)b[i]));
    return w;
}

static void expected(const char *name, cg_real *dst, int64_t n) {
    cg_st *f = cg_st_open(FIX "/expected.safetensors");
    CHECK(f && cg_st_read(f, name, dst, -1, NULL) == CG_OK, "%s", cg_last_error());
    (void)n;
    cg_st_close(f);
}

static const char *layers[4] = {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};

/* Loaded: PyTorch's logits; merged: PEFT's merged weights and the same logits; exported: those weights. */
static void test_load_merge_export(void) {
    cg_params *ps;
    cg_model *m = base_model(&ps);
    static cg_real want[B * T * V], got[B * T * V], plain[B * T * V];
    expected("logits", want, B * T * V);
    logits(m, plain);
    CHECK(cg_lora_load_peft(ps, FIX "/adapter") == CG_OK, "%s", cg_last_error());
    logits(m, got);
    CHECK(max_diff(plain, want, B * T * V) > 1e-2, "the adapters change the logits (by %g)", max_diff(plain, want, B * T * V));
    CHECK(max_diff(got, want, B * T * V) <= 2e-5, "adapted logits differ from PyTorch's by %g", max_diff(got, want, B * T * V));
    CHECK(cg_lora_merge(ps) == CG_OK, "%s", cg_last_error());
    logits(m, got);
    CHECK(max_diff(got, want, B * T * V) <= 2e-5, "merged logits differ from PyTorch's by %g", max_diff(got, want, B * T * V));
    static cg_real w[16 * 64], e[16 * 64];
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 4; k++) {
            char name[128], hf[160];
            snprintf(name, sizeof name, "h.%d.%s.weight", i, layers[k]);
            snprintf(hf, sizeof hf, "transformer.%s", name);
            cg_tensor *p = cg_params_find(ps, name);
            CHECK(p && cg_numel(p) <= 16 * 64 && cg_read(p, w) == CG_OK, "%s", name);
            expected(hf, e, cg_numel(p));
            CHECK(max_diff(w, e, cg_numel(p)) <= 1e-6, "%s merged differs from PEFT's merge by %g", name,
                  max_diff(w, e, cg_numel(p)));
        }
    char path[200];
    snprintf(path, sizeof path, "/tmp/cgrad_peft_gpt2_%ld.safetensors", (long)getpid());
    CHECK(cg_model_save_hf(m, path) == CG_OK, "%s", cg_last_error());
    cg_st *f = cg_st_open(path);
    CHECK(f && cg_st_read(f, "transformer.h.1.mlp.c_fc.weight", w, 2, (int64_t[]){16, 64}) == CG_OK, "%s", cg_last_error());
    expected("transformer.h.1.mlp.c_fc.weight", e, 16 * 64);
    CHECK(max_diff(w, e, 16 * 64) <= 1e-6, "exported c_fc differs from PEFT's merge by %g", max_diff(w, e, 16 * 64));
    cg_st_close(f);
    unlink(path);
    cg_model_free(m), cg_params_free(ps);
}

/* The fixture's adapters saved back: PEFT's bytes; trained a step: the loss falls, and the saved
 * adapters load into the model that was trained. */
static void test_save_train(void) {
    cg_params *ps;
    cg_model *m = base_model(&ps);
    CHECK(cg_lora_load_peft(ps, FIX "/adapter") == CG_OK, "%s", cg_last_error());
    char dir[200], cmd[600];
    snprintf(dir, sizeof dir, "/tmp/cgrad_peft_gpt2_%ld", (long)getpid());
    CHECK(cg_lora_save_peft(ps, dir, "../base") == CG_OK, "%s", cg_last_error());
    /* tensor by tensor: the transposes are exact */
    cg_st *a = cg_st_open(FIX "/adapter/adapter_model.safetensors");
    snprintf(cmd, sizeof cmd, "%s/adapter_model.safetensors", dir);
    cg_st *b = cg_st_open(cmd);
    CHECK(a && b && cg_st_count(a) == 16 && cg_st_count(b) == 16, "16 tensors each: %s", cg_last_error());
    for (int i = 0; a && b && i < cg_st_count(a); i++) {
        const char *name = cg_st_name(a, i);
        cg_real x[128], y[128];
        int nd;
        int64_t sh[CG_MAX_DIMS];
        CHECK(cg_st_info(a, name, NULL, &nd, sh) == CG_OK && cg_st_read(a, name, x, nd, sh) == CG_OK &&
                  cg_st_read(b, name, y, nd, sh) == CG_OK && !memcmp(x, y, (size_t)(sh[0] * sh[1]) * sizeof *x),
              "%s: saved differs from PEFT's (%s)", name, cg_last_error());
    }
    cg_st_close(a), cg_st_close(b);
    snprintf(cmd, sizeof cmd, "%s/adapter_config.json", dir);
    const char *cfg = slurp(cmd);
    CHECK(cfg && strstr(cfg, "\"fan_in_fan_out\":\ttrue") && strstr(cfg, "\"c_attn\"") && strstr(cfg, "\"c_proj\"") &&
              strstr(cfg, "\"c_fc\""), "adapter_config.json: %s", cfg ? cfg : "(none)");
    /* one step of gradient descent on the adapters */
    double loss[2];
    for (int step = 0; step < 2; step++) {
        cg_graph *g = cg_graph_new(CG_TRAIN);
        cg_model_graph mg;
        CHECK(cg_model_build(g, m, B, T, 0, &mg) == CG_OK, "%s", cg_last_error());
        int32_t *ids = cg_idata(cg_model_graph_input(&mg, "input_ids")), *tg = cg_idata(cg_model_graph_input(&mg, "targets"));
        fixture_ids(ids);
        for (int i = 0; i < B * T; i++) tg[i] = i % T == T - 1 ? -100 : ids[i + 1];
        cg_params_zero_grad(ps);
        CHECK(cg_graph_forward(g) == CG_OK && cg_graph_backward(g, mg.loss) == CG_OK, "%s", cg_last_error());
        cg_real l;
        cg_read(mg.loss, &l);
        loss[step] = l;
        for (int i = 0; step == 0 && i < cg_params_count(ps); i++) {
            cg_tensor *p = cg_params_at(ps, i);
            if (!cg_lora_is_adapter(p)) continue;
            CHECK(cg_param_trainable(p), "%s trains", cg_name(p));
            static cg_real v[128], d[128];
            cg_read(p, v), cg_read_grad(p, d);
            for (int64_t j = 0; j < cg_numel(p); j++) v[j] -= 0.5 * d[j];
            cg_write(p, v);
        }
        cg_graph_free(g);
    }
    CHECK(loss[1] < loss[0], "a step on the adapters lowers the loss: %g -> %g", loss[0], loss[1]);
    static cg_real trained[B * T * V], again[B * T * V];
    logits(m, trained);
    CHECK(cg_lora_save_peft(ps, dir, "../base") == CG_OK, "%s", cg_last_error());
    cg_params *ps2;
    cg_model *m2 = base_model(&ps2);
    CHECK(cg_lora_load_peft(ps2, dir) == CG_OK, "%s", cg_last_error());
    logits(m2, again);
    CHECK(max_diff(trained, again, B * T * V) == 0, "save -> load changed the logits by %g", max_diff(trained, again, B * T * V));
    cg_model_free(m2), cg_params_free(ps2);
    /* a Conv1D adapter of the wrong shape (lora_A [r, out] as for a Linear): refused naming the file */
    cg_st_writer *w = cg_st_writer_new();
    static cg_real z[2 * 64];
    memset(z, 0, sizeof z);
    cg_st_add(w, "base_model.model.transformer.h.0.mlp.c_fc.lora_A.weight", 2, (int64_t[]){2, 64}, z);
    cg_st_add(w, "base_model.model.transformer.h.0.mlp.c_fc.lora_B.weight", 2, (int64_t[]){16, 2}, z);
    snprintf(cmd, sizeof cmd, "%s/adapter_model.safetensors", dir);
    CHECK(cg_st_write(w, cmd) == CG_OK, "%s", cg_last_error());
    cg_st_writer_free(w);
    m2 = base_model(&ps2);
    const int before = cg_params_count(ps2);
    CHECK(cg_lora_load_peft(ps2, dir) != CG_OK && strstr(cg_last_error(), "adapter_model.safetensors") &&
              strstr(cg_last_error(), "h.0.mlp.c_fc.weight") && strstr(cg_last_error(), "Conv1D") &&
              strstr(cg_last_error(), "want [2, 16] and [64, 2]"),
          "wrong shape: %s", cg_last_error());
    CHECK(cg_params_count(ps2) == before, "a refused load added adapters");
    cg_model_free(m2), cg_params_free(ps2);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "cleanup");
    cg_model_free(m), cg_params_free(ps);
}

int main(void) {
    test_load_merge_export();
    test_save_train();
    TEST_END();
}
