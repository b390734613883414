/* Filters (`x | name(args)`) and tests (`x is name(args)`) of the chat-template interpreter, with
 * the behaviour of Jinja2's built-ins and HF's tojson override (ensure_ascii=False, indent,
 * separators, sort_keys). */
#ifndef LILY_CHAT_TPL_FILTERS_H
#define LILY_CHAT_TPL_FILTERS_H

#include "chat/tpl_eval.h"

/* Applies filter `name`; a->pos[0] is the filtered value. Raises for unknown filters. */
tpl_val tpl_filter(tpl_rt *rt, const char *name, const tpl_args *a);
/* Runs test `name`; a->pos[0] is the tested value. Raises for unknown tests. */
int tpl_test(tpl_rt *rt, const char *name, const tpl_args *a);

#endif
