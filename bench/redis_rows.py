#!/usr/bin/python3
# sluice - bench/redis_rows.py: Redis' cost of bench rows 2 and 3 through
# sluice itself (issue 11), a reduced `make bench`.
#
# Starts (with bench/run.py's helpers and configs) the nginx upstream, one
# redis-server and, per sluice binary (--sluice, and --before OLD to
# measure an older build beside it), rows 2 (sluice-one.yaml: one
# fixed_window) and 3 (sluice-three.yaml) with an admin listener added.
# Then, --reps times, interleaved (binary A row 2, row 3, binary B row 2,
# row 3, ...): a warm-up and `wrk -t1 -c64 -d<duration>s`, and around it
# Redis INFO cpu and commandstats. Per run and row it prints:
#   - sluice's own CPU-seconds (utime + stime from /proc) per 10k requests,
#   - Redis CPU-seconds per 10k requests (the figure of bench row 2, target
#     <= 0.08 s),
#   - Redis command time per decision: cmdstat_evalsha usec / requests
#     (the time limit.lua took, as bench/redis_cost.py measures it),
#   - script calls per request, and the batch sizes sluice formed
#     (sluice_redis_batch_size from /metrics: mean and buckets; a binary
#     without that metric shows the mean from the call count only).
# Everything is stopped by PID at the end, also on error and SIGTERM.

import argparse
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
import urllib.request

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
import run  # noqa: E402  (bench/run.py: processes, configs, wrk, Redis)

ROWS = [("row2", "sluice-one.yaml"), ("row3", "sluice-three.yaml")]


def batch_hist(admin_port):
    """{le: cumulative count}, sum, count of sluice_redis_batch_size, or None."""
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % admin_port, timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    buckets = {m.group(1): int(m.group(2)) for m in
               re.finditer(r'^sluice_redis_batch_size_bucket\{le="([^"]+)"\} (\d+)$', text, re.M)}
    if not buckets:
        return None
    s = int(re.search(r"^sluice_redis_batch_size_sum (\d+)$", text, re.M).group(1))
    n = int(re.search(r"^sluice_redis_batch_size_count (\d+)$", text, re.M).group(1))
    return buckets, s, n


def hist_delta(a, b):
    if a is None or b is None:
        return None
    buckets = {k: b[0][k] - a[0].get(k, 0) for k in b[0]}
    return buckets, b[1] - a[1], b[2] - a[2]


def evalsha_usec(redis):
    for k, v in redis.info("commandstats").items():
        if k == "cmdstat_evalsha":
            return int(re.search(r"usec=(\d+)", v).group(1))
    return 0


def start_row(procs, tmp, name, sluice_bin, template, ports):
    port, admin = run.free_port(), run.free_port()
    d = os.path.join(tmp, name)
    os.makedirs(d)
    conf = run.fill(template, os.path.join(d, "sluice.yaml"), DIR=d, PORT=port,
                    UPSTREAM_PORT=ports["upstream"], REDIS_PORT=ports["redis"])
    with open(conf, "a") as f:
        f.write("admin: { listen: 127.0.0.1:%d }\n" % admin)
    p = procs.start(name, [sluice_bin, "-c", conf])
    run.wait_port(procs, p, port, name)
    run.wait_port(procs, p, admin, name + " admin")
    return port, admin, p.pid


def main():
    ap = argparse.ArgumentParser(description="bench rows 2 and 3: Redis cost through sluice")
    ap.add_argument("--sluice", default=os.path.join(run.ROOT, "build", "sluice"))
    ap.add_argument("--before", help="an older sluice binary to measure beside --sluice")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--conns", type=int, default=64)
    ap.add_argument("--rate", type=int, default=0,
                    help="pace wrk at about this many requests/s (bench/fixed_rate.lua); "
                         "0: as fast as it goes")
    ap.add_argument("--rows", default="row2,row3", help="which rows: row2, row3 or both")
    opt = ap.parse_args()
    if not 1 <= opt.reps <= 20 or not 1 <= opt.duration <= 120:
        ap.error("reps 1..20, duration 1..120")
    signal.signal(signal.SIGTERM, run.on_signal)
    run.raise_nofile()
    bins = [("after", opt.sluice)] + ([("before", opt.before)] if opt.before else [])
    tmp = tempfile.mkdtemp(prefix="sluice-redis-rows-")
    os.chmod(tmp, 0o755)
    procs = run.Procs(tmp)
    try:
        ports = {"upstream": run.free_port(), "redis": run.free_port()}
        d = os.path.join(tmp, "upstream")
        os.makedirs(d)
        conf = run.fill("nginx-upstream.conf", os.path.join(d, "nginx.conf"), DIR=d,
                        PORT=ports["upstream"])
        p = procs.start("upstream", ["nginx", "-p", d, "-c", conf, "-e",
                                     os.path.join(d, "error.log")])
        run.wait_port(procs, p, ports["upstream"], "upstream nginx")
        p = procs.start("redis", ["redis-server", "--port", str(ports["redis"]), "--bind",
                                  "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", tmp,
                                  "--daemonize", "no", "--logfile", ""])
        run.wait_port(procs, p, ports["redis"], "redis-server")
        redis = run.Redis(ports["redis"])
        rows = {}
        for tag, binary in bins:
            for row, template in ROWS:
                if row not in opt.rows.split(","):
                    continue
                rows[(tag, row)] = start_row(procs, tmp, "%s-%s" % (tag, row), binary,
                                             template, ports)
        time.sleep(0.5)
        out = {k: [] for k in rows}
        for rep in range(opt.reps):
            for key, (port, admin, pid) in rows.items():
                if opt.warmup:
                    run.run_wrk(procs, port, opt.warmup, opt.conns)
                h0, u0 = batch_hist(admin), evalsha_usec(redis)
                paced = {}
                if opt.rate:
                    paced = dict(script=os.path.join(BENCH, "fixed_rate.lua"),
                                 env=dict(os.environ, BENCH_RATE=str(opt.rate),
                                          BENCH_CONNS=str(opt.conns)))
                r = run.measure(procs, redis, port, pid, opt.duration, opt.conns, **paced)
                h1, u1 = batch_hist(admin), evalsha_usec(redis)
                n = max(r["requests"], 1)
                r["usec_per_decision"] = (u1 - u0) / n
                r["batch"] = hist_delta(h0, h1)
                out[key].append(r)
                hist = ""
                if r["batch"]:
                    b, s, c = r["batch"]
                    hist = "  batch mean %.1f, buckets %s" % (s / max(c, 1), " ".join(
                        "<=%s:%d" % (k, v) for k, v in b.items()))
                else:
                    hist = "  batch mean %.1f (from calls)" % (1 / max(r["redis_calls_per_req"],
                                                                     1e-9))
                print("rep %d %-6s %s: %7.0f req/s  sluice CPU %.4f s/10k  Redis CPU %.4f s/10k"
                      "  evalsha %.2f us/decision  calls %.3f/req  non2xx %d%s" % (
                          rep + 1, key[0], key[1], r["rps"], r["proxy_cpu_per_10k"],
                          r["redis_cpu_per_10k"],
                          r["usec_per_decision"], r["redis_calls_per_req"], r["non2xx"], hist),
                      flush=True)
        print("medians of %d reps, wrk -t1 -c%d -d%ds:" % (opt.reps, opt.conns, opt.duration))
        for key, reps in out.items():
            print("  %-6s %s: %7.0f req/s  sluice CPU %.4f s/10k  Redis CPU %.4f s/10k"
                  "  evalsha %.2f us/decision  calls %.3f/req" % (
                      key[0], key[1], statistics.median(r["rps"] for r in reps),
                      statistics.median(r["proxy_cpu_per_10k"] for r in reps),
                      statistics.median(r["redis_cpu_per_10k"] for r in reps),
                      statistics.median(r["usec_per_decision"] for r in reps),
                      statistics.median(r["redis_calls_per_req"] for r in reps)))
        redis.close()
    except KeyboardInterrupt:
        return 130
    finally:
        procs.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
