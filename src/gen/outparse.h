/* Incremental parser of Qwen3.5/3.6 (and Qwen3) model output into reasoning, content and tool
 * calls, as specified in api.md §2.5.
 *
 * The parser is fed decoded text in arbitrary pieces and produces a list of deltas: reasoning
 * text, content text, tool-call headers (index, id, name) and tool-call argument fragments. The
 * deltas are final (never retracted), so a stream can forward them as they appear; the
 * concatenation of all deltas is the same for every way of splitting the same output, which is
 * what makes the streaming and non-streaming answers identical. Text that could still turn out
 * to be the start of a marker (`<`, `</th`, `\n</param`...) or an incomplete UTF-8 sequence is held
 * back until the next piece decides it; lily_outparse_finish flushes everything.
 *
 * Recognised: the reasoning block (closed by `</think>`, or implicitly by a tool call), the XML
 * call form `<tool_call><function=NAME><parameter=P>value</parameter></function></tool_call>`
 * (also without `<tool_call>`), and the JSON form `<tool_call>{"name":..,"arguments":..}
 * </tool_call>`. Parameter values become JSON by the parameter's schema type (§2.5.4); string
 * values stream as they arrive, other values are emitted converted when they close. The parser
 * never fails: malformed calls come back as text (§2.5.5), and calls cut off by the end of output
 * are closed so that every call's arguments are valid JSON. */
#ifndef LILY_GEN_OUTPARSE_H
#define LILY_GEN_OUTPARSE_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "gen/sb.h"

typedef enum lily_delta_kind {
    LILY_DELTA_REASONING, /* text: reasoning text */
    LILY_DELTA_CONTENT,   /* text: visible answer text */
    LILY_DELTA_CALL,      /* a new tool call: call index, id, text = function name */
    LILY_DELTA_ARGS,      /* text: the next fragment of call `call`'s arguments JSON string */
} lily_delta_kind;

typedef struct lily_delta {
    lily_delta_kind kind;
    int call;     /* tool-call index (CALL and ARGS) */
    char id[32];  /* CALL: "call_" + 24 alphanumerics */
    lily_sb text; /* see the kinds */
} lily_delta;

typedef struct lily_outparse_opts {
    int thinking;           /* the prompt ended inside an open <think> block */
    int tools;              /* parse tool calls (tools given and tool_choice is not "none") */
    const cJSON *tool_defs; /* the request's tools array, for parameter types; borrowed; may
                               be NULL */
    int single_call;        /* parallel_tool_calls:false: ignore output after the first call */
    uint64_t id_seed;       /* seeds the call ids */
} lily_outparse_opts;

typedef struct lily_outparse lily_outparse;

lily_outparse *lily_outparse_create(const lily_outparse_opts *opts);
void lily_outparse_free(lily_outparse *p);

/* Feeds the next piece of decoded output; new deltas are appended to the delta list. */
void lily_outparse_feed(lily_outparse *p, const char *text, size_t len);
/* End of output: flushes held text and closes an unfinished call. Further feeds are ignored. */
void lily_outparse_finish(lily_outparse *p);

/* The deltas produced since the last lily_outparse_clear; borrowed until the next call on p.
 * Consecutive text deltas of one kind (and call) are merged. */
const lily_delta *lily_outparse_deltas(const lily_outparse *p, size_t *n);
void lily_outparse_clear(lily_outparse *p);

/* Still inside the reasoning block (for counting reasoning tokens). */
int lily_outparse_in_reasoning(const lily_outparse *p);
/* Number of tool calls whose header was produced. */
int lily_outparse_n_calls(const lily_outparse *p);
/* A call is open (header sent, arguments not yet closed). */
int lily_outparse_in_call(const lily_outparse *p);
/* single_call was set and the first call completed: the caller may stop generating. */
int lily_outparse_done(const lily_outparse *p);

/* A whole message assembled from deltas (the non-streaming answer). */
typedef struct lily_outcall {
    char id[32];
    lily_sb name;
    lily_sb args;
} lily_outcall;

typedef struct lily_outmsg {
    lily_sb reasoning;
    lily_sb content;
    lily_outcall *calls;
    int n_calls;
} lily_outmsg;

/* Appends deltas to m (zero-initialise m first). */
void lily_outmsg_add(lily_outmsg *m, const lily_delta *d, size_t n);
void lily_outmsg_free(lily_outmsg *m);

#endif
