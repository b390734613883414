/* The terminal progress bar (see progress.h). */
#include "base/progress.h"

#include "base/timer.h"

void lily_bar_bytes(char *buf, size_t len, uint64_t n) {
    static const char *unit[] = {"KB", "MB", "GB", "TB"};
    if (n < 1000) {
        snprintf(buf, len, "%llu B", (unsigned long long)n);
        return;
    }
    double v = (double)n / 1000.0;
    int u = 0;
    while (v >= 1000.0 && u < 3)
        v /= 1000.0, u++;
    snprintf(buf, len, "%.*f %s", v < 10 ? 2 : v < 100 ? 1 : 0, v, unit[u]);
}

void lily_bar_update(void *ud, uint64_t done, uint64_t total) {
    lily_bar *b = ud;
    if (b->finished) return;
    FILE *f = b->out ? b->out : stderr;
    const char *label = b->label ? b->label : "loading";
    double now = lily_now();
    if (b->t0 == 0) b->t0 = now, b->last = -1;
    char d[32], t[32];
    lily_bar_bytes(t, sizeof t, total);
    if (done >= total) {
        fprintf(f, "\r\033[K%s: %s in %.1f s\n", label, t, now - b->t0);
        fflush(f);
        b->finished = 1;
        return;
    }
    if (b->last >= 0 && now - b->last < 0.1) return;
    b->last = now;
    lily_bar_bytes(d, sizeof d, done);
    double frac = total ? (double)done / (double)total : 1.0;
    int w = 30, k = (int)(frac * w);
    fprintf(f, "\r\033[K%s [%.*s%*s] %s / %s %5.1f%% %.1f s", label, k,
            "==============================", w - k, "", d, t, 100.0 * frac, now - b->t0);
    fflush(f);
}
