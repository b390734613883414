/* Stop-string matching with holdback (see stopstr.h). */
#include "gen/stopstr.h"

#include <string.h>

void lily_stopstr_init(lily_stopstr *m, char **stop, int n_stop) {
    memset(m, 0, sizeof *m);
    m->stop = stop;
    m->n_stop = n_stop;
}

/* Length of the longest suffix of s[0..n) that is a proper prefix of some stop string. */
static size_t partial_suffix(const lily_stopstr *m, const char *s, size_t n) {
    size_t best = 0;
    for (int i = 0; i < m->n_stop; i++) {
        size_t k = strlen(m->stop[i]);
        size_t max = k - 1 < n ? k - 1 : n;
        for (size_t l = max; l > best; l--) {
            if (!memcmp(s + n - l, m->stop[i], l)) {
                best = l;
                break;
            }
        }
    }
    return best;
}

int lily_stopstr_push(lily_stopstr *m, const char *text, size_t len, lily_sb *out) {
    if (m->hit) return 1;
    if (!m->n_stop) {
        lily_sb_append(out, text, len);
        return 0;
    }
    lily_sb_append(&m->held, text, len);
    const char *s = lily_sb_str(&m->held);
    size_t n = m->held.len;
    /* earliest match of any stop string */
    size_t at = n;
    for (int i = 0; i < m->n_stop; i++) {
        const char *f = memmem(s, n, m->stop[i], strlen(m->stop[i]));
        if (f && (size_t)(f - s) < at) {
            at = (size_t)(f - s);
            m->which = i;
        }
    }
    if (at < n) {
        lily_sb_append(out, s, at);
        lily_sb_clear(&m->held);
        m->hit = 1;
        return 1;
    }
    size_t keep = partial_suffix(m, s, n);
    lily_sb_append(out, s, n - keep);
    lily_sb_drop_front(&m->held, n - keep);
    return 0;
}

void lily_stopstr_flush(lily_stopstr *m, lily_sb *out) {
    if (!m->hit) lily_sb_append(out, m->held.data ? m->held.data : "", m->held.len);
    lily_sb_clear(&m->held);
}

void lily_stopstr_free(lily_stopstr *m) {
    lily_sb_free(&m->held);
}
