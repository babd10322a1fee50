/* SPDX-License-Identifier: MIT */
/* Frozen half-precision weights read in place: a small LLaMA whose safetensors file holds bf16 or
 * fp16 weights, loaded under LoRA (the base frozen and memory-mapped), computes the logits, loss and
 * adapter gradients of the same weights widened to float by hand, in fp32 and bf16 graphs, while the
 * base stays in the file's dtype (no float copy: the set's own bytes are the adapters' and the norm
 * weights'). Also fp16's widening paths (F16C, AVX-512F, portable) against an independent decoder on
 * every fp16 value, and the load's errors naming the file and tensor. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../cgrad.h"
#include "../graph/internal.h"
#include "../ops/half.h"
#include "check.h"

/* fp16 bits to float by the formula, independent of ops/half.h: subnormals m 2^-24, normals
 * (1024 + m) 2^(e - 25) */
static float f16_value(uint16_t h) {
    const int e = (h >> 10) & 31, m = h & 1023;
    const double mag = e == 31 ? (m ? NAN : INFINITY) : e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return (float)(h & 0x8000 ? -mag : mag);
}
static float bf16_value(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Every fp16 value through each widening path equals the formula (NaNs: a NaN). */
static void test_widen_f16(void) {
    static uint16_t all[65536];
    static float got[65536];
    for (int i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    int paths = 0;
    for (int path = 0; path < 3; path++) {
        memset(got, 0, sizeof got);
        if (!cgi_widen_f16_on(path, got, all, 65536)) continue;
        paths++;
        for (int i = 0; i < 65536; i++) {
            const float want = f16_value((uint16_t)i);
            const bool ok = isnan(want) ? isnan(got[i]) : memcmp(&got[i], &want, sizeof want) == 0;
            if (!ok) {
                CHECK(false, "path %d: fp16 0x%04x widened to %a, want %a", path, i, got[i], want);
                break;
            }
        }
        /* odd lengths: the vector paths' tails */
        for (int n = 1; n < 40; n++) {
            float d[40] = {0};
            cgi_widen_f16_on(path, d, all + 15360 - n, n);
            CHECK(d[n - 1] == f16_value((uint16_t)(15360 - 1)), "path %d length %d: tail", path, n);
        }
    }
    CHECK(paths >= 1, "the portable path always runs");
}

/* ---- a tiny LLaMA, its weights drawn as half-precision bit patterns ---- */

static const char *config(bool tied) {
    return tied ? "{\"model_type\": \"llama\", \"vocab_size\": 40, \"hidden_size\": 32, \"intermediate_size\": 48, "
                  "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
                  "\"max_position_embeddings\": 32, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": true}"
                : "{\"model_type\": \"llama\", \"vocab_size\": 40, \"hidden_size\": 32, \"intermediate_size\": 48, "
                  "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
                  "\"max_position_embeddings\": 32, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false}";
}

enum { BF16, F16 };
/* A random value's bits: magnitude about 2^-6 .. 2^-1 (2-D weights) or 0.5 .. 2 (norm weights);
 * fp16 draws a subnormal now and then; bf16_exact: an fp16 value bf16 holds too (3 low bits zero,
 * normal). */
static uint16_t draw(cg_rng *r, int dt, bool norm, bool bf16_exact) {
    const uint64_t u = cg_rng_next(r);
    const int sign = norm ? 0 : (int)(u & 1), lo = norm ? -1 : -6, span = norm ? 2 : 5;
    const int e = lo + (int)((u >> 1) % (uint64_t)span); /* value in [2^e, 2^(e+1)) */
    if (dt == BF16) return (uint16_t)(sign << 15 | (e + 127) << 7 | (int)((u >> 8) & 127));
    if (!bf16_exact && !norm && (u >> 20) % 16 == 0) return (uint16_t)(sign << 15 | (int)((u >> 24) & 1023)); /* subnormal */
    int m = (int)((u >> 8) & 1023);
    if (bf16_exact) m &= ~7;
    return (uint16_t)(sign << 15 | (e + 15) << 10 | m);
}
static float value_of(uint16_t h, int dt) { return dt == BF16 ? bf16_value(h) : f16_value(h); }

/* cgi_gemm_half with a float A and a half B (a weight read in place), B stored either way (W^T as
 * x W^T reads it, or by rows), one row or column of C (a generated token's products) and whole
 * blocks, against float products on the widened values. */
static void test_products(void) {
    const int64_t shapes[][3] = {{1, 37, 70}, {1, 300, 33}, {37, 1, 70}, {5, 40, 300}, {64, 64, 64}, {70, 33, 600}};
    cg_rng r;
    cg_rng_seed(&r, 9);
    for (int s = 0; s < 6; s++)
        for (int dt = BF16; dt <= F16; dt++)
            for (int by_rows = 0; by_rows < 2; by_rows++) {
                const int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
                float *a = malloc((size_t)(m * k) * sizeof *a), *bw = malloc((size_t)(k * n) * sizeof *bw);
                float *c = calloc((size_t)(m * n), sizeof *c), *want = calloc((size_t)(m * n), sizeof *want);
                uint16_t *bh = malloc((size_t)(k * n) * sizeof *bh);
                for (int64_t i = 0; i < m * k; i++) a[i] = (float)(cg_rng_next(&r) % 2001) / 1000.0f - 1.0f;
                for (int64_t i = 0; i < k * n; i++) bh[i] = draw(&r, dt, false, false), bw[i] = value_of(bh[i], dt);
                /* B[p, q] at p * rsb + q * csb: by rows [k, n], else W [n, k] read transposed */
                const int64_t rsb = by_rows ? n : 1, csb = by_rows ? 1 : k;
                for (int64_t i = 0; i < m; i++)
                    for (int64_t q = 0; q < n; q++) {
                        double acc = 0;
                        for (int64_t p = 0; p < k; p++) acc += (double)a[i * k + p] * bw[p * rsb + q * csb];
                        want[i * n + q] = (float)acc;
                    }
                CHECK(cgi_gemm_half(m, n, k, a, CGI_EL_F32, k, 1, bh, dt == BF16 ? CGI_EL_BF16 : CGI_EL_F16, rsb, csb, 1, 0, c,
                                    n, NULL, false, 2),
                      "cgi_gemm_half runs");
                double worst = 0, scale = 0;
                for (int64_t i = 0; i < m * n; i++) worst = fmax(worst, fabs(c[i] - want[i])), scale = fmax(scale, fabs(want[i]));
                CHECK(worst <= 1e-5 * scale * sqrt((double)k), "[%lld,%lld,%lld] %s B %s: off by %g of %g", (long long)m,
                      (long long)n, (long long)k, dt == BF16 ? "bf16" : "fp16", by_rows ? "by rows" : "transposed", worst, scale);
                free(a), free(bw), free(c), free(want), free(bh);
            }
}

/* Writes ps's parameters to path as dtype dt ("BF16" / "F16") safetensors, drawing each value;
 * widened[i] gets parameter i's float values (malloc'd). A writer of its own: the library's writes
 * float32 only. */
static void write_half(const char *path, cg_params *ps, int dt, bool bf16_exact, float **widened) {
    cg_rng r;
    cg_rng_seed(&r, 11);
    const int n = cg_params_count(ps);
    char *hdr = malloc(1 << 16);
    size_t len = (size_t)snprintf(hdr, 1 << 16, "{");
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        cg_tensor *p = cg_params_at(ps, i);
        len += (size_t)snprintf(hdr + len, (1 << 16) - len, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "",
                                cg_name(p), dt == BF16 ? "BF16" : "F16");
        for (int d = 0; d < cg_ndim(p); d++) len += (size_t)snprintf(hdr + len, (1 << 16) - len, "%s%lld", d ? "," : "", (long long)cg_shape(p)[d]);
        len += (size_t)snprintf(hdr + len, (1 << 16) - len, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                                (unsigned long long)(off + 2 * (uint64_t)cg_numel(p)));
        off += 2 * (uint64_t)cg_numel(p);
    }
    len += (size_t)snprintf(hdr + len, (1 << 16) - len, "}");
    while (len % 8) hdr[len++] = ' ';
    FILE *f = fopen(path, "wb");
    const uint64_t hl = len;
    fwrite(&hl, 8, 1, f);
    fwrite(hdr, 1, len, f);
    for (int i = 0; i < n; i++) {
        cg_tensor *p = cg_params_at(ps, i);
        const int64_t k = cg_numel(p);
        uint16_t *bits = malloc((size_t)k * sizeof *bits);
        widened[i] = malloc((size_t)k * sizeof **widened);
        for (int64_t j = 0; j < k; j++) {
            bits[j] = draw(&r, dt, cg_ndim(p) == 1, bf16_exact);
            widened[i][j] = value_of(bits[j], dt);
        }
        fwrite(bits, 2, (size_t)k, f);
        free(bits);
    }
    fclose(f);
    free(hdr);
}

#define TARGETS "q_proj,v_proj,down_proj"

/* Gives the adapters (LoRA B included, zero at init) the same nonzero values in any set. */
static void set_adapters(cg_params *ps) {
    cg_rng r;
    cg_rng_seed(&r, 21);
    for (int i = 0; i < cg_params_count(ps); i++)
        if (cg_lora_is_adapter(cg_params_at(ps, i))) cg_fill_normal(cg_params_at(ps, i), &r, 0, 0.2);
}

typedef struct {
    double loss;
    cg_real logits[2 * 6 * 40];
    cg_real grads[4096];
    int64_t ngrads;
} outputs;

/* The loss and adapter gradients of a training graph, the logits of an eval graph. */
static void run(cg_model *m, cg_precision prec, outputs *o) {
    cg_params *ps = cg_model_params(m);
    for (int pass = 0; pass < 2; pass++) {
        cg_graph *g = cg_graph_new(pass ? CG_EVAL : CG_TRAIN);
        CHECK(prec == CG_FP32 || cg_graph_set_precision(g, prec) == CG_OK, "%s", cg_last_error());
        cg_model_set_full_logits(m, pass == 1);
        cg_model_graph mg;
        CHECK(cg_model_build(g, m, 2, 6, 0, &mg) == CG_OK, "%s", cg_last_error());
        cg_tensor *ids = cg_model_graph_input(&mg, "input_ids"), *tg = cg_model_graph_input(&mg, "targets");
        for (int i = 0; i < 12; i++) cg_idata(ids)[i] = (i * 7 + 3) % 40, cg_idata(tg)[i] = (i * 11 + 5) % 40;
        if (!pass) {
            cg_params_zero_grad(ps);
            CHECK(cg_graph_forward(g) == CG_OK && cg_graph_backward(g, mg.loss) == CG_OK, "%s", cg_last_error());
            cg_real l;
            cg_read(mg.loss, &l);
            o->loss = l;
            o->ngrads = 0;
            for (int i = 0; i < cg_params_count(ps); i++) {
                cg_tensor *p = cg_params_at(ps, i);
                if (!cg_lora_is_adapter(p)) continue;
                CHECK(o->ngrads + cg_numel(p) <= 4096, "grads fit");
                cg_read_grad(p, o->grads + o->ngrads);
                o->ngrads += cg_numel(p);
            }
        } else {
            CHECK(mg.logits && cg_graph_forward(g) == CG_OK, "%s", cg_last_error());
            CHECK(cg_numel(mg.logits) == 2 * 6 * 40, "logits %lld", (long long)cg_numel(mg.logits));
            cg_read(mg.logits, o->logits);
        }
        cg_graph_free(g);
    }
    cg_model_set_full_logits(m, false);
}

static double worst_rel(const cg_real *a, const cg_real *b, int64_t n) {
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(b[i]));
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(a[i] - b[i]));
    return scale > 0 ? worst / scale : worst;
}

/* dt's file loaded with the base frozen and mapped, against the hand-widened weights in float, in a
 * graph of precision prec. */
static void test_half_base(int dt, bool tied, cg_precision prec) {
    const char *what = dt == BF16 ? "bf16" : "fp16";
    char path[256];
    snprintf(path, sizeof path, "/tmp/cgrad_halfmap_%ld_%s.safetensors", (long)getpid(), what);
    /* the reference: float parameters holding the widened values */
    cg_params *ref_ps = cg_params_new();
    cg_model *ref = cg_model_new(CG_ARCH_LLAMA, config(tied), 0, ref_ps, 1);
    CHECK(ref != NULL, "%s", cg_last_error());
    float *wide[64] = {0};
    CHECK(cg_params_count(ref_ps) <= 64, "params fit");
    /* a bf16 graph rounds its operands to bf16: an fp16 file there holds values bf16 holds too, so
     * both sides multiply the same numbers */
    write_half(path, ref_ps, dt, prec == CG_BF16, wide);
    for (int i = 0; i < cg_params_count(ref_ps); i++) {
        cg_tensor *p = cg_params_at(ref_ps, i);
        cg_real *v = malloc((size_t)cg_numel(p) * sizeof *v);
        for (int64_t j = 0; j < cg_numel(p); j++) v[j] = wide[i][j];
        CHECK(cg_write(p, v) == CG_OK, "%s", cg_last_error());
        free(v);
    }
    cg_rng r;
    cg_rng_seed(&r, 5);
    CHECK(cg_lora_apply(ref_ps, TARGETS, 2, 4, &r) > 0, "%s", cg_last_error());
    set_adapters(ref_ps);
    /* the model under test: the same file, the base mapped */
    cg_params *ps = cg_params_new();
    cg_params_defer_init(ps, true);
    cg_model *m = cg_model_new(CG_ARCH_LLAMA, config(tied), 0, ps, 1);
    cg_rng_seed(&r, 5);
    CHECK(m && cg_lora_apply(ps, TARGETS, 2, 4, &r) > 0, "%s", cg_last_error());
    cg_st *f = cg_st_open(path);
    char *kept = NULL, *skipped = NULL; /* the adapters are not in the file */
    CHECK(f && cg_model_load_partial(m, f, &kept, &skipped) == CG_OK, "%s", cg_last_error());
    free(kept), free(skipped);
    cg_st_close(f); /* the set keeps the mapping */
    cg_params_defer_init(ps, false);
    set_adapters(ps);
    int64_t base = 0, adapters = 0, norms = 0;
    for (int i = 0; i < cg_params_count(ps); i++) {
        cg_tensor *p = cg_params_at(ps, i);
        if (cg_lora_is_adapter(p)) adapters += cg_numel(p);
        else base += cg_numel(p), norms += cg_ndim(p) == 1 ? cg_numel(p) : 0;
    }
    outputs *want = calloc(1, sizeof *want), *got = calloc(1, sizeof *got);
    run(ref, prec, want);
    run(m, prec, got);
    const double tol = prec == CG_BF16 ? 1e-4 : 2e-5;
    CHECK(fabs(got->loss - want->loss) <= tol * fabs(want->loss), "%s %s %s: loss %.9g, widened by hand %.9g", what,
          prec == CG_BF16 ? "bf16" : "fp32", tied ? "tied" : "untied", got->loss, want->loss);
    const double el = worst_rel(got->logits, want->logits, 2 * 6 * 40);
    CHECK(el <= tol, "%s %s: logits differ by %.3g of their largest", what, prec == CG_BF16 ? "bf16" : "fp32", el);
    CHECK(got->ngrads == want->ngrads && got->ngrads > 0, "%lld adapter values", (long long)got->ngrads);
    const double eg = worst_rel(got->grads, want->grads, got->ngrads);
    CHECK(eg <= 10 * tol, "%s %s: adapter gradients differ by %.3g of their largest", what, prec == CG_BF16 ? "bf16" : "fp32",
          eg);
    /* the base stayed in the file's dtype: every 2-D weight unwidened, the set's own bytes are the
     * adapters' and the norm weights' float copies */
    for (int i = 0; i < cg_params_count(ps); i++) {
        cg_tensor *p = cg_params_at(ps, i);
        if (cg_lora_is_adapter(p) || cg_ndim(p) != 2) continue;
        if (cg_param_storage(p) != (dt == BF16 ? CG_MAP_BF16 : CG_MAP_F16)) {
            CHECK(false, "%s %s: %s was widened to float", what, prec == CG_BF16 ? "bf16" : "fp32", cg_name(p));
            break;
        }
    }
    int64_t mapped = 0;
    const int64_t own = cg_params_value_bytes(ps, &mapped);
    CHECK(mapped == 2 * base, "%s: %lld bytes mapped, want %lld", what, (long long)mapped, (long long)(2 * base));
    CHECK(own == (int64_t)sizeof(cg_real) * (adapters + norms), "%s %s: the set holds %lld bytes of its own, want %lld "
          "(adapters %lld + norm weights %lld values)", what, prec == CG_BF16 ? "bf16" : "fp32", (long long)own,
          (long long)(sizeof(cg_real) * (adapters + norms)), (long long)adapters, (long long)norms);
    free(want), free(got);
    for (int i = 0; i < 64; i++) free(wide[i]);
    cg_model_free(m), cg_params_free(ps);
    cg_model_free(ref), cg_params_free(ref_ps);
    unlink(path);
}

/* A half-precision file's errors are values naming the file and the tensor: a tensor of the wrong
 * shape, a truncated file, an unknown dtype; nothing is mapped or written. */
static void test_errors(void) {
    char path[256];
    snprintf(path, sizeof path, "/tmp/cgrad_halfmap_err_%ld.safetensors", (long)getpid());
    cg_params *ps0 = cg_params_new();
    cg_model *m0 = cg_model_new(CG_ARCH_LLAMA, config(false), 0, ps0, 1);
    float *wide[64] = {0};
    write_half(path, ps0, F16, false, wide);
    /* wrong shape: a model with a wider MLP */
    const char *wider = "{\"model_type\": \"llama\", \"vocab_size\": 40, \"hidden_size\": 32, \"intermediate_size\": 56, "
                        "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
                        "\"max_position_embeddings\": 32, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false}";
    cg_params *ps = cg_params_new();
    cg_model *m = cg_model_new(CG_ARCH_LLAMA, wider, 0, ps, 1);
    for (int i = 0; i < cg_params_count(ps); i++) cg_param_set_trainable(cg_params_at(ps, i), false);
    cg_st *f = cg_st_open(path);
    CHECK(f && cg_model_load(m, f) != CG_OK && strstr(cg_last_error(), path) && strstr(cg_last_error(), "mlp.") &&
              strstr(cg_last_error(), "56"), "wrong shape: %s", cg_last_error());
    for (int i = 0; i < cg_params_count(ps); i++)
        CHECK(cg_param_storage(cg_params_at(ps, i)) == CG_MAP_F32, "a refused load mapped %s", cg_name(cg_params_at(ps, i)));
    cg_st_close(f);
    cg_model_free(m), cg_params_free(ps);
    /* truncated: the last tensor's bytes end past the file */
    FILE *fp = fopen(path, "r+b");
    fseek(fp, 0, SEEK_END);
    const long size = ftell(fp);
    fclose(fp);
    CHECK(truncate(path, size - 6) == 0, "truncate");
    f = cg_st_open(path);
    CHECK(!f && strstr(cg_last_error(), path) && strstr(cg_last_error(), "lm_head.weight"), "truncated: %s", cg_last_error());
    cg_st_close(f);
    /* an unknown dtype, in a whole file again */
    for (int i = 0; i < 64; i++) free(wide[i]), wide[i] = NULL;
    write_half(path, ps0, F16, false, wide);
    fp = fopen(path, "r+b");
    char head[256] = {0};
    CHECK(fp && fread(head, 1, sizeof head - 1, fp) > 0, "read back");
    char *at = strstr(head + 8, "\"F16\""); /* the first tensor's dtype: same length, same offsets */
    CHECK(at != NULL, "dtype in the header");
    if (fp && at) {
        fseek(fp, (long)(at - head) + 3, SEEK_SET);
        fputc('7', fp);
    }
    if (fp) fclose(fp);
    f = cg_st_open(path);
    CHECK(!f && strstr(cg_last_error(), path) && strstr(cg_last_error(), "F17") && strstr(cg_last_error(), "model.embed_tokens.weight"),
          "unknown dtype: %s", cg_last_error());
    cg_st_close(f);
    for (int i = 0; i < 64; i++) free(wide[i]);
    cg_model_free(m0), cg_params_free(ps0);
    unlink(path);
}

int main(int argc, char **argv) {
    const bool bf16 = !strcmp(test_part(argc, argv), "bf16"); /* the bf16 graphs: their own ctest entry */
#ifdef CGRAD_DOUBLE
    return test_skip("halfmap", "the float64 build widens half-precision weights (no half products)");
#endif
    if (bf16 && cg_bf16_unavailable()) return test_skip("halfmap bf16", cg_bf16_unavailable());
    if (!bf16) test_widen_f16(), test_errors(), test_products();
    for (int dt = BF16; dt <= F16; dt++) {
        test_half_base(dt, dt == BF16, bf16 ? CG_BF16 : CG_FP32);
        test_half_base(dt, dt != BF16, bf16 ? CG_BF16 : CG_FP32);
    }
    TEST_END();
}
