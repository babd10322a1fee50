/* SPDX-License-Identifier: MIT */
/* Compares two checkpoints tensor by tensor (same names, shapes; real tensors only) and prints the
 * largest difference relative to the tensor's largest magnitude, over all tensors:
 *   ckpt_max_diff [-v] A B  ->  "max relative difference R in TENSOR (of N tensors)"; -v: each tensor
 * Exit 0 if every tensor of A is in B with its shape, 1 otherwise. For the N > 2 ranks test,
 * where the sum of the ranks' gradients may run in another order than one process's; and for the
 * export fixtures, where A and B are plain .safetensors files (read as such by their extension). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cgrad.h"

/* A gzip checkpoint, or a plain safetensors file by its extension. */
static cg_st *open_tensors(const char *path) {
    const size_t n = strlen(path), ext = strlen(".safetensors");
    if (n >= ext && !strcmp(path + n - ext, ".safetensors")) return cg_st_open(path);
    return cg_checkpoint_open(path);
}

int main(int argc, char **argv) {
    const int verbose = argc == 4 && !strcmp(argv[1], "-v");
    argv += verbose;
    argc -= verbose;
    if (argc != 3) {
        fprintf(stderr, "usage: ckpt_max_diff [-v] A B\n");
        return 2;
    }
    cg_st *a = open_tensors(argv[1]), *b = open_tensors(argv[2]);
    if (!a || !b) {
        fprintf(stderr, "ckpt_max_diff: %s\n", cg_last_error());
        return 1;
    }
    double worst = 0;
    const char *where = "none";
    int compared = 0;
    for (int i = 0; i < cg_st_count(a); i++) {
        const char *name = cg_st_name(a, i), *dt;
        int nd, ndb;
        int64_t sh[CG_MAX_DIMS], shb[CG_MAX_DIMS], n = 1;
        if (cg_st_info(a, name, &dt, &nd, sh) || strcmp(dt, "F32")) continue; /* ids and counters */
        if (cg_st_info(b, name, NULL, &ndb, shb) || ndb != nd || memcmp(sh, shb, (size_t)nd * sizeof *sh)) {
            fprintf(stderr, "ckpt_max_diff: %s missing or of another shape in %s\n", name, argv[2]);
            return 1;
        }
        for (int d = 0; d < nd; d++) n *= sh[d];
        cg_real *x = malloc((size_t)(n ? n : 1) * sizeof *x), *y = malloc((size_t)(n ? n : 1) * sizeof *y);
        if (!x || !y || cg_st_read(a, name, x, nd, sh) || cg_st_read(b, name, y, nd, sh)) {
            fprintf(stderr, "ckpt_max_diff: %s: %s\n", name, cg_last_error());
            return 1;
        }
        double scale = 0, diff = 0;
        for (int64_t k = 0; k < n; k++) {
            scale = fmax(scale, fabs((double)x[k]));
            diff = fmax(diff, fabs((double)x[k] - (double)y[k]));
        }
        const double rel = scale > 0 ? diff / scale : diff;
        if (verbose) printf("%-40s %.3g\n", name, rel);
        if (rel > worst || compared == 0) worst = rel, where = name;
        compared++;
        free(x);
        free(y);
    }
    printf("max relative difference %.3g in %s (of %d tensors)\n", worst, where, compared);
    cg_st_close(a);
    cg_st_close(b);
    return 0;
}
