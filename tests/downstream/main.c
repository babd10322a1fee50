/* SPDX-License-Identifier: MIT */
/* A downstream program, built against cgrad installed, embedded or fetched: d/dx sum(x * x) = 2x, checked by
 * value, in whichever precision the library was built (CGRAD_DOUBLE comes from the package).
 * With WITH_DIST it also joins a world of one through libcgrad_dist. */
#include <cgrad/cgrad.h>
#include <stdio.h>

int main(void) {
    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = cg_requires_grad(cg_input(g, "x", CG_REAL, 1, (int64_t[]){3}));
    cg_tensor *loss = cg_sum(g, cg_mul(g, x, x), -1, false);
    if (!loss) { fprintf(stderr, "%s\n", cg_last_error()); return 1; }
    cg_write(x, (cg_real[]){1, -2, 0.5});
    if (cg_graph_forward(g) != CG_OK || cg_graph_backward(g, loss) != CG_OK) {
        fprintf(stderr, "%s\n", cg_last_error());
        return 1;
    }
    cg_real dx[3];
    cg_read_grad(x, dx);
    int ok = cg_item(loss) == 5.25 && dx[0] == 2 && dx[1] == -4 && dx[2] == 1;
#ifdef EXPECT_REAL_BYTES
    ok = ok && sizeof(cg_real) == EXPECT_REAL_BYTES;
#endif
    printf("downstream C (%zu-byte reals): loss %g, dx %g %g %g: %s\n", sizeof(cg_real), cg_item(loss),
           (double)dx[0], (double)dx[1], (double)dx[2], ok ? "ok" : "WRONG");
    cg_graph_free(g);
#ifdef WITH_DIST /* libcgrad_dist: outside mpirun the world has one rank */
    cg_dist *d = cg_dist_init(0);
    double one = 1;
    int dist_ok = d && cg_dist_size(d) == 1 && cg_dist_rank(d) == 0 && cg_dist_sum(d, &one, 1) == CG_OK && one == 1;
    printf("downstream C, libcgrad_dist: world of %d: %s\n", cg_dist_size(d), dist_ok ? "ok" : "WRONG");
    cg_dist_free(d);
    ok = ok && dist_ok;
#endif
    return ok ? 0 : 1;
}
