#!/usr/bin/env python3
"""The layering check: every `#include "..."` in src/ and tools/ points to its own layer or a
lower one, and no two modules include each other (directly or around a longer loop).

Layers, lowest first: base < model < backend < engine < {sampler, tokenizer, chat, grammar} < gen < server
< tools. A module is a folder under src/ (its subfolders belong to it: src/backend/cpu is
backend) or tools/. include/ holds the public API (lily.h): any file may include it, and it may
include nothing from src/. An include is resolved as the compiler does: next to the including
file first, then under src/, then include/; one that resolves nowhere is an error too.

Usage: tools/check_layers.py [repo root]   (exit 0: clean; 1: violations, each printed)
"""
import os
import re
import sys

LAYERS = [["base"], ["model"], ["backend"], ["engine"], ["sampler", "tokenizer", "chat", "grammar"],
          ["gen"], ["server"], ["tools"]]
RANK = {m: i for i, group in enumerate(LAYERS) for m in group}
EXTS = (".c", ".h", ".cu", ".cuh")
# Headers the build writes (CMake, into build/generated): they belong to the including module.
GENERATED = {"lily_version.h"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def module_of(root, path):
    rel = os.path.relpath(path, root).split(os.sep)
    if rel[0] == "src" and len(rel) > 2:
        return rel[1]
    if rel[0] in ("tools", "include"):
        return rel[0]
    return None


def resolve(root, src_file, name):
    for base in (os.path.dirname(src_file), os.path.join(root, "src"),
                 os.path.join(root, "include")):
        p = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(p):
            return p
    return None


def sources(root):
    for top in ("src", "tools", "include"):
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if f.endswith(EXTS):
                    yield os.path.join(d, f)


def find_cycles(edges):
    """Every elementary loop of the module graph, each once (from its smallest module)."""
    found = []

    def walk(start, node, path):
        for nxt in sorted(edges.get(node, ())):
            if nxt == start:
                found.append(path + [start])
            elif nxt > start and nxt not in path:
                walk(start, nxt, path + [nxt])

    for m in sorted(edges):
        walk(m, m, [m])
    return found


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), ".."))
    errors, edges, n_inc = [], {}, 0
    for path in sorted(sources(root)):
        mod = module_of(root, path)
        rel = os.path.relpath(path, root)
        if mod not in RANK and mod != "include":
            errors.append(f"{rel}: module '{mod}' has no layer (add it to LAYERS)")
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for ln, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                n_inc += 1
                if m.group(1) in GENERATED:
                    continue
                target = resolve(root, path, m.group(1))
                if target is None:
                    errors.append(f"{rel}:{ln}: \"{m.group(1)}\" resolves to no file")
                    continue
                tmod = module_of(root, target)
                if tmod == "include":
                    continue
                if mod == "include":
                    errors.append(f"{rel}:{ln}: the public header includes {m.group(1)}")
                    continue
                if tmod not in RANK:
                    errors.append(f"{rel}:{ln}: \"{m.group(1)}\" is in no module")
                    continue
                if RANK[tmod] > RANK[mod]:
                    errors.append(f"{rel}:{ln}: {mod} (layer {RANK[mod]}) includes "
                                  f"{m.group(1)} of {tmod} (layer {RANK[tmod]}), a higher layer")
                if tmod != mod:
                    edges.setdefault(mod, set()).add(tmod)
    for loop in find_cycles(edges):
        errors.append("include cycle between modules: " + " -> ".join(loop))
    print("layers: " + " < ".join("/".join(g) for g in LAYERS))
    for m in sorted(edges, key=lambda k: (RANK[k], k)):
        print(f"  {m:9s} includes {', '.join(sorted(edges[m], key=lambda k: (RANK[k], k)))}")
    for e in errors:
        print("ERROR " + e)
    print(f"{n_inc} includes checked, {len(errors)} violations")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
