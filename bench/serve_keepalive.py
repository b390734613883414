#!/usr/bin/env python3
"""Cost of a request on a kept-alive connection against a new connection per request, on a
running `lily serve` (loopback): N sequential GET /health, best of 3 rounds, alternating the two.

usage: serve_keepalive.py PORT plain|tls N [CA_FILE]   (the server needs --conn-requests >= N)"""
import socket
import ssl
import sys
import time

PORT, MODE, N = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
CTX = ssl.create_default_context(cafile=sys.argv[4]) if MODE == "tls" else None


def connect():
    s = socket.create_connection(("127.0.0.1", PORT))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return CTX.wrap_socket(s, server_hostname="localhost") if CTX else s


def one(s, close):
    s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n" +
              (b"Connection: close\r\n" if close else b"") + b"\r\n")
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += s.recv(4096)
    head, _, body = buf.partition(b"\r\n\r\n")
    n = int(next(ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length"))
            .split(b":")[1])
    while len(body) < n:
        body += s.recv(4096)


best = {"kept-alive": 1e9, "new connection each": 1e9}
for _ in range(3):
    t = time.perf_counter()
    s = connect()
    for _ in range(N):
        one(s, False)
    s.close()
    best["kept-alive"] = min(best["kept-alive"], (time.perf_counter() - t) / N * 1e3)
    t = time.perf_counter()
    for _ in range(N):
        s = connect()
        one(s, True)
        s.close()
    best["new connection each"] = min(best["new connection each"], (time.perf_counter() - t) / N * 1e3)
k, c = best["kept-alive"], best["new connection each"]
print(f"{MODE}: kept-alive {k:.3f} ms/request, new connection each {c:.3f} ms/request ({c / k:.1f}x)")
