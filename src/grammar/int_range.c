/* JSON integers within bounds (int_range.h). A range of magnitudes is split by length; a range
 * of one length [a, z] becomes patterns of digit classes: the common leading digits, then the
 * low end's tail (a's next digit fixed, the rest from a's rest up to 9...9), a middle band of
 * leading digits followed by any digits, and the high end's tail (0...0 up to z's rest). */
#include "grammar/int_range.h"

#include <stdio.h>
#include <string.h>

#include "base/err.h"
#include "grammar/dfa.h"

typedef struct {
    lily_gbuild *b;
    int32_t rule;
    int neg;             /* the patterns start with '-' */
    char lo[17], hi[17]; /* the pattern so far: digit ranges, one per position */
} ranger;

static void emit(ranger *r, int n) {
    lily_dfa_item it[18];
    size_t k = 0;
    if (r->neg) it[k++] = lily_dfa_bytes("-", 1, 1);
    for (int i = 0; i < n; i++)
        it[k++] = lily_dfa_range((unsigned char)r->lo[i], (unsigned char)r->hi[i], 1, 1);
    const lily_gelem t = lily_gterm(lily_dfa_seq(r->b, it, k));
    lily_gbuild_alt(r->b, r->rule, &t, 1);
}

static int all(const char *s, int n, char c) {
    for (int i = 0; i < n; i++)
        if (s[i] != c) return 0;
    return 1;
}

/* the digit strings a[0..n) .. z[0..n) (a <= z) at positions d.. of the pattern */
static void fixed(ranger *r, const char *a, const char *z, int n, int d) {
    if (n == 0) {
        emit(r, d);
        return;
    }
    if (a[0] == z[0]) {
        r->lo[d] = r->hi[d] = a[0];
        fixed(r, a + 1, z + 1, n - 1, d + 1);
        return;
    }
    char nines[16], zeros[16];
    memset(nines, '9', sizeof nines);
    memset(zeros, '0', sizeof zeros);
    const int low_whole = all(a + 1, n - 1, '0'), high_whole = all(z + 1, n - 1, '9');
    if (!low_whole) { /* a[0] followed by a's rest .. 9...9 */
        r->lo[d] = r->hi[d] = a[0];
        fixed(r, a + 1, nines, n - 1, d + 1);
    }
    const char mlo = low_whole ? a[0] : (char)(a[0] + 1),
               mhi = high_whole ? z[0] : (char)(z[0] - 1);
    if (mlo <= mhi) { /* the middle band: any digits after */
        r->lo[d] = mlo, r->hi[d] = mhi;
        for (int i = 1; i < n; i++)
            r->lo[d + i] = '0', r->hi[d + i] = '9';
        emit(r, d + n);
    }
    if (!high_whole) { /* z[0] followed by 0...0 .. z's rest */
        r->lo[d] = r->hi[d] = z[0];
        fixed(r, zeros, z + 1, n - 1, d + 1);
    }
}

/* the magnitudes lo .. hi (0 <= lo <= hi), by length */
static void magnitudes(ranger *r, int64_t lo, int64_t hi) {
    int64_t p = 1; /* 10^(L-1) */
    for (int L = 1; L <= 16 && (L == 1 || p <= hi); L++, p *= 10) {
        const int64_t top = p * 10 - 1, a = lo > (L == 1 ? 0 : p) ? lo : (L == 1 ? 0 : p);
        const int64_t z = hi < top ? hi : top;
        if (a > z) continue;
        char sa[24], sz[24];
        snprintf(sa, sizeof sa, "%lld", (long long)a);
        snprintf(sz, sizeof sz, "%lld", (long long)z);
        fixed(r, sa, sz, L, 0);
    }
}

int32_t lily_int_range_rule(lily_gbuild *b, int64_t lo, int64_t hi) {
    LILY_ASSERT(-LILY_INT_RANGE_MAX <= lo && lo <= hi && hi <= LILY_INT_RANGE_MAX);
    ranger r = {.b = b, .rule = lily_gbuild_rule(b)};
    if (lo < 0) { /* -(magnitudes) */
        r.neg = 1;
        magnitudes(&r, hi < 0 ? -hi : 1, -lo);
    }
    if (hi >= 0) {
        r.neg = 0;
        magnitudes(&r, lo > 0 ? lo : 0, hi);
    }
    return r.rule;
}
