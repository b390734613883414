#!/usr/bin/env python3
"""Reliability checks of a running `lily serve` (loopback only, bounded counts and times; issue #38).

usage: reliability.py BASE_URL MODE [--tls CA_FILE] [--slow N] [--header-timeout S]
                      [--conn-requests N]

  slowloris  N connections (1,000 by default) from other loopback addresses send their request
             head a byte at a time; meanwhile /health and a chat request from 127.0.0.1 must
             answer within 2 s; each slow connection gets a JSON 408 once --header-timeout has
             passed since it connected (the deadline is not renewed by each byte), and one client
             address cannot hold more than --conns-per-ip connections (JSON 429 beyond).
  bad input  raw requests that libmicrohttpd would answer with HTML, and request bodies with
             the cases of issue #38: every answer is the OpenAI error JSON, valid UTF-8, with the
             expected status.
  keep-alive several requests on one connection, the last one --conn-requests allows says
             Connection: close, an idle connection and a slow head on a kept-alive connection
             are cut at --header-timeout (from the end of the previous answer).
  limits     a half-closed POST is answered; --max-tokens-cap clips; --request-timeout ends a
             generation with finish_reason "length"; a streaming client that stops reading is
             cancelled and frees the slot.

MODE main (slowloris, bad input, the half-close, the body deadline and the token cap) needs a
server with --header-timeout 2 --body-timeout 3 --conns-per-ip 300 --max-body 65536 --max-tokens-cap 8
--conn-requests 5; MODE timeout one with
--request-timeout 1.5; MODE stall one with --send-timeout 1 --send-buffer 64K (tests/scripts/
server_reliability.sh starts them). One line per check; exit 1 on any failure."""
import json
import os
import socket
import ssl
import sys
import threading
import time
from urllib.parse import urlparse

args = sys.argv[1:]
BASE, MODE = args[0], args[1]
CA = args[args.index("--tls") + 1] if "--tls" in args else None
N_SLOW = int(args[args.index("--slow") + 1]) if "--slow" in args else 1000
HEADER_TIMEOUT = float(args[args.index("--header-timeout") + 1]) if "--header-timeout" in args else 2.0
u = urlparse(BASE)
HOST, PORT = u.hostname, u.port
fails = 0


def check(ok, what, detail=""):
    global fails
    print(f"{what:<66} {'ok' if ok else 'FAIL'}{'' if ok else '  ' + str(detail)[:300]}", flush=True)
    if not ok:
        fails += 1


def ctx():
    c = ssl.create_default_context(cafile=CA)
    return c


def connect(src="127.0.0.1", timeout=10):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.bind((src, 0))
    s.connect((HOST, PORT))
    if CA:
        s = ctx().wrap_socket(s, server_hostname="localhost")
    return s


def read_response(s, limit=8 << 20):
    data = b""
    try:
        while len(data) < limit:
            b = s.recv(65536)
            if not b:
                break
            data += b
    except (socket.timeout, ConnectionResetError, ssl.SSLError, OSError):
        pass
    head, _, body = data.partition(b"\r\n\r\n")
    while head.startswith(b"HTTP/1.1 100"):  # interim answers (a half-close probe)
        head, _, body = body.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1]) if head.startswith(b"HTTP/1.") else 0
    return status, head, body


def raw(req, src="127.0.0.1", half_close=False):
    s = connect(src)
    s.sendall(req)
    if half_close:
        s.shutdown(socket.SHUT_WR) if not CA else None
    r = read_response(s)
    s.close()
    return r


def request(method, path, body=None, headers=None, ctype="application/json"):
    h = {"Host": f"localhost:{PORT}", "Connection": "close"}  # read_response reads to the end
    if body is not None:
        h["Content-Type"] = ctype
    h.update(headers or {})
    data = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    if body is not None:
        h["Content-Length"] = str(len(data))
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items())
    return raw(head.encode() + b"\r\n" + data)


def is_error_json(body):
    try:
        j = json.loads(body.decode("utf-8"))  # strict UTF-8
        e = j["error"]
        return isinstance(e["message"], str) and isinstance(e["type"], str) and "code" in e
    except Exception:
        return False


def chat(extra=None):
    b = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    b.update(extra or {})
    return request("POST", "/v1/chat/completions", b)


# ---- slowloris -----------------------------------------------------------------------------------
def slowloris():
    srcs = [f"127.0.0.{2 + i}" for i in range(8)]
    per = (N_SLOW + len(srcs) - 1) // len(srcs)
    socks = []
    t0 = time.time()
    for i in range(N_SLOW):
        s = socket.socket()
        s.setblocking(True)
        s.bind((srcs[i // per], 0))
        s.settimeout(5)
        s.connect((HOST, PORT))
        s.setblocking(False)
        socks.append(s)
    opened = time.time() - t0
    # a byte every 0.5 s of a request head that never ends
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 1000
    stop = threading.Event()
    closed_at = {}
    got = {}

    def dribble():
        k = 0
        while not stop.is_set() and k < len(head):
            for idx, s in enumerate(socks):
                if idx in closed_at:
                    continue
                try:
                    if not CA:
                        s.send(head[k:k + 1])
                except (BlockingIOError, OSError):
                    pass
                try:
                    b = s.recv(4096)
                    got[idx] = got.get(idx, b"") + b
                    if not b:
                        closed_at[idx] = time.time() - t0
                except BlockingIOError:
                    pass
                except OSError:
                    closed_at[idx] = time.time() - t0
            k += 1
            stop.wait(0.5)

    th = threading.Thread(target=dribble)
    th.start()
    time.sleep(0.5)
    # the server still answers others, quickly
    t = time.time()
    st, _, body = request("GET", "/health")
    dt_h = time.time() - t
    check(st == 200 and dt_h < 2, f"slowloris x{N_SLOW}: /health answers within 2 s", f"{st} {dt_h:.2f}s")
    t = time.time()
    st, _, body = chat()
    dt_c = time.time() - t
    check(st == 200 and dt_c < 2, f"slowloris x{N_SLOW}: a chat request answers within 2 s",
          f"{st} {dt_c:.2f}s {body[:200]}")
    # one address cannot hold more than --conns-per-ip (300 here)
    extra = []
    for _ in range(320):
        s = socket.socket()
        s.bind(("127.0.0.99", 0))
        s.settimeout(5)
        s.connect((HOST, PORT))
        extra.append(s)
    time.sleep(0.3)
    if not CA:
        st, _, body = read_response(extra[-1])
        check(st == 429 and is_error_json(body), "connections over --conns-per-ip: JSON 429",
              f"{st} {body[:200]}")
    else:  # no handshake is spent on them: closed at once
        st, hd, body = read_response(extra[-1])
        check(hd == b"" and body == b"", "connections over --conns-per-ip: closed", f"{hd[:100]}")
    for s in extra:
        s.close()
    # every slow connection is cut at the head deadline (from accept), with a JSON 408
    deadline = time.time() + HEADER_TIMEOUT + 4
    while time.time() < deadline and len(closed_at) < N_SLOW:
        time.sleep(0.2)
    stop.set()
    th.join()
    n_closed = len(closed_at)
    late = max(closed_at.values()) if closed_at else 1e9
    check(n_closed == N_SLOW and late < opened + HEADER_TIMEOUT + 3,
          f"slowloris: all {N_SLOW} cut at the head deadline (not renewed by bytes)",
          f"{n_closed} closed, last at {late:.1f}s (opened in {opened:.1f}s)")
    if not CA:
        n408 = sum(1 for b in got.values() if b.startswith(b"HTTP/1.1 408") and
                   is_error_json(b.partition(b"\r\n\r\n")[2]))
        check(n408 >= 0.95 * N_SLOW, "slowloris: they get a JSON 408", f"{n408} of {N_SLOW}")
    for s in socks:
        s.close()


# ---- bad input -----------------------------------------------------------------------------------
def bad_input():
    H = f"Host: localhost:{PORT}\r\n"
    raw_cases = [
        ("bad Content-Length", 400, f"POST /v1/chat/completions HTTP/1.1\r\n{H}Content-Type: application/json\r\nContent-Length: 1x\r\n\r\n{{}}"),
        ("conflicting Content-Length", 400, f"POST /v1/chat/completions HTTP/1.1\r\n{H}Content-Type: application/json\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{{}}x"),
        ("URI too long (414)", 414, f"GET /{'a' * 9000} HTTP/1.1\r\n{H}\r\n"),
        ("header fields too large (431)", 431, f"GET /health HTTP/1.1\r\n{H}" + "X-Pad: " + "b" * 17000 + "\r\n\r\n"),
        ("malformed chunked body", 400, f"POST /v1/chat/completions HTTP/1.1\r\n{H}Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{{}}\r\n0\r\n\r\n"),
        ("HTTP/2.0 (505)", 505, f"GET /health HTTP/2.0\r\n{H}\r\n"),
        ("garbage request line", 400, "HELLO THERE\r\n\r\n"),
        ("unknown Transfer-Encoding (501)", 501, f"POST /v1/chat/completions HTTP/1.1\r\n{H}Transfer-Encoding: gzip\r\n\r\n"),
    ]
    for what, want, req in raw_cases:  # the same over HTTPS: the front terminates TLS
        st, head, body = raw(req.encode())
        check(st == want and is_error_json(body) and b"application/json" in head,
              f"bad input: {what} -> JSON {want}", f"{st} {body[:200]}")
    msgs = [{"role": "user", "content": "hi"}]
    body_cases = [
        ("model id with invalid UTF-8", 404, ("GET", "/v1/models/%ff%fe", None, "application/json")),
        ("unknown URL", 404, ("GET", "/nope", None, "application/json")),
        ("invalid JSON", 400, ("POST", "/v1/chat/completions", b"{\"messages\": [", "application/json")),
        ("NUL in content (not cut short)", 400, ("POST", "/v1/chat/completions",
                                                 b'{"messages":[{"role":"user","content":"a\\u0000 b c"}]}', "application/json")),
        ("seed -1.5e19 (was UB)", 400, ("POST", "/v1/chat/completions",
                                        json.dumps({"messages": msgs, "seed": -1.5e19}).encode(), "application/json")),
        ("seed 2^64", 400, ("POST", "/v1/chat/completions",
                            b'{"messages":[{"role":"user","content":"hi"}],"seed":18446744073709551616}', "application/json")),
        ("Content-Type text/plain (415)", 415, ("POST", "/v1/chat/completions",
                                                json.dumps({"messages": msgs}).encode(), "text/plain")),
        ("body over --max-body (413)", 413, ("POST", "/v1/chat/completions", b"x" * 70000, "application/json")),
        ("tokenize with NUL", 400, ("POST", "/tokenize", b'{"content":"a\\u0000"}', "application/json")),
    ]
    for what, want, (m, path, b, ct) in body_cases:
        st, head, body = request(m, path, b, ctype=ct)
        check(st == want and is_error_json(body), f"bad input: {what} -> JSON {want}", f"{st} {body[:200]}")
    st, _, body = request("GET", "/health", headers={"Host": "evil.example:80"})
    check(st == 403 and is_error_json(body), "bad input: Host evil.example (DNS rebinding) -> JSON 403", f"{st} {body[:200]}")
    st, _, body = request("GET", "/health", headers={"Host": f"[::1]:{PORT}"})
    check(st == 200, "Host [::1] is a localhost name", st)
    st, _, body = request("POST", "/v1/chat/completions",
                          b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":1,"seed":18446744073709551615}')
    check(st == 200, "seed 2^64-1 accepted", f"{st} {body[:200]}")


# ---- limits ----------------------------------------------------------------------------------
def half_close_and_cap():
    b = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
    req = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost:{PORT}\r\nContent-Type: "
           f"application/json\r\nContent-Length: {len(b)}\r\n\r\n").encode() + b
    if not CA:
        st, _, body = raw(req, half_close=True)
        ok = st == 200 and json.loads(body)["choices"][0]["finish_reason"] == "length"
        check(ok, "a half-closed POST (shutdown(SHUT_WR)) is answered", f"{st} {body[:200]}")
    # a body that trickles in a byte every 0.3 s is cut at --body-timeout (3 s from accept)
    s = connect()
    s.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
               f"application/json\r\nContent-Length: 1000\r\n\r\n").encode())
    t = time.time()
    cut = None
    while time.time() - t < 8 and cut is None:
        try:
            s.sendall(b" ")
        except OSError:
            cut = time.time() - t
            break
        time.sleep(0.3)
        s.setblocking(False)
        try:
            if s.recv(4096) == b"":
                cut = time.time() - t
        except (BlockingIOError, ssl.SSLWantReadError):
            pass
        except OSError:
            cut = time.time() - t
        s.setblocking(True)
    s.close()
    check(cut is not None and cut < 4.5, "a body that trickles in is cut at --body-timeout",
          f"cut after {cut}")
    st, _, body = request("POST", "/v1/completions", {"prompt": "once upon a time", "max_tokens": 100})
    j = json.loads(body) if st == 200 else {}
    ok = st == 200 and 0 < j["usage"]["completion_tokens"] <= 8
    check(ok, "--max-tokens-cap 8 clips max_tokens 100", f"{st} {body[:300]}")


# ---- keep-alive -------------------------------------------------------------------------------
class Conn:
    """One client connection that reads answers one at a time (Content-Length or chunked)."""

    def __init__(self):
        self.s = connect()
        self.buf = b""

    def fill(self):
        b = self.s.recv(65536)
        if not b:
            raise EOFError
        self.buf += b

    def answer(self):
        while b"\r\n\r\n" not in self.buf:
            self.fill()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        h = {k.strip().lower(): v.strip() for k, _, v in
             (ln.partition(b":") for ln in head.split(b"\r\n")[1:])}
        body = b""
        if h.get(b"transfer-encoding") == b"chunked":
            while True:
                while b"\r\n" not in self.buf:
                    self.fill()
                size_line, _, self.buf = self.buf.partition(b"\r\n")
                n = int(size_line.split(b";")[0], 16)
                while len(self.buf) < n + 2:
                    self.fill()
                body += self.buf[:n]
                self.buf = self.buf[n + 2:]
                if n == 0:
                    break
        else:
            n = int(h.get(b"content-length", b"0"))
            while len(self.buf) < n:
                self.fill()
            body, self.buf = self.buf[:n], self.buf[n:]
        return int(head.split(b" ")[1]), h, body

    def ask(self, method, path, body=None):
        data = b"" if body is None else json.dumps(body).encode()
        head = f"{method} {path} HTTP/1.1\r\nHost: localhost:{PORT}\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        self.s.sendall(head.encode() + b"\r\n" + data)
        return self.answer()

    def closed_within(self, secs):
        """Whether the server closes the connection within secs (reading what comes)."""
        t = time.time()
        self.s.settimeout(0.2)
        while time.time() - t < secs:
            try:
                if not self.s.recv(65536):
                    return time.time() - t
            except (socket.timeout, ssl.SSLWantReadError):
                continue
            except OSError:
                return time.time() - t
        return None


def keepalive(cap):
    """HTTP/1.1 persistent connections: several requests on one connection, the request cap,
    the idle limit and a slow head on a kept-alive connection (--header-timeout from the end of
    the previous answer)."""
    msgs = [{"role": "user", "content": "hi"}]
    c = Conn()
    got = []
    try:
        got.append(c.ask("GET", "/health"))
        got.append(c.ask("POST", "/v1/chat/completions", {"messages": msgs, "max_tokens": 2}))
        got.append(c.ask("POST", "/v1/chat/completions",
                         {"messages": msgs, "max_tokens": 2, "stream": True}))
        got.append(c.ask("GET", "/v1/models/%ff"))  # an error keeps the connection too
    except (EOFError, OSError) as e:
        got.append((0, {}, str(e).encode()))
    ok = [g[0] for g in got] == [200, 200, 200, 404] and got[2][2].rstrip().endswith(b"[DONE]") \
        and is_error_json(got[3][2]) and all(b"keep-alive" in g[1] for g in got)
    check(ok, "keep-alive: 4 requests (JSON, stream, error) on one connection",
          [(g[0], g[1].get(b"connection")) for g in got])
    cut = c.closed_within(HEADER_TIMEOUT + 2)
    check(cut is not None and cut > HEADER_TIMEOUT - 0.5,
          "keep-alive: an idle connection closes after --header-timeout", cut)
    # a malformed request after good ones on a kept-alive connection (pipelined): the answers
    # before it, then the error JSON (not libmicrohttpd's HTML page), then the connection closes
    for what, want, bad in [("bad Content-Length", 400, "POST /v1/chat/completions HTTP/1.1\r\n"
                             "Host: localhost\r\nContent-Length: 1x\r\n\r\n"),
                            ("HTTP/2.0", 505, "GET /health HTTP/2.0\r\nHost: localhost\r\n\r\n"),
                            ("malformed chunked", 400, "POST /tokenize HTTP/1.1\r\nHost: localhost\r\n"
                             "Transfer-Encoding: chunked\r\n\r\nzz\r\n")]:
        c = Conn()
        c.s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n" + bad.encode())
        try:
            got = [c.answer(), c.answer()]
            closed = c.closed_within(2) is not None
        except (EOFError, OSError) as e:
            got, closed = [(0, {}, str(e).encode())] * 2, False
        check(got[0][0] == 200 and got[1][0] == want and is_error_json(got[1][2]) and closed,
              f"keep-alive: then {what} -> JSON {want}, closed", [(g[0], g[2][:80]) for g in got])
    # the last request a connection may carry says Connection: close, then the server closes
    c = Conn()
    try:
        last = [c.ask("GET", "/health") for _ in range(cap)][-1]
    except (EOFError, OSError) as e:
        last = (0, {}, str(e).encode())
    check(last[0] == 200 and last[1].get(b"connection") == b"close" and
          c.closed_within(2) is not None, f"keep-alive: request {cap} (--conn-requests) closes",
          last[1])
    # a head that trickles in on a kept-alive connection is cut (not renewed by bytes)
    c = Conn()
    c.ask("GET", "/health")
    t = time.time()
    head = b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 200
    cut = None
    for k in range(len(head)):
        try:
            c.s.sendall(head[k:k + 1])
        except OSError:
            cut = time.time() - t
            break
        r = c.closed_within(0.3)
        if r is not None:
            cut = time.time() - t
            break
        if time.time() - t > HEADER_TIMEOUT + 4:
            break
    check(cut is not None and cut < HEADER_TIMEOUT + 1.5,
          "keep-alive: a slow head on a kept-alive connection is cut", cut)


def timeout():
    t = time.time()
    st, _, body = request("POST", "/v1/completions", {"prompt": "once upon a time", "max_tokens": 3000})
    dt = time.time() - t
    j = json.loads(body) if st == 200 else {}
    ok = st == 200 and j["choices"][0]["finish_reason"] == "length" and dt < 4 and \
        j["usage"]["completion_tokens"] < 3000
    check(ok, "--request-timeout ends a long generation with finish length",
          f"{st} {dt:.1f}s {body[-300:]}")


def metric(name):
    _, _, t = request("GET", "/metrics")
    for line in t.decode().splitlines():
        if line.startswith(f"lily_{name} "):
            return float(line.split()[1])
    return -1


def stall():
    """A streaming client that stops reading is cancelled, and its slot freed."""
    c0 = metric("cancelled_total")
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(10)
    s.connect((HOST, PORT))
    if CA:
        s = ctx().wrap_socket(s, server_hostname="localhost")
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3000,
                       "stream": True, "logprobs": True, "top_logprobs": 20}).encode()
    s.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
               f"application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body)
    t = time.time()
    c1 = c0
    while time.time() - t < 30 and c1 == c0:
        time.sleep(0.5)
        c1 = metric("cancelled_total")
    dt = time.time() - t
    busy = metric("busy")
    check(c1 == c0 + 1 and busy == 0, "a stream whose reader stopped reading is cancelled",
          f"cancelled {c0}->{c1} busy {busy} after {dt:.1f}s")
    s.close()
    st, _, _ = chat()
    check(st == 200, "the slot serves the next request", st)


t_start = time.time()
if MODE == "main":
    bad_input()
    half_close_and_cap()
    keepalive(int(args[args.index("--conn-requests") + 1]) if "--conn-requests" in args else 100)
    slowloris()
elif MODE == "timeout":
    timeout()
elif MODE == "stall":
    stall()
st, _, body = request("GET", "/health")
check(st == 200, "server healthy afterwards", st)
print(f"{MODE} ({'TLS' if CA else 'plain'}): {fails} failed, {time.time() - t_start:.1f} s")
sys.exit(1 if fails else 0)
