/* Loss curves as a standalone SVG, written by hand: training loss (raw and smoothed) and
 * held-out loss against the step, with ticked axes, a legend and a title. Reads the metrics CSV,
 * so a resumed run's earlier rows are drawn too, and `cgrad plot` redraws any CSV. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/session.h"
#include "graph/internal.h"

typedef struct {
    double *step, *train, *val;
    int n, cap;
} series;

static bool push(series *s, double step, double train, double val) {
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 256;
        double *a = realloc(s->step, (size_t)cap * sizeof *a);
        if (a) s->step = a;
        double *b = a ? realloc(s->train, (size_t)cap * sizeof *b) : NULL;
        if (b) s->train = b;
        double *c = b ? realloc(s->val, (size_t)cap * sizeof *c) : NULL;
        if (c) s->val = c;
        if (!c) return false;
        s->cap = cap;
    }
    s->step[s->n] = step, s->train[s->n] = train, s->val[s->n] = val;
    s->n++;
    return true;
}

/* Column index of name in a CSV header line, or -1. */
static int column(const char *header, const char *name) {
    int col = 0;
    size_t len = strlen(name);
    for (const char *p = header; *p; col++) {
        size_t w = strcspn(p, ",\r\n");
        if (w == len && !strncmp(p, name, len)) return col;
        p += w;
        if (*p != ',') break;
        p++;
    }
    return -1;
}

/* Field col of a CSV line as a number; NAN when empty or missing. */
static double field_num(const char *line, int col) {
    const char *p = line;
    for (int c = 0; c < col; c++) {
        p = strpbrk(p, ",\n");
        if (!p || *p != ',') return NAN;
        p++;
    }
    char *end;
    double v = strtod(p, &end);
    return end == p ? NAN : v;
}

static cg_status read_csv(const char *path, series *s) {
    FILE *f = fopen(path, "r");
    if (!f) return cgi_fail(CG_ERR_IO, "[plot] cannot open %s", path);
    char line[1024];
    int cs = -1, ct = -1, cv = -1;
    if (fgets(line, sizeof line, f)) cs = column(line, "step"), ct = column(line, "train_loss"), cv = column(line, "val_loss");
    cg_status st = CG_OK;
    if (cs < 0 || ct < 0 || cv < 0) st = cgi_fail(CG_ERR_FORMAT, "[plot] %s: the header needs step, train_loss and val_loss", path);
    for (long no = 2; !st && fgets(line, sizeof line, f); no++) {
        double step = field_num(line, cs);
        if (isnan(step)) continue;
        if (!isfinite(step)) { /* an axis to infinity has no ticks to draw */
            st = cgi_fail(CG_ERR_FORMAT, "[plot] %s line %ld: step %g is not a finite number", path, no, step);
            break;
        }
        if (!push(s, step, field_num(line, ct), field_num(line, cv))) st = cgi_fail(CG_ERR_NOMEM, "[plot] out of memory");
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
        else fputc(*s, f);
    }
}

/* Ticks lo, lo + step, ... up to hi: their count, 0 when the range cannot be ticked in a few
 * finite steps (a step lost in rounding, an infinite or NaN range), so no loop can run away. */
static int tick_count(double lo, double hi, double step) {
    const double n = (hi - lo) / step;
    return n >= 0 && n <= 64 ? (int)floor(n + 0.5) + 1 : 0;
}

enum { W = 860, H = 500, ML = 72, MR = 24, MT = 48, MB = 56 };

typedef struct {
    double x0, x1, y0, y1;
} frame;

static double px(const frame *fr, double x) { return ML + (x - fr->x0) / (fr->x1 - fr->x0) * (W - ML - MR); }
static double py(const frame *fr, double y) { return H - MB - (y - fr->y0) / (fr->y1 - fr->y0) * (H - MT - MB); }

/* A polyline through the finite points of ys (every stride-th one). */
static void polyline(FILE *f, const frame *fr, const series *s, const double *ys, int stride, const char *style) {
    fprintf(f, "<polyline fill=\"none\" %s points=\"", style);
    for (int i = 0; i < s->n; i += stride)
        if (isfinite(ys[i])) fprintf(f, "%.1f,%.1f ", px(fr, s->step[i]), py(fr, ys[i]));
    fprintf(f, "\"/>\n");
}

cg_status cli_plot_metrics(const char *csv_path, const char *svg_path, const char *title, const char *ylabel) {
    series s = {0};
    cg_status st = read_csv(csv_path, &s);
    double *smooth = st ? NULL : malloc((size_t)(s.n ? s.n : 1) * sizeof *smooth);
    if (!st && !smooth) st = cgi_fail(CG_ERR_NOMEM, "[plot] out of memory");
    FILE *f = st ? NULL : fopen(svg_path, "w");
    if (!st && !f) st = cgi_fail(CG_ERR_IO, "[plot] cannot write %s", svg_path);
    if (st) {
        free(s.step), free(s.train), free(s.val), free(smooth);
        return st;
    }
    /* An exponential moving average over about 1/50 of the run, bias-corrected at the start. */
    const double a = 2.0 / (fmax(1.0, fmin(100.0, s.n / 50.0)) + 1.0);
    double m = 0, wsum = 0;
    frame fr = {INFINITY, -INFINITY, INFINITY, -INFINITY};
    int n_val = 0;
    for (int i = 0; i < s.n; i++) {
        if (isfinite(s.train[i])) m = (1 - a) * m + a * s.train[i], wsum = (1 - a) * wsum + a;
        smooth[i] = wsum > 0 ? m / wsum : NAN;
        fr.x0 = fmin(fr.x0, s.step[i]), fr.x1 = fmax(fr.x1, s.step[i]);
        const double ys[2] = {s.train[i], s.val[i]};
        for (int k = 0; k < 2; k++)
            if (isfinite(ys[k])) fr.y0 = fmin(fr.y0, ys[k]), fr.y1 = fmax(fr.y1, ys[k]);
        n_val += isfinite(s.val[i]);
    }
    if (!(fr.x1 >= fr.x0)) fr.x0 = 0, fr.x1 = 1;
    if (!(fr.y1 >= fr.y0)) fr.y0 = 0, fr.y1 = 1;
    fr.x0 = fmin(fr.x0, 0);
    const double xs = nice_step(fr.x1 - fr.x0, 8);
    fr.x1 = fmax(ceil(fr.x1 / xs) * xs, fr.x0 + xs);
    const double ys = nice_step(fr.y1 - fr.y0, 6);
    fr.y0 = floor(fr.y0 / ys) * ys, fr.y1 = fmax(ceil(fr.y1 / ys) * ys, fr.y0 + ys);
    const int nx = tick_count(fr.x0, fr.x1, xs), ny = tick_count(fr.y0, fr.y1, ys);

    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n", W, H, W, H);
    fprintf(f, "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", W, H);
    fprintf(f, "<text x=\"%d\" y=\"28\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">", (ML + W - MR) / 2);
    esc(f, title ? title : "training loss");
    fprintf(f, "</text>\n<g stroke=\"#e4e4e4\" stroke-width=\"1\">\n");
    for (int i = 0; i < nx; i++) {
        const double x = fr.x0 + i * xs;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/>\n", px(&fr, x), MT, px(&fr, x), H - MB);
    }
    for (int i = 0; i < ny; i++) {
        const double y = fr.y0 + i * ys;
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>\n", ML, py(&fr, y), W - MR, py(&fr, y));
    }
    fprintf(f, "</g>\n<g stroke=\"#333\" stroke-width=\"1\">\n");
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>\n", ML, H - MB, W - MR, H - MB);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>\n", ML, MT, ML, H - MB);
    for (int i = 0; i < nx; i++) {
        const double x = fr.x0 + i * xs;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/>\n", px(&fr, x), H - MB, px(&fr, x), H - MB + 5);
    }
    for (int i = 0; i < ny; i++) {
        const double y = fr.y0 + i * ys;
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>\n", ML - 5, py(&fr, y), ML, py(&fr, y));
    }
    fprintf(f, "</g>\n<g fill=\"#333\">\n");
    for (int i = 0; i < nx; i++) {
        const double x = fr.x0 + i * xs;
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%g</text>\n", px(&fr, x), H - MB + 19,
                fabs(x) < xs * 1e-9 ? 0.0 : x);
    }
    for (int i = 0; i < ny; i++) {
        const double y = fr.y0 + i * ys;
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", ML - 8, py(&fr, y) + 4,
                fabs(y) < ys * 1e-9 ? 0.0 : y);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"13\">step</text>\n", (ML + W - MR) / 2, H - 14);
    fprintf(f, "<text transform=\"translate(20 %d) rotate(-90)\" text-anchor=\"middle\" font-size=\"13\">",
            (MT + H - MB) / 2);
    esc(f, ylabel ? ylabel : "loss (nats per token)");
    fprintf(f, "</text>\n</g>\n");
    const int stride = s.n > 3000 ? s.n / 1500 : 1;
    polyline(f, &fr, &s, s.train, stride, "stroke=\"#1f77b4\" stroke-opacity=\"0.3\" stroke-width=\"1\"");
    polyline(f, &fr, &s, smooth, stride, "stroke=\"#1f77b4\" stroke-width=\"2\"");
    polyline(f, &fr, &s, s.val, 1, "stroke=\"#ff7f0e\" stroke-width=\"2\"");
    fprintf(f, "<g fill=\"#ff7f0e\">\n");
    for (int i = 0; i < s.n; i++)
        if (isfinite(s.val[i])) fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\"/>\n", px(&fr, s.step[i]), py(&fr, s.val[i]));
    fprintf(f, "</g>\n");
    /* Legend, top right, with the last held-out value. */
    const int lx = W - MR - 220, ly = MT + 10;
    double last_val = NAN;
    for (int i = 0; i < s.n; i++)
        if (isfinite(s.val[i])) last_val = s.val[i];
    fprintf(f, "<g font-size=\"12\">\n<rect x=\"%d\" y=\"%d\" width=\"210\" height=\"66\" fill=\"white\" "
               "fill-opacity=\"0.9\" stroke=\"#bbb\"/>\n", lx, ly);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#1f77b4\" stroke-opacity=\"0.3\"/>\n", lx + 10, ly + 16,
            lx + 36, ly + 16);
    fprintf(f, "<text x=\"%d\" y=\"%d\">train (each step)</text>\n", lx + 44, ly + 20);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#1f77b4\" stroke-width=\"2\"/>\n", lx + 10, ly + 34,
            lx + 36, ly + 34);
    fprintf(f, "<text x=\"%d\" y=\"%d\">train (moving average)</text>\n", lx + 44, ly + 38);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#ff7f0e\" stroke-width=\"2\"/>\n", lx + 10, ly + 52,
            lx + 36, ly + 52);
    fprintf(f, "<circle cx=\"%d\" cy=\"%d\" r=\"3\" fill=\"#ff7f0e\"/>\n", lx + 23, ly + 52);
    if (n_val) fprintf(f, "<text x=\"%d\" y=\"%d\">held-out (last %.4f)</text>\n</g>\n</svg>\n", lx + 44, ly + 56, last_val);
    else fprintf(f, "<text x=\"%d\" y=\"%d\">held-out (none yet)</text>\n</g>\n</svg>\n", lx + 44, ly + 56);
    bool bad = ferror(f);
    if (fclose(f) || bad) st = cgi_fail(CG_ERR_IO, "[plot] error writing %s", svg_path);
    free(s.step), free(s.train), free(s.val), free(smooth);
    return st;
}

const cli_opt cli_plot_opts[] = {{"--out", CLI_OUT, 0, 0, "SVG to write (METRICS.svg)"},
                                 {"--title", CLI_STR, 0, 0, "chart title (the CSV's name)"},
                                 {"--ylabel", CLI_STR, 0, 0, "y-axis label (loss (nats per token))"},
                                 {NULL, CLI_BARE, 0, 0, NULL}};

int cmd_plot(int argc, char **argv) {
    cli_args a;
    if (!cli_parse("plot", cli_plot_opts, argc, argv, &a) || !cli_words(&a, 1, 1, "the metrics file")) return 2;
    const char *csv = a.words[0], *out = cli_str(&a, "--out", NULL), *title = cli_str(&a, "--title", NULL),
               *ylabel = cli_str(&a, "--ylabel", NULL);
    const cli_opt in = {"METRICS.csv", CLI_IN, 0, 0, NULL};
    cli_value v;
    if (!cli_check_value("plot", &in, csv, &v)) return 2;
    char def[4096];
    if (!out) {
        size_t n = strlen(csv);
        snprintf(def, sizeof def, "%.*s.svg", (int)(n > 4 && !strcmp(csv + n - 4, ".csv") ? n - 4 : n), csv);
        out = def;
    }
    if (cli_plot_metrics(csv, out, title ? title : csv, ylabel)) return cli_fail("plot", "cannot draw");
    printf("wrote %s\n", out);
    return 0;
}
