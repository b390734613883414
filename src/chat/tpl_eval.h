/* Evaluator of the chat-template interpreter: executes the statement tree, writing text to the
 * runtime's current output buffer, with Jinja2's scoping (a fresh scope per loop iteration and
 * per macro call; `if` opens none) and loop controls. Errors raise through tpl_raise. */
#ifndef LILY_CHAT_TPL_EVAL_H
#define LILY_CHAT_TPL_EVAL_H

#include "chat/tpl_parse.h"

struct tpl_scope {
    tpl_scope *parent;
    tpl_dict vars;
};

struct tpl_macro {
    const tpl_node *def; /* S_MACRO */
    tpl_scope *closure;  /* scope the macro was defined in */
};

struct tpl_loop {
    const tpl_list *items;
    size_t i;
    int depth;            /* 1 for the outermost loop */
    const tpl_node *node; /* the S_FOR, for recursive loop(...) calls */
    tpl_val last_changed; /* for loop.changed() */
    int has_changed;
};

/* Arguments of a builtin call: positional then keyword. */
typedef struct tpl_args {
    tpl_val *pos;
    size_t npos;
    const char **kwn;
    tpl_val *kwv;
    size_t nkw;
} tpl_args;

/* Returns argument `name` (positional index i, or keyword) or NULL when absent. */
const tpl_val *tpl_arg(const tpl_args *a, size_t i, const char *name);
/* Raises if a has more than max_pos positional arguments or a keyword not in names (a
 * NULL-terminated list); `what` names the callee in the message. */
void tpl_args_check(tpl_rt *rt, const tpl_args *a, size_t max_pos, const char *const *names,
                    const char *what);

/* Runs a statement list in the current scope. Stops early when a break/continue is pending. */
void tpl_exec(tpl_rt *rt, tpl_node *const *body, size_t n);
tpl_val tpl_eval(tpl_rt *rt, const tpl_node *x);
/* Calls a macro, global function, bound method or loop with the given arguments. */
tpl_val tpl_call(tpl_rt *rt, const tpl_val *callee, const tpl_args *a);

tpl_scope *tpl_scope_new(tpl_rt *rt, tpl_scope *parent);
void tpl_scope_set(tpl_rt *rt, tpl_scope *s, const char *name, tpl_val v);

/* Python iteration: list items, dict keys, string characters; Undefined iterates empty.
 * Raises for values that are not iterable. */
tpl_list *tpl_iter(tpl_rt *rt, const tpl_val *v);

#endif
