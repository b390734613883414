/* lily: entry point; dispatches to the subcommands declared in cli.h. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} lily_command;

static const lily_command commands[] = {
    /* one line per subcommand, in the order shown by --help */
    {"score", lily_cmd_score, "teacher-forced logits of a token file (prefill/decode/chunked)"},
    {"eval", lily_cmd_eval,
     "perplexity of a text; KL, top-1 and PPL ratio against reference logits"},
    {"generate", lily_cmd_generate, "generate token ids from prompt token ids"},
    {"bench", lily_cmd_bench, "prefill and decode speed at a sweep of context lengths"},
    {"info", lily_cmd_info, "what a model directory holds: shapes, sizes, bytes per token"},
    {"convert", lily_cmd_convert, "MLX affine checkpoint -> HF bf16 layout (dequantized)"},
    {"mkmodel", lily_cmd_mkmodel, "write a random-weight checkpoint (HF or MLX layout)"},
    {"tokenize", lily_cmd_tokenize, "text -> token ids with a model's tokenizer.json"},
    {"detokenize", lily_cmd_detokenize, "token ids -> text with a model's tokenizer.json"},
    {"template", lily_cmd_template, "render a model's chat template for a request (JSON file)"},
    {"serve", lily_cmd_serve, "OpenAI-compatible HTTP server (chat/completions, streaming, tools)"},
    {"chat", lily_cmd_chat, "interactive chat in the terminal (reuses state between turns)"},
    {"run", lily_cmd_run, "one-shot: one prompt in, streamed text out"},
    {"pull", lily_cmd_pull, "download a model from the Hugging Face hub (OWNER/NAME[:REVISION])"},
    {NULL, NULL, NULL},
};

static void usage(FILE *f) {
    fprintf(f, "usage: lily <command> [options]\n\ncommands:\n");
    for (size_t i = 0; commands[i].name; i++)
        fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\nRun 'lily <command> --help' for a command's options; 'lily --version' for the\n"
               "commit and build options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        lily_cli_version(stdout);
        return 0;
    }
    for (size_t i = 0; commands[i].name; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 2, argv + 2);
    fprintf(stderr, "lily: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
