/* printf-style formatting with Python's rules (see tpl_format.h). Numbers go through the C
 * library's printf, whose output matches Python's for these conversions; strings are padded
 * and truncated by code points, as Python counts characters. */
#include "chat/tpl_format.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static void pad(tpl_rt *rt, tpl_buf *b, const char *p, size_t n, size_t chars, long width,
                int left) {
    size_t fill = width > 0 && (size_t)width > chars ? (size_t)width - chars : 0;
    if (!left)
        for (size_t i = 0; i < fill; i++)
            tpl_buf_putc(rt, b, ' ');
    tpl_buf_put(rt, b, p, n);
    if (left)
        for (size_t i = 0; i < fill; i++)
            tpl_buf_putc(rt, b, ' ');
}

tpl_val tpl_percent_format(tpl_rt *rt, tpl_val fmt, const tpl_val *args) {
    const tpl_val *pos = args;
    size_t npos = 1, next = 0;
    if (args->kind == TV_LIST && (args->flags & TV_F_TUPLE)) {
        pos = args->l->v;
        npos = args->l->n;
    }
    int mapping = args->kind == TV_DICT;
    tpl_buf b = {0};
    const char *s = fmt.s.p;
    size_t n = fmt.s.n;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '%') {
            tpl_buf_putc(rt, &b, s[i]);
            continue;
        }
        if (++i >= n) tpl_raise(rt, "incomplete format");
        const tpl_val *v = NULL;
        if (s[i] == '(') {
            const char *close = memchr(s + i, ')', n - i);
            if (!close || !mapping) tpl_raise(rt, "format requires a mapping");
            v = tpl_dict_getn(args->d, s + i + 1, (size_t)(close - s - i - 1));
            if (!v)
                tpl_raise(rt, "format: key '%.*s' not found", (int)(close - s - i - 1), s + i + 1);
            i = (size_t)(close - s) + 1;
        }
        char flags[8];
        int nf = 0, left = 0;
        while (i < n && strchr("-+ #0", s[i]) && nf < 6) {
            if (s[i] == '-') left = 1;
            flags[nf++] = s[i++];
        }
        flags[nf] = 0;
        long width = -1, prec = -1;
        while (i < n && s[i] >= '0' && s[i] <= '9' && width < 100000)
            width = (width < 0 ? 0 : width * 10) + (s[i++] - '0');
        if (i < n && s[i] == '.') {
            prec = 0;
            for (i++; i < n && s[i] >= '0' && s[i] <= '9' && prec < 1000; i++)
                prec = prec * 10 + (s[i] - '0');
        }
        if (width > 100000 || prec > 1000) tpl_raise(rt, "format: width or precision too large");
        if (i >= n) tpl_raise(rt, "incomplete format");
        char conv = s[i];
        if (conv == '%') {
            tpl_buf_putc(rt, &b, '%');
            continue;
        }
        if (!v) {
            if (mapping && npos == 1) tpl_raise(rt, "format requires a mapping");
            if (next >= npos) tpl_raise(rt, "not enough arguments for format string");
            v = &pos[next++];
        }
        char spec[32], out[1200];
        if (conv == 's' || conv == 'r') {
            tpl_buf tmp = {0};
            if (conv == 's')
                tpl_to_str(rt, &tmp, v);
            else
                tpl_repr(rt, &tmp, v);
            size_t len = tmp.n, chars = tpl_utf8_len(tmp.p, tmp.n);
            if (prec >= 0 && (size_t)prec < chars) { /* truncate to prec code points */
                size_t off = 0;
                for (long k = 0; k < prec; k++) {
                    int32_t cp;
                    off += tpl_utf8_next(tmp.p + off, tmp.n - off, &cp);
                }
                len = off;
                chars = (size_t)prec;
            }
            pad(rt, &b, tmp.p ? tmp.p : "", len, chars, width, left);
            continue;
        }
        int is_num = v->kind == TV_INT || v->kind == TV_BOOL || v->kind == TV_FLOAT;
        if (!is_num) {
            if (v->kind == TV_UNDEF) tpl_raise_undef(rt, v);
            tpl_raise(rt, "%%%c format: a real number is required, not %s", conv, tpl_type_name(v));
        }
        double f = v->kind == TV_FLOAT ? v->f : v->kind == TV_INT ? (double)v->i : v->b;
        if (strchr("dixXoc", conv)) {
            if (v->kind == TV_FLOAT && !isfinite(f))
                tpl_raise(rt, "cannot convert float to integer");
            if (v->kind == TV_FLOAT && conv != 'd' && conv != 'i')
                tpl_raise(rt, "%%%c format: an integer is required, not float", conv);
            long long x = v->kind == TV_FLOAT ? (long long)f : v->kind == TV_INT ? v->i : v->b;
            if (conv == 'c') {
                char enc[4];
                if (x < 0 || x > 0x10ffff) tpl_raise(rt, "%%c arg not in range(0x110000)");
                size_t k = tpl_utf8_put((int32_t)x, enc);
                pad(rt, &b, enc, k, 1, width, left);
                continue;
            }
            char c = conv == 'i' ? 'd' : conv;
            if (prec >= 0)
                snprintf(spec, sizeof spec, "%%%s%ld.%ldll%c", flags, width < 0 ? 0 : width, prec,
                         c);
            else
                snprintf(spec, sizeof spec, "%%%s%ldll%c", flags, width < 0 ? 0 : width, c);
            if (c != 'd' && x < 0) { /* Python prints -0x1f, C would print two's complement */
                tpl_buf_putc(rt, &b, '-');
                x = -x;
            }
            snprintf(out, sizeof out, spec, x);
        } else if (strchr("fFeEgG", conv)) {
            snprintf(spec, sizeof spec, "%%%s%ld.%ld%c", flags, width < 0 ? 0 : width,
                     prec < 0 ? 6 : prec, conv);
            if (fabs(f) >= 1e50 && (conv == 'f' || conv == 'F'))
                tpl_raise(rt, "format: %%f of a number this large is not supported");
            snprintf(out, sizeof out, spec, f);
        } else {
            tpl_raise(rt, "unsupported format character '%c'", conv);
        }
        tpl_buf_puts(rt, &b, out);
    }
    if (next < npos && !mapping && (args->kind == TV_LIST && (args->flags & TV_F_TUPLE)))
        tpl_raise(rt, "not all arguments converted during string formatting");
    if (next == 0 && !mapping && !(args->kind == TV_LIST && (args->flags & TV_F_TUPLE)))
        tpl_raise(rt, "not all arguments converted during string formatting");
    return b.n ? tpl_buf_val(&b) : tpl_cstr("");
}
