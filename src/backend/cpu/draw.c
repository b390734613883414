/* The CPU backend's ring of pipelined draws (draw.h). */
#include "backend/cpu/draw.h"

#include <stdlib.h>

#include "base/err.h"

lily_cpu_drawq *lily_cpu_drawq_create(int V) {
    lily_cpu_drawq *q = lily_xcalloc(1, sizeof *q);
    q->logits = lily_xcalloc((size_t)V, sizeof *q->logits);
    q->scr = lily_xcalloc((size_t)V, sizeof *q->scr);
    q->last = -1;
    return q;
}

void lily_cpu_drawq_free(lily_cpu_drawq *q) {
    if (!q) return;
    free(q->logits);
    free(q->scr);
    free(q);
}
