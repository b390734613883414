#!/usr/bin/env python3
"""Builds the English training corpus of the small trained model (models/tiny-trained) from
unpacked Debian packages. Called by tools/make_corpus.sh, which downloads and unpacks them.

Usage: make_corpus.py ROOT OUTDIR
  ROOT    the folder the .deb files were extracted into (dpkg -x)
  OUTDIR  receives train.txt, heldout.txt, chat_train.txt, chat_heldout.txt, stats.txt

Documents are separated by a line holding only DOC_SEP. Sources, in this fixed order:
  man       every manual page under usr/share/man/man[1-8] (rendered with groff -man -Tutf8)
  pydoc     the Python 3.11 documentation (usr/share/doc/python3.11/html, HTML to text)
  debdoc    debian-policy, debian-reference, developers-reference (HTML to text)
  gcide     the GNU Collaborative International Dictionary of English (one document per letter
            block of 400 entries; pronunciation marks and source tags removed)
The held-out split takes every document whose name hashes (sha256) to 0 mod 50.
Chat pairs (question -> short answer in the Qwen3.5 chat format with an empty-ish think block)
are built from man-page NAME lines, the Python module index and dictionary definitions; a pair
is held out by the same hash rule on its question.
Only the standard library; the output is byte-identical for the same packages.
"""
import gzip
import hashlib
import html
import html.parser
import os
import re
import subprocess
import sys

DOC_SEP = "<|endoftext|>"


def held_out(name):
    return int(hashlib.sha256(name.encode()).hexdigest(), 16) % 50 == 0


def pick(name, n):
    return int(hashlib.sha256(("pick:" + name).encode()).hexdigest(), 16) % n


def clean(text):
    text = text.replace("\r", "").replace("\t", "    ")
    text = "".join(c for c in text if c == "\n" or c.isprintable())
    lines = [l.rstrip() for l in text.split("\n")]
    out, blank = [], 0
    for l in lines:
        if not l:
            blank += 1
            if blank > 1:
                continue
        else:
            blank = 0
        out.append(l)
    return "\n".join(out).strip() + "\n"


# ---- manual pages ------------------------------------------------------------------------------

def render_man(path):
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".gz"):
        data = gzip.decompress(data)
    if data.lstrip().startswith(b".so "):
        return None  # a redirect to another page
    env = dict(os.environ, LC_ALL="C.UTF-8", MANWIDTH="80")
    r = subprocess.run(["groff", "-t", "-man", "-Tutf8", "-P", "-cbou", "-rLL=80n"],
                       input=data, capture_output=True, env=env)
    if r.returncode != 0 or not r.stdout.strip():
        return None
    text = r.stdout.decode("utf-8", "replace")
    # drop the page header and footer lines (title / date lines)
    lines = text.split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    if lines:
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    if lines:
        lines.pop()
    return clean("\n".join(lines))


NAME_RE = re.compile(r"^NAME\n\s+(.+?)\n\n", re.S | re.M)


def man_name_line(text):
    m = NAME_RE.search(text)
    if not m:
        return None
    line = " ".join(m.group(1).split())
    if " - " not in line:
        return None
    names, desc = line.split(" - ", 1)
    names = [n.strip() for n in names.split(",") if n.strip()]
    if not names or not desc or len(desc) > 160:
        return None
    return names[0], desc.strip().rstrip(".")


# ---- HTML --------------------------------------------------------------------------------------

class Text(html.parser.HTMLParser):
    SKIP = {"script", "style", "head", "nav"}
    BLOCK = {"p", "div", "pre", "li", "h1", "h2", "h3", "h4", "h5", "h6", "dt", "dd", "tr",
             "table", "ul", "ol", "dl", "section", "br", "blockquote", "title"}
    SKIP_CLASS = ("related", "sphinxsidebar", "footer", "navheader", "navfooter", "headerlink",
                  "toc")

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts, self.skip, self.stack, self.pre = [], 0, [], 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        cls = a.get("class") or ""
        skipping = tag in self.SKIP or any(c in cls.split() for c in self.SKIP_CLASS) or \
            a.get("role") == "navigation"
        if tag in ("br", "img", "hr", "meta", "link", "input"):
            if tag == "br":
                self.parts.append("\n")
            return
        self.stack.append((tag, skipping))
        if skipping:
            self.skip += 1
        if tag == "pre":
            self.pre += 1
        if tag in self.BLOCK:
            self.parts.append("\n\n" if tag not in ("li", "dd", "tr") else "\n")
        if tag == "li" and not self.skip:
            self.parts.append("- ")

    def handle_endtag(self, tag):
        while self.stack:
            t, s = self.stack.pop()
            if s:
                self.skip -= 1
            if t == "pre":
                self.pre -= 1
            if t in self.BLOCK:
                self.parts.append("\n")
            if t == tag:
                break

    def handle_data(self, data):
        if self.skip:
            return
        if not self.pre:
            data = re.sub(r"\s+", " ", data)
        self.parts.append(data)

    def text(self):
        t = "".join(self.parts)
        t = re.sub(r"[ \u00a0]+\n", "\n", t)
        t = "\n".join(l.strip() if not l.startswith("    ") else l for l in t.split("\n"))
        return clean(t.replace("\u00b6", ""))


def html_text(path):
    with open(path, "rb") as f:
        raw = f.read().decode("utf-8", "replace")
    p = Text()
    p.feed(raw)
    p.close()
    return p.text()


# ---- dictionary --------------------------------------------------------------------------------

HEAD_RE = re.compile(r'^([A-Z][^\\\n]*?) \\[^\\\n]*\\,?\s*(.*)$')


def gcide_entries(path):
    data = gzip.decompress(open(path, "rb").read()).decode("utf-8", "replace")
    entries, cur = [], None
    for line in data.split("\n"):
        m = HEAD_RE.match(line) if line and not line[0].isspace() else None
        if m:
            if cur:
                entries.append(cur)
            cur = [m.group(1), [m.group(2)]]
        elif cur is not None:
            cur[1].append(line)
    if cur:
        entries.append(cur)
    out = []
    for head, body in entries:
        t = "\n".join(body)
        t = re.sub(r"\[(1913 Webster|Webster 1913 Suppl\.|PJC|WordNet 1\.5|RH|Century Dict\.|"
                   r"Chambers 1881|Cent\. Dict\.|f|[A-Z]{2,3})\]", "", t)
        t = re.sub(r"\\[^\\\n]*\\", "", t)
        t = t.replace("{", "").replace("}", "").replace("--", "-")
        t = re.sub(r"[ \t]+", " ", t)
        paras = [" ".join(p.split()) for p in re.split(r"\n\s*\n", t)]
        paras = [p for p in paras if p]
        if paras:
            out.append((head.strip(), paras))
    return out


def gcide_definition(head, paras):
    """(word, first definition) for a plain entry, or None."""
    if not re.fullmatch(r"[A-Z][a-z]{2,14}", head):
        return None
    first = paras[0]
    m = re.match(r"^(n|v\. ?t|v\. ?i|a|adv)\.[^A-Z]*?(?:\] )?(?:\d\. )?(?:\([A-Za-z. ]+\) )?([A-Z].*)$",
                 first)
    if not m:
        return None
    d = m.group(2)
    d = re.split(r"(?<=[a-z])\. |; as,|; -", d)[0].strip().rstrip(".;:,")
    if not (12 <= len(d) <= 140) or any(c in d for c in "[]=\\*") or \
            re.match(r"^\w{1,4}\. ", d) or " fr. " in d or " p. p." in d:
        return None
    return head.lower(), d[0].lower() + d[1:]


# ---- chat ----------------------------------------------------------------------------------------

def chat(q, think, answer):
    return (f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n<think>\n{think}\n"
            f"</think>\n\n{answer}<|im_end|>\n")


def man_chat(name, desc):
    qs = [f"What does {name} do?", f"What is the {name} command for?", f"Explain {name}.",
          f"What is {name}?", f"Tell me about the {name} command."]
    q = qs[pick(name, len(qs))]
    ans = [f"The {name} command is used to {desc}.",
           f"{name} is a program to {desc}. Its manual page explains the options.",
           f"You use {name} to {desc}."]
    a = ans[pick(name + "a", len(ans))]
    return q, chat(q, f"The user asks about {name}. Its manual page says: {name} - {desc}.", a)


def py_chat(mod, desc):
    qs = [f"What is the Python module {mod} for?", f"What does the {mod} module do?",
          f"Explain the {mod} module in Python."]
    q = qs[pick(mod, len(qs))]
    a = f"The {mod} module of the Python standard library: {desc[0].lower() + desc[1:]}."
    return q, chat(q, f"This is about the Python module {mod}.", a)


def dict_chat(word, d):
    qs = [f"What does the word {word} mean?", f"What is the meaning of {word}?",
          f"Define {word}."]
    q = qs[pick(word, len(qs))]
    a = f"The word {word} means {d}."
    return q, chat(q, f"The user wants the meaning of {word}.", a)


GENERAL = [
    ("Hello!", "A greeting.", "Hello! How can I help you today?"),
    ("Who are you?", "The user asks who I am.",
     "I am a small language model trained on Debian documentation: manual pages, the Python "
     "documentation and a dictionary. I can answer short questions about commands and words."),
    ("Write one sentence about lilies.", "A short sentence about lilies.",
     "A lily is a plant that grows from a bulb and has large, fragrant flowers."),
    ("Thank you.", "The user thanks me.", "You are welcome."),
]


def main():
    root, outdir = sys.argv[1], sys.argv[2]
    os.makedirs(outdir, exist_ok=True)
    docs = []  # (name, text)
    chats = []  # (question, rendered)
    # man pages
    mandir = os.path.join(root, "usr/share/man")
    pages = []
    for sec in sorted(os.listdir(mandir)):
        if not re.fullmatch(r"man[1-8]", sec):
            continue
        for fn in sorted(os.listdir(os.path.join(mandir, sec))):
            p = os.path.join(mandir, sec, fn)
            if os.path.isfile(p) and not os.path.islink(p):
                pages.append((f"man/{sec}/{fn}", p))
    seen_cmd = set()
    for name, p in pages:
        t = render_man(p)
        if not t or len(t) < 200:
            continue
        docs.append((name, t))
        nl = man_name_line(t)
        if nl and nl[0] not in seen_cmd:
            seen_cmd.add(nl[0])
            chats.append(man_chat(*nl))
    n_man = len(docs)
    # python docs
    pyroot = os.path.join(root, "usr/share/doc/python3.11/html")
    html_files = []
    for d, _, fs in os.walk(pyroot):
        for fn in fs:
            if fn.endswith(".html") and fn not in ("genindex-all.html", "search.html"):
                html_files.append(os.path.join(d, fn))
    for p in sorted(html_files):
        rel = os.path.relpath(p, pyroot)
        if rel.startswith("genindex") or rel in ("py-modindex.html", "download.html"):
            continue
        t = html_text(p)
        if len(t) >= 200:
            docs.append(("pydoc/" + rel, t))
    modidx = open(os.path.join(pyroot, "py-modindex.html"), encoding="utf-8").read()
    for m in re.finditer(r'<code class="xref">([\w.]+)</code></a>.*?<em>(.*?)</em>', modidx):
        mod, desc = m.group(1), html.unescape(re.sub("<[^>]+>", "", m.group(2))).strip()
        if desc and len(desc) < 150:
            chats.append(py_chat(mod, desc.rstrip(".")))
    n_py = len(docs) - n_man
    # Debian documentation
    for sub in ("usr/share/doc/debian-policy", "usr/share/debian-reference",
                "usr/share/developers-reference"):
        base = os.path.join(root, sub)
        fl = []
        for d, _, fs in os.walk(base):
            fl += [os.path.join(d, f) for f in fs if f.endswith(".html")]
        for p in sorted(fl):
            if not p.endswith(".en.html") and "debian-reference" in p:
                continue
            t = html_text(p)
            if len(t) >= 200:
                docs.append((os.path.relpath(p, root), t))
    n_deb = len(docs) - n_man - n_py
    # dictionary
    ents = gcide_entries(os.path.join(root, "usr/share/dictd/gcide.dict.dz"))
    ents = [e for e in ents if not e[0].startswith("00-database")]
    seen_w = set()
    for i in range(0, len(ents), 400):
        blk = ents[i:i + 400]
        t = "\n\n".join(f"{h}: " + "\n".join(ps) for h, ps in blk)
        docs.append((f"gcide/{i // 400:04d}", clean(t)))
        for h, ps in blk:
            d = gcide_definition(h, ps)
            if d and d[0] not in seen_w:
                seen_w.add(d[0])
                chats.append(dict_chat(*d))
    n_dict = len(docs) - n_man - n_py - n_deb
    for q, th, a in GENERAL:
        chats.append((q, chat(q, th, a)))
    # split and write
    sep = "\n" + DOC_SEP + "\n"
    tr = [t for n, t in docs if not held_out(n)]
    ho = [t for n, t in docs if held_out(n)]
    ctr = [c for q, c in chats if not held_out(q) or (q, 0) in [(g[0], 0) for g in GENERAL]]
    cho = [c for q, c in chats if held_out(q) and q not in [g[0] for g in GENERAL]]
    for fn, lst in (("train.txt", tr), ("heldout.txt", ho)):
        with open(os.path.join(outdir, fn), "w", encoding="utf-8") as f:
            f.write(sep.join(lst))
    for fn, lst in (("chat_train.txt", ctr), ("chat_heldout.txt", cho)):
        with open(os.path.join(outdir, fn), "w", encoding="utf-8") as f:
            f.write(sep.join(lst))
    sizes = {fn: os.path.getsize(os.path.join(outdir, fn)) for fn in
             ("train.txt", "heldout.txt", "chat_train.txt", "chat_heldout.txt")}
    with open(os.path.join(outdir, "stats.txt"), "w") as f:
        f.write(f"documents: man {n_man}, pydoc {n_py}, debdoc {n_deb}, gcide {n_dict}; "
                f"train {len(tr)}, held out {len(ho)}\n")
        f.write(f"chat pairs: train {len(ctr)}, held out {len(cho)}\n")
        for k, v in sizes.items():
            f.write(f"{k}: {v} bytes\n")
    print(open(os.path.join(outdir, "stats.txt")).read(), end="")


if __name__ == "__main__":
    main()
