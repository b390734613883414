/* The lily command-line front end: one function per subcommand, each in tools/cmd_<name>.c.
 * Each takes the arguments after the subcommand name and returns the process exit code. */
#ifndef LILY_TOOLS_CLI_H
#define LILY_TOOLS_CLI_H

#include <stdint.h>

#include "lily.h"

/* Small shared helpers for argument parsing (tools/cli_util.c). */
/* Returns argv[i+1] for option argv[i], or prints an error and returns NULL. */
const char *lily_cli_value(int argc, char **argv, int *i);
/* Parses a size such as 512, 4K, 128k, 1M into *out. Returns 0 or -1. */
int lily_cli_size(const char *s, long *out);
/* Parses "cpu" or "cuda". Returns 0 or -1 (with a message on stderr). */
int lily_cli_backend(const char *s, lily_backend_kind *out);
/* Reads a file of little-endian int32 token ids (caller frees *out). Returns 0 or -1. */
int lily_cli_read_tokens(const char *path, int32_t **out, int *n);

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

#endif
