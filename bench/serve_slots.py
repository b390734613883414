#!/usr/bin/env python3
"""Continuous batching through `lily serve --parallel 8`: aggregate decode tokens/s with 1, 2, 4, 8
concurrent streams (each at a context of --context tokens), and the time to first token of a
--ttft-prompt-token request that arrives while 7 streams decode, against the same request on an
idle server. Python's standard library only (the GPU machine has no node).

  python3 bench/serve_slots.py BASE_URL [--model DIR] [--tokens 256] [--context 4096]
                               [--ttft-prompt 512] [--rounds 2] [--json FILE]

--model DIR (the served checkpoint) names the end-of-turn tokens to ban (logit_bias), so every
stream runs to --tokens. Aggregate decode tok/s is measured in the window where every stream of
the round decodes: from the last stream's first token to the first stream's last token, so the
prompts' prefill (interleaved with the first streams' decoding) stays out of it. Its tokens are
the server's own count (lily_decode_rows_total, polled every 10 ms and interpolated at the
window's ends), and the content events per token are printed beside (a token need not give text
at once: part of a UTF-8 character, a held-back stop string or tag). "ms/step in the window" is
streams / aggregate: every step there has one row per stream. "Round's steps" is the server's
lily_decode_rows_total over lily_step_seconds_total for the whole round: every step, most of them
with fewer rows while the other streams' prompts prefill, so it is not the window's rate.
"""
import argparse
import json
import sys
import threading
import time
import urllib.request

WORDS = "list copy move remove find grep sort uniq head tail".split()


def ban_ids(model):
    if not model:
        return {}
    try:
        with open(f"{model}/tokenizer.json", encoding="utf-8") as f:
            added = json.load(f).get("added_tokens", [])
    except OSError as e:
        sys.exit(f"serve_slots: {e}")
    ids = [t["id"] for t in added if t.get("content") in ("<|im_end|>", "<|endoftext|>")]
    return {str(i): -100 for i in ids}


def prompt_of(words, seed):
    return f"Request {seed}: " + " ".join(WORDS[(i * 7 + seed) % 10] for i in range(words))


class Bench:
    def __init__(self, base, ban):
        self.base, self.ban = base.rstrip("/"), ban

    def stream(self, content, max_tokens, seed):
        """One streamed chat completion: its start, every content event's arrival time, and the
        usage (prompt and completion tokens)."""
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
                "seed": seed, "temperature": 0.8, "logit_bias": self.ban, "stream": True,
                "stream_options": {"include_usage": True},
                "chat_template_kwargs": {"enable_thinking": False}}
        req = urllib.request.Request(self.base + "/v1/chat/completions",
                                     json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        t0, times, usage = time.perf_counter(), [], {}
        with urllib.request.urlopen(req, timeout=600) as r:
            for line in r:
                line = line.decode("utf-8", "replace").strip()
                if not line.startswith("data: {"):
                    continue
                ev = json.loads(line[6:])
                ch = ev.get("choices") or []
                if ch and ch[0].get("delta", {}).get("content"):
                    times.append(time.perf_counter())
                if ev.get("usage"):
                    usage = ev["usage"]
        return {"t0": t0, "times": times, "prompt": usage.get("prompt_tokens", 0),
                "n": usage.get("completion_tokens", 0)}

    def at_once(self, jobs, poll=None):
        """Runs stream(*job) for every job in threads; their results in order. With poll (a
        list), (time, decode rows so far) samples of the server's metrics go to it meanwhile."""
        out = [None] * len(jobs)
        errs = []
        done = threading.Event()

        def poller():
            while not done.is_set():
                v = self.steps()
                poll.append((time.perf_counter(), v["decode_rows_total"]))
                time.sleep(0.01)
        pt = threading.Thread(target=poller) if poll is not None else None
        if pt:
            pt.start()

        def go(k):
            try:
                out[k] = self.stream(*jobs[k])
            except Exception as e:  # a failed stream fails the benchmark
                errs.append(e)
        ts = [threading.Thread(target=go, args=(k,)) for k in range(len(jobs))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        done.set()
        if pt:
            pt.join()
        if errs:
            raise errs[0]
        return out

    def steps(self):
        with urllib.request.urlopen(self.base + "/metrics", timeout=30) as r:
            m = r.read().decode()
        v = {}
        for line in m.splitlines():
            for k in ("decode_rows_total", "step_seconds_total", "decode_steps_total"):
                if line.startswith(f"lily_{k} "):
                    v[k] = float(line.split()[1])
        return v


def rows_at(poll, t):
    """The server's decode rows at time t, interpolated between the samples around it."""
    for (t0, v0), (t1, v1) in zip(poll, poll[1:]):
        if t0 <= t <= t1:
            return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1
    return poll[0][1] if t < poll[0][0] else poll[-1][1]


def window(runs, poll):
    """Tokens/s over the span where every run decodes (the server's decode rows in it), the
    tokens, and the content events that arrived in it per token."""
    a = max(r["times"][0] for r in runs)
    b = min(r["times"][-1] for r in runs)
    if b <= a or len(poll) < 2:
        return 0.0, 0, 0.0
    n = rows_at(poll, b) - rows_at(poll, a)
    ev = sum(1 for r in runs for t in r["times"] if a < t <= b)
    return n / (b - a), round(n), ev / n if n > 0 else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base")
    ap.add_argument("--model")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--context", type=int, default=0, help="prompt tokens of each stream (0: a short one)")
    ap.add_argument("--ttft-prompt", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--streams", default="1,2,4,8")
    ap.add_argument("--json")
    a = ap.parse_args()
    B = Bench(a.base, ban_ids(a.model))
    ns = [int(x) for x in a.streams.split(",")]

    # tokens per word of the prompts, from one request (template included)
    cal = B.stream(prompt_of(400, 999), 1, 1)
    per_word = max(cal["prompt"], 1) / 400.0
    words = lambda tok: max(int(tok / per_word), 1)

    B.at_once([(f"Warm up {i}.", 8, i) for i in range(max(ns))])
    res = {"context": a.context, "tokens": a.tokens, "rounds": a.rounds, "streams": {}}
    agg = {n: [] for n in ns}
    st = {n: {"rows": 0.0, "s": 0.0, "n": 0.0} for n in ns}
    ctx_seen = {n: [] for n in ns}
    evs = {n: [] for n in ns}
    for r in range(a.rounds):
        for n in (ns if r % 2 == 0 else ns[::-1]):  # alternated: the machine's drift falls alike
            jobs = []
            for i in range(n):
                seed = 1000 * (r + 1) + 10 * n + i
                text = prompt_of(words(a.context), seed) if a.context else f"Say something about {WORDS[i]}."
                jobs.append((text, a.tokens, seed))
            m0 = B.steps()
            poll = []
            runs = B.at_once(jobs, poll)
            m1 = B.steps()
            if any(len(x["times"]) < 2 for x in runs):
                sys.exit(f"serve_slots: a stream of {n} gave fewer than 2 tokens")
            tps, counted, evpt = window(runs, poll)
            agg[n].append((tps, counted))
            evs[n].append(evpt)
            ctx_seen[n] += [x["prompt"] for x in runs]
            st[n]["rows"] += m1["decode_rows_total"] - m0["decode_rows_total"]
            st[n]["s"] += m1["step_seconds_total"] - m0["step_seconds_total"]
            st[n]["n"] += m1["decode_steps_total"] - m0["decode_steps_total"]
    one = sum(x for x, _ in agg[ns[0]]) / a.rounds
    print(f"streams  prompt tokens  aggregate tok/s (mean of {a.rounds}; tokens in the window)  "
          f"per stream  vs {ns[0]}  ms/step in the window  round's steps: tok/s, ms/step  events/token")
    for n in ns:
        mean = sum(x for x, _ in agg[n]) / a.rounds
        s = st[n]
        steps_tps = s["rows"] / s["s"] if s["s"] > 0 else 0
        ms = 1e3 * s["s"] / s["n"] if s["n"] else 0
        p = sum(ctx_seen[n]) / len(ctx_seen[n])
        print(f"{n:7d}  {p:13.0f}  {mean:10.1f} ({', '.join(f'{x:.1f}/{c}' for x, c in agg[n])})  "
              f"{mean / n:10.1f}  {mean / one if one else 0:5.2f}x  {1e3 * n / mean if mean else 0:20.2f}  "
              f"{steps_tps:14.1f}  {ms:8.2f}  "
              f"{', '.join(f'{x:.2f}' for x in evs[n])}")
        res["streams"][n] = {"aggregate_tps": mean, "rounds": [x for x, _ in agg[n]],
                             "window_tokens": [c for _, c in agg[n]], "prompt_tokens": p,
                             "window_ms_per_step": 1e3 * n / mean if mean else 0,
                             "steps_tps": steps_tps, "ms_per_step": ms,
                             "events_per_token": evs[n]}

    # TTFT of a P-token prompt: idle, then while 7 streams (at the context) decode
    idle, busy, step_ms = [], [], []
    P = words(a.ttft_prompt)
    for r in range(a.rounds):
        x = B.stream(prompt_of(P, 500 + r), 4, r)
        idle.append(x["times"][0] - x["t0"])
        bg_out, started = [None] * 7, threading.Event()

        def bg(k):
            text = prompt_of(words(a.context), 700 + 10 * r + k) if a.context else f"Tell me about {WORDS[k]}."
            bg_out[k] = B.stream(text, 4 * a.tokens, 700 + k)
        ts = [threading.Thread(target=bg, args=(k,)) for k in range(7)]
        for t in ts:
            t.start()
        # the 7 are decoding once the server's decode steps take 7 rows
        deadline, seven = time.time() + 300, False
        prev = B.steps()
        while not seven and time.time() < deadline:
            time.sleep(0.2)
            cur = B.steps()
            dn = cur["decode_steps_total"] - prev["decode_steps_total"]
            seven = dn > 0 and (cur["decode_rows_total"] - prev["decode_rows_total"]) / dn >= 6.99
            prev = cur
        if not seven:
            print(f"note: round {r}: the 7 streams never decoded together; its busy TTFT is not one")
        m0 = B.steps()
        y = B.stream(prompt_of(P, 600 + r), 4, r)
        m1 = B.steps()
        busy.append(y["times"][0] - y["t0"])
        dn = m1["decode_steps_total"] - m0["decode_steps_total"]
        step_ms.append(1e3 * (m1["step_seconds_total"] - m0["step_seconds_total"]) / dn if dn else 0)
        for t in ts:
            t.join()
    med = lambda v: sorted(v)[len(v) // 2]
    print(f"ttft of a {y['prompt']}-token prompt: idle {med(idle):.3f} s, while 7 streams decode "
          f"{med(busy):.3f} s (medians of {a.rounds}: idle {', '.join(f'{v:.3f}' for v in idle)}; "
          f"busy {', '.join(f'{v:.3f}' for v in busy)}); the 7 streams' steps meanwhile "
          f"{med(step_ms):.2f} ms each; busy - idle = {(med(busy) - med(idle)) * 1e3 / max(med(step_ms), 1e-9):.1f} steps")
    res["ttft"] = {"prompt_tokens": y["prompt"], "idle_s": idle, "busy_s": busy, "step_ms": step_ms}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
