/* The lily command-line front end: one function per subcommand, each in tools/cmd_<name>.c.
 * Each takes the arguments after the subcommand name and returns the process exit code. */
#ifndef LILY_TOOLS_CLI_H
#define LILY_TOOLS_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "lily.h"

#include "args.h"

/* Small shared helpers for argument parsing (tools/cli_util.c); the parser itself is
 * tools/args.h. */
/* Parses a size such as 512, 4K, 128k, 1M into *out. Returns 0 or -1. */
int lily_cli_size(const char *s, long *out);
/* The engine options' usage lines: --precision default|exact|fast, --cpu-isa
 * auto|avx512|avx2|scalar, --sample-on auto|device|host (device: the backend draws tokens, the
 * CPU backend too). */
#define LILY_CLI_ENGINE_USAGE                                                \
    "  --precision default|exact|fast   --cpu-isa auto|avx512|avx2|scalar\n" \
    "  --sample-on auto|device|host     (where tokens are drawn: device = the backend)\n"
/* The engine options, declared once for every command that opens a model (parsed by
 * tools/args.c): --backend cpu|cuda, --threads N, --precision, --cpu-isa, --sample-on. Each
 * field holds the lily.h enum's value (0 = its default). */
typedef struct lily_cli_engine {
    int backend, threads, precision, cpu_isa, sample_on;
} lily_cli_engine;
#define LILY_CLI_ENGINE_N 6 /* lily_arg entries lily_cli_engine_table() writes, with the end */
void lily_cli_engine_table(lily_cli_engine *e, lily_arg t[LILY_CLI_ENGINE_N]);
/* Copies e into o's fields of the same names. */
void lily_cli_engine_apply(const lily_cli_engine *e, lily_engine_opts *o);
/* Reads a file of little-endian int32 token ids (caller frees *out). Returns 0 or -1. */
int lily_cli_read_tokens(const char *path, int32_t **out, int *n);

/* Shows a loading bar (bytes, time) on stderr while o's model loads, when stderr is a terminal
 * (tools/cli_term.c). */
void lily_cli_load_bar(lily_engine_opts *o);

/* The commit this binary was built from (git describe), and `lily --version`'s text
 * (tools/cli_version.c). */
const char *lily_cli_commit(void);
void lily_cli_version(FILE *f);

/* The model directory for --model arg: arg itself when it exists or is no hub repository id;
 * for owner/name[:revision] the hub cache's snapshot (downloaded when absent, tools/hub.h) in
 * buf. NULL (a message printed) for a .gguf file or a failed download (tools/cli_model.c). */
const char *lily_cli_model(const char *arg, char *buf, size_t len);

/* subcommands (one line each) */
int lily_cmd_score(int argc, char **argv);
int lily_cmd_eval(int argc, char **argv);
int lily_cmd_convert(int argc, char **argv);
int lily_cmd_bench(int argc, char **argv);
int lily_cmd_generate(int argc, char **argv);
int lily_cmd_info(int argc, char **argv);
int lily_cmd_mkmodel(int argc, char **argv);
int lily_cmd_tokenize(int argc, char **argv);
int lily_cmd_detokenize(int argc, char **argv);
int lily_cmd_template(int argc, char **argv);
int lily_cmd_serve(int argc, char **argv);
int lily_cmd_chat(int argc, char **argv);
int lily_cmd_run(int argc, char **argv);
int lily_cmd_pull(int argc, char **argv);

#endif
