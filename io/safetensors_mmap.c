/* SPDX-License-Identifier: MIT */
/* A frozen parameter read in place from an opened safetensors file: bf16 tensors feed the bf16
 * products as they are, float32 ones are the parameter's value (a read-only mapping: a write gives
 * the parameter a copy first). The file stays open as long as the parameter set. Loading a model's
 * frozen weights this way costs a header parse and a scan for values that are not finite. */
#include <math.h>
#include <string.h>

#include "io/safetensors_internal.h"

static void close_file(void *f) { cg_st_close(f); }

/* Index of the first element that is not finite, or -1: bf16 with exponent bits all set (a fast
 * scan over the upper half of each float), float32 by isfinite. */
static int64_t first_nonfinite(const void *data, uint64_t n, bool bf16) {
    if (bf16) {
        const uint16_t *h = data;
        uint64_t bad = n;
        for (uint64_t i = 0; i < n; i++) bad = (h[i] & 0x7f80u) == 0x7f80u && bad == n ? i : bad;
        return bad == n ? -1 : (int64_t)bad;
    }
    const float *x = data;
    for (uint64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return (int64_t)i;
    return -1;
}

cg_status cg_st_map_param(cg_st *f, const char *name, cg_tensor *p, cg_params *ps) {
    if (!f || !name || !p || !ps) return cg_set_error(CG_ERR_ARG, "[safetensors] map_param: NULL argument");
    const int i = cg_st_find(f, name);
    const char *dtype = NULL;
    uint64_t nbytes = 0;
    const void *data = cgi_st_bytes(f, i, &dtype, &nbytes);
    if (!data) return cgi_st_fail(cgi_st_label(f), CG_ERR_ARG, "no tensor '%s'", name);
    int ndim = 0;
    int64_t shape[CG_MAX_DIMS];
    cg_status st = cg_st_info(f, name, NULL, &ndim, shape);
    if (st) return st;
    if (ndim != cg_ndim(p) || memcmp(shape, cg_shape(p), (size_t)ndim * sizeof *shape))
        return cgi_st_fail(cgi_st_label(f), CG_ERR_SHAPE, "tensor '%s' has shape %s, parameter %s wants %s", name,
                           cg_dims_str(ndim, shape), cg_name(p), cg_shape_str(p));
    const bool bf16 = !strcmp(dtype, "BF16"), f32 = !strcmp(dtype, "F32") && sizeof(cg_real) == 4;
    if (!bf16 && !f32)
        return cgi_st_fail(cgi_st_label(f), CG_ERR_ARG, "tensor '%s' is %s: only BF16 and F32 are read in place", name, dtype);
    const uint64_t n = (uint64_t)cg_numel(p);
    if (nbytes != n * (bf16 ? 2u : 4u))
        return cgi_st_fail(cgi_st_label(f), CG_ERR_FORMAT, "tensor '%s' holds %llu bytes for %llu %s elements", name,
                           (unsigned long long)nbytes, (unsigned long long)n, dtype);
    const int64_t bad = first_nonfinite(data, n, bf16);
    if (bad >= 0)
        return cgi_st_fail(cgi_st_label(f), CG_ERR_FORMAT, "tensor '%s' element %lld is not finite", name, (long long)bad);
    if ((st = cg_params_keep(ps, close_file, f))) return st;
    cgi_st_retain(f); /* the set closes it once more when it is freed */
    return cg_param_map(p, data, bf16 ? CG_MAP_BF16 : CG_MAP_F32);
}
