/* SPDX-License-Identifier: MIT */
/* graph_dot: what a graph looks like, drawn by Graphviz. A small network (linear, GELU, residual
 * add, layer norm, linear, cross-entropy) runs one training step under CGRAD_PROFILE, then
 * cg_graph_dot writes it: ops and shapes, the nodes a gradient flows through (blue), the memory
 * plan's buffer offsets and which buffers reuse another's memory (dashed grey edges), and each
 * node's time. Usage: graph_dot [out.dot], then: dot -Tpng out.dot -o graph.png */
#include <stdio.h>
#include <stdlib.h>

#include <cgrad/cgrad.h>

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "graph.dot";
    setenv("CGRAD_PROFILE", "1", 0); /* before the first run: node times go into the picture */
    enum { B = 8, D = 16, H = 32, C = 3 };
    cg_params *ps = cg_params_new();
    cg_tensor *w1 = cg_params_add(ps, "fc1.weight", 2, (int64_t[]){H, D});
    cg_tensor *w2 = cg_params_add(ps, "fc2.weight", 2, (int64_t[]){D, H});
    cg_tensor *gain = cg_params_add(ps, "ln.weight", 1, (int64_t[]){D});
    cg_tensor *head = cg_params_add(ps, "head.weight", 2, (int64_t[]){C, D});
    cg_rng rng;
    cg_rng_seed(&rng, 1);
    for (int i = 0; i < cg_params_count(ps); i++) cg_fill_normal(cg_params_at(ps, i), &rng, 0, 0.2);
    cg_fill(gain, 1);

    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = cg_input(g, "x", CG_REAL, 2, (int64_t[]){B, D});
    cg_tensor *y = cg_input(g, "y", CG_INT32, 1, (int64_t[]){B});
    cg_tensor *h = cg_linear(g, cg_gelu(g, cg_linear(g, x, w1, NULL)), w2, NULL);
    h = cg_layernorm(g, cg_add(g, x, h), gain, NULL, 1e-5);
    cg_tensor *loss = cg_cross_entropy(g, cg_linear(g, h, head, NULL), y, -100);
    if (!loss) return fprintf(stderr, "graph_dot: %s\n", cg_last_error()), 1;
    cg_fill_normal(x, &rng, 0, 1);
    for (int i = 0; i < B; i++) cg_idata(y)[i] = i % C;

    int rc = 0;
    if (cg_graph_forward(g) || cg_graph_backward(g, loss) || cg_graph_dot(g, path)) {
        fprintf(stderr, "graph_dot: %s\n", cg_last_error());
        rc = 1;
    } else
        printf("graph_dot: loss %.4f; wrote %s (render: dot -Tpng %s -o graph.png)\n", cg_item(loss), path, path);
    cg_graph_free(g);
    cg_params_free(ps);
    return rc;
}
