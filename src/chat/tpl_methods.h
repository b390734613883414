/* Object model of the chat-template interpreter: attribute and item lookup with Jinja2's
 * getattr-then-getitem rules, slicing, `in`, Python str/dict/list methods, the `loop` object's
 * attributes, and the global functions HF exposes (range, namespace, dict, raise_exception,
 * strftime_now). Mutating methods (list.append, dict.update, ...) are refused as HF's
 * ImmutableSandboxedEnvironment does. */
#ifndef LILY_CHAT_TPL_METHODS_H
#define LILY_CHAT_TPL_METHODS_H

#include "chat/tpl_eval.h"

enum { TPL_FN_RANGE = 1, TPL_FN_NAMESPACE, TPL_FN_DICT, TPL_FN_RAISE, TPL_FN_STRFTIME };

/* obj.name: a method, a loop attribute, a dict key or namespace attribute, else Undefined.
 * Raises when obj is Undefined (as Jinja's default Undefined does). */
tpl_val tpl_getattr(tpl_rt *rt, const tpl_val *obj, const char *name);
/* obj[key]: list/str index (negative counts from the end), dict key; else Undefined. */
tpl_val tpl_getitem(tpl_rt *rt, const tpl_val *obj, const tpl_val *key);
/* obj[start:stop:step] on a list, tuple or str (NULL bounds are omitted ones). */
tpl_val tpl_slice(tpl_rt *rt, const tpl_val *obj, const tpl_val *start, const tpl_val *stop,
                  const tpl_val *step);
/* item in container. */
int tpl_contains(tpl_rt *rt, const tpl_val *container, const tpl_val *item);

tpl_val tpl_call_method(tpl_rt *rt, const tpl_method *m, const tpl_args *a);
tpl_val tpl_call_global(tpl_rt *rt, int fn, const tpl_args *a);
/* Binds the global functions in scope s. */
void tpl_define_globals(tpl_rt *rt, tpl_scope *s);

/* String helpers shared with the filters. what: 1 = lstrip, 2 = rstrip, 3 = strip; chars NULL
 * strips whitespace. */
tpl_val tpl_str_strip(tpl_rt *rt, tpl_val s, const tpl_val *chars, int what);
/* mode: 'l' lower, 'u' upper, 'c' capitalize, 't' title. */
tpl_val tpl_str_case(tpl_rt *rt, tpl_val s, int mode);
tpl_val tpl_str_replace(tpl_rt *rt, tpl_val s, tpl_val old, tpl_val rep, int64_t count);
/* Python len(): code points of a str, items of a list/dict; raises for other types. */
int64_t tpl_len(tpl_rt *rt, const tpl_val *v);

#endif
