/* SPDX-License-Identifier: MIT */
/* Central differences against backward, for any small graph. */
#include <math.h>
#include <stdlib.h>

#include "graph/gradcheck.h"
#include "graph/internal.h"
#include "ops/ops.h"

static cg_status loss_value(cg_graph *g, cg_tensor *loss, uint64_t step, double *v) {
    g->step = step; /* the same dropout masks on every evaluation */
    cg_status s = cg_graph_forward(g);
    *v = s ? NAN : (double)*(cg_real *)loss->data;
    return s;
}

/* Loss with element k of x moved by delta; *took is the step the element really took. Leaves are
 * written in place; a computed node is moved by forward right after it computes it. */
static cg_status nudged_loss(cg_graph *g, cg_tensor *loss, uint64_t step, cg_tensor *x, int64_t k, double delta,
                             double *took, double *v) {
    if (x->op == CGI_OP_INPUT || x->op == CGI_OP_PARAM) { /* contiguous: checked by the caller */
        cg_real *val = x->data, keep = val[k];
        val[k] = (cg_real)(keep + delta);
        *took = (double)val[k] - (double)keep;
        cg_status s = loss_value(g, loss, step, v);
        val[k] = keep;
        return s;
    }
    g->nudge = x, g->nudge_at = k, g->nudge_by = delta;
    cg_status s = loss_value(g, loss, step, v);
    *took = g->nudge_took;
    g->nudge = NULL;
    return s;
}

cg_status cg_gradcheck_tol(cg_graph *g, cg_tensor *out, int n, cg_tensor *const *inputs, double eps, double atol,
                           double rtol, cg_gradcheck_result *results) {
    if (!g || !out || n < 0 || (n && (!inputs || !results)))
        return cgi_fail(CG_ERR_ARG, "[gradcheck] NULL argument");
    if (g->mode != CG_TRAIN) return cgi_fail(CG_ERR_STATE, "[gradcheck] graph must be in train mode");
    for (int i = 0; i < n; i++) {
        cg_tensor *x = inputs[i];
        bool leaf = x && ((x->op == CGI_OP_INPUT && x->requires_grad) || (x->op == CGI_OP_PARAM && x->trainable));
        bool computed = x && x->graph == g && cgi_ops[x->op].kind == CGI_KIND_COMPUTE && x->requires_grad;
        if ((!leaf && !computed) || x->dtype != CG_REAL)
            return cgi_fail(CG_ERR_ARG, "[gradcheck] input %d is not a requires-grad real leaf, trainable parameter or "
                                        "node computed from them%s", i, x && cgi_ops[x->op].kind == CGI_KIND_VIEW
                                        ? " (a view: check its source, or cg_contiguous it)" : "");
        if (computed) cg_retain(x);
    }
    if (eps <= 0) eps = CG_GRADCHECK_EPS;
    if (atol < 0) atol = CG_GRADCHECK_ATOL;
    if (rtol < 0) rtol = CG_GRADCHECK_RTOL;
    cg_tensor *loss = out;
    if (cgi_numel(out->ndim, out->shape) != 1) {
        cg_tensor *r = cg_input(g, "gradcheck.R", CG_REAL, out->ndim, out->shape);
        if (!r) return CG_ERR_NOMEM;
        cg_rng rng;
        cg_rng_seed(&rng, 0x9c0ffee);
        cg_fill_uniform(r, &rng, -1, 1);
        loss = cg_sum_all(g, cg_mul(g, out, r));
        if (!loss) return CG_ERR_NOMEM;
    }
    cg_retain(loss);
    const uint64_t step = g->step;
    double v;
    cg_status s = loss_value(g, loss, step, &v);
    if (s) return s;
    for (int i = 0; i < n; i++)
        if (inputs[i]->op == CGI_OP_PARAM) memset(inputs[i]->grad, 0, (size_t)cg_numel(inputs[i]) * sizeof(cg_real));
    s = cg_graph_backward(g, loss);
    if (s) return s;
    for (int i = 0; i < n && !s; i++) {
        cg_tensor *x = inputs[i];
        int64_t m = cg_numel(x);
        cg_real *analytic = malloc((size_t)(m ? m : 1) * sizeof *analytic);
        if (!analytic) return cgi_fail(CG_ERR_NOMEM, "[gradcheck] out of memory");
        s = cg_read_grad(x, analytic);
        double max_abs = 0, max_a = 0, max_n = 0, worst_ratio = -1;
        cg_gradcheck_result r = {cg_name(x), m, 0, 0, true, 0, 0, 0};
        for (int64_t k = 0; k < m && !s; k++) {
            double up = 0, down = 0, h1 = 0, h2 = 0;
            s = nudged_loss(g, loss, step, x, k, eps, &h1, &up);
            if (!s) s = nudged_loss(g, loss, step, x, k, -eps, &h2, &down);
            const double a = analytic[k], numeric = (up - down) / (h1 - h2), err = fabs(numeric - a);
            const double bound = atol + rtol * fabs(numeric), ratio = isnan(err) ? INFINITY : err / bound;
            if (err > max_abs || isnan(err)) max_abs = isnan(err) ? INFINITY : err;
            if (fabs(numeric) > max_n) max_n = fabs(numeric);
            if (fabs(a) > max_a) max_a = fabs(a);
            if (!(err <= bound)) r.pass = false;
            if (ratio > worst_ratio) worst_ratio = ratio, r.worst = k, r.analytic = a, r.numeric = numeric;
        }
        free(analytic);
        double scale = max_a > max_n ? max_a : max_n;
        r.max_abs_err = max_abs;
        r.max_rel_err = scale > 0 ? max_abs / scale : max_abs;
        results[i] = r;
    }
    double ignored;
    cg_status s2 = loss_value(g, loss, step, &ignored); /* leave the graph's values as they were */
    g->step = step;
    return s ? s : s2;
}

cg_status cg_gradcheck(cg_graph *g, cg_tensor *out, int n, cg_tensor *const *inputs, double eps,
                       cg_gradcheck_result *results) {
    return cg_gradcheck_tol(g, out, n, inputs, eps, -1, -1, results);
}
