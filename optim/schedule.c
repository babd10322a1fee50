/* SPDX-License-Identifier: MIT */
/* Learning-rate schedules as pure functions of the step, so a resumed run only needs the step. */
#include <math.h>

#include "graph/internal.h"
#include "optim/optim.h"

static const char *sched_names[] = {"constant", "cosine", "linear", "noam"};

cg_status cg_schedule_parse(const char *name, cg_sched_kind *kind) {
    if (!name || !kind) return cgi_fail(CG_ERR_ARG, "[schedule_parse] NULL argument");
    for (int k = 0; k < 4; k++)
        if (strcmp(name, sched_names[k]) == 0) {
            *kind = (cg_sched_kind)k;
            return CG_OK;
        }
    return cgi_fail(CG_ERR_ARG, "[schedule_parse] unknown schedule '%s' (constant, cosine, linear, noam)", name);
}

cg_status cg_schedule_check(const cg_schedule *s) {
    if (!s) return cgi_fail(CG_ERR_ARG, "[schedule] NULL schedule");
    if (s->kind < CG_SCHED_CONSTANT || s->kind > CG_SCHED_NOAM)
        return cgi_fail(CG_ERR_ARG, "[schedule] unknown kind %d", (int)s->kind);
    if (s->warmup < 0) return cgi_fail(CG_ERR_ARG, "[schedule] warmup %lld < 0", (long long)s->warmup);
    if (s->kind == CG_SCHED_NOAM) {
        if (s->warmup < 1) return cgi_fail(CG_ERR_ARG, "[schedule] noam needs warmup >= 1");
        if (s->d_model < 1) return cgi_fail(CG_ERR_ARG, "[schedule] noam needs d_model >= 1, got %lld", (long long)s->d_model);
        if (!(s->noam_factor > 0 && isfinite(s->noam_factor)))
            return cgi_fail(CG_ERR_ARG, "[schedule] noam_factor %g must be > 0", s->noam_factor);
        return CG_OK;
    }
    if (!(s->lr >= 0 && isfinite(s->lr))) return cgi_fail(CG_ERR_ARG, "[schedule] %s: lr %g must be >= 0", sched_names[s->kind], s->lr);
    if (s->kind == CG_SCHED_CONSTANT) return CG_OK;
    if (!(s->min_lr >= 0 && s->min_lr <= s->lr))
        return cgi_fail(CG_ERR_ARG, "[schedule] %s: min_lr %g not in [0, lr %g]", sched_names[s->kind], s->min_lr, s->lr);
    if (s->total <= s->warmup)
        return cgi_fail(CG_ERR_ARG, "[schedule] %s: total %lld must exceed warmup %lld", sched_names[s->kind],
                        (long long)s->total, (long long)s->warmup);
    return CG_OK;
}

double cg_schedule_lr(const cg_schedule *s, int64_t step) {
    if (!s) return NAN;
    if (step < 0) step = 0;
    if (s->kind == CG_SCHED_NOAM) {
        /* Step 0 reads as 1, as in the Annotated Transformer, so the first update is not lost. */
        double n = step < 1 ? 1.0 : (double)step, w = s->warmup > 0 ? (double)s->warmup : 1.0;
        return s->noam_factor / sqrt((double)s->d_model) * fmin(1.0 / sqrt(n), n * pow(w, -1.5));
    }
    if (step < s->warmup) return s->lr * (double)step / (double)s->warmup;
    if (s->kind == CG_SCHED_CONSTANT) return s->lr;
    if (step >= s->total) return s->min_lr;
    double ratio = (double)(step - s->warmup) / (double)(s->total - s->warmup);
    double coeff = s->kind == CG_SCHED_COSINE ? 0.5 * (1.0 + cos(3.14159265358979323846 * ratio)) : 1.0 - ratio;
    return s->min_lr + coeff * (s->lr - s->min_lr);
}
