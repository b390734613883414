/* The lily command-line front end: one function per subcommand, each in tools/cmd_<name>.c.
 * Each takes the arguments after the subcommand name and returns the process exit code. */
#ifndef LILY_TOOLS_CLI_H
#define LILY_TOOLS_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "lily.h"

/* Small shared helpers for argument parsing (tools/cli_util.c). */
/* Returns argv[i+1] for option argv[i], or prints an error and returns NULL. */
const char *lily_cli_value(int argc, char **argv, int *i);
/* Parses a size such as 512, 4K, 128k, 1M into *out. Returns 0 or -1. */
int lily_cli_size(const char *s, long *out);
/* Parses "cpu" or "cuda". Returns 0 or -1 (with a message on stderr). */
int lily_cli_backend(const char *s, lily_backend_kind *out);
/* The engine options every engine command takes: --precision default|exact|fast, --cpu-isa
 * auto|avx512|avx2|scalar, --sample-on auto|device|host (device: the backend draws tokens, the
 * CPU backend too). Returns 1 when a was one of them (stored in *o), 0 when it is not, -1 with a
 * message on stderr when v is not one of its values. */
#define LILY_CLI_ENGINE_USAGE                                                \
    "  --precision default|exact|fast   --cpu-isa auto|avx512|avx2|scalar\n" \
    "  --sample-on auto|device|host     (where tokens are drawn: device = the backend)\n"
int lily_cli_engine_arg(const char *a, const char *v, lily_engine_opts *o);
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
