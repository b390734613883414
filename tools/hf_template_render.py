#!/usr/bin/env python3
"""Render chat-template request cases with Hugging Face transformers, as expected outputs for lily.

For every case file CASES/<case>.json (a template context: {"messages": [...], "tools": [...],
"add_generation_prompt": bool, ...extra template variables}) and every --template FILE.jinja, it
writes OUT/<case>.<name>.txt with the exact rendered bytes, or OUT/<case>.<name>.error with the
exception message when rendering fails. <name> is the template file name without ".jinja" and
without a trailing "_chat_template" (qwen3_5_chat_template.jinja -> qwen3_5).

Rendering paths, in order of preference (the first that works is used for all cases; the others,
when available, are run too and any disagreement is reported):
  apply   PreTrainedTokenizerFast.apply_chat_template(messages, tools=..., add_generation_prompt=...,
          tokenize=False, **extras) on a minimal in-memory tokenizer carrying the template
  render  transformers.utils.chat_template_utils.render_jinja_template(...)
  compile transformers.utils.chat_template_utils._compile_jinja_template(template).render(...)
  jinja2  a plain jinja2 environment configured like HF's (only with --allow-jinja2-emulation;
          for development machines without transformers, never for committed expectations)

OUT/_meta.json records the transformers and jinja2 versions and the path used. Runs offline.

Usage:
  python3 tools/hf_template_render.py --template ../shared/data/qwen3_chat_template.jinja \\
      --template ../shared/data/qwen3_5_chat_template.jinja \\
      --template ../shared/data/qwen3_coder_chat_template.jinja \\
      --cases tests/fixtures/template/cases --out tests/fixtures/template/hf
"""
import argparse
import inspect
import json
import os
import sys
import traceback

RESERVED = ("messages", "tools", "documents", "add_generation_prompt")


def log(*a):
    print("[hf_template_render]", *a, file=sys.stderr, flush=True)


def template_name(path):
    name = os.path.basename(path)
    if name.endswith(".jinja"):
        name = name[: -len(".jinja")]
    if name.endswith("_chat_template"):
        name = name[: -len("_chat_template")]
    return name


def split_case(ctx):
    messages = ctx.get("messages")
    tools = ctx.get("tools")
    documents = ctx.get("documents")
    agp = bool(ctx.get("add_generation_prompt", False))
    extras = {k: v for k, v in ctx.items() if k not in RESERVED}
    return messages, tools, documents, agp, extras


# ---- rendering paths ------------------------------------------------------------------------


def make_apply():
    from tokenizers import Tokenizer, models  # a transformers dependency
    from transformers import PreTrainedTokenizerFast

    base = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tok = PreTrainedTokenizerFast(tokenizer_object=base)

    def render(src, ctx):
        messages, tools, documents, agp, extras = split_case(ctx)
        tok.chat_template = src
        kw = dict(tools=tools, add_generation_prompt=agp, tokenize=False)
        if documents is not None:
            kw["documents"] = documents
        out = tok.apply_chat_template(messages, **kw, **extras)
        if not isinstance(out, str):
            raise TypeError("apply_chat_template returned %r, not str" % type(out))
        return out

    return render


def make_render():
    from transformers.utils.chat_template_utils import render_jinja_template

    params = inspect.signature(render_jinja_template).parameters

    def render(src, ctx):
        messages, tools, documents, agp, extras = split_case(ctx)
        kw = dict(tools=tools, documents=documents, chat_template=src, add_generation_prompt=agp)
        kw = {k: v for k, v in kw.items() if k in params}
        first = "conversations" if "conversations" in params else next(iter(params))
        out = render_jinja_template(**{first: [messages]}, **kw, **extras)
        if isinstance(out, tuple):
            out = out[0]
        if isinstance(out, list):
            out = out[0]
        return out

    return render


def make_compile():
    from transformers.utils.chat_template_utils import _compile_jinja_template

    def render(src, ctx):
        messages, tools, documents, agp, extras = split_case(ctx)
        return _compile_jinja_template(src).render(
            messages=messages, tools=tools, documents=documents, add_generation_prompt=agp, **extras
        )

    return render


def make_jinja2():
    # Mirrors transformers' _compile_jinja_template (environment, globals and tojson override).
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from datetime import datetime

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_gen"), [], [], body).set_lineno(lineno)

        def _gen(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now

    def render(src, ctx):
        messages, tools, documents, agp, extras = split_case(ctx)
        return env.from_string(src).render(messages=messages, tools=tools, documents=documents,
                                           add_generation_prompt=agp, **extras)

    return render


def available_paths(allow_emulation):
    paths = []
    probe_src = "{{ messages[0]['content'] }}|{{ tools|length }}|{{ add_generation_prompt }}|{{ x }}"
    probe_ctx = {"messages": [{"role": "user", "content": "hi"}], "tools": [{"a": 1}],
                 "add_generation_prompt": True, "x": "y"}
    for name, make in (("apply", make_apply), ("render", make_render), ("compile", make_compile)):
        try:
            fn = make()
            got = fn(probe_src, probe_ctx)
            if got != "hi|1|True|y":
                raise ValueError("probe render gave %r" % (got,))
            paths.append((name, fn))
            log("path '%s' available" % name)
        except Exception as e:  # report and fall through to the next path
            log("path '%s' unavailable: %s: %s" % (name, type(e).__name__, e))
    if allow_emulation:
        paths.append(("jinja2", make_jinja2()))
        log("path 'jinja2' (emulation) available")
    return paths


def run_one(fn, src, ctx):
    try:
        return "txt", fn(src, ctx)
    except Exception as e:
        return "error", str(e) if str(e) else type(e).__name__


# ---- main -----------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--template", action="append", required=True, help="a .jinja file (repeatable)")
    ap.add_argument("--cases", required=True, help="folder of <case>.json request files")
    ap.add_argument("--out", required=True, help="folder for <case>.<template>.txt/.error")
    ap.add_argument("--allow-jinja2-emulation", action="store_true",
                    help="fall back to plain jinja2 configured like HF when transformers is absent")
    args = ap.parse_args()

    versions = {"python": sys.version.split()[0]}
    for mod in ("transformers", "jinja2", "tokenizers"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception as e:
            versions[mod] = "unavailable (%s)" % type(e).__name__
    log("versions:", json.dumps(versions))

    paths = available_paths(args.allow_jinja2_emulation)
    if not paths:
        log("no rendering path works; is transformers installed? (see messages above)")
        return 2

    templates = []
    for t in args.template:
        with open(t, encoding="utf-8") as f:
            templates.append((template_name(t), f.read()))
    cases = sorted(f[:-5] for f in os.listdir(args.cases) if f.endswith(".json"))
    if not cases:
        log("no .json cases in", args.cases)
        return 2
    os.makedirs(args.out, exist_ok=True)

    primary_name, primary = paths[0]
    disagreements = 0
    written = 0
    for case in cases:
        with open(os.path.join(args.cases, case + ".json"), encoding="utf-8") as f:
            ctx = json.load(f)
        for tname, src in templates:
            kind, text = run_one(primary, src, ctx)
            for other_name, other in paths[1:]:
                if other_name == "jinja2" and primary_name != "jinja2":
                    continue
                okind, otext = run_one(other, src, ctx)
                if (okind, otext if okind == "txt" else "") != (kind, text if kind == "txt" else ""):
                    disagreements += 1
                    log("DISAGREE %s.%s: %s gives %s, %s gives %s" % (
                        case, tname, primary_name, kind, other_name, okind))
            base = os.path.join(args.out, "%s.%s" % (case, tname))
            for ext in ("txt", "error"):
                if os.path.exists(base + "." + ext):
                    os.remove(base + "." + ext)
            with open(base + "." + kind, "wb") as f:
                f.write(text.encode("utf-8"))
            written += 1
            log("%-40s %s (%d bytes)" % (case + "." + tname, kind, len(text.encode("utf-8"))))

    meta = {"versions": versions, "path": primary_name,
            "paths_available": [p[0] for p in paths], "templates": [t[0] for t in templates],
            "cases": len(cases), "disagreements": disagreements}
    with open(os.path.join(args.out, "_meta.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    log("wrote %d renders with path '%s' to %s (%d disagreements between paths)" % (
        written, primary_name, args.out, disagreements))
    return 1 if disagreements else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:
        traceback.print_exc()
        sys.exit(3)
