/* Prompt line reader (see cli_line.h). */
#include "cli_line.h"

#include <errno.h>
#include <limits.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <wchar.h>

#ifdef LILY_HAVE_LIBEDIT
#include <histedit.h>
#endif

struct lily_line {
    volatile sig_atomic_t *intr;
    char *history; /* file, or NULL */
#ifdef LILY_HAVE_LIBEDIT
    EditLine *el;
    History *hist;
    const char *prompt; /* for prompt_fn */
#endif
};

#ifdef LILY_HAVE_LIBEDIT
static lily_line *g_line; /* for the libedit callbacks (one reader per process) */

static char *prompt_fn(EditLine *el) {
    (void)el;
    return (char *)g_line->prompt;
}

/* libedit's read function: one character from stdin, decoded from the locale's multibyte form.
 * A signal that interrupts read() with *intr set ends the line (returns -1, so el_gets returns
 * NULL); libedit's own read would retry it. */
static int getc_fn(EditLine *el, wchar_t *wc) {
    (void)el;
    char buf[MB_LEN_MAX];
    size_t n = 0;
    for (;;) {
        ssize_t r = read(0, buf + n, 1);
        if (r < 0 && errno == EINTR) {
            if (*g_line->intr) return -1;
            continue;
        }
        if (r <= 0) return r < 0 ? -1 : 0;
        n++;
        mbstate_t st;
        memset(&st, 0, sizeof st);
        size_t k = mbrtowc(wc, buf, n, &st);
        if (k == (size_t)-2 && n < sizeof buf) continue;
        if (k == (size_t)-1 || k == (size_t)-2) *wc = (unsigned char)buf[0];
        return 1;
    }
}
#endif

lily_line *lily_line_open(const char *histfile, volatile sig_atomic_t *intr) {
    lily_line *l = calloc(1, sizeof *l);
    l->intr = intr;
    l->history = histfile ? strdup(histfile) : NULL;
#ifdef LILY_HAVE_LIBEDIT
    if (!isatty(0) || !isatty(1) || g_line) return l;
    /* UTF-8 input needs a UTF-8 character type; the C locale has none */
    const char *loc = setlocale(LC_CTYPE, "");
    if (!loc || !strcmp(loc, "C") || !strcmp(loc, "POSIX")) setlocale(LC_CTYPE, "C.UTF-8");
    g_line = l;
    l->el = el_init("lily", stdin, stdout, stderr);
    l->hist = history_init();
    HistEvent ev;
    history(l->hist, &ev, H_SETSIZE, 1000);
    history(l->hist, &ev, H_SETUNIQUE, 1);
    if (l->history) history(l->hist, &ev, H_LOAD, l->history);
    el_set(l->el, EL_EDITOR, "emacs");
    el_set(l->el, EL_PROMPT, prompt_fn);
    el_set(l->el, EL_HIST, history, l->hist);
    el_set(l->el, EL_GETCFN, getc_fn);
    el_source(l->el, NULL); /* ~/.editrc */
#endif
    return l;
}

void lily_line_close(lily_line *l) {
    if (!l) return;
#ifdef LILY_HAVE_LIBEDIT
    if (l->el) {
        el_end(l->el);
        history_end(l->hist);
        g_line = NULL;
    }
#endif
    free(l->history);
    free(l);
}

int lily_line_editing(const lily_line *l) {
#ifdef LILY_HAVE_LIBEDIT
    return l->el != NULL;
#else
    (void)l;
    return 0;
#endif
}

char *lily_line_read(lily_line *l, const char *prompt) {
#ifdef LILY_HAVE_LIBEDIT
    if (l->el) {
        int n = 0;
        l->prompt = prompt;
        const char *s = el_gets(l->el, &n);
        if (!s || n < 0) {
            if (*l->intr) fputs("^C\n", stdout), fflush(stdout);
            return NULL;
        }
        char *r = strndup(s, (size_t)n);
        r[strcspn(r, "\n")] = 0;
        return r;
    }
#endif
    if (isatty(0) && isatty(1)) fputs(prompt, stdout), fflush(stdout);
    size_t cap = 256, n = 0;
    char *buf = malloc(cap);
    int c;
    while ((c = getchar()) != EOF && c != '\n') {
        if (n + 1 == cap) buf = realloc(buf, cap *= 2);
        buf[n++] = (char)c;
    }
    if (c == EOF && (n == 0 || *l->intr)) {
        if (*l->intr) fputs("\n", stdout), fflush(stdout);
        clearerr(stdin);
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    return buf;
}

void lily_line_remember(lily_line *l, const char *text) {
#ifdef LILY_HAVE_LIBEDIT
    if (!l->el || !text[0]) return;
    HistEvent ev;
    history(l->hist, &ev, H_ENTER, text);
    if (l->history) history(l->hist, &ev, H_SAVE, l->history);
#else
    (void)l, (void)text;
#endif
}
