/* SPDX-License-Identifier: MIT */
/* Training curves as a standalone SVG, written by hand: one or several runs (metrics CSV or JSON
 * lines) against the step, in stacked panels with a shared step axis: loss (training, raw and
 * smoothed, and held-out), learning rate, and throughput. Each run has one colour. Reads the
 * metrics files, so a resumed run's earlier rows are drawn too, and `cgrad plot` redraws any. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli/commands.h"
#include "cli/session.h"
#include "io/file_internal.h"

enum { STEP, TRAIN, VAL, LR, TOK, NCOL };
enum { PLOT_LINE_MAX = 4096 }; /* bytes of a metrics line, its newline included (docs/limits.md) */ /* the columns a run's rows have (NAN: none) */

typedef struct {
    double *v[NCOL];
    double *smooth; /* the training loss's moving average */
    int n, cap;
    const char *label;
} series;

static bool push(series *s, const double *row) {
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 256;
        for (int c = 0; c < NCOL; c++) {
            double *a = realloc(s->v[c], (size_t)cap * sizeof *a);
            if (!a) return false;
            s->v[c] = a;
        }
        s->cap = cap;
    }
    for (int c = 0; c < NCOL; c++) s->v[c][s->n] = row[c];
    s->n++;
    return true;
}

static void series_free(series *s) {
    for (int c = 0; c < NCOL; c++) free(s->v[c]);
    free(s->smooth);
}

/* Column index of the CSV header field name (prefix: any field starting with it), or -1. */
static int column(const char *header, const char *name, bool prefix) {
    int col = 0;
    size_t len = strlen(name);
    for (const char *p = header; *p; col++) {
        size_t w = strcspn(p, ",\r\n");
        if ((w == len || (prefix && w > len)) && !strncmp(p, name, len)) return col;
        p += w;
        if (*p != ',') break;
        p++;
    }
    return -1;
}

/* Field col of a CSV line as a number into *v (NAN when empty or missing, col < 0 included);
 * false when the field holds something else than a decimal number, inf or nan ("0x10", "1.5abc"). */
static bool field_num(const char *line, int col, double *v) {
    const char *p = line;
    *v = NAN;
    if (col < 0) return true;
    for (int c = 0; c < col; c++) {
        p = strpbrk(p, ",\n");
        if (!p || *p != ',') return true;
        p++;
    }
    const size_t w = strcspn(p, ",\r\n");
    if (w == 0) return true;
    char num[64];
    if (w >= sizeof num) return false;
    memcpy(num, p, w);
    num[w] = 0;
    const char *bare = num + (*num == '-' || *num == '+');
    const bool special = !strcasecmp(bare, "inf") || !strcasecmp(bare, "nan"); /* a diverged loss, as written */
    if (!special && !cli_decimal(num, false)) return false;
    *v = strtod(num, NULL);
    return true;
}

/* A JSON line's number under key (prefix: the first key starting with it); NAN when absent. */
static double json_num(const cJSON *o, const char *key, bool prefix) {
    for (const cJSON *v = o->child; v; v = v->next)
        if (prefix ? !strncmp(v->string, key, strlen(key)) : !strcmp(v->string, key))
            return cJSON_IsNumber(v) ? v->valuedouble : NAN;
    return NAN;
}

/* Reads line no of f into line; false at the end of the file or on an error (*st set: a read
 * error, or a line longer than PLOT_LINE_MAX, which is refused rather than split into two rows). */
static bool next_line(FILE *f, const char *path, long no, char *line, size_t n, cg_status *st) {
    if (!fgets(line, (int)n, f)) {
        if (ferror(f)) *st = cg_set_error(CG_ERR_IO, "[plot] %s line %ld: read error", path, no);
        return false;
    }
    const size_t len = strlen(line);
    if (len + 1 == n && line[len - 1] != '\n') {
        *st = cg_set_error(CG_ERR_FORMAT, "[plot] %s line %ld: longer than %d bytes (not a metrics file?)", path, no,
                           PLOT_LINE_MAX);
        return false;
    }
    if ((len == 0 || line[len - 1] != '\n') && !feof(f)) { /* fgets stopped short of the newline: a NUL */
        *st = cg_set_error(CG_ERR_FORMAT, "[plot] %s line %ld: holds a NUL byte (not a metrics file?)", path, no);
        return false;
    }
    return true;
}

/* Reads a metrics file: CSV with a header (step, train_loss, val_loss; lr and a tok... column if
 * there), or JSON lines (one object a line with the same keys). */
static cg_status read_metrics(const char *path, series *s) {
    FILE *f = cgi_fopen_bounded(path, CGI_LIMIT_METRICS, "plot", NULL);
    if (!f) return cg_last_status();
    char line[PLOT_LINE_MAX + 2]; /* a line, its newline and the NUL */
    int col[NCOL] = {-1, -1, -1, -1, -1};
    cg_status st = CG_OK;
    bool jsonl = false, any = false;
    long no = 1;
    if (next_line(f, path, no, line, sizeof line, &st)) {
        any = true;
        jsonl = line[strspn(line, " \t")] == '{';
        if (!jsonl) {
            col[STEP] = column(line, "step", false), col[TRAIN] = column(line, "train_loss", false);
            col[VAL] = column(line, "val_loss", false), col[LR] = column(line, "lr", false);
            col[TOK] = column(line, "tok", true); /* tok_per_s_last20, or an older file's tokens_per_s */
            if (col[STEP] < 0 || col[TRAIN] < 0 || col[VAL] < 0)
                st = cg_set_error(CG_ERR_FORMAT, "[plot] %s: the header needs step, train_loss and val_loss", path);
            if (!st && !next_line(f, path, ++no, line, sizeof line, &st)) line[0] = 0;
        }
    } else line[0] = 0;
    if (!st && !any) st = cg_set_error(CG_ERR_FORMAT, "[plot] %s: empty file: no header and no rows", path);
    for (; !st && line[0]; no++) {
        double row[NCOL];
        if (jsonl) {
            cJSON *o = line[strspn(line, " \t\r\n")] ? cJSON_Parse(line) : NULL;
            if (o && cJSON_IsObject(o)) {
                static const char *const keys[] = {"step", "train_loss", "val_loss", "lr", "tok"};
                for (int c = 0; c < NCOL; c++) row[c] = json_num(o, keys[c], c == TOK);
            } else if (line[strspn(line, " \t\r\n")])
                st = cg_set_error(CG_ERR_FORMAT, "[plot] %s line %ld: not a JSON object", path, no);
            else row[STEP] = NAN;
            cJSON_Delete(o);
        } else
            for (int c = 0; !st && c < NCOL; c++)
                if (!field_num(line, col[c], &row[c]))
                    st = cg_set_error(CG_ERR_FORMAT, "[plot] %s line %ld, column %d: not a decimal number", path, no,
                                      col[c] + 1);
        if (!st && !isnan(row[STEP])) {
            if (!isfinite(row[STEP])) /* an axis to infinity has no ticks to draw */
                st = cg_set_error(CG_ERR_FORMAT, "[plot] %s line %ld: step %g is not a finite number", path, no, row[STEP]);
            else if (!push(s, row)) st = cg_set_error(CG_ERR_NOMEM, "[plot] out of memory");
        }
        if (!st && !next_line(f, path, no + 1, line, sizeof line, &st)) line[0] = 0;
    }
    fclose(f);
    return st;
}

/* A round tick spacing giving about target intervals over range. */
static double nice_step(double range, int target) {
    if (!(range > 0)) return 1;
    double raw = range / target, p = pow(10, floor(log10(raw))), f = raw / p;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * p;
}

static void esc(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '&') fputs("&amp;", f);
        else if (*s == '"') fputs("&quot;", f);
        else fputc(*s, f);
    }
}

/* Ticks lo, lo + step, ... up to hi: their count, 0 when the range cannot be ticked in a few
 * finite steps (a step lost in rounding, an infinite or NaN range), so no loop can run away. */
static int tick_count(double lo, double hi, double step) {
    const double n = (hi - lo) / step;
    return n >= 0 && n <= 64 ? (int)floor(n + 0.5) + 1 : 0;
}

enum { W = 860, ML = 80, MR = 24, MT = 48, MB = 56, GAP = 34, H_LOSS = 396, H_SMALL = 150 };

/* A panel: data ranges and its pixel rows [top, bottom]. */
typedef struct {
    double x0, x1, y0, y1, xs, ys;
    int top, bottom;
} frame;

static double px(const frame *fr, double x) { return ML + (x - fr->x0) / (fr->x1 - fr->x0) * (W - ML - MR); }
static double py(const frame *fr, double y) { return fr->bottom - (y - fr->y0) / (fr->y1 - fr->y0) * (fr->bottom - fr->top); }

/* A polyline through the finite points of column ys of s (every stride-th one). */
static void polyline(FILE *f, const frame *fr, const series *s, const double *ys, int stride, const char *color,
                     const char *style) {
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" %s points=\"", color, style);
    for (int i = 0; i < s->n; i += stride)
        if (isfinite(ys[i])) fprintf(f, "%.1f,%.1f ", px(fr, s->v[STEP][i]), py(fr, ys[i]));
    fprintf(f, "\"/>\n");
}

/* Rounds a panel's y range [lo, hi] (none finite: [0, 1]) out to ticks. */
static void y_range(frame *fr, double lo, double hi) {
    if (!(hi >= lo)) lo = 0, hi = 1;
    fr->ys = nice_step(hi - lo, fr->bottom - fr->top > 200 ? 6 : 3);
    fr->y0 = floor(lo / fr->ys) * fr->ys, fr->y1 = fmax(ceil(hi / fr->ys) * fr->ys, fr->y0 + fr->ys);
}

/* Grid, axes, ticks and labels of a panel. */
static void axes(FILE *f, const frame *fr, const char *ylabel) {
    const int nx = tick_count(fr->x0, fr->x1, fr->xs), ny = tick_count(fr->y0, fr->y1, fr->ys);
    fprintf(f, "<g stroke=\"#e4e4e4\" stroke-width=\"1\">\n");
    for (int i = 0; i < nx; i++) {
        const double x = px(fr, fr->x0 + i * fr->xs);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/>\n", x, fr->top, x, fr->bottom);
    }
    for (int i = 0; i < ny; i++) {
        const double y = py(fr, fr->y0 + i * fr->ys);
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>\n", ML, y, W - MR, y);
    }
    fprintf(f, "</g>\n<g stroke=\"#333\" stroke-width=\"1\">\n");
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>\n", ML, fr->bottom, W - MR, fr->bottom);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>\n", ML, fr->top, ML, fr->bottom);
    for (int i = 0; i < nx; i++) {
        const double x = px(fr, fr->x0 + i * fr->xs);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/>\n", x, fr->bottom, x, fr->bottom + 5);
    }
    for (int i = 0; i < ny; i++) {
        const double y = py(fr, fr->y0 + i * fr->ys);
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>\n", ML - 5, y, ML, y);
    }
    fprintf(f, "</g>\n<g fill=\"#333\">\n");
    for (int i = 0; i < nx; i++) {
        const double x = fr->x0 + i * fr->xs;
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%g</text>\n", px(fr, x), fr->bottom + 19,
                fabs(x) < fr->xs * 1e-9 ? 0.0 : x);
    }
    for (int i = 0; i < ny; i++) {
        const double y = fr->y0 + i * fr->ys;
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", ML - 8, py(fr, y) + 4,
                fabs(y) < fr->ys * 1e-9 ? 0.0 : y);
    }
    fprintf(f, "<text transform=\"translate(18 %d) rotate(-90)\" text-anchor=\"middle\" font-size=\"13\">",
            (fr->top + fr->bottom) / 2);
    esc(f, ylabel);
    fprintf(f, "</text>\n</g>\n");
}

/* One legend row: a line (dashed, dotted or plain) and its text. */
static void legend_row(FILE *f, int x, int y, const char *color, const char *style, bool dot, const char *text) {
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" %s/>\n", x + 10, y, x + 36, y, color, style);
    if (dot) fprintf(f, "<circle cx=\"%d\" cy=\"%d\" r=\"3\" fill=\"%s\"/>\n", x + 23, y, color);
    fprintf(f, "<text x=\"%d\" y=\"%d\">", x + 44, y + 4);
    esc(f, text);
    fprintf(f, "</text>\n");
}

static const char *const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
                                      "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

cg_status cli_plot_runs(const char *const *paths, const char *const *labels, int n_runs, const char *svg_path,
                        const char *title, const char *ylabel) {
    series *runs = calloc((size_t)(n_runs > 0 ? n_runs : 1), sizeof *runs);
    cg_status st = runs ? CG_OK : cg_set_error(CG_ERR_NOMEM, "[plot] out of memory");
    for (int r = 0; !st && r < n_runs; r++) {
        runs[r].label = labels && labels[r] ? labels[r] : paths[r];
        st = read_metrics(paths[r], &runs[r]);
    }
    cli_out out = {0};
    if (!st && !cli_out_open(&out, svg_path)) st = cg_last_status();
    FILE *f = out.f; /* a temporary file beside svg_path, renamed into place when whole */
    /* Ranges over every run; an exponential moving average over about 1/50 of each run. */
    double x0 = INFINITY, x1 = -INFINITY, lo[NCOL], hi[NCOL];
    for (int c = 0; c < NCOL; c++) lo[c] = INFINITY, hi[c] = -INFINITY;
    for (int r = 0; !st && r < n_runs; r++) {
        series *s = &runs[r];
        if (!(s->smooth = malloc((size_t)(s->n ? s->n : 1) * sizeof *s->smooth))) {
            st = cg_set_error(CG_ERR_NOMEM, "[plot] out of memory");
            break;
        }
        const double a = 2.0 / (fmax(1.0, fmin(100.0, s->n / 50.0)) + 1.0);
        double m = 0, wsum = 0;
        for (int i = 0; i < s->n; i++) {
            if (isfinite(s->v[TRAIN][i])) m = (1 - a) * m + a * s->v[TRAIN][i], wsum = (1 - a) * wsum + a;
            s->smooth[i] = wsum > 0 ? m / wsum : NAN;
            x0 = fmin(x0, s->v[STEP][i]), x1 = fmax(x1, s->v[STEP][i]);
            for (int c = TRAIN; c < NCOL; c++)
                if (isfinite(s->v[c][i])) lo[c] = fmin(lo[c], s->v[c][i]), hi[c] = fmax(hi[c], s->v[c][i]);
        }
    }
    if (st) {
        if (f) cli_out_abort(&out);
        for (int r = 0; runs && r < n_runs; r++) series_free(&runs[r]);
        free(runs);
        return st;
    }
    /* Panels top to bottom, on one step axis; the small ones only when some run has their column. */
    const bool has_lr = hi[LR] > 0, has_tok = hi[TOK] > 0;
    frame loss = {.top = MT, .bottom = MT + H_LOSS}, lr = loss, tok = loss;
    if (!(x1 >= x0)) x0 = 0, x1 = 1;
    x0 = fmin(x0, 0);
    loss.xs = nice_step(x1 - x0, 8);
    loss.x0 = x0, loss.x1 = fmax(ceil(x1 / loss.xs) * loss.xs, x0 + loss.xs);
    y_range(&loss, fmin(lo[TRAIN], lo[VAL]), fmax(hi[TRAIN], hi[VAL]));
    int bottom = loss.bottom;
    if (has_lr) {
        lr = loss, lr.top = bottom + GAP, lr.bottom = lr.top + H_SMALL, bottom = lr.bottom;
        y_range(&lr, 0, hi[LR]);
    }
    if (has_tok) {
        tok = loss, tok.top = bottom + GAP, tok.bottom = tok.top + H_SMALL, bottom = tok.bottom;
        y_range(&tok, 0, hi[TOK]);
    }
    const int H = bottom + MB;

    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n", W, H, W, H);
    fprintf(f, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", W, H);
    fprintf(f, "<text x=\"%d\" y=\"28\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">", (ML + W - MR) / 2);
    esc(f, title ? title : "training loss");
    fprintf(f, "</text>\n");
    axes(f, &loss, ylabel ? ylabel : "loss (nats per token)");
    if (has_lr) axes(f, &lr, "learning rate");
    if (has_tok) axes(f, &tok, "tokens/s");
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"13\" fill=\"#333\">step</text>\n",
            (ML + W - MR) / 2, H - 14);
    /* One run: training in blue, held-out in orange. Several: one colour a run, held-out dashed. */
    const bool one = n_runs == 1;
    for (int r = 0; r < n_runs; r++) {
        const series *s = &runs[r];
        const char *c = palette[r % 10], *cv = one ? "#ff7f0e" : c;
        const int stride = s->n > 3000 ? s->n / 1500 : 1;
        if (one) polyline(f, &loss, s, s->v[TRAIN], stride, c, "stroke-opacity=\"0.3\" stroke-width=\"1\"");
        polyline(f, &loss, s, s->smooth, stride, c, "stroke-width=\"2\"");
        polyline(f, &loss, s, s->v[VAL], 1, cv, one ? "stroke-width=\"2\"" : "stroke-width=\"2\" stroke-dasharray=\"6 3\"");
        fprintf(f, "<g fill=\"%s\">\n", cv);
        for (int i = 0; i < s->n; i++)
            if (isfinite(s->v[VAL][i]))
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\"/>\n", px(&loss, s->v[STEP][i]), py(&loss, s->v[VAL][i]));
        fprintf(f, "</g>\n");
        if (has_lr) polyline(f, &lr, s, s->v[LR], stride, c, "stroke-width=\"1.5\"");
        if (has_tok) polyline(f, &tok, s, s->v[TOK], stride, c, "stroke-width=\"1\"");
    }
    /* Legend, top right of the loss panel, with each run's last held-out value. */
    const int rows = one ? 3 : n_runs + 1, lw = one ? 220 : 300, lx = W - MR - lw - 10, ly = MT + 10;
    fprintf(f, "<g font-size=\"12\">\n<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"white\" "
               "fill-opacity=\"0.9\" stroke=\"#bbb\"/>\n", lx, ly, lw, 18 * rows + 12);
    for (int r = 0; r < n_runs; r++) {
        double last = NAN;
        for (int i = 0; i < runs[r].n; i++)
            if (isfinite(runs[r].v[VAL][i])) last = runs[r].v[VAL][i];
        char text[600], held[64];
        if (isnan(last)) snprintf(held, sizeof held, "none yet");
        else snprintf(held, sizeof held, "last %.4f", last);
        if (one) {
            legend_row(f, lx, ly + 16, palette[0], "stroke-opacity=\"0.3\"", false, "train (each step)");
            legend_row(f, lx, ly + 34, palette[0], "stroke-width=\"2\"", false, "train (moving average)");
            snprintf(text, sizeof text, "held-out (%s)", held);
            legend_row(f, lx, ly + 52, "#ff7f0e", "stroke-width=\"2\"", true, text);
        } else {
            snprintf(text, sizeof text, "%.40s (held-out %s)", runs[r].label, held);
            legend_row(f, lx, ly + 16 + 18 * r, palette[r % 10], "stroke-width=\"2\"", false, text);
        }
    }
    if (!one)
        legend_row(f, lx, ly + 16 + 18 * n_runs, "#555", "stroke-width=\"2\" stroke-dasharray=\"6 3\"", true,
                   "solid: train (moving average); dashed: held-out");
    fprintf(f, "</g>\n</svg>\n");
    st = cli_out_close(&out);
    for (int r = 0; r < n_runs; r++) series_free(&runs[r]);
    free(runs);
    return st;
}

cg_status cli_plot_metrics(const char *csv_path, const char *svg_path, const char *title, const char *ylabel) {
    return cli_plot_runs(&csv_path, NULL, 1, svg_path, title, ylabel);
}

const cli_opt cli_plot_opts[] = {{"--out", CLI_OUT, 0, 0, "SVG to write (one file: METRICS.svg; several: needed)"},
                                 {"--labels", CLI_STR, 0, 0, "the runs' names in the legend, comma-separated (the file names)"},
                                 {"--title", CLI_STR, 0, 0, "chart title (the metrics file's name)"},
                                 {"--ylabel", CLI_STR, 0, 0, "loss axis label (loss (nats per token))"},
                                 {NULL, CLI_BARE, 0, 0, NULL}};

int cmd_plot(int argc, char **argv) {
    cli_args a;
    if (!cli_parse("plot", cli_plot_opts, argc, argv, &a) || !cli_words(&a, 1, 64, "the metrics files (at most 64)"))
        return 2;
    const char *out = cli_str(&a, "--out", NULL), *title = cli_str(&a, "--title", NULL),
               *ylabel = cli_str(&a, "--ylabel", NULL), *label_list = cli_str(&a, "--labels", NULL);
    const cli_opt in = {"METRICS", CLI_IN, 0, 0, NULL};
    cli_value v;
    for (int i = 0; i < a.n_words; i++)
        if (!cli_check_value("plot", &in, a.words[i], &v)) return 2;
    if (!out && a.n_words > 1) {
        fprintf(stderr, "cgrad plot: %d metrics files need --out FILE.svg (cgrad plot --help)\n", a.n_words);
        return 2;
    }
    /* --labels: one name per file */
    char *copy = label_list ? strdup(label_list) : NULL;
    const char *labels[64] = {0};
    int n_labels = 0;
    for (char *p = copy, *save = NULL, *t = p ? strtok_r(p, ",", &save) : NULL; t; t = strtok_r(NULL, ",", &save))
        if (n_labels < 64) labels[n_labels++] = t;
        else n_labels++;
    if (label_list && n_labels != a.n_words) {
        fprintf(stderr, "cgrad plot: --labels '%s' names %d runs, for %d metrics files\n", label_list, n_labels, a.n_words);
        free(copy);
        return 2;
    }
    char def[4096];
    if (!out) {
        const char *m = a.words[0];
        size_t n = strlen(m);
        const size_t ext = n > 4 && !strcmp(m + n - 4, ".csv") ? 4 : n > 6 && !strcmp(m + n - 6, ".jsonl") ? 6 : 0;
        snprintf(def, sizeof def, "%.*s.svg", (int)(n - ext), m);
        out = def;
    }
    if (!title) title = a.n_words == 1 ? a.words[0] : "training runs";
    const cg_status st = cli_plot_runs(a.words, label_list ? labels : NULL, a.n_words, out, title, ylabel);
    free(copy);
    if (st) return cli_fail("plot", "cannot draw");
    printf("wrote %s\n", out);
    return 0;
}
