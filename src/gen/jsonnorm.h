/* Re-serialising JSON (and Python-literal) values into the one fixed form used for tool-call
 * arguments: ", " and ": " separators, no other whitespace, strings with only the mandatory
 * escapes (UTF-8 left unescaped), numbers kept verbatim (no float round trip, so large integers
 * survive). The streaming and non-streaming paths of the output parser both produce arguments
 * through these functions, so their bytes agree. */
#ifndef LILY_GEN_JSONNORM_H
#define LILY_GEN_JSONNORM_H

#include <stddef.h>

#include "gen/sb.h"

/* Parses s[0..n) as exactly one JSON value (surrounding whitespace allowed) and appends its
 * normalised form to out. With python != 0 also accepts Python literals: single-quoted strings,
 * True/False/None and trailing commas. Returns 0, or -1 with out unchanged. */
int lily_json_normalize(const char *s, size_t n, int python, lily_sb *out);

#endif
