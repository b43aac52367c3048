#!/usr/bin/python3
# sluice - bench/redis_cost.py: Redis' own command time per sluice decision
# (issue 11), next to a minimal fixed-window script, in one run.
#
# Starts its own redis-server on a free 127.0.0.1 port, loads
# src/store/scripts/limit.lua (and, with --before FILE, an older limit.lua beside
# it: the per-request protocol of before issue 11, one request per call;
# with --baseline FILE, another limit.lua of today's batch protocol, e.g.
# main's, measured with the same batches in the same rounds; it gets a
# request of several limits as m and ref cost pairs, the script measured as
# store.c sends it now, 15 + m and the refs) and
# two minimal scripts (TIME, INCRBY, PEXPIREAT for one key; the same for
# three keys, TIME read once), then drives each with redis-benchmark (-c 64
# -P 16, EVALSHA with the keys and arguments sluice's store.c sends, one key
# per client out of 10,000), interleaved: A B C ... A B C ... limit.lua
# takes the decisions of one event-loop turn in one call (store.c's
# batches); --batch gives the batch sizes measured (default 1,16,64; the
# sizes sluice forms under wrk -c64 are what bench/redis_rows.py shows:
# see docs/performance.md), each request of a batch on its own random key
# (redis-benchmark draws every __rand_int__ apart), so no batch gains from
# two requests sharing a key. Before each scenario it flushes the data and
# resets INFO commandstats; after it, it reads cmdstat_evalsha's usec and
# calls: usec per decision = usec / (calls x batch size). That usec is wall
# time inside Redis, so a loaded machine that preempts Redis mid-script
# inflates it; beside it, the redis-server process's own CPU time (utime +
# stime from /proc) over the scenario, per decision, which preemption does
# not inflate (it also counts Redis' network I/O and expiry of the keys).
# A run is --rounds
# such rounds; it reports each scenario's median (the machine may be shared:
# medians of short interleaved rounds are what stays stable). Every reply is
# checked first (one call by hand: allowing decisions, no error), and INFO
# errorstats must stay empty. The redis-server is stopped by PID at the end,
# also on error, SIGINT and SIGTERM. Standard library only.
#
# Prints, per run, usec per decision (then the same for CPU usec) and the
# ratios the issue asks for:
#   one limit:    sluice (fixed_window) / minimal          target <= 1.0
#   three limits: sluice (token_bucket, gcra, fixed_window) / minimal  <= 2.0
#                 (and / minimal x3, the same script over three keys)
# The three limits go as store.c sends a route's limits that share a key
# (redis.pack_limits): parts of one key per request ("One key per route" in
# limit.lua), their refs as a run, -(16 + m) and the first; "apart" beside
# it is the same script with one key per limit, as store.c sends them on a
# Redis Cluster or with pack_limits off (and as a --baseline script older
# than the parts gets them).

import argparse
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)

MINIMAL = """
local t = redis.call('TIME')
local w = tonumber(ARGV[2])
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('PEXPIREAT', KEYS[1], (math.floor(now_ms / w) + 1) * w)
return n
"""

MINIMAL3 = """
local t = redis.call('TIME')
local w = tonumber(ARGV[2])
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 1, #KEYS do
    out[i] = redis.call('INCRBY', KEYS[i], ARGV[1])
    redis.call('PEXPIREAT', KEYS[i], (math.floor(now_ms / w) + 1) * w)
end
return out
"""

# Keys as store.c sends them: PREFIX{ROUTE|LIMIT|LEN:PART}; redis-benchmark
# replaces each __rand_int__ with a 12-digit number below -r.
KEY = "sluice:{all|%s|12:__rand_int__}"
HOUR_MS = 3600000
BIG = 1000000000
# (algo limit window_ms interval_us cost flags), enum limiter_algo order.
FIXED = [0, BIG, HOUR_MS, 0, 1, 0]
BUCKET = [3, 1000000, 0, 1, 1, 0]       # rate 1000000/s, burst 1000000
GCRA = [4, 1000000, 0, 1, 1, 0]
# The three limits' names, whose parts' tags store.c sends (conf's
# conf_part_tag: FNV-1a of the name, 32 bits, 0 read as 1).
NAMES = ["burst", "steady", "hourly"]


def part_tag(name):
    h = 2166136261
    for b in name.encode():
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h or 1


def resp(args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


class Conn:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""

    def line(self):
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("redis closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def reply(self):
        line = self.line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError("redis: " + rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise ConnectionError("redis closed the connection")
                self.buf += chunk
            data, self.buf = self.buf[:n], self.buf[n + 2:]
            return data
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.reply() for _ in range(n)]
        raise RuntimeError("bad reply %r" % line)

    def call(self, *args):
        self.sock.sendall(resp(args))
        return self.reply()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_redis(workdir):
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", workdir, "--loglevel", "warning",
         "--daemonize", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if Conn(port).call("PING") == "PONG":
                return proc, port
        except OSError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    stop(proc)
    raise RuntimeError("redis-server did not start")


def stop(proc):
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()            # this Popen's own PID
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def sluice_args(sha, limits, batch=None, multi_short=True, parts=False, run=False):
    """batch None: the per-request protocol of the --before script; else
    limit.lua's batch protocol with `batch` requests of every limit, each
    limit of each request on a key of its own, or (parts) the limits of
    each request parts of one key of its own, tagged by NAMES (run: their
    refs as a run, -(16 + m) and the first, as store.c sends them without
    redis.overrides; else 15 + m and the refs). multi_short:
    a request of several limits of cost 1 as store.c sends it, 15 + m and
    the refs; off for a --baseline script older than that form (m and ref
    cost pairs)."""
    n = len(limits)
    if parts:
        keys = [KEY % "" for _ in range(batch)]
        args = ["EVALSHA", sha, len(keys)] + keys + ["d", n]
        for i, lim in enumerate(limits):
            args += [lim[0] + 16 * part_tag(NAMES[i])] + lim[1:4]
        args.append(batch)
        for r in range(batch):
            if run:
                args += [-16 - n, (r * n) * 16]
                continue
            args.append(15 + n)
            args += [(r * n + i) * 16 + lim[5] for i, lim in enumerate(limits)]
        return [str(a) for a in args]
    if batch is None:
        args = ["EVALSHA", sha, n] + [KEY % ("l%d" % i) for i in range(n)] + ["d", n]
        for lim in limits:
            args += lim
        return [str(a) for a in args]
    keys = [KEY % ("l%d" % i) for _ in range(batch) for i in range(n)]
    args = ["EVALSHA", sha, len(keys)] + keys + ["d", n]
    for lim in limits:
        args += lim[:4]
    args.append(batch)
    for r in range(batch):
        if n == 1 and limits[0][4] == 1:
            # one limit of cost 1: 32 + ref, as store.c sends it
            args.append(32 + (r * n * n) * 16 + limits[0][5])
            continue
        if multi_short and all(lim[4] == 1 for lim in limits):
            args.append(15 + n)
            args += [((r * n + i) * n + i) * 16 + lim[5] for i, lim in enumerate(limits)]
            continue
        args.append(n)
        for i, lim in enumerate(limits):
            args += [((r * n + i) * n + i) * 16 + lim[5], lim[4]]
    return [str(a) for a in args]


def scenarios(shas, batches):
    sc = [("minimal", ["EVALSHA", shas["minimal"], "1", KEY % "l0", "1", str(HOUR_MS)], 1),
          ("minimal_x3", ["EVALSHA", shas["minimal3"], "3"] + [KEY % ("l%d" % i) for i in range(3)]
           + ["1", str(HOUR_MS)], 1)]
    if "before" in shas:
        sc.append(("sluice_1_before", sluice_args(shas["before"], [FIXED]), 1))
        sc.append(("sluice_3_before", sluice_args(shas["before"], [BUCKET, GCRA, FIXED]), 1))
    for b in batches:
        if "baseline" in shas:
            sc.append(("sluice_1_baseline_b%d" % b, sluice_args(shas["baseline"], [FIXED], b, False), b))
            sc.append(("sluice_3_baseline_b%d" % b,
                       sluice_args(shas["baseline"], [BUCKET, GCRA, FIXED], b, False), b))
        sc.append(("sluice_1_after_b%d" % b, sluice_args(shas["after"], [FIXED], b), b))
        sc.append(("sluice_3_after_b%d" % b,
                   sluice_args(shas["after"], [BUCKET, GCRA, FIXED], b, parts=True, run=True), b))
        sc.append(("sluice_3_apart_b%d" % b,
                   sluice_args(shas["after"], [BUCKET, GCRA, FIXED], b), b))
    return sc


def check_reply(conn, name, args):
    """One call by hand, on keys of its own: it must allow, without error."""
    probe = [a.replace("__rand_int__", "999999999999") for a in args]
    r = conn.call(*probe)
    if name.startswith("minimal_x3"):
        ok = isinstance(r, list) and all(x >= 1 for x in r)
    elif name.endswith("_before"):
        ok = isinstance(r, list) and r[0] == 1
    elif name.startswith("sluice_"):
        # { time_s, time_us, (remaining or -retry, reset) per limit }
        ok = isinstance(r, list) and all(x >= 0 for x in r[2::2])
    else:
        ok = isinstance(r, int) and r >= 1
    if not ok:
        raise RuntimeError("%s: unexpected reply %r" % (name, r))


def commandstat(conn, cmd):
    info = conn.call("INFO", "commandstats").decode()
    m = re.search(r"cmdstat_%s:calls=(\d+),usec=(\d+)" % cmd, info)
    if not m:
        raise RuntimeError("no cmdstat_%s in INFO commandstats" % cmd)
    return int(m.group(1)), int(m.group(2))


def cpu_seconds(pid):
    """utime + stime of a process (Linux /proc), in seconds."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_one(conn, pid, port, args, requests, clients, pipeline, keyspace, batch=1):
    """(EVALSHA usec, redis-server CPU usec) per decision of one scenario."""
    conn.call("FLUSHALL")
    conn.call("CONFIG", "RESETSTAT")
    cpu0 = cpu_seconds(pid)
    cmd = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-c", str(clients),
           "-P", str(pipeline), "-n", str(requests), "-r", str(keyspace), "-q"] + args
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True,
                   timeout=300)
    cpu = cpu_seconds(pid) - cpu0
    errors = conn.call("INFO", "errorstats").decode()
    if "errorstat_" in errors:
        raise RuntimeError("errors during the run: %s" % errors.strip())
    calls, usec = commandstat(conn, "evalsha")
    if calls < requests:
        raise RuntimeError("only %d of %d calls counted" % (calls, requests))
    return usec / (calls * batch), cpu * 1e6 / (calls * batch)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--script", default=os.path.join(ROOT, "src", "store", "scripts", "limit.lua"))
    ap.add_argument("--before", help="an older limit.lua to measure beside --script")
    ap.add_argument("--baseline",
                    help="another limit.lua of today's batch protocol (an older commit's)"
                    " measured beside --script in the same rounds, one key per limit")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5,
                    help="interleaved rounds per run; a run reports each scenario's median")
    ap.add_argument("--requests", type=int, default=20000, help="calls per scenario and round")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--pipeline", type=int, default=16)
    ap.add_argument("--keyspace", type=int, default=10000)
    ap.add_argument("--batch", default="1,16,64",
                    help="batch sizes (requests per call) of limit.lua to measure, 1..64")
    opt = ap.parse_args()
    try:
        opt.batches = [int(x) for x in opt.batch.split(",")]
    except ValueError:
        ap.error("--batch: comma-separated numbers")
    if not opt.batches or any(not 1 <= b <= 64 for b in opt.batches):
        ap.error("--batch: sizes 1..64")
    if not 1 <= opt.runs <= 20 or not 1 <= opt.rounds <= 50 or \
            not 1000 <= opt.requests <= 10000000:
        ap.error("runs 1..20, rounds 1..50, requests 1000..10000000")

    proc = None

    def on_signal(signum, frame):
        raise KeyboardInterrupt()
    signal.signal(signal.SIGTERM, on_signal)
    try:
        with tempfile.TemporaryDirectory(prefix="sluice-redis-cost-") as tmp:
            proc, port = start_redis(tmp)
            conn = Conn(port)
            version = re.search(r"redis_version:(\S+)", conn.call("INFO", "server").decode())
            shas = {"minimal": conn.call("SCRIPT", "LOAD", MINIMAL).decode(),
                    "minimal3": conn.call("SCRIPT", "LOAD", MINIMAL3).decode()}
            with open(opt.script, "rb") as f:
                shas["after"] = conn.call("SCRIPT", "LOAD", f.read()).decode()
            if opt.baseline:
                with open(opt.baseline, "rb") as f:
                    shas["baseline"] = conn.call("SCRIPT", "LOAD", f.read()).decode()
            if opt.before:
                with open(opt.before, "rb") as f:
                    shas["before"] = conn.call("SCRIPT", "LOAD", f.read()).decode()
            sc = scenarios(shas, opt.batches)
            for name, args, _ in sc:
                check_reply(conn, name, args)
            print("redis-server %s on 127.0.0.1:%d; redis-benchmark -c %d -P %d -n %d -r %d;"
                  " %d interleaved rounds per run, medians"
                  % (version.group(1) if version else "?", port, opt.clients, opt.pipeline,
                     opt.requests, opt.keyspace, opt.rounds))
            print("script: %s%s" % (opt.script, "; before: " + opt.before if opt.before else ""))
            table = {name: [] for name, _, _ in sc}
            ctable = {name: [] for name, _, _ in sc}
            for run in range(opt.runs):
                rounds = {name: [] for name, _, _ in sc}
                crounds = {name: [] for name, _, _ in sc}
                for _ in range(opt.rounds):
                    for name, args, b in sc:
                        # calls of b decisions: as many decisions as the others
                        n = max(100, opt.requests // b)
                        usec, cpu = run_one(conn, proc.pid, port, args, n, opt.clients,
                                            opt.pipeline, opt.keyspace, b)
                        rounds[name].append(usec)
                        crounds[name].append(cpu)
                for name in rounds:
                    table[name].append(statistics.median(rounds[name]))
                    ctable[name].append(statistics.median(crounds[name]))
                print_run(run + 1, {k: v[-1] for k, v in table.items()}, opt.batches)
                print_run(run + 1, {k: v[-1] for k, v in ctable.items()}, opt.batches, "cpu")
            if opt.runs > 1:
                print_run("median", {k: statistics.median(v) for k, v in table.items()},
                          opt.batches)
                print_run("median", {k: statistics.median(v) for k, v in ctable.items()},
                          opt.batches, "cpu")
    except KeyboardInterrupt:
        return 130
    finally:
        stop(proc)
    return 0


def ratio(a, b):
    """a / b; nan when b is 0 (a CPU time below the clock tick's resolution)."""
    return a / b if b else float("nan")


def print_run(label, us, batches, kind="usec"):
    m = us["minimal"]
    parts = ["run %s: %s/decision minimal %.2f, minimal_x3 %.2f"
             % (label, kind, m, us["minimal_x3"])]
    tags = (["before"] if "sluice_1_before" in us else []) + \
        (["baseline_b%d" % b for b in batches] if "sluice_1_baseline_b%d" % batches[0] in us
         else []) + ["after_b%d" % b for b in batches]
    for tag in tags:
        s1, s3 = us["sluice_1_" + tag], us["sluice_3_" + tag]
        parts.append("  %-9s 1 limit %.2f (%.2fx minimal)  3 limits %.2f (%.2fx minimal,"
                     " %.2fx minimal_x3)" % (tag, s1, ratio(s1, m), s3, ratio(s3, m),
                                             ratio(s3, us["minimal_x3"])))
    for b in batches:
        s3 = us["sluice_3_apart_b%d" % b]
        parts.append("  apart_b%d 3 limits on a key each (a Redis Cluster) %.2f (%.2fx minimal)"
                     % (b, s3, ratio(s3, m)))
    print("\n".join(parts), flush=True)


if __name__ == "__main__":
    sys.exit(main())
