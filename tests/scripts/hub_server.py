#!/usr/bin/env python3
"""A stand-in for the Hugging Face hub on loopback, for tests/scripts/pull.sh.

Usage: hub_server.py ROOT PORTFILE LOGFILE

ROOT/<owner>/<name>/ holds each repository's files. It answers as the hub does:
  GET /api/models/<owner>/<name>/revision/<rev>   {"sha", "siblings": [{"rfilename", "size",
                                                   "blobId", "lfs": {"sha256", "size"}}]}
  GET /<owner>/<name>/resolve/<rev>/<file>        *.safetensors are LFS files: 302 to /cdn/<sha256>
                                                   with X-Linked-Etag (the sha256), X-Linked-Size,
                                                   X-Repo-Commit; other files 200 with the git blob
                                                   id as ETag
  GET /cdn/<sha256>                                the bytes, with Range (206) support
<rev> is "main" or the commit. Faults, by repository name:
  *private*  401 without "Authorization: Bearer secret-token"
  *corrupt*  the listing and X-Linked-Etag give a wrong sha256 for LFS files
  *flaky*    the first download of each LFS file without a Range header stops after half its
             bytes and closes the connection (the client must resume with Range)
Each request is logged to LOGFILE as "METHOD PATH RANGE AUTH".
"""
import hashlib
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT, PORTFILE, LOGFILE = sys.argv[1:4]
cut_done = set()
cdn = {}  # sha256 -> (path, flaky)


def commit_of(repo):
    return hashlib.sha1(repo.encode()).hexdigest()


def files_of(repo):
    base = os.path.join(ROOT, repo)
    out = []
    for d, _, names in os.walk(base):
        for n in sorted(names):
            p = os.path.join(d, n)
            out.append((os.path.relpath(p, base), p))
    return sorted(out)


digests = {}  # path -> (size, git blob id, sha256)


def digest(path):
    if path not in digests:
        data = open(path, "rb").read()
        digests[path] = (len(data), hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(),
                         hashlib.sha256(data).hexdigest())
    return digests[path]


def describe(repo, rel, path):
    size, blob_id, sha = digest(path)
    info = {"rfilename": rel, "size": size, "blobId": blob_id}
    if rel.endswith(".safetensors"):
        data = open(path, "rb").read() if "corrupt" in repo else b""
        if "corrupt" in repo:
            sha = hashlib.sha256(data + b"x").hexdigest()
        info["lfs"] = {"sha256": sha, "size": size, "pointerSize": 134}
        cdn[sha] = (path, "flaky" in repo)
    return info


class Hub(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def send(self, code, body=b"", headers=()):
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        rng = self.headers.get("Range", "-")
        auth = self.headers.get("Authorization", "-")
        with open(LOGFILE, "a") as f:
            f.write("GET %s %s %s\n" % (self.path, rng.replace(" ", ""), auth.replace(" ", "_")))
        parts = self.path.split("?")[0].strip("/").split("/")
        if parts[0] == "cdn" and len(parts) == 2 and parts[1] in cdn:
            return self.serve_bytes(*cdn[parts[1]], parts[1])
        if parts[0] == "api" and len(parts) == 6 and parts[1] == "models":
            repo = parts[2] + "/" + parts[3]
            if not self.allowed(repo):
                return
            if not os.path.isdir(os.path.join(ROOT, repo)) or parts[5] not in ("main", commit_of(repo)):
                return self.send(404, b'{"error": "Repository not found"}')
            body = {"id": repo, "sha": commit_of(repo),
                    "siblings": [describe(repo, r, p) for r, p in files_of(repo)]}
            return self.send(200, json.dumps(body).encode(), [("Content-Type", "application/json")])
        if len(parts) >= 5 and parts[2] == "resolve":
            repo = parts[0] + "/" + parts[1]
            if not self.allowed(repo):
                return
            rel = "/".join(parts[4:])
            path = os.path.join(ROOT, repo, rel)
            if parts[3] not in ("main", commit_of(repo)) or not os.path.isfile(path):
                return self.send(404, b"Entry not found")
            info = describe(repo, rel, path)
            common = [("X-Repo-Commit", commit_of(repo))]
            if "lfs" in info:
                sha = info["lfs"]["sha256"]
                return self.send(302, b"", common + [
                    ("Location", "/cdn/" + sha), ("X-Linked-Etag", '"%s"' % sha),
                    ("X-Linked-Size", str(info["size"])), ("ETag", '"%s"' % info["blobId"])])
            return self.serve_bytes(path, False, info["blobId"], common)
        self.send(404, b"not found")

    def allowed(self, repo):
        if "private" in repo and self.headers.get("Authorization") != "Bearer secret-token":
            self.send(401, b'{"error": "Invalid credentials"}')
            return False
        return True

    def serve_bytes(self, path, flaky, etag, headers=()):
        data = open(path, "rb").read()
        rng = self.headers.get("Range")
        h = list(headers) + [("ETag", '"%s"' % (etag if len(etag) == 40 else "cdn-" + etag[:16]))]
        if rng and rng.startswith("bytes="):
            start = int(rng[6:].split("-")[0])
            if start >= len(data):
                return self.send(416, b"", h)
            return self.send(206, data[start:], h + [
                ("Content-Range", "bytes %d-%d/%d" % (start, len(data) - 1, len(data)))])
        if flaky and path not in cut_done:
            cut_done.add(path)
            self.send_response(200)
            for k, v in h:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.send(200, data, h)


srv = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
with open(PORTFILE + ".tmp", "w") as f:
    f.write(str(srv.server_address[1]))
os.rename(PORTFILE + ".tmp", PORTFILE)
srv.serve_forever()
