/* SPDX-License-Identifier: MIT */
/* What a cgrad train run shows and leaves beside its checkpoint: the progress bar or lines, the
 * evaluation lines, the metrics (CSV and JSON lines), the loss plot and the resolved options. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/train.h"
#include "io/file_internal.h"

/* The step a metrics row is about: a CSV row's first field, a JSON line's leading "step"; -1 if neither. */
static int64_t row_step(const char *line) {
    if (!strncmp(line, "{\"step\":", 8)) line += 8 + strspn(line + 8, " ");
    return *line >= '0' && *line <= '9' ? strtoll(line, NULL, 10) : -1;
}

/* Rewrites a metrics file (header NULL: JSON lines) keeping the rows up to the resumed step, then
 * appends to it. */
FILE *train_open_metrics(const char *path, int64_t keep_upto, const char *header) {
    char *old = NULL;
    size_t len = 0;
    struct stat sb; /* rows to keep are in a regular file (a rank's /dev/null has none) */
    if (keep_upto > 0 && !stat(path, &sb) && S_ISREG(sb.st_mode) &&
        !(old = cgi_read_bounded(path, CGI_LIMIT_METRICS, "metrics", &len))) {
        fprintf(stderr, "cgrad train: %s\n", cg_last_error());
        errno = EINVAL;
        return NULL;
    }
    FILE *f = fopen(path, "w");
    if (!f) {
        free(old);
        return NULL;
    }
    if (header) fputs(header, f);
    for (char *line = old; line && *line;) {
        char *nl = strchr(line, '\n');
        if (!nl) break;
        const int64_t step = row_step(line);
        if (step >= 0 && step <= keep_upto) fwrite(line, 1, (size_t)(nl - line + 1), f);
        line = nl + 1;
    }
    free(old);
    errno = 0;
    if (fflush(f) || ferror(f)) { /* the kept rows must be there before the run adds to them */
        const int err = errno ? errno : EIO;
        fclose(f);
        errno = err;
        return NULL;
    }
    return f;
}

/* False, with "[write] path: reason" as the error, when stream f failed a write. */
static bool stream_ok(run *r, FILE *f, const char *path) {
    errno = 0;
    if (!f || (!fflush(f) && !ferror(f))) return true;
    cg_set_error(CG_ERR_IO, "[write] %s: %s", path, strerror(errno ? errno : EIO));
    if (!r->write_failed) snprintf(r->write_error, sizeof r->write_error, "%s", cg_last_error());
    r->write_failed = true;
    return false;
}

/* One metrics row, in the CSV and as a JSON line. NAN lr, val_loss or tok_s: no value (an empty
 * field, an absent key); train NULL: none (a skipped step's non-finite loss is written as it is). */
bool train_metrics_row(run *r, int64_t step, double lr, const double *train, double val, double tok_s, double elapsed) {
    const struct { const char *key, *fmt; double v; bool any; } col[] = {
        {"lr", "%.6g", lr, false}, {"train_loss", "%.9g", train ? *train : NAN, train != NULL},
        {"val_loss", "%.9g", val, false}, {TOK_COLUMN, "%.1f", tok_s, false}, {"elapsed_s", "%.3f", elapsed, false}};
    fprintf(r->metrics, "%lld", (long long)step);
    if (r->jsonl) fprintf(r->jsonl, "{\"step\": %lld", (long long)step);
    for (size_t i = 0; i < sizeof col / sizeof col[0]; i++) {
        fputc(',', r->metrics);
        if (isnan(col[i].v) && !col[i].any) continue;
        fprintf(r->metrics, col[i].fmt, col[i].v);
        if (r->jsonl && isfinite(col[i].v)) { /* JSON has no infinity: a diverged loss stays in the CSV */
            fprintf(r->jsonl, ", \"%s\": ", col[i].key);
            fprintf(r->jsonl, col[i].fmt, col[i].v);
        }
    }
    fputc('\n', r->metrics);
    if (r->jsonl) fputs("}\n", r->jsonl);
    /* a row a step: one write each, so a full disk stops the run at the row it lost */
    return stream_ok(r, r->metrics, r->metrics_path) && stream_ok(r, r->jsonl, r->jsonl_path);
}

bool train_close_metrics(run *r) {
    bool ok = stream_ok(r, r->metrics, r->metrics_path) && stream_ok(r, r->jsonl, r->jsonl_path);
    if (r->metrics && fclose(r->metrics) && ok) {
        cg_set_error(CG_ERR_IO, "[write] %s: %s", r->metrics_path, strerror(errno));
        ok = false;
    }
    if (r->jsonl && fclose(r->jsonl) && ok) {
        cg_set_error(CG_ERR_IO, "[write] %s: %s", r->jsonl_path, strerror(errno));
        ok = false;
    }
    r->metrics = r->jsonl = NULL;
    if (!ok && !r->write_failed) snprintf(r->write_error, sizeof r->write_error, "%s", cg_last_error());
    if (!ok) r->write_failed = true;
    return ok;
}

/* The run's resolved options as one JSON object (the checkpoint's "train" object, pretty): the file
 * --config reads, so `cgrad train --config X_run.json` sets up the same run. */
int train_write_run_json(run *r) {
    cJSON *j = train_opts_json(&r->o);
    char *text = j ? cJSON_Print(j) : NULL;
    cJSON_Delete(j);
    cli_out out;
    if (!text || !cli_out_open(&out, r->run_path)) {
        free(text);
        return -1;
    }
    fputs(text, out.f);
    fputc('\n', out.f);
    free(text);
    return cli_out_close(&out) ? -1 : 0;
}

static void fmt_time(char *buf, size_t n, double s) {
    if (!(s >= 0) || s > 1e7) snprintf(buf, n, "--:--");
    else if (s >= 3600) snprintf(buf, n, "%d:%02d:%02d", (int)s / 3600, (int)s / 60 % 60, (int)s % 60);
    else snprintf(buf, n, "%d:%02d", (int)s / 60, (int)s % 60);
}

void train_clear_bar(run *r) {
    if (r->tty && r->bar_shown) fputs("\r\033[K", stdout);
    r->bar_shown = false;
}

/* Evaluations still to come once step done is trained (its own, if due, runs after the progress
 * line): at each multiple of --eval-every in [done, total], and at the end. */
static int64_t evals_left(const topts *o, int64_t done) {
    const int64_t total = o->steps, every = o->eval_every;
    if (done > total) return 0;
    return every > 0 ? total / every - (done - 1) / every + (total % every != 0) : 1;
}

void train_progress(run *r, double loss, double lr) {
    const int64_t total = r->o.steps, done = r->step;
    const double tok_s = cli_rate_tokens_per_s(&r->rate);
    char eta[32];
    fmt_time(eta, sizeof eta, cli_rate_eta(&r->rate, total - done, evals_left(&r->o, done), r->eval_s));
    if (r->tty) {
        char bar[25];
        int fillc = total > 0 ? (int)(24 * done / total) : 24;
        for (int i = 0; i < 24; i++) bar[i] = i < fillc ? '#' : '.';
        bar[24] = 0;
        printf("\r\033[K[%s] %lld/%lld loss %.4f lr %.2e %.0f tok/s ETA %s", bar, (long long)done, (long long)total,
               loss, lr, tok_s, eta);
        r->bar_shown = true;
    } else {
        printf("step %lld/%lld loss %.4f lr %.2e %.0f tok/s ETA %s\n", (long long)done, (long long)total, loss, lr, tok_s,
               eta);
    }
    fflush(stdout);
}

void train_log_eval(run *r, const cli_eval *e, double exact, int64_t tried) {
    train_clear_bar(r);
    printf("eval step %lld:", (long long)r->step);
    if (r->win_n) printf(" train %.4f", r->win_sum / (double)r->win_n);
    printf(" held-out %.4f", e->loss);
    if (!isnan(e->mlm_loss)) printf(" (mlm %.4f nsp %.4f)", e->mlm_loss, e->nsp_loss);
    if (!isnan(e->accuracy)) printf(" accuracy %.4f (%lld held-out)", e->accuracy, (long long)e->items);
    if (tried > 0) printf(" exact-match %.4f (%lld held-out, greedy)", exact, (long long)tried);
    char el[32];
    fmt_time(el, sizeof el, r->elapsed0 + train_now_s() - r->t_start);
    printf(" [%s]\n", el);
    fflush(stdout);
}

bool train_finish_files(run *r) {
    if (!stream_ok(r, r->metrics, r->metrics_path) || !stream_ok(r, r->jsonl, r->jsonl_path)) {
        fprintf(stderr, "cgrad train: %s\n", cg_last_error());
        return false;
    }
    char title[256];
    const bool image = r->arch == CG_ARCH_VIT || r->arch == CG_ARCH_CNN; /* no layers, width or context of a text model */
    if (image)
        snprintf(title, sizeof title, "cgrad train %s: batch %lld", cg_arch_name(r->arch),
                 (long long)(r->o.batch * r->o.grad_accum));
    else
        snprintf(title, sizeof title, "cgrad train %s: %lld layers, d %lld, context %lld, batch %lld", cg_arch_name(r->arch),
                 (long long)r->o.layers, (long long)r->o.dim, (long long)r->task.t, (long long)(r->o.batch * r->o.grad_accum));
    static const char *const ylabel[] = {"loss (nats per token)", "loss (masked-LM + next-sentence, nats)",
                                         "loss (nats per target token)", "loss (nats per example)",
                                         "loss (nats per token)", "loss (nats per image)", "loss (nats per image)"};
    _Static_assert(sizeof ylabel / sizeof *ylabel == CG_ARCH_CNN + 1, "a loss label per arch");
    if (cli_plot_metrics(r->metrics_path, r->plot_path, title, ylabel[r->arch])) {
        fprintf(stderr, "cgrad train: cannot draw %s: %s\n", r->plot_path, cg_last_error());
        if (!r->write_failed) snprintf(r->write_error, sizeof r->write_error, "%s", cg_last_error());
        r->write_failed = true;
        return false;
    }
    return true;
}

/* Derived file names: in the run directory when there is one, else next to the checkpoint. */
void train_derive_paths(run *r, const char *run_dir) {
    const char *c = r->o.checkpoint, *dot = strrchr(c, '.'), *slash = strrchr(c, '/');
    const int base = dot && (!slash || dot > slash) ? (int)(dot - c) : (int)strlen(c); /* the checkpoint's stem */
    if (*r->o.metrics) snprintf(r->metrics_path, sizeof r->metrics_path, "%s", r->o.metrics);
    else if (run_dir) snprintf(r->metrics_path, sizeof r->metrics_path, "%s/metrics.csv", run_dir);
    else snprintf(r->metrics_path, sizeof r->metrics_path, "%.*s_metrics.csv", base, c);
    size_t n = strlen(r->metrics_path);
    int mbase = n > 4 && !strcmp(r->metrics_path + n - 4, ".csv") ? (int)n - 4 : (int)n;
    snprintf(r->jsonl_path, sizeof r->jsonl_path, "%.*s.jsonl", mbase, r->metrics_path); /* beside the CSV */
    if (*r->o.plot) snprintf(r->plot_path, sizeof r->plot_path, "%s", r->o.plot);
    else if (run_dir && !*r->o.metrics) snprintf(r->plot_path, sizeof r->plot_path, "%s/loss.svg", run_dir);
    else {
        if (mbase > 8 && !strncmp(r->metrics_path + mbase - 8, "_metrics", 8)) mbase -= 8;
        snprintf(r->plot_path, sizeof r->plot_path, "%.*s_loss.svg", mbase, r->metrics_path);
    }
    /* the resolved options: in the run directory, else beside the checkpoint */
    if (run_dir) snprintf(r->run_path, sizeof r->run_path, "%s/run.json", run_dir);
    else snprintf(r->run_path, sizeof r->run_path, "%.*s_run.json", base, c);
}
