/* Hugging Face hub downloads (see hub.h). */
#include "hub.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/err.h"
#include "base/file.h"

int lily_hub_is_repo_id(const char *s) {
    const char *slash = strchr(s, '/');
    if (!slash || slash == s || strchr(slash + 1, '/') || !slash[1]) return 0;
    if (s[0] == '.' || slash[1] == '.') return 0;
    for (const char *p = s; *p && *p != ':'; p++)
        if (!isalnum((unsigned char)*p) && !strchr("-_./", *p)) return 0;
    return 1;
}

/* The cache root into out (see hub.h). */
static void cache_root(char *out, size_t len) {
    const char *v;
    if ((v = getenv("HF_HUB_CACHE")) && *v)
        snprintf(out, len, "%s", v);
    else if ((v = getenv("HF_HOME")) && *v)
        snprintf(out, len, "%s/hub", v);
    else if ((v = getenv("XDG_CACHE_HOME")) && *v)
        snprintf(out, len, "%s/huggingface/hub", v);
    else
        snprintf(out, len, "%s/.cache/huggingface/hub", getenv("HOME") ? getenv("HOME") : ".");
}

/* {cache}/models--owner--name into out. */
static void repo_dir(const char *repo, char *out, size_t len) {
    char root[2048];
    cache_root(root, sizeof root);
    int n = snprintf(out, len, "%s/models--", root);
    for (const char *p = repo; *p && n + 3 < (int)len; p++) {
        if (*p == '/')
            out[n++] = '-', out[n++] = '-';
        else
            out[n++] = *p;
    }
    out[n] = 0;
}

int lily_hub_cached(const char *repo, const char *revision, char *out, size_t outlen) {
    char dir[4096], ref[4352], commit[128] = "", cfg[4600];
    repo_dir(repo, dir, sizeof dir);
    if (!revision) revision = "main";
    snprintf(ref, sizeof ref, "%s/refs/%s", dir, revision);
    FILE *f = fopen(ref, "r");
    if (f) {
        if (!fgets(commit, sizeof commit, f)) commit[0] = 0;
        fclose(f);
        commit[strcspn(commit, "\r\n")] = 0;
    } else {
        snprintf(commit, sizeof commit, "%s", revision); /* a commit given as the revision */
    }
    if (!commit[0] || strchr(commit, '/')) return -1;
    snprintf(cfg, sizeof cfg, "%s/snapshots/%s/config.json", dir, commit);
    if (!lily_file_exists(cfg)) return -1;
    snprintf(out, outlen, "%s/snapshots/%s", dir, commit);
    return 0;
}

#ifdef LILY_HAVE_CURL
#include <curl/curl.h>

#include <cjson/cJSON.h>

#include "base/progress.h"
#include "base/sha256.h"
#include "cli.h"

/* mkdir -p of the directory part of path (everything before the last '/'). */
static int mkdirs_for(const char *path, lily_err *e) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) && errno != EEXIST)
            return lily_fail(e, "%s: %s", buf, strerror(errno));
        *p = '/';
    }
    return 0;
}

typedef struct {
    CURL *c;
    struct curl_slist *hdr;
    char endpoint[1024];
} hub;

typedef struct {
    char *p;
    size_t n, cap;
} membuf;

static size_t to_mem(char *d, size_t sz, size_t n, void *ud) {
    membuf *b = ud;
    size_t k = sz * n;
    if (b->n + k + 1 > b->cap) {
        b->cap = (b->n + k + 1) * 2;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, d, k);
    b->n += k;
    b->p[b->n] = 0;
    return k;
}

static void hub_setup(hub *h, const char *url) {
    curl_easy_reset(h->c);
    curl_easy_setopt(h->c, CURLOPT_URL, url);
    curl_easy_setopt(h->c, CURLOPT_HTTPHEADER, h->hdr);
    curl_easy_setopt(h->c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(h->c, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(h->c, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(h->c, CURLOPT_LOW_SPEED_LIMIT, 1L); /* stalled for a minute: give up */
    curl_easy_setopt(h->c, CURLOPT_LOW_SPEED_TIME, 60L);
    char ua[128];
    snprintf(ua, sizeof ua, "lily/%s", lily_cli_commit());
    curl_easy_setopt(h->c, CURLOPT_USERAGENT, ua);
}

/* The status line's meaning for a failed request. */
static int http_fail(lily_err *e, long code, const char *what) {
    if (code == 401 || code == 403)
        return lily_fail(e,
                         "%s: HTTP %ld: access denied (a gated or private repository: set "
                         "HF_TOKEN to a token that may read it)",
                         what, code);
    if (code == 404) return lily_fail(e, "%s: HTTP 404: not found on the hub", what);
    return lily_fail(e, "%s: HTTP %ld", what, code);
}

typedef struct {
    const char *name;
    long long size; /* -1: unknown */
    char etag[72];  /* sha256 (LFS) or git blob id; empty: from the download's headers */
    int lfs;
} hub_file;

/* Whether lily reads a file of the repository: config, weights, tokenizer, template. */
static int wanted(const char *f) {
    static const char *ext[] = {".json", ".safetensors", ".jinja", ".txt", ".model", ".tiktoken"};
    if (f[0] == '.' || !strncmp(f, "original/", 9)) return 0;
    size_t n = strlen(f);
    for (size_t i = 0; i < sizeof ext / sizeof ext[0]; i++) {
        size_t k = strlen(ext[i]);
        if (n > k && !strcmp(f + n - k, ext[i])) return 1;
    }
    return 0;
}

static void unquote_etag(const char *v, char *out, size_t len) {
    while (*v == ' ')
        v++;
    if (!strncmp(v, "W/", 2)) v += 2;
    if (*v == '"') v++;
    snprintf(out, len, "%s", v);
    out[strcspn(out, "\"\r\n ")] = 0;
}

/* ---- one file ---------------------------------------------------------------------------------
 */

typedef struct {
    FILE *f;
    lily_sha256 sha;
    long long have;   /* bytes in the file (resumed from + written) */
    long long offset; /* the Range start asked for */
    int hop;          /* responses seen (redirects count) */
    int checked;      /* the final status was looked at */
    long status;
    char linked[72]; /* X-Linked-Etag (any hop) */
    char etag[72];   /* the first response's ETag (the hub's, not the CDN's) */
    membuf err;      /* the body of an error response */
    lily_bar bar;
    int tty;
    CURL *c;
} dl;

static size_t on_header(char *d, size_t sz, size_t n, void *ud) {
    dl *x = ud;
    size_t k = sz * n;
    char line[512];
    snprintf(line, sizeof line, "%.*s", (int)(k < sizeof line - 1 ? k : sizeof line - 1), d);
    if (!strncmp(line, "HTTP/", 5))
        x->hop++;
    else if (!strncasecmp(line, "x-linked-etag:", 14))
        unquote_etag(line + 14, x->linked, 72);
    else if (!strncasecmp(line, "etag:", 5) && x->hop == 1)
        unquote_etag(line + 5, x->etag, 72);
    return k;
}

static size_t on_data(char *d, size_t sz, size_t n, void *ud) {
    dl *x = ud;
    size_t k = sz * n;
    if (!x->checked) {
        x->checked = 1;
        curl_easy_getinfo(x->c, CURLINFO_RESPONSE_CODE, &x->status);
        if (x->status == 200 && x->offset > 0) { /* the server ignored Range: start over */
            if (ftruncate(fileno(x->f), 0) || fseek(x->f, 0, SEEK_SET)) return 0;
            x->have = 0;
            lily_sha256_init(&x->sha);
        }
    }
    if (x->status >= 300) return to_mem(d, sz, n, &x->err);
    if (fwrite(d, 1, k, x->f) != k) return 0;
    lily_sha256_update(&x->sha, d, k);
    x->have += (long long)k;
    return k;
}

static int on_progress(void *ud, curl_off_t total, curl_off_t now, curl_off_t ut, curl_off_t un) {
    (void)ut, (void)un;
    dl *x = ud;
    if (x->tty && total > 0 && x->status < 300)
        lily_bar_update(&x->bar, (uint64_t)(x->offset + now), (uint64_t)(x->offset + total) + 1);
    return 0;
}

/* Hashes the bytes already in f (a partial download) into s. */
static int hash_existing(FILE *f, lily_sha256 *s, long long *n) {
    static char buf[1 << 16];
    size_t k;
    *n = 0;
    rewind(f);
    while ((k = fread(buf, 1, sizeof buf, f)) > 0)
        lily_sha256_update(s, buf, k), *n += (long long)k;
    return ferror(f) ? -1 : 0;
}

/* Downloads one file into blobs/ (resuming a .incomplete) and links it from the snapshot. */
static int fetch(hub *h, const char *repo, const char *dir, const char *commit, hub_file *hf,
                 int quiet, lily_err *e) {
    char blob[4352], part[4400], url[4096], link[8192], target[4400];
    int tty = isatty(2);
    if (hf->etag[0]) {
        snprintf(blob, sizeof blob, "%s/blobs/%s", dir, hf->etag);
        struct stat st;
        if (!stat(blob, &st) && (hf->size < 0 || st.st_size == hf->size)) goto link; /* cached */
        snprintf(part, sizeof part, "%s.incomplete", blob);
    } else {
        snprintf(part, sizeof part, "%s/blobs/unnamed-%ld.incomplete", dir, (long)getpid());
    }
    if (mkdirs_for(part, e)) return -1;
    char *esc = curl_easy_escape(h->c, hf->name, 0);
    for (char *p = esc; (p = strstr(p, "%2F"));)
        memmove(p + 1, p + 3, strlen(p + 3) + 1), *p = '/';
    snprintf(url, sizeof url, "%s/%s/resolve/%s/%s", h->endpoint, repo, commit, esc);
    curl_free(esc);
    int rc = -1;
    for (int attempt = 0; attempt < 3 && rc; attempt++) {
        dl x = {.tty = tty, .c = h->c, .bar = {.label = hf->name}};
        x.f = fopen(part, "a+b");
        if (!x.f) return lily_fail(e, "%s: %s", part, strerror(errno));
        lily_sha256_init(&x.sha);
        if (hash_existing(x.f, &x.sha, &x.have)) {
            fclose(x.f);
            return lily_fail(e, "%s: read error", part);
        }
        x.offset = x.have;
        if (attempt || x.offset) fprintf(stderr, "%s: resuming at byte %lld\n", hf->name, x.offset);
        hub_setup(h, url);
        char range[64];
        snprintf(range, sizeof range, "%lld-", x.offset);
        if (x.offset > 0) curl_easy_setopt(h->c, CURLOPT_RANGE, range);
        curl_easy_setopt(h->c, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(h->c, CURLOPT_HEADERDATA, &x);
        curl_easy_setopt(h->c, CURLOPT_WRITEFUNCTION, on_data);
        curl_easy_setopt(h->c, CURLOPT_WRITEDATA, &x);
        curl_easy_setopt(h->c, CURLOPT_XFERINFOFUNCTION, on_progress);
        curl_easy_setopt(h->c, CURLOPT_XFERINFODATA, &x);
        curl_easy_setopt(h->c, CURLOPT_NOPROGRESS, 0L);
        CURLcode cc = curl_easy_perform(h->c);
        long code = 0;
        curl_easy_getinfo(h->c, CURLINFO_RESPONSE_CODE, &code);
        fclose(x.f);
        free(x.err.p);
        if (tty && x.bar.t0 > 0 && cc != CURLE_OK) fputs("\r\033[K", stderr);
        if (code == 416 && hf->size >= 0 && x.have == hf->size) cc = CURLE_OK, code = 206;
        if (cc == CURLE_OK && code >= 300) return http_fail(e, code, url);
        if (cc != CURLE_OK) {
            lily_fail(e, "%s: download interrupted at byte %lld (%s)", hf->name, x.have,
                      curl_easy_strerror(cc));
            fprintf(stderr, "lily pull: %s\n", e->msg);
            continue;
        }
        if (hf->size >= 0 && x.have != hf->size) {
            lily_fail(e, "%s: %lld bytes, the hub lists %lld", hf->name, x.have, hf->size);
            continue;
        }
        /* the checksum: the listing's sha256 for LFS files, else the headers' when it is one */
        char got[65], want[72];
        lily_sha256_hex(&x.sha, got);
        snprintf(want, sizeof want, "%s", hf->lfs ? hf->etag : x.linked);
        if (!want[0] && strlen(x.etag) == 64) snprintf(want, sizeof want, "%s", x.etag);
        if (hf->lfs && x.linked[0] && strcmp(x.linked, hf->etag)) {
            unlink(part);
            return lily_fail(e,
                             "%s: the hub's X-Linked-Etag %s differs from the listing's sha256 "
                             "%s",
                             hf->name, x.linked, hf->etag);
        }
        if (strlen(want) == 64 && strcmp(got, want)) {
            unlink(part);
            return lily_fail(e,
                             "%s: checksum mismatch: sha256 %s, the hub says %s (the partial "
                             "file was removed; run lily pull again)",
                             hf->name, got, want);
        }
        if (!hf->etag[0]) {
            const char *t = x.linked[0] ? x.linked : x.etag;
            if (!t[0]) {
                unlink(part);
                return lily_fail(e, "%s: the hub sent no ETag", hf->name);
            }
            snprintf(hf->etag, sizeof hf->etag, "%s", t);
            snprintf(blob, sizeof blob, "%s/blobs/%s", dir, hf->etag);
        }
        if (rename(part, blob)) return lily_fail(e, "%s: %s", blob, strerror(errno));
        if (tty)
            lily_bar_update(&x.bar, (uint64_t)x.have, (uint64_t)x.have);
        else if (!quiet) {
            char sz[32];
            lily_bar_bytes(sz, sizeof sz, (uint64_t)x.have);
            fprintf(stderr, "%s: %s%s\n", hf->name, sz, hf->lfs ? ", sha256 ok" : "");
        }
        rc = 0;
    }
    if (rc) return -1;
link:
    /* snapshots/{commit}/{name} -> ../../blobs/{etag}, one more ../ per folder in name */
    snprintf(link, sizeof link, "%s/snapshots/%s/%s", dir, commit, hf->name);
    int n = snprintf(target, sizeof target, "../../");
    for (const char *p = hf->name; *p; p++)
        if (*p == '/') n += snprintf(target + n, sizeof target - (size_t)n, "../");
    snprintf(target + n, sizeof target - (size_t)n, "blobs/%s", hf->etag);
    if (mkdirs_for(link, e)) return -1;
    unlink(link);
    if (symlink(target, link)) return lily_fail(e, "%s: %s", link, strerror(errno));
    return 0;
}

/* ---- a repository ------------------------------------------------------------------------------
 */

static int list_files(hub *h, const char *repo, const char *rev, cJSON **out, lily_err *e) {
    char url[4096];
    char *esc = curl_easy_escape(h->c, rev, 0);
    snprintf(url, sizeof url, "%s/api/models/%s/revision/%s?blobs=true", h->endpoint, repo, esc);
    curl_free(esc);
    membuf b = {0};
    hub_setup(h, url);
    curl_easy_setopt(h->c, CURLOPT_WRITEFUNCTION, to_mem);
    curl_easy_setopt(h->c, CURLOPT_WRITEDATA, &b);
    CURLcode cc = curl_easy_perform(h->c);
    long code = 0;
    curl_easy_getinfo(h->c, CURLINFO_RESPONSE_CODE, &code);
    if (cc != CURLE_OK) {
        free(b.p);
        return lily_fail(e, "%s: %s", url, curl_easy_strerror(cc));
    }
    if (code != 200) {
        free(b.p);
        return http_fail(e, code, url);
    }
    *out = cJSON_Parse(b.p ? b.p : "");
    free(b.p);
    if (!cJSON_IsObject(*out) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(*out, "sha")) ||
        !cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(*out, "siblings"))) {
        cJSON_Delete(*out);
        return lily_fail(e, "%s: not a model listing (no sha or siblings)", url);
    }
    return 0;
}

int lily_hub_pull(const char *repo, const char *revision, int quiet, char *out, size_t outlen,
                  lily_err *e) {
    if (!lily_hub_is_repo_id(repo))
        return lily_fail(e, "'%s' is not a repository id (owner/name)", repo);
    if (!revision) revision = "main";
    hub h = {0};
    const char *v = getenv("HF_ENDPOINT");
    snprintf(h.endpoint, sizeof h.endpoint, "%s", v && *v ? v : "https://huggingface.co");
    size_t el = strlen(h.endpoint);
    while (el && h.endpoint[el - 1] == '/')
        h.endpoint[--el] = 0;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    h.c = curl_easy_init();
    if ((v = getenv("HF_TOKEN")) && *v) {
        char auth[1024];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", v);
        h.hdr = curl_slist_append(h.hdr, auth);
    }
    cJSON *j = NULL;
    int rc = list_files(&h, repo, revision, &j, e);
    char dir[4096];
    repo_dir(repo, dir, sizeof dir);
    if (rc == 0) {
        const char *commit = cJSON_GetObjectItemCaseSensitive(j, "sha")->valuestring;
        const cJSON *s;
        int n_skip = 0, n_file = 0, n_have = 0;
        long long total = 0;
        cJSON_ArrayForEach(s, cJSON_GetObjectItemCaseSensitive(j, "siblings")) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(s, "rfilename");
            if (!cJSON_IsString(name) || strstr(name->valuestring, "..")) continue;
            if (!wanted(name->valuestring)) {
                n_skip++;
                continue;
            }
            hub_file f = {.name = name->valuestring, .size = -1};
            const cJSON *lfs = cJSON_GetObjectItemCaseSensitive(s, "lfs"), *x;
            if (cJSON_IsNumber(x = cJSON_GetObjectItemCaseSensitive(s, "size")))
                f.size = (long long)x->valuedouble;
            if (cJSON_IsObject(lfs) &&
                cJSON_IsString(x = cJSON_GetObjectItemCaseSensitive(lfs, "sha256"))) {
                f.lfs = 1;
                snprintf(f.etag, sizeof f.etag, "%s", x->valuestring);
                if (cJSON_IsNumber(x = cJSON_GetObjectItemCaseSensitive(lfs, "size")))
                    f.size = (long long)x->valuedouble;
            } else if (cJSON_IsString(x = cJSON_GetObjectItemCaseSensitive(s, "blobId"))) {
                snprintf(f.etag, sizeof f.etag, "%s", x->valuestring);
            }
            char blob[4400];
            struct stat st;
            snprintf(blob, sizeof blob, "%s/blobs/%s", dir, f.etag);
            n_have += f.etag[0] && !stat(blob, &st) && (f.size < 0 || st.st_size == f.size);
            if ((rc = fetch(&h, repo, dir, commit, &f, quiet, e))) break;
            n_file++;
            total += f.size > 0 ? f.size : 0;
        }
        if (rc == 0 && n_file == 0)
            rc = lily_fail(e,
                           "%s@%s holds no file lily reads (config.json, *.safetensors, "
                           "tokenizer files)%s",
                           repo, revision, n_skip ? "; GGUF and other formats are not read" : "");
        char ref[4400];
        snprintf(ref, sizeof ref, "%s/refs/%s", dir, revision);
        if (rc == 0 && strcmp(revision, commit)) {
            FILE *rf = NULL;
            if (mkdirs_for(ref, e) || !(rf = fopen(ref, "w")) || fputs(commit, rf) < 0 ||
                fclose(rf)) {
                if (rf) fclose(rf);
                rc = lily_fail(e, "%s: cannot write", ref);
            }
        }
        snprintf(out, outlen, "%s/snapshots/%s", dir, commit);
        if (rc == 0 && !quiet) {
            char sz[32];
            lily_bar_bytes(sz, sizeof sz, (uint64_t)total);
            fprintf(stderr, "%s@%s (commit %.12s): %d files, %s (%d already in the cache)%s\n",
                    repo, revision, commit, n_file, sz, n_have,
                    n_skip ? "; other files skipped" : "");
        }
        char cfg[4400];
        snprintf(cfg, sizeof cfg, "%s/config.json", out);
        if (rc == 0 && !lily_file_exists(cfg))
            rc = lily_fail(e, "%s@%s has no config.json: not a model lily reads", repo, revision);
    }
    cJSON_Delete(j);
    curl_slist_free_all(h.hdr);
    curl_easy_cleanup(h.c);
    curl_global_cleanup();
    return rc;
}
#endif
