/* SPDX-License-Identifier: MIT */
// The same check from C++: the headers' extern "C" guards let a C++ program link the C API. Then a
// custom op written in C++ (cube: y = x^3, its kernels as capture-less lambdas) trains like a
// built-in one: its gradient 3 x^2 reaches the input through the graph.
#include <cgrad/cgrad.h>

#include <cstdio>
#include <memory>
#include <vector>

static const cg_custom_op cube = {
    "cube", 1,
    [](const cg_custom_tensor *in, int, const void *, void *, cg_custom_shape *out) -> cg_status {
        if (in[0].ndim != 1) return cg_set_error(CG_ERR_SHAPE, "x must be 1-D");
        out->ndim = 1;
        out->shape[0] = in[0].shape[0];
        return CG_OK;
    },
    [](cg_custom_ctx *c) -> cg_status {
        const cg_custom_tensor x = cg_custom_input(c, 0), y = cg_custom_output(c);
        const cg_real *xs = static_cast<const cg_real *>(x.data);
        cg_real *ys = static_cast<cg_real *>(y.data);
        for (int64_t i = 0; i < y.shape[0]; i++) ys[i] = xs[i * x.stride[0]] * xs[i * x.stride[0]] * xs[i * x.stride[0]];
        return CG_OK;
    },
    [](cg_custom_ctx *c) -> cg_status {
        const cg_custom_tensor x = cg_custom_input(c, 0), dx = cg_custom_input_grad(c, 0), dy = cg_custom_output_grad(c);
        if (!dx.data) return CG_OK;
        const cg_real *xs = static_cast<const cg_real *>(x.data), *g = static_cast<const cg_real *>(dy.data);
        cg_real *d = static_cast<cg_real *>(dx.data);
        for (int64_t i = 0; i < dy.shape[0]; i++) {
            const cg_real v = xs[i * x.stride[0]];
            d[i * dx.stride[0]] += 3 * v * v * g[i];
        }
        return CG_OK;
    },
    1u, false, nullptr, nullptr};

int main() {
    std::unique_ptr<cg_graph, void (*)(cg_graph *)> g(cg_graph_new(CG_TRAIN), cg_graph_free);
    const int64_t shape[] = {3};
    cg_tensor *x = cg_requires_grad(cg_input(g.get(), "x", CG_REAL, 1, shape));
    cg_tensor *loss = cg_sum(g.get(), cg_mul(g.get(), x, x), -1, false);
    if (!loss) { std::fprintf(stderr, "%s\n", cg_last_error()); return 1; }
    std::vector<cg_real> xs{1, -2, 0.5}, dx(3);
    cg_write(x, xs.data());
    if (cg_graph_forward(g.get()) != CG_OK || cg_graph_backward(g.get(), loss) != CG_OK) {
        std::fprintf(stderr, "%s\n", cg_last_error());
        return 1;
    }
    cg_read_grad(x, dx.data());
    bool ok = cg_item(loss) == 5.25 && dx == std::vector<cg_real>{2, -4, 1};
    std::printf("downstream C++: loss %g, dx %g %g %g: %s\n", cg_item(loss), double(dx[0]), double(dx[1]),
                double(dx[2]), ok ? "ok" : "WRONG");

    std::unique_ptr<cg_graph, void (*)(cg_graph *)> h(cg_graph_new(CG_TRAIN), cg_graph_free);
    cg_tensor *u = cg_requires_grad(cg_input(h.get(), "u", CG_REAL, 1, shape));
    cg_tensor *in[] = {u};
    cg_tensor *cubed = cg_sum_all(h.get(), cg_custom(h.get(), &cube, in, nullptr, 0));
    if (!cubed) { std::fprintf(stderr, "%s\n", cg_last_error()); return 1; }
    cg_write(u, xs.data());
    if (cg_graph_forward(h.get()) != CG_OK || cg_graph_backward(h.get(), cubed) != CG_OK) {
        std::fprintf(stderr, "%s\n", cg_last_error());
        return 1;
    }
    cg_read_grad(u, dx.data());
    const bool custom_ok = cg_item(cubed) == 1 - 8 + 0.125 && dx == std::vector<cg_real>{3, 12, 0.75};
    std::printf("downstream C++ custom op: sum(x^3) %g, dx %g %g %g: %s\n", cg_item(cubed), double(dx[0]), double(dx[1]),
                double(dx[2]), custom_ok ? "ok" : "WRONG");
    return ok && custom_ok ? 0 : 1;
}
