/* JSON integers within bounds, as grammar terminals: the JSON Schema compiler's minimum /
 * maximum (and their exclusive forms) on integers. */
#ifndef LILY_GRAMMAR_INT_RANGE_H
#define LILY_GRAMMAR_INT_RANGE_H

#include <stdint.h>

#include "grammar/grammar.h"

/* The largest magnitude a bounded integer may have: 16 digits, as lily_jgram_integer. */
#define LILY_INT_RANGE_MAX 9999999999999999LL

/* A rule matching exactly the JSON integers (no leading zeros, no "-0") in [lo, hi], with
 * -LILY_INT_RANGE_MAX <= lo <= hi <= LILY_INT_RANGE_MAX: one digit-class pattern per
 * alternative (the classic decomposition by length and leading digits, ~2 per digit). */
int32_t lily_int_range_rule(lily_gbuild *b, int64_t lo, int64_t hi);

#endif
