/* SPDX-License-Identifier: MIT */
// The same check from C++: the headers' extern "C" guards let a C++ program link the C API.
#include <cgrad/cgrad.h>

#include <cstdio>
#include <memory>
#include <vector>

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
    return ok ? 0 : 1;
}
