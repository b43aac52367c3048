#!/usr/bin/env python3
# sluice - layers.py: includes in src/ only go down the layers.
#
# src/README.md lists the folders of src/ bottom to top, one a line, as
# "N. `FOLDER/`". A file may include a header of its own folder or of a
# folder listed before its own, never one of a folder listed after it. Every
# folder of SRC_DIR holding a .c or .h must be listed, and every listed one
# must have a README.md (its job and what it may include). Prints each
# include that goes up ("FILE:LINE: includes H (FOLDER, above DIR)") and
# each unlisted or undocumented folder, and exits 1; or prints "layers ok"
# and exits 0. Usage: layers.py [SRC_DIR]
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
LAYER = re.compile(r'^\s*\d+\.\s+`([A-Za-z0-9_]+)/`')


def order(src):
    """The folders, bottom first, from SRC_DIR/README.md."""
    with open(os.path.join(src, "README.md"), encoding="utf-8") as fh:
        return [m.group(1) for m in map(LAYER.match, fh) if m]


def check(src):
    """The problems found, as lines; empty when the layers hold."""
    layers = order(src)
    rank = {d: i for i, d in enumerate(layers)}
    problems = []
    folders = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
    home = {}
    for d in folders:
        files = [f for f in os.listdir(os.path.join(src, d)) if f.endswith((".c", ".h"))]
        if not files:
            continue
        if d not in rank:
            problems.append(f"{d}/: not listed in README.md")
            continue
        for f in files:
            if f.endswith(".h"):
                home[f] = d
    for d in layers:
        if not os.path.isfile(os.path.join(src, d, "README.md")):
            problems.append(f"{d}/: no README.md")
    for d in folders:
        if d not in rank:
            continue
        for f in sorted(os.listdir(os.path.join(src, d))):
            if not f.endswith((".c", ".h")):
                continue
            with open(os.path.join(src, d, f), encoding="utf-8", errors="replace") as fh:
                for n, line in enumerate(fh, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    h = os.path.basename(m.group(1))
                    if h in home and rank[home[h]] > rank[d]:
                        problems.append(f"{d}/{f}:{n}: includes {h} ({home[h]}/, above {d}/)")
    return problems


def main(argv):
    src = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "src")
    problems = check(src)
    for p in problems:
        print(p)
    if problems:
        return 1
    print("layers ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
