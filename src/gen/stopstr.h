/* Stop strings matched on decoded output text across token boundaries (api.md §2.1.4): text that
 * could be the beginning of a stop string is held back until the next piece decides it; the
 * matched stop string itself is never returned. */
#ifndef LILY_GEN_STOPSTR_H
#define LILY_GEN_STOPSTR_H

#include <stddef.h>

#include "gen/sb.h"

typedef struct lily_stopstr {
    char **stop; /* borrowed */
    int n_stop;
    lily_sb held; /* text not yet released */
    int hit;      /* a stop string was found: everything after it is dropped */
    int which;    /* with hit: the index of the stop string that matched */
} lily_stopstr;

/* stop may be NULL when n_stop is 0; the strings must outlive m. */
void lily_stopstr_init(lily_stopstr *m, char **stop, int n_stop);

/* Adds text; appends the part that is now safe to out. Returns 1 when a stop string matched
 * (out then ends right before it and later pushes add nothing). */
int lily_stopstr_push(lily_stopstr *m, const char *text, size_t len, lily_sb *out);

/* End of output: releases what is held. */
void lily_stopstr_flush(lily_stopstr *m, lily_sb *out);

void lily_stopstr_free(lily_stopstr *m);

#endif
