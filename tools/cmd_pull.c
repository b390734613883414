/* lily pull REPO[:REVISION]: downloads a model from the Hugging Face hub into the hub's cache
 * (tools/hub.h) and prints its snapshot directory on stdout. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "hub.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: lily pull OWNER/NAME[:REVISION] [--quiet]\n"
            "Downloads config, weights (safetensors), tokenizer and template files of a Hugging\n"
            "Face model repository (REVISION: a branch, tag or commit; default main) into the\n"
            "hub cache ($HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub), resuming\n"
            "partial downloads and checking sha256 sums; prints the snapshot directory.\n"
            "$HF_TOKEN is sent for gated or private repositories; $HF_ENDPOINT replaces\n"
            "https://huggingface.co. Checkpoints that work: Qwen/Qwen3.6-35B-A3B and the other\n"
            "official Qwen3.5/3.6 repositories, and their mlx-community 4-bit twins (e.g.\n"
            "mlx-community/Qwen3.6-35B-A3B-4bit). GGUF files are not read.\n");
}

int lily_cmd_pull(int argc, char **argv) {
    const char *spec = NULL;
    int quiet = 0;
    const lily_arg own[] = {
        {.name = "--quiet", .kind = LILY_ARG_FLAG, .dst = &quiet, .help = "no progress bar"}, {0}};
    const lily_arg *tabs[] = {own};
    const int pr = lily_args_parse("pull", tabs, 1, argc, argv, &spec, 1, NULL, usage);
    if (pr) return lily_args_exit(pr);
    if (!spec) {
        usage(stderr);
        return 2;
    }
    char repo[512], *rev = NULL;
    snprintf(repo, sizeof repo, "%s", spec);
    if ((rev = strchr(repo, ':'))) *rev++ = 0;
    if (!lily_hub_is_repo_id(repo) || (rev && !*rev)) {
        fprintf(stderr, "lily pull: '%s' is not OWNER/NAME[:REVISION]\n", spec);
        return 2;
    }
#ifdef LILY_HAVE_CURL
    char dir[4096];
    lily_err e;
    if (lily_hub_pull(repo, rev, quiet, dir, sizeof dir, &e)) {
        fprintf(stderr, "lily pull: %s\n", e.msg);
        return 1;
    }
    printf("%s\n", dir);
    return 0;
#else
    (void)quiet;
    fprintf(stderr, "lily pull: this build has no libcurl (Debian: apt install "
                    "libcurl4-openssl-dev, then rebuild)\n");
    return 1;
#endif
}
