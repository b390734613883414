/* --model resolution: a directory, or a hub repository id (owner/name[:revision]) taken from the
 * hub cache or downloaded (tools/hub.h); a .gguf file is refused with the reason. */
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "cli.h"
#include "hub.h"

const char *lily_cli_model(const char *arg, char *buf, size_t len) {
    size_t n = strlen(arg);
    struct stat st;
    if (n > 5 && !strcasecmp(arg + n - 5, ".gguf")) {
        fprintf(stderr,
                "lily: %s: GGUF files are not read. lily loads safetensors checkpoints "
                "(HF bf16 or MLX 4/8-bit) from a directory, or from the hub: e.g. "
                "`lily pull Qwen/Qwen3.6-35B-A3B` or --model "
                "mlx-community/Qwen3.6-35B-A3B-4bit\n",
                arg);
        return NULL;
    }
    if (!stat(arg, &st) || !lily_hub_is_repo_id(arg)) return arg;
    char repo[512], *rev;
    snprintf(repo, sizeof repo, "%s", arg);
    if ((rev = strchr(repo, ':'))) *rev++ = 0;
    if (!lily_hub_cached(repo, rev, buf, len)) return buf;
#ifdef LILY_HAVE_CURL
    lily_err e;
    fprintf(stderr, "lily: no directory %s: downloading it from the hub (lily pull)\n", arg);
    if (lily_hub_pull(repo, rev, 0, buf, len, &e)) {
        fprintf(stderr, "lily: %s\n", e.msg);
        return NULL;
    }
    return buf;
#else
    fprintf(stderr,
            "lily: no directory %s, and this build cannot download it from the hub (no "
            "libcurl)\n",
            arg);
    return NULL;
#endif
}
