/* SPDX-License-Identifier: MIT */
/* LoRA adapters in PEFT's layout: a committed fixture written by tests/make_peft_fixture.py (PEFT's
 * names and config, PyTorch's outputs of the adapted layers) loads and computes PyTorch's outputs;
 * save then load gives identical outputs; merging computes what the unmerged adapters compute, also
 * on a base read in place as bf16; configs PEFT would compute differently are refused by name;
 * fan_in_fan_out on Linear modules computes as without it, as in PEFT. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cgrad/cgrad.h>
#include "check.h"
#include "io/safetensors.h"

#define FIX CGRAD_TEST_DIR "/fixtures/peft"
static const char *modules[2] = {"model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj"};

/* A parameter set with the fixture's two base weights (names "<module>.weight"). */
static cg_params *base_params(void) {
    cg_st *f = cg_st_open(FIX "/base.safetensors");
    CHECK(f != NULL, "%s", cg_last_error());
    cg_params *ps = cg_params_new();
    for (int m = 0; f && m < 2; m++) {
        char name[200];
        int nd;
        int64_t sh[CG_MAX_DIMS];
        snprintf(name, sizeof name, "%s.weight", modules[m]);
        cg_st_info(f, name, NULL, &nd, sh);
        cg_tensor *w = cg_params_add(ps, name, nd, sh);
        cg_real buf[64];
        CHECK(cg_st_read(f, name, buf, nd, sh) == CG_OK, "%s", cg_last_error());
        cg_write(w, buf);
    }
    cg_st_close(f);
    return ps;
}

/* linear(x, W) of module m (with its adapter, if any) on the fixture's x into y; its element count. */
static int64_t forward(cg_params *ps, int m, cg_real *y) {
    cg_st *f = cg_st_open(FIX "/base.safetensors");
    char name[200];
    int nd;
    int64_t sh[CG_MAX_DIMS];
    snprintf(name, sizeof name, "%s.x", modules[m]);
    cg_st_info(f, name, NULL, &nd, sh);
    cg_graph *g = cg_graph_new(CG_EVAL);
    cg_tensor *x = cg_input(g, "x", CG_REAL, nd, sh);
    cg_real xv[64];
    cg_st_read(f, name, xv, nd, sh);
    cg_write(x, xv);
    snprintf(name, sizeof name, "%s.weight", modules[m]);
    cg_tensor *out = cg_linear(g, x, cg_params_find(ps, name), NULL);
    cg_retain(out);
    int64_t n = 0;
    if (cg_graph_forward(g) == CG_OK && cg_read(out, y) == CG_OK) n = cg_numel(out);
    else CHECK(0, "%s", cg_last_error());
    cg_graph_free(g);
    cg_st_close(f);
    return n;
}

static void test_fixture(void) {
    cg_params *ps = base_params();
    CHECK(cg_lora_load_peft(ps, FIX "/adapter") == CG_OK, "%s", cg_last_error());
    cg_st *f = cg_st_open(FIX "/base.safetensors");
    for (int m = 0; m < 2; m++) {
        cg_real y[64], want[64];
        const int64_t n = forward(ps, m, y);
        char name[200];
        snprintf(name, sizeof name, "%s.y", modules[m]);
        CHECK(cg_st_read(f, name, want, -1, NULL) == CG_OK, "%s", cg_last_error());
        double worst = 0;
        for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(y[i] - want[i]));
        CHECK(n > 0 && worst <= 1e-5, "%s: PyTorch's output differs by %.3g", modules[m], worst);
    }
    cg_st_close(f);
    /* the adapters train, the bases do not */
    CHECK(!cg_param_trainable(cg_params_find(ps, "model.layers.0.mlp.down_proj.weight")) &&
              cg_param_trainable(cg_params_find(ps, "model.layers.0.mlp.down_proj.weight.lora_A")),
          "trainable flags after loading");
    cg_params_free(ps);
}

static void test_round_trip_and_merge(void) {
    cg_params *ps = base_params();
    CHECK(cg_lora_load_peft(ps, FIX "/adapter") == CG_OK, "%s", cg_last_error());
    char dir[200];
    snprintf(dir, sizeof dir, "/tmp/cgrad_peft_%ld", (long)getpid());
    CHECK(cg_lora_save_peft(ps, dir, "tiny-llama-test") == CG_OK, "%s", cg_last_error());
    char path[300];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    char *cfg = test_slurp(path, NULL);
    CHECK(cfg && strstr(cfg, "\"r\":\t2") && strstr(cfg, "\"lora_alpha\":\t6") && strstr(cfg, "\"q_proj\"") &&
              strstr(cfg, "\"down_proj\"") && strstr(cfg, "\"peft_type\":\t\"LORA\"") && strstr(cfg, "tiny-llama-test"),
          "adapter_config.json: %s", cfg ? cfg : "(missing)");
    free(cfg);
    cg_params *again = base_params();
    CHECK(cg_lora_load_peft(again, dir) == CG_OK, "%s", cg_last_error());
    cg_real y1[64], y2[64], y3[64];
    for (int m = 0; m < 2; m++) {
        const int64_t n = forward(ps, m, y1);
        CHECK(n == forward(again, m, y2) && !memcmp(y1, y2, (size_t)n * sizeof *y1), "%s: the round trip changed the output",
              modules[m]);
    }
    /* merged: the same function, within float rounding */
    CHECK(cg_lora_merge(again) == CG_OK, "%s", cg_last_error());
    for (int m = 0; m < 2; m++) {
        const int64_t n = forward(ps, m, y1);
        forward(again, m, y3);
        double worst = 0;
        for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(y1[i] - y3[i]));
        CHECK(worst <= 1e-5, "%s: merged differs from unmerged by %.3g", modules[m], worst);
    }
    snprintf(path, sizeof path, "rm -rf %s", dir);
    CHECK(system(path) == 0, "cleanup");
    cg_params_free(again);
    cg_params_free(ps);
}

/* A frozen base read in place as bf16 merges into a float copy: merged = unmerged. */
static void test_merge_mapped(void) {
    cg_params *ps = base_params();
    cg_tensor *w = cg_params_find(ps, "model.layers.0.mlp.down_proj.weight");
    static uint16_t bits[40];
    cg_real v[40];
    cg_read(w, v);
    for (int i = 0; i < 40; i++) { /* bf16 by truncation: the mapped value is exactly these */
        float x = (float)v[i];
        uint32_t u;
        memcpy(&u, &x, 4);
        bits[i] = (uint16_t)(u >> 16);
    }
    cg_param_set_trainable(w, false);
    CHECK(cg_param_map(w, bits, CG_MAP_BF16) == CG_OK, "%s", cg_last_error());
    CHECK(cg_lora_load_peft(ps, FIX "/adapter") == CG_OK, "%s", cg_last_error());
    cg_real y1[64], y2[64];
    const int64_t n = forward(ps, 1, y1);
    CHECK(cg_lora_merge(ps) == CG_OK, "%s", cg_last_error());
    forward(ps, 1, y2);
    double worst = 0;
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(y1[i] - y2[i]));
    CHECK(n > 0 && worst <= 1e-5, "mapped base: merged differs from unmerged by %.3g", worst);
    cg_params_free(ps);
}

/* fan_in_fan_out true on nn.Linear modules: PEFT sets it back to false (it transposes Conv1D weights
 * only, tests/test_peft_gpt2.c), so the adapters load and compute as without it. */
static void test_fan_in_fan_out_linear(void) {
    char dir[200], cmd[1600];
    snprintf(dir, sizeof dir, "/tmp/cgrad_peft_fifo_%ld", (long)getpid());
    snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s/adapter %s && sed -i 's/\"fan_in_fan_out\": false/\"fan_in_fan_out\": "
             "true/' %s/adapter_config.json && grep -q '\"fan_in_fan_out\": true' %s/adapter_config.json", dir, FIX, dir, dir, dir);
    CHECK(system(cmd) == 0, "%s", cmd);
    cg_params *ps = base_params(), *ref = base_params();
    CHECK(cg_lora_load_peft(ps, dir) == CG_OK && cg_lora_load_peft(ref, FIX "/adapter") == CG_OK, "%s", cg_last_error());
    cg_real y1[64], y2[64];
    for (int m = 0; m < 2; m++) {
        const int64_t n = forward(ps, m, y1);
        CHECK(n > 0 && n == forward(ref, m, y2) && !memcmp(y1, y2, (size_t)n * sizeof *y1), "%s: fan_in_fan_out on a Linear "
              "changed the output", modules[m]);
    }
    cg_params_free(ps), cg_params_free(ref);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "cleanup");
}

/* A copy of the fixture with one config line replaced; expects the load to fail naming want. */
static void bad_config(const char *from, const char *to, const char *want) {
    char dir[200], cmd[800];
    snprintf(dir, sizeof dir, "/tmp/cgrad_peft_bad_%ld", (long)getpid());
    snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s/adapter %s && sed -i 's/%s/%s/' %s/adapter_config.json", dir, FIX, dir,
             from, to, dir);
    CHECK(system(cmd) == 0, "%s", cmd);
    cg_params *ps = base_params();
    const cg_status st = cg_lora_load_peft(ps, dir);
    CHECK(st != CG_OK && strstr(cg_last_error(), want), "%s -> %s: wanted '%s', got '%s'", from, to, want,
          st ? cg_last_error() : "success");
    CHECK(cg_params_count(ps) == 2, "a refused load added adapters");
    cg_params_free(ps);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "cleanup");
}

static void test_refusals(void) {
    bad_config("\"use_dora\": false", "\"use_dora\": true", "use_dora");
    bad_config("\"rank_pattern\": {}", "\"rank_pattern\": {\"q_proj\": 4}", "rank_pattern");
    bad_config("\"bias\": \"none\"", "\"bias\": \"all\"", "bias");
    bad_config("\"peft_type\": \"LORA\"", "\"peft_type\": \"IA3\"", "peft_type");
    bad_config("\"r\": 2", "\"r\": 3", "want [3, 5] and [8, 3]");
    /* adapters on a module the model does not have */
    cg_params *ps = cg_params_new();
    cg_params_add(ps, "model.layers.0.self_attn.q_proj.weight", 2, (int64_t[]){6, 8});
    CHECK(cg_lora_load_peft(ps, FIX "/adapter") != CG_OK && strstr(cg_last_error(), "model.layers.0.mlp.down_proj.weight"),
          "%s", cg_last_error());
    CHECK(cg_params_count(ps) == 1, "a refused load added adapters");
    cg_params_free(ps);
}

int main(void) {
    test_fixture();
    test_round_trip_and_merge();
    test_merge_mapped();
    test_refusals();
    test_fan_in_fan_out_linear();
    TEST_END();
}
