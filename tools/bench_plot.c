/* lily bench --plot (see bench_plot.h): the SVG is written by hand, no dependencies. */
#include "bench_plot.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/err.h"
#include "base/file.h"

void lily_plot_add(lily_plot_series *s, int decode, double x, double y) {
    int *n = decode ? &s->n_tg : &s->n_pp;
    if (*n >= LILY_PLOT_MAX_POINTS || !(x > 0) || !(y >= 0) || !isfinite(y)) return;
    (decode ? s->tg_x : s->pp_x)[*n] = x;
    (decode ? s->tg_y : s->pp_y)[*n] = y;
    (*n)++;
}

/* ---- reference files ---------------------------------------------------------------------------
 */

static double num(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static const char *str(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* The series named name in s[0..*n), added (empty) when absent; NULL when s is full. */
static lily_plot_series *series(lily_plot_series *s, int *n, int max, const char *name) {
    for (int i = 0; i < *n; i++)
        if (!strcmp(s[i].name, name)) return &s[i];
    if (*n >= max) return NULL;
    lily_plot_series *r = &s[(*n)++];
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", name);
    return r;
}

static int read_llama_bench(const cJSON *arr, lily_plot_series *s, int *n, int max) {
    const cJSON *t;
    int used = 0;
    cJSON_ArrayForEach(t, arr) {
        double np = num(t, "n_prompt"), ng = num(t, "n_gen"), nd = num(t, "n_depth"),
               ts = num(t, "avg_ts");
        if (isnan(nd)) nd = 0;
        if (isnan(np) || isnan(ng) || isnan(ts)) continue;
        char name[128];
        snprintf(name, sizeof name, "llama.cpp %s, %s, %.0f threads", str(t, "model_type"),
                 str(t, "backends"), num(t, "n_threads"));
        lily_plot_series *r = series(s, n, max, name);
        if (!r) break;
        if (ng == 0 && np > 0)
            lily_plot_add(r, 0, np + nd, ts), used++;
        else if (np == 0 && ng > 0)
            lily_plot_add(r, 1, nd > 0 ? nd : ng, ts), used++;
    }
    return used;
}

static int read_lily(const cJSON *o, lily_plot_series *s, int *n, int max) {
    char name[128];
    snprintf(name, sizeof name, "lily %s, %s %s, %s", str(o, "commit"), str(o, "quant"),
             str(o, "backend"), str(o, "device"));
    lily_plot_series *r = series(s, n, max, name);
    if (!r) return 0;
    const cJSON *row;
    int used = 0;
    cJSON_ArrayForEach(row, cJSON_GetObjectItemCaseSensitive(o, "rows")) {
        double len = num(row, "len"), p = num(row, "prefill_tok_s"), d = num(row, "decode_tok_s");
        if (!isnan(p)) lily_plot_add(r, 0, len, p), used++;
        if (!isnan(d)) lily_plot_add(r, 1, len, d), used++;
    }
    return used;
}

int lily_plot_read_ref(const char *path, lily_plot_series *s, int *n, int max, lily_err *e) {
    char *text = NULL;
    if (lily_read_file(path, (size_t)64 << 20, &text, NULL, e)) return -1;
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!j) return lily_fail(e, "%s: not JSON", path);
    int used = cJSON_IsArray(j) ? read_llama_bench(j, s, n, max)
               : cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(j, "rows"))
                   ? read_lily(j, s, n, max)
                   : -1;
    cJSON_Delete(j);
    if (used < 0)
        return lily_fail(e,
                         "%s: neither llama-bench JSON (an array of tests) nor lily bench JSON "
                         "(an object with \"rows\")",
                         path);
    if (used == 0) return lily_fail(e, "%s: no prefill or decode measurement in it", path);
    return 0;
}

/* ---- the chart ---------------------------------------------------------------------------------
 */

enum { W = 960, H = 760, X0 = 90, X1 = 600, LEGEND_X = 625 };
static const char *colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                               "#9467bd", "#8c564b", "#e377c2", "#17becf"};

static void xml_text(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '&')
            fputs("&amp;", f);
        else if (*s == '<')
            fputs("&lt;", f);
        else if (*s == '>')
            fputs("&gt;", f);
        else if (*s == '"')
            fputs("&quot;", f);
        else
            fputc(*s, f);
    }
}

static void tokens_label(char *buf, size_t len, double v) {
    if (v >= 1048576 && fmod(v, 1048576) == 0)
        snprintf(buf, len, "%.0fM", v / 1048576);
    else if (v >= 1024 && fmod(v, 1024) == 0)
        snprintf(buf, len, "%.0fK", v / 1024);
    else
        snprintf(buf, len, "%.0f", v);
}

/* A step of 1, 2 or 5 x 10^k that cuts [0, hi] into about 5 intervals. */
static double nice_step(double hi) {
    double raw = hi / 5, p = pow(10, floor(log10(raw))), m = raw / p;
    return p * (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10);
}

typedef struct {
    double lx0, lx1; /* log2 of the x range */
    int top, bottom; /* pixel rows of the panel */
    double ymax;
} panel;

static double px(const panel *p, double x) {
    return X0 + (log2(x) - p->lx0) / (p->lx1 - p->lx0) * (X1 - X0);
}
static double py(const panel *p, double y) {
    return p->bottom - y / p->ymax * (p->bottom - p->top);
}

static void draw_panel(FILE *f, const panel *p, const lily_plot_series *s, int n, int decode,
                       const char *ylabel) {
    double step = nice_step(p->ymax);
    fprintf(f, "<g font-size=\"12\">\n");
    for (double y = 0; y <= p->ymax * 1.0001; y += step) {
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", X0,
                py(p, y), X1, py(p, y));
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", X0 - 6,
                py(p, y) + 4, y);
    }
    /* x ticks at powers of two, every 2^k with k chosen so that at most ~10 ticks show */
    int k0 = (int)ceil(p->lx0), k1 = (int)floor(p->lx1), every = 1;
    while ((k1 - k0) / every > 9)
        every++;
    for (int k = k0; k <= k1; k++) {
        if (k % every) continue;
        double x = pow(2, k);
        char lab[32];
        tokens_label(lab, sizeof lab, x);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#ddd\"/>\n",
                px(p, x), p->top, px(p, x), p->bottom);
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", px(p, x),
                p->bottom + 16, lab);
    }
    fprintf(f,
            "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
            "stroke=\"#000\"/>\n",
            X0, p->top, X1 - X0, p->bottom - p->top);
    fprintf(f,
            "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"13\">context length "
            "(tokens, log scale)</text>\n",
            (X0 + X1) / 2, p->bottom + 36);
    fprintf(f,
            "<text transform=\"translate(%d,%d) rotate(-90)\" text-anchor=\"middle\" "
            "font-size=\"13\">%s</text>\n",
            X0 - 58, (p->top + p->bottom) / 2, ylabel);
    for (int i = 0; i < n; i++) {
        const double *xs = decode ? s[i].tg_x : s[i].pp_x, *ys = decode ? s[i].tg_y : s[i].pp_y;
        int m = decode ? s[i].n_tg : s[i].n_pp;
        const char *c = colors[i % 8];
        /* points in x order */
        int idx[LILY_PLOT_MAX_POINTS];
        for (int a = 0; a < m; a++)
            idx[a] = a;
        for (int a = 1; a < m; a++)
            for (int b = a; b > 0 && xs[idx[b]] < xs[idx[b - 1]]; b--) {
                int t = idx[b];
                idx[b] = idx[b - 1], idx[b - 1] = t;
            }
        if (m > 1) {
            fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"", c,
                    i ? " stroke-dasharray=\"6 3\"" : "");
            for (int a = 0; a < m; a++)
                fprintf(f, "%s%.1f,%.1f", a ? " " : "", px(p, xs[idx[a]]), py(p, ys[idx[a]]));
            fprintf(f, "\"/>\n");
        }
        for (int a = 0; a < m; a++)
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>\n", px(p, xs[a]),
                    py(p, ys[a]), c);
    }
    fprintf(f, "</g>\n");
}

int lily_plot_svg(const char *path, const char *title, const lily_plot_series *s, int n,
                  lily_err *e) {
    double xmin = INFINITY, xmax = 0, pmax = 0, dmax = 0;
    for (int i = 0; i < n; i++) {
        for (int a = 0; a < s[i].n_pp; a++) {
            xmin = fmin(xmin, s[i].pp_x[a]), xmax = fmax(xmax, s[i].pp_x[a]);
            pmax = fmax(pmax, s[i].pp_y[a]);
        }
        for (int a = 0; a < s[i].n_tg; a++) {
            xmin = fmin(xmin, s[i].tg_x[a]), xmax = fmax(xmax, s[i].tg_x[a]);
            dmax = fmax(dmax, s[i].tg_y[a]);
        }
    }
    if (xmax == 0) return lily_fail(e, "--plot: nothing was measured to plot");
    FILE *f = fopen(path, "w");
    if (!f) return lily_fail(e, "%s: cannot write", path);
    panel pp = {log2(xmin) - 0.3, log2(xmax) + 0.3, 70, 330, 0};
    panel tg = pp;
    tg.top = 420, tg.bottom = 680;
    pp.ymax = pmax > 0 ? ceil(pmax * 1.08 / nice_step(pmax * 1.08)) * nice_step(pmax * 1.08) : 1;
    tg.ymax = dmax > 0 ? ceil(dmax * 1.08 / nice_step(dmax * 1.08)) * nice_step(dmax * 1.08) : 1;
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n",
            W, H, W, H);
    fprintf(f,
            "<text x=\"%d\" y=\"32\" text-anchor=\"middle\" font-size=\"16\" "
            "font-weight=\"bold\">",
            W / 2);
    xml_text(f, title);
    fprintf(f, "</text>\n");
    draw_panel(f, &pp, s, n, 0, "prefill tok/s");
    draw_panel(f, &tg, s, n, 1, "decode tok/s");
    fprintf(f, "<g font-size=\"12\">\n");
    for (int i = 0; i < n; i++) {
        int y = 80 + 22 * i;
        fprintf(f,
                "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" "
                "stroke-width=\"2\"%s/>\n",
                LEGEND_X, y, LEGEND_X + 28, y, colors[i % 8], i ? " stroke-dasharray=\"6 3\"" : "");
        fprintf(f, "<text x=\"%d\" y=\"%d\">", LEGEND_X + 34, y + 4);
        char clip[61];
        snprintf(clip, sizeof clip, "%.60s", s[i].name);
        xml_text(f, clip);
        fprintf(f, "</text>\n");
    }
    fprintf(f, "</g>\n</svg>\n");
    if (fclose(f)) return lily_fail(e, "%s: write failed", path);
    return 0;
}
