#!/usr/bin/env python3
# sluice - include_cycles.py: the module include graph of src/ must have no cycle.
#
# A module is a file stem (conf.c and conf.h are module conf); module A
# depends on B when A.c or A.h has `#include "B.h"`. Prints the cycles (for
# each module caught in one, its shortest: A -> B -> ... -> A) and exits 1,
# or prints "no cycles" and exits 0. With --graph, prints every edge first
# ("A -> B C D"). Usage: include_cycles.py [--graph] [SRC_DIR]
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def graph(src):
    """{module: set(modules it includes)}, only modules with a file in src."""
    files = [os.path.join(d, f) for d, _, fs in os.walk(src)
             for f in fs if f.endswith(('.c', '.h'))]
    mods = {os.path.splitext(os.path.basename(f))[0] for f in files}
    g = {m: set() for m in mods}
    for f in files:
        m = os.path.splitext(os.path.basename(f))[0]
        with open(f, encoding='utf-8', errors='replace') as fh:
            for inc in INCLUDE.findall(fh.read()):
                dep = os.path.splitext(os.path.basename(inc))[0]
                if dep != m and dep in mods:
                    g[m].add(dep)
    return g


def components(g):
    """Tarjan's strongly connected components with more than one module."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def cycle_in(g, comp, start):
    """The shortest cycle through start inside its component."""
    inside = set(comp)
    prev = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(g[v] & inside):
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return comp


def main(argv):
    args = [a for a in argv if a != '--graph']
    src = args[0] if args else os.path.join(os.path.dirname(__file__), '..', '..', 'src')
    g = graph(src)
    if '--graph' in argv:
        for m in sorted(g):
            print('%s -> %s' % (m, ' '.join(sorted(g[m])) or '-'))
    comps = components(g)
    for comp in comps:
        seen = set()
        for m in comp:          # each module's shortest cycle, once per rotation
            c = cycle_in(g, comp, m)
            k = frozenset(zip(c, c[1:]))
            if k not in seen:
                seen.add(k)
                print('cycle: %s' % ' -> '.join(c))
    if not comps:
        print('no cycles')
    return 1 if comps else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
