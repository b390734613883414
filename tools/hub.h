/* Hugging Face hub downloads (lily pull, and --model owner/name): the file list and commit of a
 * revision from {endpoint}/api/models/{repo}/revision/{rev}, each file from
 * {endpoint}/{repo}/resolve/{commit}/{file}, into a cache laid out as the hub's own, so files
 * that other tools downloaded are reused and theirs ours:
 *   {cache}/models--{owner}--{name}/blobs/{etag}            the bytes (etag: sha256 for LFS files)
 *   {cache}/models--{owner}--{name}/snapshots/{commit}/{file} -> ../../blobs/{etag}
 *   {cache}/models--{owner}--{name}/refs/{revision}          the commit
 * A download goes to blobs/{etag}.incomplete first and resumes from it (HTTP Range); LFS files
 * are checked against their sha256. The cache is $HF_HUB_CACHE, $HF_HOME/hub,
 * $XDG_CACHE_HOME/huggingface/hub or ~/.cache/huggingface/hub; the endpoint $HF_ENDPOINT or
 * https://huggingface.co; $HF_TOKEN is sent as a bearer token. */
#ifndef LILY_TOOLS_HUB_H
#define LILY_TOOLS_HUB_H

#include <stddef.h>

#include "lily.h"

/* Non-zero when s looks like a hub repository id "owner/name" (optionally ":revision"). */
int lily_hub_is_repo_id(const char *s);

/* The cache's snapshot directory of repo at revision (NULL = "main") when refs/{revision} names
 * a snapshot holding config.json. Returns 0 with the path in out, -1 when absent. */
int lily_hub_cached(const char *repo, const char *revision, char *out, size_t outlen);

#ifdef LILY_HAVE_CURL
/* Downloads what lily reads of repo at revision (NULL = "main": config, weights, tokenizer and
 * template files; not GGUF, .bin or original/) into the cache. Progress bars on stderr when it is
 * a terminal, else one line per file unless quiet. Returns 0 with the snapshot directory in out,
 * or -1 with a message. */
int lily_hub_pull(const char *repo, const char *revision, int quiet, char *out, size_t outlen,
                  lily_err *e);
#endif

#endif
