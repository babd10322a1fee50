/* SPDX-License-Identifier: MIT */
/* cg_graph_dot: the DOT text names every node with its op and shape, fills exactly the nodes a
 * gradient flows through, reports each planned buffer at its true offset in the graph's block,
 * draws a reuse edge only between buffers that really overlap, carries the profiled times, and
 * parses with Graphviz when it is installed. Errors are values. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cgrad/cgrad.h>
#include "check.h"
#include "graph/internal.h"

/* The label line of node id in the DOT text, NUL-terminated in buf; false if absent. */
static bool node_line(const char *dot, int id, char *buf, size_t n) {
    char key[32];
    snprintf(key, sizeof key, "\n  n%d [label=", id);
    const char *p = strstr(dot, key);
    if (!p) return false;
    p += 3;
    const char *e = strchr(p, '\n');
    size_t len = (size_t)(e - p) < n - 1 ? (size_t)(e - p) : n - 1;
    memcpy(buf, p, len);
    buf[len] = 0;
    return true;
}

int main(void) {
    setenv("CGRAD_PROFILE", "1", 1); /* read once, at the first run */
    const char *path = "test_dot.dot";
    cg_params *ps = cg_params_new();
    cg_tensor *w = cg_params_add(ps, "fc.weight", 2, (int64_t[]){6, 4});
    cg_tensor *frozen = cg_params_add(ps, "frozen", 1, (int64_t[]){6});
    cg_param_set_trainable(frozen, false);
    cg_rng rng;
    cg_rng_seed(&rng, 3);
    cg_fill_normal(w, &rng, 0, 0.5);
    cg_fill(frozen, 0.5);

    cg_graph *g = cg_graph_new(CG_TRAIN);
    cg_tensor *x = cg_input(g, "x", CG_REAL, 2, (int64_t[]){5, 4});
    cg_tensor *y = cg_input(g, "y \"quoted\"", CG_INT32, 1, (int64_t[]){5});
    cg_tensor *h = cg_linear(g, x, w, NULL);                    /* #2 [5,6] */
    cg_tensor *t = cg_tanh(g, h);                               /* #3 */
    cg_tensor *s = cg_add(g, cg_tanh(g, t), frozen);            /* #4 tanh, #5 add */
    cg_tensor *v = cg_reshape(g, s, 2, (int64_t[]){6, 5});      /* #6 view */
    cg_tensor *loss = cg_cross_entropy(g, cg_reshape(g, v, 2, (int64_t[]){5, 6}), y, -100); /* #7 view, #8 */
    CHECK(loss && cg_graph_size(g) == 9, "graph: %s, %d nodes", cg_last_error(), cg_graph_size(g));
    cg_fill_normal(x, &rng, 0, 1);
    for (int i = 0; i < 5; i++) cg_idata(y)[i] = i;

    /* before any run: no plan yet, so no offsets */
    CHECK(cg_graph_dot(g, path) == CG_OK, "%s", cg_last_error());
    char *dot = test_slurp(path, NULL);
    CHECK(dot && !strstr(dot, "value @") && !strstr(dot, "color=grey"), "unplanned graph shows memory:\n%s", dot);
    free(dot);

    CHECK(cg_graph_forward(g) == CG_OK && cg_graph_backward(g, loss) == CG_OK, "%s", cg_last_error());
    CHECK(cg_graph_dot(g, path) == CG_OK, "%s", cg_last_error());
    dot = test_slurp(path, NULL);
    CHECK(dot && !strncmp(dot, "digraph cgrad {", 15) && strstr(dot, "\n}\n"), "not a digraph");
    char line[512];
    const char *ops[] = {"input x", "input y \\\"quoted\\\"", "linear", "tanh", "tanh", "add", "reshape", "reshape", "cross_entropy"};
    const char *shapes[] = {"[5,4]", "[5] int32", "[5,6]", "[5,6]", "[5,6]", "[5,6]", "[6,5]", "[5,6]", "[]"};
    for (int i = 0; i < 9; i++) {
        CHECK(node_line(dot, i, line, sizeof line), "node %d missing", i);
        char want[64];
        snprintf(want, sizeof want, "#%d %s\\n%s", i, ops[i], shapes[i]);
        CHECK(strstr(line, want), "node %d: want \"%s\" in %s", i, want, line);
        /* blue exactly where a gradient flows: not the inputs, everything from the linear on */
        CHECK(!strstr(line, "#cfe2ff") == (i < 2), "node %d fill: %s", i, line);
        CHECK(!strstr(line, "view of") == (i != 6 && i != 7), "node %d view: %s", i, line);
        /* every compute node ran under the profiler, so it carries a time */
        CHECK(!strstr(line, "fwd ") == (i < 2 || i == 6 || i == 7), "node %d time: %s", i, line);
    }
    /* offsets are the real ones: the linear's value and gradient, read from the node itself */
    node_line(dot, 2, line, sizeof line);
    char want[96];
    snprintf(want, sizeof want, "value @%zu (120 B)", (size_t)((char *)h->data - (char *)g->block));
    CHECK(strstr(line, want), "want \"%s\" in %s", want, line);
    snprintf(want, sizeof want, "gradient @%zu", (size_t)((char *)h->grad - (char *)g->block));
    CHECK(strstr(line, want), "want \"%s\" in %s", want, line);
    /* parameters: trainable filled, frozen not, each with an edge into its consumer */
    CHECK(strstr(dot, "label=\"fc.weight\\n[6,4]\", style=filled"), "trainable parameter:\n%s", dot);
    CHECK(strstr(dot, "label=\"frozen\\n[6]\\nfrozen\"]"), "frozen parameter:\n%s", dot);
    /* each reuse edge joins two nodes whose buffers really overlap in the block */
    int reuse = 0;
    for (const char *p = dot; (p = strstr(p, "[style=dashed, color=grey")); p++) {
        const char *q = p;
        while (q > dot && q[-1] != '\n') q--;
        int a, b;
        CHECK(sscanf(q, "  n%d -> n%d", &a, &b) == 2 && a < b, "edge line: %.60s", q);
        cg_tensor *na = g->nodes[a], *nb = g->nodes[b];
        size_t sa = (size_t)cg_numel(na) * (na->dtype == CG_INT32 ? 4 : sizeof(cg_real));
        size_t sb = (size_t)cg_numel(nb) * (nb->dtype == CG_INT32 ? 4 : sizeof(cg_real));
        const char *bufa[2] = {na->data, (char *)na->grad}, *bufb[2] = {nb->data, (char *)nb->grad};
        bool hit = false;
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2; j++)
                hit |= bufa[i] && bufb[j] && bufa[i] < bufb[j] + sb && bufb[j] < bufa[i] + sa;
        CHECK(hit, "n%d -> n%d reuse edge without overlapping buffers", a, b);
        reuse++;
    }
    CHECK(reuse > 0, "a chain of five [5,6] values and gradients on one block reuses nothing?\n%s", dot);
    free(dot);
    if (system("command -v dot >/dev/null 2>&1") == 0) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "dot -Tsvg %s -o /dev/null", path);
        CHECK(system(cmd) == 0, "Graphviz rejects %s", path);
    }
    remove(path);

    CHECK(cg_graph_dot(NULL, path) == CG_ERR_ARG && strstr(cg_last_error(), "[graph_dot] graph is NULL"), "%s",
          cg_last_error());
    CHECK(cg_graph_dot(g, "/nonexistent-dir/g.dot") == CG_ERR_IO && strstr(cg_last_error(), "/nonexistent-dir/g.dot"),
          "%s", cg_last_error());
    cg_graph_free(g);
    cg_params_free(ps);

    /* `cgrad step --dot` on the committed GPT-2 fixture, profiled: the whole model, with times */
    const char *fx = CGRAD_TEST_DIR "/fixtures/models/gpt2";
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "CGRAD_PROFILE=1 ../cgrad step --arch gpt2 --config %s/config.json --weights %s/weights.safetensors "
             "--batch %s/batch.safetensors --dot step.dot 2>/dev/null",
             fx, fx, fx);
    CHECK(system(cmd) == 0, "%s failed", cmd);
    dot = test_slurp("step.dot", NULL);
    CHECK(dot && strstr(dot, "#0 input input_ids\\n[2,9] int32") && strstr(dot, "h.1.attn.c_attn.weight") &&
              strstr(dot, "memory plan: one") && strstr(dot, "fwd "),
          "step.dot lacks the model, its plan or its times:\n%.2000s", dot ? dot : "(none)");
    free(dot);
    remove("step.dot");
    TEST_END();
}
