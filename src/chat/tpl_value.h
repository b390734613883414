/* Values and runtime of the chat-template interpreter: a small dynamic type system that mimics the
 * Python objects Jinja2 works on (str, int, float, bool, None, list, dict, Undefined, Namespace,
 * macros, bound methods), an arena that owns every value of one render, and the error exit.
 *
 * Why an arena and longjmp: a render is one short pass whose values die together, so each value
 * is bump-allocated from the render's arena and freed in one go. Runtime errors (type errors,
 * raise_exception, limits) unwind with longjmp to the render entry, which frees the arena; no
 * error path can leak, and the evaluator stays free of status plumbing. */
#ifndef LILY_CHAT_TPL_VALUE_H
#define LILY_CHAT_TPL_VALUE_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

typedef enum tpl_kind {
    TV_UNDEF = 0, /* Jinja's default Undefined: prints "", falsy, iterates empty */
    TV_NONE,
    TV_BOOL,
    TV_INT,
    TV_FLOAT,
    TV_STR,
    TV_LIST,   /* also tuples (flag TV_F_TUPLE) */
    TV_DICT,   /* insertion-ordered, like a Python dict */
    TV_NS,     /* namespace(): a dict whose attributes can be assigned */
    TV_MACRO,  /* a {% macro %} bound to the scope it was defined in */
    TV_FUNC,   /* a global function (range, namespace, raise_exception, ...) */
    TV_METHOD, /* a method bound to its receiver, e.g. "abc".startswith */
    TV_LOOP,   /* the `loop` object of a for loop */
} tpl_kind;

enum { TV_F_SAFE = 1, TV_F_TUPLE = 2 };

typedef struct tpl_list tpl_list;
typedef struct tpl_dict tpl_dict;
typedef struct tpl_method tpl_method;
typedef struct tpl_loop tpl_loop;
typedef struct tpl_macro tpl_macro;

typedef struct tpl_val {
    uint8_t kind;  /* tpl_kind */
    uint8_t flags; /* TV_F_SAFE on a str marks Markup (from |safe); TV_F_TUPLE on a list */
    union {
        int b;
        int64_t i;
        double f;
        struct {
            const char *p; /* UTF-8 bytes, not NUL-terminated; immutable once made */
            size_t n;
        } s;
        tpl_list *l;
        tpl_dict *d; /* dicts and namespaces */
        tpl_method *m;
        tpl_loop *loop;
        tpl_macro *macro;
        int func; /* global function id (tpl_methods.h) */
        struct {
            const char *name;  /* the missing name, or NULL */
            const char *owner; /* type name of the object it was looked up on, or NULL;
                                * "!" when name is the whole error message */
        } u;
    };
} tpl_val;

struct tpl_list {
    tpl_val *v;
    size_t n, cap;
};

struct tpl_dict {
    tpl_val *k, *v;
    size_t n, cap;
    int busy; /* being printed: a namespace that contains itself prints as {...} */
};

struct tpl_method {
    tpl_val self;
    const char *name;
};

/* ---- arena -------------------------------------------------------------------------------- */

typedef struct tpl_chunk tpl_chunk;
typedef struct tpl_arena {
    tpl_chunk *head;
    size_t used;  /* bytes handed out plus chunk overhead */
    size_t limit; /* 0 = unlimited */
} tpl_arena;

/* ---- runtime (one render, or one compile) --------------------------------------------------- */

typedef struct tpl_scope tpl_scope;
typedef struct tpl_buf {
    char *p;
    size_t n, cap;
} tpl_buf;

typedef struct tpl_rt {
    tpl_arena arena;
    jmp_buf jmp;   /* tpl_raise jumps here */
    char msg[480]; /* error message (without the line prefix) */
    int line;      /* template line being evaluated, for error messages */
    uint64_t steps, max_steps;
    size_t max_output; /* bytes of any one output buffer */
    int depth, max_depth;
    int cdepth;       /* nested evaluator/printer calls, bounded to protect the C stack */
    tpl_buf *out;     /* where output goes now (the render's or a capture) */
    tpl_scope *scope; /* innermost variable scope */
    tpl_scope *globals;
    int ctl; /* pending loop control: 0, 1 = break, 2 = continue */
} tpl_rt;

_Noreturn void tpl_raise(tpl_rt *rt, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Raises "'<name>' is undefined" or "'<type> object' has no attribute '<name>'" for v. */
_Noreturn void tpl_raise_undef(tpl_rt *rt, const tpl_val *v);

void *tpl_alloc(tpl_rt *rt, size_t n);     /* zeroed, 16-byte aligned, owned by the arena */
void *tpl_alloc_raw(tpl_rt *rt, size_t n); /* same, not zeroed (for text buffers) */
void tpl_arena_free(tpl_arena *a);
/* Counts one evaluation step; raises when the render has run too long. */
void tpl_step(tpl_rt *rt);
/* Enter/leave a recursive evaluator or printer call; raises beyond TPL_MAX_CDEPTH so that deep
 * expressions (a+a+...+a, x.a.a.a...) or deeply nested values cannot overflow the C stack. */
#define TPL_MAX_CDEPTH 1000 /* ~2.5 KiB a level under ASan: stays well inside an 8 MiB stack */
void tpl_enter(tpl_rt *rt);
#define tpl_leave(rt) ((rt)->cdepth--)

/* ---- constructors --------------------------------------------------------------------------- */

tpl_val tpl_undef(const char *name, const char *owner);
tpl_val tpl_none(void);
tpl_val tpl_bool(int b);
tpl_val tpl_int(int64_t i);
tpl_val tpl_float(double f);
tpl_val tpl_str(tpl_rt *rt, const char *p, size_t n); /* copies */
tpl_val tpl_str_ref(const char *p, size_t n);         /* borrows (p must outlive the render) */
tpl_val tpl_cstr(const char *s);                      /* borrows a static C string */
tpl_val tpl_new_list(tpl_rt *rt, size_t cap);
tpl_val tpl_new_dict(tpl_rt *rt, size_t cap);
void tpl_list_push(tpl_rt *rt, tpl_list *l, tpl_val v);
/* Inserts or replaces key k (Python dict assignment: a replaced key keeps its position). */
void tpl_dict_set(tpl_rt *rt, tpl_dict *d, tpl_val k, tpl_val v);
/* Returns the value for key k, or NULL. */
tpl_val *tpl_dict_get(const tpl_dict *d, tpl_val k);
tpl_val *tpl_dict_getn(const tpl_dict *d, const char *key, size_t n);

/* ---- Python semantics ----------------------------------------------------------------------- */

int tpl_truthy(const tpl_val *v);
int tpl_equal(const tpl_val *a, const tpl_val *b);
/* Python's a < b style ordering; raises on unorderable types. Returns <0, 0, >0. */
int tpl_compare(tpl_rt *rt, const tpl_val *a, const tpl_val *b, const char *op);
/* Python type name, e.g. "str", "int", "NoneType", "dict". */
const char *tpl_type_name(const tpl_val *v);
/* str(v) and repr(v), appended to b. */
void tpl_to_str(tpl_rt *rt, tpl_buf *b, const tpl_val *v);
void tpl_repr(tpl_rt *rt, tpl_buf *b, const tpl_val *v);
/* str(v) as a string value (v itself when it is already a str). */
tpl_val tpl_as_str(tpl_rt *rt, const tpl_val *v);
/* Python repr of a float (shortest round-trip digits), written to out (>= 32 bytes). */
void tpl_float_repr(double f, char *out, size_t outlen);

/* ---- buffers -------------------------------------------------------------------------------- */

void tpl_buf_put(tpl_rt *rt, tpl_buf *b, const char *p, size_t n);
void tpl_buf_puts(tpl_rt *rt, tpl_buf *b, const char *s);
void tpl_buf_putc(tpl_rt *rt, tpl_buf *b, char c);
/* The buffer's bytes as a string value (no copy; the buffer must not be reused). */
tpl_val tpl_buf_val(const tpl_buf *b);

/* ---- UTF-8 helpers (Python strings index code points, not bytes) ---------------------------- */

/* Decodes one code point at p (n > 0 bytes left); an invalid byte decodes as itself. Returns its
 * length in bytes. */
size_t tpl_utf8_next(const char *p, size_t n, int32_t *cp);
size_t tpl_utf8_len(const char *p, size_t n);
size_t tpl_utf8_put(int32_t cp, char out[4]);
int tpl_is_space(int32_t cp); /* Python str.isspace() */

#endif
