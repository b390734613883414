/* Reading lines at an interactive prompt: libedit (line editing, history kept in a file) when
 * the build has it (LILY_HAVE_LIBEDIT) and stdin is a terminal, else plain fgets. */
#ifndef LILY_TOOLS_CLI_LINE_H
#define LILY_TOOLS_CLI_LINE_H

#include <signal.h>

typedef struct lily_line lily_line;

/* A reader on stdin. history: a file to load the history from and append entered lines to
 * (NULL: none). *intr is set by the caller's SIGINT handler (installed without SA_RESTART): a
 * Ctrl-C while a line is being typed discards that line. Caller frees with lily_line_close. */
lily_line *lily_line_open(const char *history, volatile sig_atomic_t *intr);
void lily_line_close(lily_line *l);

/* Reads one line (without its newline) after showing prompt (terminal only). Returns a heap
 * string (caller frees), or NULL at end of input or, with *intr set, when Ctrl-C discarded the
 * line being typed (the caller clears *intr). */
char *lily_line_read(lily_line *l, const char *prompt);

/* Adds a complete input (possibly several lines) to the history. */
void lily_line_remember(lily_line *l, const char *text);

/* Non-zero when lines are read with libedit. */
int lily_line_editing(const lily_line *l);

#endif
