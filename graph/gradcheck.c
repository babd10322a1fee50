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

cg_status cg_gradcheck(cg_graph *g, cg_tensor *out, int n, cg_tensor *const *inputs, double eps,
                       cg_gradcheck_result *results) {
    if (!g || !out || n < 0 || (n && (!inputs || !results)))
        return cgi_fail(CG_ERR_ARG, "[gradcheck] NULL argument");
    if (g->mode != CG_TRAIN) return cgi_fail(CG_ERR_STATE, "[gradcheck] graph must be in train mode");
    for (int i = 0; i < n; i++) {
        cg_tensor *x = inputs[i];
        bool leaf = x && ((x->op == CGI_OP_INPUT && x->requires_grad) || (x->op == CGI_OP_PARAM && x->trainable));
        if (!leaf || x->dtype != CG_REAL)
            return cgi_fail(CG_ERR_ARG, "[gradcheck] input %d is not a requires-grad real leaf or trainable parameter", i);
    }
    if (eps <= 0) eps = CG_GRADCHECK_EPS;
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
    for (int i = 0; i < n; i++) {
        cg_tensor *x = inputs[i];
        int64_t m = cg_numel(x);
        double *analytic = malloc((size_t)(m ? m : 1) * sizeof *analytic);
        if (!analytic) return cgi_fail(CG_ERR_NOMEM, "[gradcheck] out of memory");
        cg_real *val = x->data;
        for (int64_t k = 0; k < m; k++) analytic[k] = x->grad[k];
        double max_abs = 0, max_a = 0, max_n = 0;
        for (int64_t k = 0; k < m && !s; k++) {
            cg_real keep = val[k];
            double up = 0, down = 0;
            val[k] = (cg_real)(keep + eps);
            double h1 = (double)val[k] - (double)keep; /* the step the element really took */
            s = loss_value(g, loss, step, &up);
            val[k] = (cg_real)(keep - eps);
            double h2 = (double)keep - (double)val[k];
            if (!s) s = loss_value(g, loss, step, &down);
            val[k] = keep;
            double numeric = (up - down) / (h1 + h2), err = fabs(numeric - analytic[k]);
            if (err > max_abs || isnan(err)) max_abs = isnan(err) ? INFINITY : err;
            if (fabs(numeric) > max_n) max_n = fabs(numeric);
            if (fabs(analytic[k]) > max_a) max_a = fabs(analytic[k]);
        }
        free(analytic);
        if (s) break;
        double scale = max_a > max_n ? max_a : max_n;
        results[i].name = cg_name(x);
        results[i].numel = m;
        results[i].max_abs_err = max_abs;
        results[i].max_rel_err = scale > 0 ? max_abs / scale : max_abs;
    }
    double ignored;
    cg_status s2 = loss_value(g, loss, step, &ignored); /* leave the graph's values as they were */
    g->step = step;
    return s ? s : s2;
}
