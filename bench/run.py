#!/usr/bin/python3
# sluice - bench/run.py: sluice side by side with nginx and HAProxy (issue 5).
#
# Starts its own upstream (nginx answering 200 "ok"), its own redis-server and
# every proxy on free loopback ports, drives them with wrk interleaved over
# the rows (A B C ... A B C ...), takes medians, measures memory, and writes
# bench/results/latest.{json,md} plus docs/performance.png. Every process it
# starts is stopped by PID at the end, also on error, SIGINT and SIGTERM.
# Standard library only; run with Debian's /usr/bin/python3.

import argparse
import http.client
import json
import os
import re
import resource
import selectors
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
CLK_TCK = os.sysconf("SC_CLK_TCK")
NOFILE_WANTED = 65536           # sluice and this script hold 10,000 sockets each

# The rows of issue 5, in the order they interleave.
ROWS = [
    # key, label, kind, template
    ("direct", "1 direct to upstream", "none", None),
    ("sluice1", "2 sluice, 1 limit", "sluice", "sluice-one.yaml"),
    ("sluice3", "3 sluice, 3 limits", "sluice", "sluice-three.yaml"),
    ("sluiceflood", "4 sluice, flood (429)", "sluice", "sluice-flood.yaml"),
    ("nginx", "5 nginx proxy_pass", "nginx", "nginx-proxy.conf"),
    ("nginxflood", "6 nginx limit_req, flood (429)", "nginx", "nginx-limitreq.conf"),
    ("haproxy", "7 HAProxy stick-table", "haproxy", "haproxy.cfg"),
    # Issue 12: each proxy terminating TLS (the same ECDSA P-256 certificate)
    # in front of the same upstream; keep-alive, then a new TLS connection
    # (a full handshake: wrk resumes no session) per request.
    ("sluicetls", "8 sluice TLS, keep-alive", "sluice", "sluice-tls.yaml"),
    ("nginxtls", "9 nginx TLS, keep-alive", "nginx", "nginx-tls.conf"),
    ("sluicetlsnew", "10 sluice TLS, new conn/req", "sluice", "sluice-tls.yaml"),
    ("nginxtlsnew", "11 nginx TLS, new conn/req", "nginx", "nginx-tls.conf"),
]
# Rows wrk drives over https, and those with a new connection per request.
TLS_ROWS = ("sluicetls", "nginxtls", "sluicetlsnew", "nginxtlsnew")
NEWCONN_ROWS = ("sluicetlsnew", "nginxtlsnew")
FLOOD_ROWS = ("sluiceflood", "nginxflood")
PLOT_LABELS = {"direct": "1 direct", "sluice1": "2 sluice\\n1 limit", "sluice3": "3 sluice\\n3 limits",
               "sluiceflood": "4 sluice\\nflood (429)", "nginx": "5 nginx\\nproxy_pass",
               "nginxflood": "6 nginx limit_req\\nflood (429)", "haproxy": "7 HAProxy\\nstick-table",
               "sluicetls": "8 sluice\\nTLS k-a", "nginxtls": "9 nginx\\nTLS k-a",
               "sluicetlsnew": "10 sluice\\nTLS new", "nginxtlsnew": "11 nginx\\nTLS new"}

TARGETS_DOC = {
    "allowed_vs_nginx": "row 2 proxy CPU/request <= 0.8 x row 5",
    "allowed_vs_haproxy": "row 2 proxy CPU/request <= 1.0 x row 7",
    "three_vs_one": "row 3 proxy CPU/request <= 1.10 x row 2",
    "three_limits_one_call": "row 3 script calls per request <= 1 (+ wrk in-flight)",
    "redis_calls_allowed": "rows 2, 3: script calls per allowed request <= 1 (+ in-flight)",
    "redis_cpu_allowed": "row 2 Redis CPU <= 0.08 s per 10k requests",
    "flood_vs_nginx": "row 4 proxy CPU/request <= row 6",
    "flood_no_redis": "row 4: 0 Redis calls after the first denial",
    "latency_half_rate": "p99 at half of row 2's peak rate <= direct + 0.5 ms",
    "idle_rss": "10,000 idle client connections in <= 64 MiB RSS",
    "tls_keepalive_vs_nginx": "row 8 proxy CPU/request <= 1.0 x row 9 (TLS, keep-alive)",
    "tls_newconn_vs_nginx": "row 10 proxy CPU/request <= 1.1 x row 11 (TLS, new conn/req)",
}


def log(msg):
    print("bench: " + msg, flush=True)


# ---------------------------------------------------------------- processes

def proc_stat(pid):
    """(ppid, starttime, utime+stime ticks) of pid, or None when it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            s = f.read()
    except OSError:
        return None
    # The command name may hold spaces or ')': fields start after the last ')'.
    fields = s[s.rindex(")") + 2:].split()
    # fields[0] is field 3 (state): field N is fields[N - 3].
    return int(fields[1]), int(fields[19]), int(fields[11]) + int(fields[12])


def proc_tree(pid):
    """pid and all its descendants, as {pid: starttime}."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = proc_stat(int(name))
        if st:
            children.setdefault(st[0], []).append((int(name), st[1]))
    top = proc_stat(pid)
    if top is None:
        return {}
    tree, todo = {pid: top[1]}, [pid]
    while todo:
        for child, start in children.get(todo.pop(), []):
            if child not in tree:
                tree[child] = start
                todo.append(child)
    return tree


def tree_cpu_s(pid):
    """CPU-seconds (user + system, every thread) of pid and its descendants.
    /proc/PID/stat of a process already sums its threads."""
    total = 0
    for p in proc_tree(pid):
        st = proc_stat(p)
        if st:
            total += st[2]
    return total / CLK_TCK


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def raise_nofile():
    """Raise RLIMIT_NOFILE as far as allowed (the hard limit too when root)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = NOFILE_WANTED
    if hard != resource.RLIM_INFINITY and hard < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
            return want
        except (ValueError, OSError):
            want = hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return want


class Procs:
    """Every process this run started; stop_all() ends them by PID."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.running = []       # (name, Popen, log path)

    def start(self, name, argv, env=None):
        path = os.path.join(self.tmp, name + ".log")
        out = open(path, "wb")
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, env=env,
                             start_new_session=True, preexec_fn=raise_nofile)
        out.close()
        self.running.append((name, p, path))
        return p

    def log_tail(self, p, n=2000):
        for _, q, path in self.running:
            if q is p:
                with open(path, "rb") as f:
                    return f.read()[-n:].decode("utf-8", "replace")
        return ""

    def stop(self, p, grace_s=5.0):
        # Remember the whole tree first: nginx workers outlive a killed master.
        tree = proc_tree(p.pid)
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=grace_s)
        for pid, start in tree.items():
            st = proc_stat(pid)
            if pid != p.pid and st and st[1] == start:     # same process still there
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.running = [r for r in self.running if r[1] is not p]

    def stop_all(self):
        for _, p, _ in list(reversed(self.running)):
            try:
                self.stop(p)
            except Exception as e:          # keep stopping the others
                log("could not stop pid %d: %s" % (p.pid, e))


def on_signal(signum, frame):
    raise SystemExit(128 + signum)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(procs, p, port, what, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise RuntimeError("%s exited with %s:\n%s" % (what, p.returncode, procs.log_tail(p)))
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("%s did not listen on %d within %.0fs" % (what, port, timeout_s))


def fill(template, out_path, **subst):
    with open(os.path.join(BENCH, "conf", template)) as f:
        text = f.read()
    for k, v in subst.items():
        text = text.replace("@%s@" % k, str(v))
    with open(out_path, "w") as f:
        f.write(text)
    return out_path


# -------------------------------------------------------------------- redis

class Redis:
    """A minimal RESP client, enough for INFO, SCAN, MEMORY USAGE and TTL."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.f = self.sock.makefile("rb")

    def call(self, *args):
        parts = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            parts.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.sock.sendall(b"".join(parts))
        return self.read()

    def read(self):
        line = self.f.readline()
        if not line.endswith(b"\r\n"):
            raise RuntimeError("redis: connection closed")
        t, rest = line[:1], line[1:-2]
        if t == b"+":
            return rest.decode()
        if t == b"-":
            raise RuntimeError("redis: " + rest.decode())
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.f.read(n + 2)
            return data[:-2]
        if t == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise RuntimeError("redis: bad reply %r" % line)

    def info(self, section):
        out = {}
        for line in self.call("INFO", section).decode().splitlines():
            if ":" in line and not line.startswith("#"):
                k, v = line.split(":", 1)
                out[k] = v
        return out

    def sample(self):
        """(CPU-seconds, script calls) so far."""
        cpu = self.info("cpu")
        cpu_s = float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
        calls = 0
        for k, v in self.info("commandstats").items():
            if k in ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_evalsha_ro", "cmdstat_eval_ro"):
                calls += int(re.search(r"calls=(\d+)", v).group(1))
        return cpu_s, calls

    def close(self):
        self.sock.close()


# ---------------------------------------------------------------------- wrk

UNITS_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0, "h": 3600000.0}


def parse_latency_ms(text):
    m = re.fullmatch(r"([0-9.]+)(us|ms|s|m|h)", text)
    if not m:
        raise ValueError("wrk: latency '%s'" % text)
    return float(m.group(1)) * UNITS_MS[m.group(2)]


def parse_wrk(out):
    r = {"non2xx": 0, "socket_errors": 0}
    m = re.search(r"^\s*(\d+) requests in ([0-9.]+)(\w+)", out, re.M)
    if not m:
        raise RuntimeError("wrk: no request count in output:\n" + out)
    r["requests"] = int(m.group(1))
    r["rps"] = float(re.search(r"^Requests/sec:\s*([0-9.]+)", out, re.M).group(1))
    for pct, key in (("50", "p50_ms"), ("99", "p99_ms")):
        m = re.search(r"^\s*%s(?:\.000)?%%\s+(\S+)" % pct, out, re.M)
        r[key] = parse_latency_ms(m.group(1)) if m else None
    m = re.search(r"Non-2xx or 3xx responses:\s*(\d+)", out)
    if m:
        r["non2xx"] = int(m.group(1))
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if m:
        r["socket_errors"] = sum(int(x) for x in m.groups())
    return r


def run_wrk(procs, port, duration_s, conns, script=None, env=None, key=None):
    argv = ["wrk", "-t1", "-c%d" % conns, "-d%ds" % duration_s, "--latency",
            "--timeout", "5s"]
    if script:
        argv += ["-s", script]
    if key in NEWCONN_ROWS:
        argv += ["-H", "Connection: close"]     # wrk reconnects after each response
    argv.append("%s://127.0.0.1:%d/" % ("https" if key in TLS_ROWS else "http", port))
    p = procs.start("wrk", argv, env=env)
    try:
        p.wait(timeout=duration_s + 30)
    except subprocess.TimeoutExpired:
        raise RuntimeError("wrk did not finish within %ds" % (duration_s + 30))
    out = procs.log_tail(p, 1 << 16)
    procs.stop(p)
    if p.returncode != 0:
        raise RuntimeError("wrk failed (%s):\n%s" % (p.returncode, out))
    return parse_wrk(out)


# --------------------------------------------------------------------- rows

def http_get(port, path="/", headers=None, conn=None, tls=False):
    if conn is not None:
        c = conn
    elif tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE     # the bench's own self-signed certificate
        c = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=ctx)
    else:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    c.request("GET", path, headers=headers or {})
    resp = c.getresponse()
    resp.read()
    if conn is None:
        c.close()
    return resp.status


def start_everything(procs, tmp, sluice_bin):
    """Upstream, Redis and every proxy; returns {row key: (port, pid)}."""
    ports = {"upstream": free_port(), "redis": free_port()}
    d = os.path.join(tmp, "upstream")
    os.makedirs(d)
    conf = fill("nginx-upstream.conf", os.path.join(d, "nginx.conf"), DIR=d, PORT=ports["upstream"])
    p = procs.start("upstream", ["nginx", "-p", d, "-c", conf, "-e", os.path.join(d, "error.log")])
    wait_port(procs, p, ports["upstream"], "upstream nginx")

    p = procs.start("redis", ["redis-server", "--port", str(ports["redis"]), "--bind", "127.0.0.1",
                              "--save", "", "--appendonly", "no", "--dir", tmp,
                              "--daemonize", "no", "--logfile", ""])
    wait_port(procs, p, ports["redis"], "redis-server")
    redis_pid = p.pid

    tls_certificate(tmp)
    rows = {"direct": (ports["upstream"], None)}
    for key, label, kind, template in ROWS:
        if kind == "none":
            continue
        port = free_port()
        d = os.path.join(tmp, key)
        os.makedirs(d)
        subst = dict(DIR=d, PORT=port, UPSTREAM_PORT=ports["upstream"], REDIS_PORT=ports["redis"])
        if kind == "sluice":
            conf = fill(template, os.path.join(d, "sluice.yaml"), **subst)
            argv = [sluice_bin, "-c", conf]
        elif kind == "nginx":
            conf = fill(template, os.path.join(d, "nginx.conf"), **subst)
            argv = ["nginx", "-p", d, "-c", conf, "-e", os.path.join(d, "error.log")]
        else:
            conf = fill(template, os.path.join(d, "haproxy.cfg"), **subst)
            argv = ["haproxy", "-db", "-f", conf]
        p = procs.start(key, argv)
        wait_port(procs, p, port, label)
        rows[key] = (port, p.pid)
    return ports, redis_pid, rows


def tls_certificate(tmp):
    """tmp/tls.pem and tmp/tls.key: a self-signed ECDSA P-256 certificate,
    the one every TLS row serves."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:P-256", "-nodes", "-keyout", os.path.join(tmp, "tls.key"),
                    "-out", os.path.join(tmp, "tls.pem"), "-days", "2", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=30)


def sanity(rows):
    """One request per row before measuring: a proxy that cannot proxy is
    reported, not benchmarked into a fast table of errors."""
    problems = []
    for key, label, _, _ in ROWS:
        status = http_get(rows[key][0], tls=key in TLS_ROWS)
        ok = (200, 429) if key in FLOOD_ROWS else (200,)
        if status not in ok:
            problems.append("%s: first request got %d" % (label, status))
    return problems


def measure(procs, redis, port, pid, duration_s, conns, script=None, env=None, key=None):
    cpu0 = tree_cpu_s(pid) if pid else 0.0
    rcpu0, calls0 = redis.sample()
    r = run_wrk(procs, port, duration_s, conns, script, env, key=key)
    rcpu1, calls1 = redis.sample()
    cpu1 = tree_cpu_s(pid) if pid else 0.0
    n = max(r["requests"], 1)
    r["proxy_cpu_s"] = cpu1 - cpu0
    r["redis_cpu_s"] = rcpu1 - rcpu0
    r["script_calls"] = calls1 - calls0
    r["proxy_cpu_per_10k"] = r["proxy_cpu_s"] / n * 10000
    r["redis_cpu_per_10k"] = r["redis_cpu_s"] / n * 10000
    r["redis_calls_per_req"] = r["script_calls"] / n
    return r


MEDIAN_KEYS = ("rps", "p50_ms", "p99_ms", "proxy_cpu_per_10k", "redis_cpu_per_10k",
               "redis_calls_per_req")


def medians(reps):
    out = {}
    for k in MEDIAN_KEYS:
        vals = [r[k] for r in reps if r.get(k) is not None]
        out[k] = statistics.median(vals) if vals else None
    out["non2xx"] = sum(r["non2xx"] for r in reps)
    out["socket_errors"] = sum(r["socket_errors"] for r in reps)
    out["requests"] = sum(r["requests"] for r in reps)
    out["script_calls"] = sum(r["script_calls"] for r in reps)
    return out


# ------------------------------------------------------------------- memory

def idle_connections(port, n, timeout_s=120.0):
    """Open up to n connections within timeout_s. Returns (socks, connected);
    the caller closes socks."""
    deadline = time.monotonic() + timeout_s
    socks = []
    try:
        for _ in range(n):
            if time.monotonic() > deadline:
                break
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=10))
    except OSError as e:
        log("idle connections: stopped at %d: %s" % (len(socks), e))
    connected = len(socks)
    return socks, connected


def request_all(socks, batch=256, timeout_s=120.0):
    """One GET on every socket, responses read: they are then idle keep-alive
    clients. Sent batch sockets at a time: 10,000 requests at once would
    exceed the Redis budget (redis.timeout) and measure on_error instead.
    Returns {status or "closed" or "no answer": count}."""
    statuses = {}
    deadline = time.monotonic() + timeout_s
    for i in range(0, len(socks), batch):
        left = deadline - time.monotonic()
        for k, v in request_batch(socks[i:i + batch], max(left, 0.1)).items():
            statuses[k] = statuses.get(k, 0) + v
    return statuses


def request_batch(socks, timeout_s):
    req = b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n"
    sel = selectors.DefaultSelector()
    bufs = {}
    for s in socks:
        s.setblocking(False)
        try:
            s.send(req)
        except OSError:
            continue
        bufs[s] = b""
        sel.register(s, selectors.EVENT_READ)
    statuses = {}
    deadline = time.monotonic() + timeout_s
    while bufs and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=1.0):
            s = key.fileobj
            try:
                data = s.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                statuses["closed"] = statuses.get("closed", 0) + 1
                sel.unregister(s)
                del bufs[s]
                continue
            bufs[s] += data
            head, sep, body = bufs[s].partition(b"\r\n\r\n")
            if not sep:
                continue
            m = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", head)
            if m and len(body) >= int(m.group(1)):
                status = head[9:12].decode("ascii", "replace")
                statuses[status] = statuses.get(status, 0) + 1
                sel.unregister(s)
                del bufs[s]
    if bufs:
        statuses["no answer"] = len(bufs)
    sel.close()
    return statuses


def memory(procs, tmp, sluice_bin, ports, redis, idle_n):
    port = free_port()
    d = os.path.join(tmp, "mem")
    os.makedirs(d)
    conf = fill("sluice-mem.yaml", os.path.join(d, "sluice.yaml"), PORT=port,
                UPSTREAM_PORT=ports["upstream"], REDIS_PORT=ports["redis"])
    p = procs.start("sluice-mem", [sluice_bin, "-c", conf])
    wait_port(procs, p, port, "sluice (memory)")
    out = {"keys": {}}

    # Redis memory per key: 100 keys per algorithm, one request each; and one
    # sliding_log key holding 100 entries (its size grows with the log).
    algos = ("fixed_window", "sliding_window", "sliding_log", "token_bucket", "gcra")
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    bad = 0
    for a in algos:
        for i in range(100):
            bad += http_get(port, "/m/" + a, {"X-Bench-Key": "k%d" % i}, conn=c) != 200
    for _ in range(100):
        bad += http_get(port, "/m/sliding_log", {"X-Bench-Key": "long"}, conn=c) != 200
    c.close()
    out["non200"] = bad
    no_ttl = 0
    for a in algos:
        sizes, long_size, cursor = [], None, b"0"
        for _ in range(1000):
            cursor, keys = redis.call("SCAN", cursor, "MATCH", "benchmem:{%s|*" % a, "COUNT", 1000)
            for k in keys:
                size = redis.call("MEMORY", "USAGE", k, "SAMPLES", "0")
                if redis.call("PTTL", k) < 0:
                    no_ttl += 1
                if b"long" in k:
                    long_size = size
                else:
                    sizes.append(size)
            if cursor == b"0":
                break
        out["keys"][a] = {"keys": len(sizes),
                          "bytes_per_key": statistics.mean(sizes) if sizes else None}
        if long_size is not None:
            out["keys"][a]["bytes_100_entries"] = long_size
    out["keys_without_ttl"] = no_ttl

    # RSS with idle_n idle client connections.
    out["rss_kib_start"] = rss_kib(p.pid)
    socks, connected = idle_connections(port, idle_n)
    try:
        time.sleep(1.0)
        out["connected"] = connected
        out["rss_kib_connected"] = rss_kib(p.pid)
        out["statuses"] = request_all(socks)
        out["answered"] = out["statuses"].get("200", 0)
        time.sleep(1.0)
        out["rss_kib_idle"] = rss_kib(p.pid)
        out["alive"] = p.poll() is None
    finally:
        for s in socks:
            s.close()
    procs.stop(p)
    return out


# ------------------------------------------------------------------ results

def ratio(a, b):
    return a / b if a is not None and b else None


def judge(rows, half, mem, conns):
    """Each target: value, limit, met. Script calls are counted by Redis for
    every request sluice decided, while wrk counts only those completed before
    it stopped: up to one request per connection is in flight at that moment,
    so the calls limits allow conns extra calls per run."""
    med = {k: v["median"] for k, v in rows.items()}

    def calls_limit(key):
        return 1.0 + conns / min(r["requests"] for r in rows[key]["reps"])
    r = {}
    cpu = {k: med[k]["proxy_cpu_per_10k"] for k in med}
    r["allowed_vs_nginx"] = (ratio(cpu["sluice1"], cpu["nginx"]), 0.8)
    r["allowed_vs_haproxy"] = (ratio(cpu["sluice1"], cpu["haproxy"]), 1.0)
    r["three_vs_one"] = (ratio(cpu["sluice3"], cpu["sluice1"]), 1.10)
    r["three_limits_one_call"] = (med["sluice3"]["redis_calls_per_req"], calls_limit("sluice3"))
    worst = max(("sluice1", "sluice3"), key=lambda k: med[k]["redis_calls_per_req"] - calls_limit(k))
    r["redis_calls_allowed"] = (med[worst]["redis_calls_per_req"], calls_limit(worst))
    r["redis_cpu_allowed"] = (med["sluice1"]["redis_cpu_per_10k"], 0.08)
    r["flood_vs_nginx"] = (ratio(cpu["sluiceflood"], cpu["nginxflood"]), 1.0)
    r["flood_no_redis"] = (med["sluiceflood"]["script_calls"], 0)
    r["tls_keepalive_vs_nginx"] = (ratio(cpu["sluicetls"], cpu["nginxtls"]), 1.0)
    r["tls_newconn_vs_nginx"] = (ratio(cpu["sluicetlsnew"], cpu["nginxtlsnew"]), 1.1)
    if half:
        r["latency_half_rate"] = (half["sluice1"]["p99_ms"] - half["direct"]["p99_ms"], 0.5)
    if mem and mem.get("connected"):
        r["idle_rss"] = (mem["rss_kib_idle"] / 1024.0, 64.0)
    out = {}
    for k, (value, limit) in r.items():
        out[k] = {"value": value, "limit": round(limit, 4), "target": TARGETS_DOC[k],
                  "met": value is not None and value <= limit + 1e-12}
    # An allowed row that answered anything but 200 is not a valid figure.
    for k in ("sluice1", "sluice3"):
        if med[k]["non2xx"] or med[k]["socket_errors"]:
            for t in ("allowed_vs_nginx", "allowed_vs_haproxy", "three_vs_one", "redis_cpu_allowed"):
                out[t]["met"] = False
                out[t]["note"] = "row %s had non-2xx responses or socket errors" % k
    return out


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def table_md(res):
    lines = ["| row | req/s | p50 ms | p99 ms | proxy CPU-s/10k | Redis CPU-s/10k | Redis calls/req | non-2xx | socket errors |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key, label, _, _ in ROWS:
        m = res["rows"][key]["median"]
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %d | %d |" % (
            label, fmt(m["rps"], ".0f"), fmt(m["p50_ms"], ".3f"), fmt(m["p99_ms"], ".3f"),
            fmt(m["proxy_cpu_per_10k"], ".3f"), fmt(m["redis_cpu_per_10k"], ".4f"),
            fmt(m["redis_calls_per_req"], ".4f"), m["non2xx"], m["socket_errors"]))
    return "\n".join(lines)


def write_markdown(res, path):
    L = ["# sluice benchmark: latest run", "",
         "%s, %s (%d CPUs), load average at start %s. wrk -t1 -c%d -d%ds --latency, "
         "%d repetitions interleaved, medians. Every proxy runs 1 worker." % (
             res["started"], res["machine"]["cpu_model"], res["machine"]["nproc"],
             res["machine"]["loadavg_start"], res["conns"], res["duration_s"], res["reps"]),
         "", table_md(res), ""]
    if res.get("half_rate"):
        h = res["half_rate"]
        L += ["Half of row 2's peak rate: %.0f req/s offered (wrk paced by bench/fixed_rate.lua, "
              "an approximation of a fixed-rate load):" % h["rate"], "",
              "| row | req/s reached | p50 ms | p99 ms |", "|---|---:|---:|---:|"]
        for k in ("direct", "sluice1"):
            m = h[k]
            L.append("| %s | %.0f | %.3f | %.3f |" % (k, m["rps"], m["p50_ms"], m["p99_ms"]))
        L.append("")
    mem = res.get("memory")
    if mem:
        L += ["Memory: sluice RSS %.1f MiB at start, %.1f MiB with %d connections open, "
              "%.1f MiB with them idle after one request each (%d answered 200)." % (
                  mem["rss_kib_start"] / 1024, mem["rss_kib_connected"] / 1024, mem["connected"],
                  mem["rss_kib_idle"] / 1024, mem["answered"]), "",
              "| algorithm | Redis bytes per key (1 request) | keys measured |", "|---|---:|---:|"]
        for a, v in mem["keys"].items():
            L.append("| %s | %s | %d |" % (a, fmt(v["bytes_per_key"], ".0f"), v["keys"]))
        sl = mem["keys"].get("sliding_log", {}).get("bytes_100_entries")
        if sl:
            L += ["", "A sliding_log key holding 100 entries: %d bytes." % sl]
        L.append("")
    L += ["| target | value | limit | met |", "|---|---:|---:|---|"]
    for k, t in res["targets"].items():
        L.append("| %s | %s | %s | %s |" % (t["target"], fmt(t["value"], ".3f"), t["limit"],
                                           "yes" if t["met"] else "**no**"))
    if res["problems"]:
        L += ["", "Problems seen:", ""] + ["- " + p for p in res["problems"]]
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")


def write_ratios_md(jsonl, path, last=3):
    """The targets of the last runs side by side (docs: "the ratios of three runs")."""
    with open(jsonl) as f:
        runs = [json.loads(line) for line in f if line.strip()][-last:]
    L = ["| target | " + " | ".join(r["started"] for r in runs) + " |",
         "|---|" + "---:|" * len(runs)]
    for k, doc in TARGETS_DOC.items():
        cells = []
        for r in runs:
            v = r["targets"].get(k)
            cells.append("-" if v is None else "%s %s" % (fmt(v[0], ".3f"), "ok" if v[1] else "**miss**"))
        L.append("| %s | %s |" % (doc, " | ".join(cells)))
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")


def plot(res, tmp, png):
    if not shutil.which("gnuplot"):
        log("gnuplot not found: no plot")
        return
    data = os.path.join(tmp, "cpu.dat")
    with open(data, "w") as f:
        for i, (key, label, _, _) in enumerate(ROWS):
            v = res["rows"][key]["median"]["proxy_cpu_per_10k"] or 0.0
            f.write('%d "%s" %.6f\n' % (i, PLOT_LABELS[key], v))
    subprocess.run(["gnuplot", "-e", "datafile='%s'; outfile='%s'; subtitle='%s'" % (
        data, png, "%s, %s, wrk -c%d, median of %d" % (
            res["started"][:10], res["machine"]["cpu_model"], res["conns"], res["reps"])),
        os.path.join(BENCH, "plot.gp")], check=True, timeout=60)


def machine_facts():
    model = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break

    def version(argv):
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=10)
            return (p.stdout + p.stderr).strip().splitlines()[0]
        except Exception:
            return None
    return {"nproc": os.cpu_count(), "cpu_model": model, "kernel": os.uname().release,
            "loadavg_start": open("/proc/loadavg").read().split()[:3],
            "nginx": version(["nginx", "-v"]), "haproxy": version(["haproxy", "-v"]),
            "redis": version(["redis-server", "--version"]), "wrk": version(["wrk", "-v"])}


# --------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description="sluice vs nginx vs HAProxy (issue 5)")
    ap.add_argument("--duration", type=int, default=int(os.environ.get("BENCH_DURATION", 10)),
                    help="seconds per measured wrk run (default 10)")
    ap.add_argument("--warmup", type=int, default=2, help="seconds of warm-up before each run")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--conns", type=int, default=64)
    ap.add_argument("--idle", type=int, default=10000, help="idle client connections for the RSS figure")
    ap.add_argument("--sluice", default=os.environ.get("SLUICE_BIN", os.path.join(ROOT, "build", "sluice")))
    ap.add_argument("--out", default=os.path.join(BENCH, "results"))
    ap.add_argument("--png", default=os.path.join(ROOT, "docs", "performance.png"))
    args = ap.parse_args()
    for tool in ("wrk", "nginx", "haproxy", "redis-server"):
        if not shutil.which(tool):
            sys.exit("bench: %s not found (make bench installs it)" % tool)
    if not os.access(args.sluice, os.X_OK):
        sys.exit("bench: no sluice binary at %s (run make first)" % args.sluice)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    raise_nofile()

    tmp = tempfile.mkdtemp(prefix="sluice-bench-")
    os.chmod(tmp, 0o755)        # nginx workers run as nobody when started by root
    procs = Procs(tmp)
    started = time.time()
    res = {"started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": machine_facts(),
           "duration_s": args.duration, "warmup_s": args.warmup, "reps": args.reps,
           "conns": args.conns, "rows": {}, "problems": []}
    try:
        ports, redis_pid, rows = start_everything(procs, tmp, args.sluice)
        redis = Redis(ports["redis"])
        res["problems"] += sanity(rows)
        reps = {k: [] for k, _, _, _ in ROWS}
        for rep in range(args.reps):
            for key, label, _, _ in ROWS:
                port, pid = rows[key]
                if args.warmup:
                    run_wrk(procs, port, args.warmup, args.conns, key=key)
                r = measure(procs, redis, port, pid, args.duration, args.conns, key=key)
                reps[key].append(r)
                log("rep %d %-32s %8.0f req/s  p99 %7.3f ms  cpu %.3f s/10k  redis %.4f s/10k  "
                    "calls %.3f/req  non2xx %d" % (rep + 1, label, r["rps"], r["p99_ms"],
                                                   r["proxy_cpu_per_10k"], r["redis_cpu_per_10k"],
                                                   r["redis_calls_per_req"], r["non2xx"]))
        for key, label, _, _ in ROWS:
            res["rows"][key] = {"label": label, "reps": reps[key], "median": medians(reps[key])}
            m = res["rows"][key]["median"]
            if key not in FLOOD_ROWS and (m["non2xx"] or m["socket_errors"]):
                res["problems"].append("%s: %d non-2xx responses, %d socket errors over %d requests" % (
                    label, m["non2xx"], m["socket_errors"], m["requests"]))
            if key in FLOOD_ROWS and m["non2xx"] < m["requests"] * 0.99:
                res["problems"].append("%s: only %d of %d requests were rejected" % (
                    label, m["non2xx"], m["requests"]))

        # Latency at half of sluice's peak rate, direct and through sluice.
        rate = res["rows"]["sluice1"]["median"]["rps"] / 2
        half = {"rate": rate, "direct": [], "sluice1": []}
        env = dict(os.environ, BENCH_RATE="%.1f" % rate, BENCH_CONNS=str(args.conns))
        script = os.path.join(BENCH, "fixed_rate.lua")
        for rep in range(args.reps):
            for key in ("direct", "sluice1"):
                port, pid = rows[key]
                run_wrk(procs, port, args.warmup or 1, args.conns, script, env)
                r = measure(procs, redis, port, pid, args.duration, args.conns, script, env)
                half[key].append(r)
                log("half rate rep %d %-8s %8.0f req/s  p50 %.3f ms  p99 %.3f ms" % (
                    rep + 1, key, r["rps"], r["p50_ms"], r["p99_ms"]))
        for key in ("direct", "sluice1"):
            half[key] = medians(half[key])
        res["half_rate"] = half

        res["memory"] = memory(procs, tmp, args.sluice, ports, redis, args.idle)
        mem = res["memory"]
        if mem["connected"] < args.idle or mem["answered"] < mem["connected"] or not mem["alive"]:
            res["problems"].append("memory: %d of %d connected, answers %s, sluice alive: %s" % (
                mem["connected"], args.idle, json.dumps(mem["statuses"]), mem["alive"]))
        if mem["keys_without_ttl"]:
            res["problems"].append("memory: %d keys without a TTL" % mem["keys_without_ttl"])
        redis.close()

        res["targets"] = judge(res["rows"], half, mem, args.conns)
        res["elapsed_s"] = round(time.time() - started, 1)
        # Proxies still alive at the end: a crash mid-run is a finding.
        for name, p, _ in procs.running:
            if p.poll() is not None:
                res["problems"].append("%s exited during the run with %s" % (name, p.returncode))
    finally:
        procs.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "latest.json"), "w") as f:
        json.dump(res, f, indent=1)
    write_markdown(res, os.path.join(args.out, "latest.md"))
    with open(os.path.join(args.out, "ratios.jsonl"), "a") as f:
        f.write(json.dumps({"started": res["started"],
                            "targets": {k: [t["value"], t["met"]] for k, t in res["targets"].items()}}) + "\n")
    write_ratios_md(os.path.join(args.out, "ratios.jsonl"), os.path.join(args.out, "ratios.md"))
    os.makedirs(os.path.dirname(args.png), exist_ok=True)
    tmp2 = tempfile.mkdtemp(prefix="sluice-bench-plot-")
    try:
        plot(res, tmp2, args.png)
    finally:
        shutil.rmtree(tmp2, ignore_errors=True)

    print()
    print(table_md(res))
    print()
    for k, t in res["targets"].items():
        print("%-4s %-58s %s (limit %s)" % ("ok" if t["met"] else "MISS", t["target"],
                                            fmt(t["value"], ".3f"), t["limit"]))
    for p in res["problems"]:
        print("problem: " + p)
    print("\nbench: %.0fs; results in %s, plot in %s" % (res["elapsed_s"], args.out, args.png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
