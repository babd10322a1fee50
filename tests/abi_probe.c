/* SPDX-License-Identifier: MIT */
/* Built by abi_guard.sh with and without -DCGRAD_DOUBLE against both libraries: a mismatched pair
 * must fail to link; a matched one links and reads 1.5 back. */
#include <stdio.h>

#include <cgrad/cgrad.h>

int main(void) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    int64_t one = 1;
    cg_tensor *x = cg_input(g, "x", CG_REAL, 1, &one);
    cg_fill(x, 1.5);
    double v = cg_item(x);
    cg_graph_free(g);
    printf("%g\n", v);
    return v == 1.5 ? 0 : 1;
}
