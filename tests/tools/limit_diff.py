#!/usr/bin/python3
# sluice - tests/tools/limit_diff.py: a random differential check of two
# limit.lua versions (e.g. main's and a rewrite that must answer the same).
#
# Starts its own redis-server (bench/redis_cost.py's helpers), loads both
# scripts and sends each the same random batches in mode "t" (a fake clock
# that moves forward by 0..1.5 s between calls), each on a key namespace of
# its own: every algorithm, costs 1..3, shadow, check-only, delay,
# overrides, refund marks, calendar windows, two limits of a request on one
# key, limits low enough that many requests are denied. The replies must be
# equal but for sliding_log's members (named after Redis TIME), and after
# every call each key's type, value (a ZSET: its scores) and whether it has
# a TTL. --short-b: script B gets store.c's short forms (32 + ref, 15 + m)
# where they apply, script A the long form. Exits 1 at the first
# difference, printing the call. Standard library only.
#
#   limit_diff.py A.lua B.lua [--calls N] [--seed S] [--short-b]

import argparse
import os
import random
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import redis_cost as rc  # noqa: E402

NKEYS = 5
DAY = 86400000


def rand_params(rng):
    algo = rng.choice([0, 0, 1, 1, 2, 3, 3, 4, 4, 5])
    limit = rng.randint(1, 6)
    if algo in (0, 1, 2):
        if algo == 0 and rng.random() < 0.15:
            return [0, limit, 0, 1]                    # calendar: a day
        return [algo, limit, rng.choice([500, 1000, 3000]), 0]
    if algo == 5:
        return [5, limit, rng.choice([500, 2000]), 0]
    return [algo, limit, 0, rng.choice([100000, 300000, 1000000])]


def make_call(rng, now_us):
    """(params, requests, overrides): requests = [(marks, [(pi, key, cost, flags, slot)])]."""
    params = [rand_params(rng) for _ in range(rng.randint(1, 4))]
    reqs = []
    for _ in range(rng.randint(1, 6)):
        lims = []
        for _ in range(rng.choice([1, 1, 2, 3, 3])):
            pi = rng.randrange(len(params))
            algo = params[pi][0]
            key = rng.randrange(NKEYS)
            cost = 1 if rng.random() < 0.7 else rng.randint(2, 3)
            flags = rng.choice([0, 0, 0, 1, 2, 3])
            if algo in (3, 4) and rng.random() < 0.3:
                flags |= 4
            slot = rng.randint(1, 4) if algo == 5 else None
            lims.append((pi, key, cost, flags, slot))
        reqs.append((rng.random() < 0.3, lims))
    return params, reqs, rng.random() < 0.2


def encode(ns, params, reqs, overrides, now_us, short):
    """keys and ARGV of one call for namespace ns."""
    keys, kidx = [], {}

    def key(name):
        if name not in kidx:
            keys.append(name)
            kidx[name] = len(keys)
        return kidx[name]
    # a param set used with a delay carries the delay in its window's place;
    # give delayed limits their own set
    plist, pidx = [], {}

    def param(p, delay):
        vals = list(p)
        if delay:
            vals[2] = 200                                 # ms
        t = tuple(vals)
        if t not in pidx:
            plist.append(vals)
            pidx[t] = len(plist)
        return pidx[t]
    body = []
    for marks, lims in reqs:
        ents = []
        for pi, k, cost, flags, slot in lims:
            ki = key("%s:{k%d}" % (ns, k))
            pj = param(params[pi], flags & 4)
            f = flags | (8 if overrides else 0)
            ents.append([ki, pj, f, cost, slot, k])
        body.append((marks, ents))
    if overrides:
        for marks, ents in body:
            for e in ents:
                e.append(key("%s:{k%d}:ovr" % (ns, e[5])))
    np_ = len(plist)
    args = []
    for marks, ents in body:
        refs = [((e[0] - 1) * np_ + (e[1] - 1)) * 16 + e[2] for e in ents]
        if short and not marks and len(ents) == 1 and ents[0][3] == 1:
            args.append(32 + refs[0])
        elif short and not marks and len(ents) > 1 and all(e[3] == 1 for e in ents):
            args.append(15 + len(ents))
            for e, r in zip(ents, refs):
                args.append(r)
                if e[4] is not None:
                    args.append(e[4])
                if overrides:
                    args.append(e[6])
            continue
        else:
            args.append(-len(ents) if marks else len(ents))
            for e, r in zip(ents, refs):
                args += [r, e[3]]
                if e[4] is not None:
                    args.append(e[4])
                if overrides:
                    args.append(e[6])
            continue
        e = ents[0]
        if e[4] is not None:
            args.append(e[4])
        if overrides:
            args.append(e[6])
    argv = ["t", np_]
    for p in plist:
        argv += p
    argv.append(len(body))
    argv += args
    now_ms = now_us // 1000
    for p in plist:
        if p[0] == 0 and p[3] == 1:
            b1 = now_ms - now_ms % DAY
            argv += [b1 - DAY, b1, b1 + DAY, b1 + 2 * DAY]
    argv.append(now_us)
    return keys, argv


def state(conn, keys):
    out = []
    for k in keys:
        typ = conn.call("TYPE", k)
        if typ == "string":
            v = conn.call("GET", k)
        elif typ == "zset":
            v = [s for i, s in enumerate(conn.call("ZRANGE", k, 0, -1, "WITHSCORES")) if i % 2]
        else:
            v = None
        ttl = conn.call("PTTL", k)
        out.append((typ, v, ttl > 0 if ttl != -2 else None))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--short-b", action="store_true")
    opt = ap.parse_args()
    rng = random.Random(opt.seed)
    proc = None
    try:
        with tempfile.TemporaryDirectory(prefix="sluice-limit-diff-") as tmp:
            proc, port = rc.start_redis(tmp)
            conn = rc.Conn(port)
            sha = {}
            for name, path in (("a", opt.a), ("b", opt.b)):
                with open(path, "rb") as f:
                    sha[name] = conn.call("SCRIPT", "LOAD", f.read()).decode()
            now_us = 1700000000000000 + rng.randrange(DAY * 1000)
            denied = allowed = 0
            for n in range(opt.calls):
                now_us += rng.choice([0, 0, rng.randrange(1000), rng.randrange(1500000)])
                if rng.random() < 0.02:               # an operator's override
                    k = rng.randrange(NKEYS)
                    ov = "%d %d %d" % (rng.choice([0, 1, 3, 4, 5]), rng.randint(1, 6),
                                       rng.choice([100000, 500000]))
                    for ns in ("a", "b"):
                        conn.call("SET", "%s:{k%d}:ovr" % (ns, k), ov)
                params, reqs, overrides = make_call(rng, now_us)
                replies, states = {}, {}
                for ns in ("a", "b"):
                    keys, argv = encode(ns, params, reqs, overrides, now_us,
                                        opt.short_b and ns == "b")
                    try:
                        replies[ns] = conn.call("EVALSHA", sha[ns], len(keys), *keys, *argv)
                    except RuntimeError as e:
                        replies[ns] = "error: %s" % e
                    states[ns] = state(conn, ["%s:{k%d}" % (ns, k) for k in range(NKEYS)])
                    if ns == "a":
                        call_a = (keys, argv)
                ra, rb = replies["a"], replies["b"]
                if isinstance(ra, list) and isinstance(rb, list):
                    ra, rb = ra[2:], rb[2:]               # TIME: real, not the fake clock
                    denied += sum(1 for x in ra[::1] if isinstance(x, int) and x < 0)
                    allowed += 1
                if ra != rb or states["a"] != states["b"]:
                    print("difference at call %d:\n A %r\n B %r\n reply A %r\n reply B %r\n"
                          " state A %r\n state B %r" % (n, call_a, (keys, argv), replies["a"],
                                                        replies["b"], states["a"], states["b"]))
                    return 1
            print("limit_diff: %d calls, seed %d%s: replies and keys equal (%d calls answered,"
                  " %d negative reply fields)" % (opt.calls, opt.seed,
                                                   ", short forms to B" if opt.short_b else "",
                                                   allowed, denied))
    finally:
        rc.stop(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
