#!/usr/bin/python3
# sluice - bench/run.py: sluice side by side with nginx and HAProxy (issue 5).
#
# Starts its own upstream (nginx answering 200 "ok"), its own redis-server and
# every proxy on free loopback ports, drives them with wrk interleaved over
# the rows (A B C ... A B C ...), takes medians, measures memory, and writes
# bench/results/latest.{json,md} plus docs/performance.png. Every process it
# starts is stopped by PID at the end, also on error, SIGINT and SIGTERM.
# The HTTP/2, gRPC and decision-service rows (issues 20-22) are driven by
# h2load (nghttp2-client) and need python3-grpcio and python3-hpack; the
# rest is the standard library. Run with Debian's /usr/bin/python3.

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
import struct
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
    # Issue 20: HTTP/2 from the client (h2load -c 8 -m 10): over TLS (ALPN h2,
    # the TLS rows' certificate) to the HTTP/1.1 upstream; the flood over h2c.
    ("sluiceh2", "12 sluice h2 TLS, 1 limit", "sluice", "sluice-h2.yaml"),
    ("nginxh2", "13 nginx h2 TLS proxy_pass", "nginx", "nginx-h2.conf"),
    ("haproxyh2", "14 HAProxy h2 TLS stick-table", "haproxy", "haproxy-h2.cfg"),
    ("sluiceh2flood", "15 sluice h2c, flood (429)", "sluice", "sluice-h2flood.yaml"),
    ("nginxh2flood", "16 nginx h2c limit_req, flood (429)", "nginx", "nginx-h2limitreq.conf"),
    # Issue 21: unary gRPC calls over h2c to bench/grpc_upstream.py (grpcio).
    ("sluicegrpc", "17 sluice gRPC unary, 1 limit", "sluice", "sluice-grpc.yaml"),
    ("nginxgrpc", "18 nginx grpc_pass", "nginx", "nginx-grpc.conf"),
    # Issue 22: Envoy RLS v3 ShouldRateLimit on the decision listener (h2c).
    ("sluicerls", "19 sluice RLS ShouldRateLimit", "sluice", "sluice-rls.yaml"),
]
# Rows wrk drives over https, and those with a new connection per request.
TLS_ROWS = ("sluicetls", "nginxtls", "sluicetlsnew", "nginxtlsnew")
NEWCONN_ROWS = ("sluicetlsnew", "nginxtlsnew")
FLOOD_ROWS = ("sluiceflood", "nginxflood", "sluiceh2flood", "nginxh2flood")
# Row groups (--groups): "memory" is the idle-connection RSS and the Redis
# bytes per key; "h2" includes the idle HTTP/2 RSS, "http1" the latency at
# half of row 2's rate, "rls" the latency at half of row 19's.
GROUPS = {
    "http1": ("direct", "sluice1", "sluice3", "sluiceflood", "nginx", "nginxflood", "haproxy"),
    "tls": TLS_ROWS,
    "memory": (),
    "h2": ("sluiceh2", "nginxh2", "haproxyh2", "sluiceh2flood", "nginxh2flood"),
    "grpc": ("sluicegrpc", "nginxgrpc"),
    "rls": ("sluicerls",),
}
# Rows h2load drives: scheme, path, request body ("grpc": a framed unary
# request, "rls": a framed RateLimitRequest) and streams per connection.
H2_CONNS = 8
H2LOAD_ROWS = {
    "sluiceh2": ("https", "/", None, 10), "nginxh2": ("https", "/", None, 10),
    "haproxyh2": ("https", "/", None, 10),
    "sluiceh2flood": ("http", "/", None, 10), "nginxh2flood": ("http", "/", None, 10),
    "sluicegrpc": ("http", "/bench.Bench/Echo", "grpc", 10),
    "nginxgrpc": ("http", "/bench.Bench/Echo", "grpc", 10),
    "sluicerls": ("http", "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", "rls", 50),
}
PLOT_LABELS = {"direct": "1 direct", "sluice1": "2 sluice\\n1 limit", "sluice3": "3 sluice\\n3 limits",
               "sluiceflood": "4 sluice\\nflood (429)", "nginx": "5 nginx\\nproxy_pass",
               "nginxflood": "6 nginx limit_req\\nflood (429)", "haproxy": "7 HAProxy\\nstick-table",
               "sluicetls": "8 sluice\\nTLS k-a", "nginxtls": "9 nginx\\nTLS k-a",
               "sluicetlsnew": "10 sluice\\nTLS new", "nginxtlsnew": "11 nginx\\nTLS new",
               "sluiceh2": "12 sluice\\nh2 TLS", "nginxh2": "13 nginx\\nh2 TLS",
               "haproxyh2": "14 HAProxy\\nh2 TLS", "sluiceh2flood": "15 sluice\\nh2 flood",
               "nginxh2flood": "16 nginx\\nh2 flood", "sluicegrpc": "17 sluice\\ngRPC",
               "nginxgrpc": "18 nginx\\ngrpc_pass", "sluicerls": "19 sluice\\nRLS"}

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
    "h2_tls_vs_nginx": "row 12 proxy CPU/request <= 1.0 x row 13 (HTTP/2 over TLS)",
    "h2_flood_vs_nginx": "row 15 proxy CPU/request <= row 16 (flood over HTTP/2)",
    "h2_flood_no_redis": "row 15: 0 Redis calls after the first denial",
    "idle_rss_h2": "10,000 idle HTTP/2 connections in <= 128 MiB RSS",
    "grpc_vs_nginx": "row 17 proxy CPU/call <= 1.0 x row 18 (unary gRPC)",
    "rls_latency_half_rate": "row 19 p99 at half of its peak rate < 1 ms",
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
    return parse_wrk(run_tool(procs, "wrk", argv, duration_s, env))


def run_tool(procs, name, argv, duration_s, env=None):
    """Run a load generator for duration_s (30 s of grace); its output."""
    p = procs.start(name, argv, env=env)
    try:
        p.wait(timeout=duration_s + 30)
    except subprocess.TimeoutExpired:
        raise RuntimeError("%s did not finish within %ds" % (name, duration_s + 30))
    out = procs.log_tail(p, 1 << 16)
    procs.stop(p)
    if p.returncode != 0:
        raise RuntimeError("%s failed (%s):\n%s" % (name, p.returncode, out[-4000:]))
    return out


# ------------------------------------------------------------------- h2load

def pb_bytes(num, data):
    """A protobuf length-delimited field (field numbers < 16, data < 128 bytes)."""
    data = data.encode() if isinstance(data, str) else data
    assert num < 16 and len(data) < 128
    return bytes([num << 3 | 2, len(data)]) + data


def grpc_frame(msg):
    return b"\0" + struct.pack(">I", len(msg)) + msg


# The messages of rows 17 and 19. RLS v3 RateLimitRequest{domain=1,
# descriptors=2 RateLimitDescriptor{entries=1 Entry{key=1, value=2}}}.
GRPC_MESSAGE = pb_bytes(1, "bench")
RLS_MESSAGE = pb_bytes(1, "bench") + pb_bytes(2, pb_bytes(1, pb_bytes(1, "remote_address") +
                                                         pb_bytes(2, "127.0.0.1")))
RLS_DOMAIN_OK = 1           # RateLimitResponse.overall_code OK


def h2load_argv(port, key, duration_s=None, requests=None, conns=H2_CONNS, streams=None,
                rps=None, log_file=None, tmp=None):
    scheme, path, body, default_streams = H2LOAD_ROWS[key]
    argv = ["h2load", "-t1", "-c%d" % conns, "-m%d" % (streams or default_streams)]
    argv += ["-D", str(duration_s)] if duration_s else ["-n", str(requests)]
    if rps:
        argv.append("--rps=%.3f" % rps)
    if log_file:
        argv.append("--log-file=" + log_file)
    if body:
        argv += ["-d", os.path.join(tmp, body + ".bin"), "-H", "content-type: application/grpc",
                 "-H", "te: trailers"]
    argv.append("%s://127.0.0.1:%d%s" % (scheme, port, path))
    return argv


def parse_h2load(out):
    m = re.search(r"^requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, "
                  r"(\d+) failed, (\d+) errored, (\d+) timeout", out, re.M)
    st = re.search(r"^status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out, re.M)
    fin = re.search(r"^finished in ([0-9.]+)(\w+), ([0-9.]+) req/s", out, re.M)
    if not (m and st and fin):
        raise RuntimeError("h2load: no summary in output:\n" + out[-2000:])
    codes = [int(x) for x in st.groups()]
    return {"requests": sum(codes), "rps": float(fin.group(3)), "non2xx": sum(codes[1:]),
            "socket_errors": int(m.group(6)) + int(m.group(7))}


def latency_ms(log_file):
    """p50 and p99 of h2load's per-request log (status, microseconds)."""
    us = []
    with open(log_file) as f:
        for line in f:
            parts = line.split("\t")
            if len(parts) >= 3 and parts[1] != "-1":
                us.append(int(parts[2]))
    if not us:
        return None, None
    us.sort()
    return us[len(us) // 2] / 1000.0, us[min(len(us) - 1, int(len(us) * 0.99))] / 1000.0


def run_h2load(procs, port, duration_s, key, rps=None):
    log_file = os.path.join(procs.tmp, "h2load.tsv")
    r = parse_h2load(run_tool(procs, "h2load", h2load_argv(
        port, key, duration_s=duration_s, rps=rps, log_file=log_file, tmp=procs.tmp), duration_s))
    r["p50_ms"], r["p99_ms"] = latency_ms(log_file)
    os.unlink(log_file)
    return r


def h2_refusal(port, tls):
    """Why the listener does not speak HTTP/2, or None: no ALPN h2 over TLS,
    or an answer to the prior-knowledge preface that is not HTTP/2."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        if tls:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            ctx.set_alpn_protocols(["h2", "http/1.1"])
            s = ctx.wrap_socket(s)
            alpn = s.selected_alpn_protocol()
            s.close()
            return None if alpn == "h2" else "refused HTTP/2: its TLS handshake chose ALPN %r" % alpn
        s.sendall(H2_PREFACE + h2_frame(4, 0, 0))
        data = s.recv(64)
        s.close()
    except OSError as e:
        return "HTTP/2 probe failed: %s" % e
    if len(data) >= 9 and data[3] == 4 and data[4] == 0:       # the server's SETTINGS
        return None
    return "refused HTTP/2: it answered the preface with %r" % data.split(b"\r\n")[0][:60]


def h2_probe(port, key, tmp):
    """One request with h2load and, for gRPC rows, one call with grpcio:
    None when the row works, else why not."""
    why = h2_refusal(port, H2LOAD_ROWS[key][0] == "https")
    if why:
        return why
    p = subprocess.run(h2load_argv(port, key, requests=1, conns=1, streams=1, tmp=tmp),
                       capture_output=True, text=True, timeout=30)
    r = parse_h2load(p.stdout)
    ok = r["requests"] == 1 and (r["non2xx"] == 0 or key in FLOOD_ROWS)
    if not ok:
        return "h2load: %d answers (%d non-2xx), %d errors" % (r["requests"], r["non2xx"],
                                                              r["socket_errors"])
    body = H2LOAD_ROWS[key][2]
    if body:
        import grpc     # python3-grpcio, only for the gRPC rows
        with grpc.insecure_channel("127.0.0.1:%d" % port) as ch:
            try:
                reply = ch.unary_unary(H2LOAD_ROWS[key][1])(
                    GRPC_MESSAGE if body == "grpc" else RLS_MESSAGE, timeout=10)
            except grpc.RpcError as e:
                return "grpcio call: %s %s" % (e.code(), e.details())
        if body == "rls" and reply[:2] != bytes([1 << 3, RLS_DOMAIN_OK]):
            return "RLS answer not OK: %r" % reply[:40]
    return None


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


def start_everything(procs, tmp, sluice_bin, selected=None, unavailable=None):
    """Upstream, Redis and every proxy of the selected rows (all when None);
    returns {row key: (port, pid)}. A row of h2load's whose proxy does not
    start or does not speak what the row needs (sluice without HTTP/2, an h2
    upstream or a decision listener) goes into unavailable {key: why}
    instead of ending the run."""
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
    want = [r for r in ROWS if selected is None or r[0] in selected]
    if any(H2LOAD_ROWS.get(k, (0, 0, None))[2] == "grpc" for k, _, _, _ in want):
        ports["grpc"] = free_port()
        p = procs.start("grpc-upstream", [sys.executable, os.path.join(BENCH, "grpc_upstream.py"),
                                          "--port", str(ports["grpc"])])
        wait_port(procs, p, ports["grpc"], "gRPC upstream (python3-grpcio)", timeout_s=30.0)
    for name, msg in (("grpc", GRPC_MESSAGE), ("rls", RLS_MESSAGE)):
        with open(os.path.join(tmp, name + ".bin"), "wb") as f:
            f.write(grpc_frame(msg))
    rows = {}
    for key, label, kind, template in want:
        if kind == "none":
            rows[key] = (ports["upstream"], None)
            continue
        port = free_port()
        d = os.path.join(tmp, key)
        os.makedirs(d)
        subst = dict(DIR=d, PORT=port, UPSTREAM_PORT=ports["upstream"], REDIS_PORT=ports["redis"],
                     GRPC_PORT=ports.get("grpc", 0))
        if kind == "sluice":
            conf = fill(template, os.path.join(d, "sluice.yaml"), **subst)
            if key == "sluicerls":
                fill("rls-ratelimit.yaml", os.path.join(d, "ratelimit.yaml"))
            argv = [sluice_bin, "-c", conf]
        elif kind == "nginx":
            conf = fill(template, os.path.join(d, "nginx.conf"), **subst)
            argv = ["nginx", "-p", d, "-c", conf, "-e", os.path.join(d, "error.log")]
        else:
            conf = fill(template, os.path.join(d, "haproxy.cfg"), **subst)
            argv = ["haproxy", "-db", "-f", conf]
        p = procs.start(key, argv)
        if key not in H2LOAD_ROWS:
            wait_port(procs, p, port, label)
            rows[key] = (port, p.pid)
            continue
        try:
            wait_port(procs, p, port, label)
            why = h2_probe(port, key, tmp)
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            why = str(e).strip().splitlines()
            # sluice's config error is the last line of its output; its
            # lines are the template's (fill() keeps them).
            why = "%s: %s" % ("exited (its config refused?)" if p.poll() is not None
                              else "did not answer",
                              (why[-1] if why else "?").replace(conf, "bench/conf/" + template))
        if why:
            unavailable[key] = "%s %s" % (kind, why)
            log("%s: unavailable: %s" % (label, unavailable[key]))
            procs.stop(p)
        else:
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
    with open(os.path.join(tmp, "tls-combined.pem"), "wb") as out:     # HAProxy's crt
        for name in ("tls.pem", "tls.key"):
            with open(os.path.join(tmp, name), "rb") as f:
                out.write(f.read())


def sanity(rows):
    """One request per row before measuring: a proxy that cannot proxy is
    reported, not benchmarked into a fast table of errors."""
    problems = []
    for key, label, _, _ in ROWS:
        if key not in rows or key in H2LOAD_ROWS:      # h2load's rows: h2_probe
            continue
        status = http_get(rows[key][0], tls=key in TLS_ROWS)
        ok = (200, 429) if key in FLOOD_ROWS else (200,)
        if status not in ok:
            problems.append("%s: first request got %d" % (label, status))
    return problems


def measure(procs, redis, port, pid, duration_s, conns, script=None, env=None, key=None,
            rps=None):
    cpu0 = tree_cpu_s(pid) if pid else 0.0
    rcpu0, calls0 = redis.sample()
    if key in H2LOAD_ROWS:
        r = run_h2load(procs, port, duration_s, key, rps=rps)
    else:
        r = run_wrk(procs, port, duration_s, conns, script, env, key=key)
    rcpu1, calls1 = redis.sample()
    cpu1 = tree_cpu_s(pid) if pid else 0.0
    n = r["requests"]
    r["proxy_cpu_s"] = cpu1 - cpu0
    r["redis_cpu_s"] = rcpu1 - rcpu0
    r["script_calls"] = calls1 - calls0
    # A repetition that completed no request has no figure per request: it
    # is left out of the medians and fails the row's targets (judge).
    r["proxy_cpu_per_10k"] = r["proxy_cpu_s"] / n * 10000 if n else None
    r["redis_cpu_per_10k"] = r["redis_cpu_s"] / n * 10000 if n else None
    r["redis_calls_per_req"] = r["script_calls"] / n if n else None
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
    out["empty_reps"] = sum(1 for r in reps if r["requests"] == 0)
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


def idle_rss(p, port, n, open_batch=None, request_batch_fn=None):
    """The RSS of process p with n idle client connections on port: once they
    are connected (and open_batch, run as request_all's batch_fn, has set
    them up) and once each did one request (request_batch_fn; default an
    HTTP/1.1 GET) and went idle. The sockets are closed on return."""
    out = {}
    socks, connected = idle_connections(port, n)
    try:
        out["connected"] = connected
        if open_batch:
            out["handshakes"] = request_all(socks, batch_fn=open_batch)
        time.sleep(1.0)
        out["rss_kib_connected"] = rss_kib(p.pid)
        out["statuses"] = request_all(socks, batch_fn=request_batch_fn)
        out["answered"] = out["statuses"].get("200", 0)
        time.sleep(1.0)
        out["rss_kib_idle"] = rss_kib(p.pid)
        out["alive"] = p.poll() is None
    finally:
        for so in socks:
            so.close()
    return out


def request_all(socks, batch=256, timeout_s=120.0, batch_fn=None):
    """One GET on every socket, responses read: they are then idle keep-alive
    clients. Sent batch sockets at a time: 10,000 requests at once would
    exceed the Redis budget (redis.timeout) and measure on_error instead.
    batch_fn(socks, timeout_s) does one batch (default: request_batch).
    Returns {status or "closed" or "no answer": count}."""
    statuses = {}
    deadline = time.monotonic() + timeout_s
    for i in range(0, len(socks), batch):
        left = deadline - time.monotonic()
        for k, v in (batch_fn or request_batch)(socks[i:i + batch], max(left, 0.1)).items():
            statuses[k] = statuses.get(k, 0) + v
    return statuses


def exchange_batch(socks, timeout_s, send, answered, bufs):
    """Send send on every socket, then read until answered(sock), which looks
    at bufs[sock] (all read so far, or what it left there), gives a status.
    Returns {status or "closed" or "no answer": count}."""
    sel = selectors.DefaultSelector()
    statuses, pending = {}, set()

    def finish(so, status):
        statuses[status] = statuses.get(status, 0) + 1
        sel.unregister(so)
        pending.discard(so)

    for so in socks:
        so.setblocking(False)
        try:
            so.send(send)
        except OSError:
            statuses["closed"] = statuses.get("closed", 0) + 1
            continue
        sel.register(so, selectors.EVENT_READ)
        pending.add(so)
        bufs.setdefault(so, b"")
        status = answered(so)
        if status:
            finish(so, status)
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=1.0):
            so = key.fileobj
            try:
                data = so.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                finish(so, "closed")
                continue
            bufs[so] += data
            status = answered(so)
            if status:
                finish(so, status)
    if pending:
        statuses["no answer"] = len(pending)
    sel.close()
    return statuses


def request_batch(socks, timeout_s):
    bufs = {}

    def answered(so):
        head, sep, body = bufs[so].partition(b"\r\n\r\n")
        if not sep:
            return None
        m = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", head)
        if m and len(body) >= int(m.group(1)):
            return head[9:12].decode("ascii", "replace")
        return None
    return exchange_batch(socks, timeout_s, b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n", answered, bufs)


# HTTP/2 with prior knowledge, frame by frame: the idle-connection RSS of
# HTTP/2 (issue 20), measured as the HTTP/1.1 one above.
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def h2_frame(ftype, flags, stream, payload=b""):
    return (struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) +
            struct.pack(">I", stream) + payload)


# GET / on stream 1, HPACK: static :method GET, :scheme http, :path /, and
# :authority "bench" as a literal without indexing.
H2_GET = h2_frame(1, 0x5, 1, b"\x82\x86\x84\x01\x05bench")


def h2_batch(socks, timeout_s, send, done, bufs):
    """exchange_batch reading HTTP/2 frames until done(sock, type, flags,
    stream, payload) gives a status; what was read past that frame stays in
    bufs for the next batch on the socket. "refused": HTTP/1.1 came back."""
    def answered(so):
        buf = bufs[so]
        if buf.startswith(b"HTTP/"):
            return "refused"
        while len(buf) >= 9:
            n = int.from_bytes(buf[:3], "big")
            if len(buf) < 9 + n:
                break
            ftype, flags, stream = buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
            payload, buf = buf[9:9 + n], buf[9 + n:]
            status = done(so, ftype, flags, stream, payload)
            if status:
                bufs[so] = buf
                return status
        bufs[so] = buf
        return None
    return exchange_batch(socks, timeout_s, send, answered, bufs)


def h2_settings_seen(so, ftype, flags, stream, payload):
    if ftype == 7:
        return "goaway"
    return "h2" if ftype == 4 and not flags & 1 else None


def h2_response_done(decoders):
    """done() of h2_batch for the answer on stream 1: its :status."""
    import hpack         # python3-hpack, for the answer's header block only

    def done(so, ftype, flags, stream, payload):
        if ftype == 7:
            return "goaway"
        if stream != 1:
            return None
        if ftype == 3:
            return "reset"
        if ftype == 1:
            if flags & 0x8:                         # PADDED
                payload = payload[1:len(payload) - payload[0]]
            if flags & 0x20:                        # PRIORITY
                payload = payload[5:]
            d = decoders.setdefault(so, [hpack.Decoder(), None])
            for name, value in d[0].decode(payload):
                if name == ":status":
                    d[1] = value
        if ftype in (0, 1) and flags & 1:           # END_STREAM
            return decoders.get(so, [None, "no status"])[1]
        return None
    return done


def memory_h2(procs, tmp, sluice_bin, ports, idle_n):
    """sluice's RSS with idle_n idle HTTP/2 connections (h2c): at start,
    once each sent the preface and SETTINGS and got the server's SETTINGS,
    and once each then did one GET / (decided in Redis, proxied)."""
    p, port = start_sluice(procs, tmp, sluice_bin, ports, "h2mem", "sluice-h2mem.yaml")
    out = {"rss_kib_start": rss_kib(p.pid)}
    why = h2_refusal(port, False)
    if why:
        out["unavailable"] = "sluice " + why
        procs.stop(p)
        return out
    bufs, decoders = {}, {}
    out.update(idle_rss(p, port, idle_n, lambda b, t: h2_batch(
        b, t, H2_PREFACE + h2_frame(4, 0, 0), h2_settings_seen, bufs), lambda b, t: h2_batch(
        b, t, h2_frame(4, 1, 0) + H2_GET, h2_response_done(decoders), bufs)))
    procs.stop(p)
    return out


def start_sluice(procs, tmp, sluice_bin, ports, name, template):
    """A sluice of its own for a memory figure: (process, port)."""
    port = free_port()
    d = os.path.join(tmp, name)
    os.makedirs(d)
    conf = fill(template, os.path.join(d, "sluice.yaml"), PORT=port,
                UPSTREAM_PORT=ports["upstream"], REDIS_PORT=ports["redis"])
    p = procs.start("sluice-" + name, [sluice_bin, "-c", conf])
    wait_port(procs, p, port, "sluice (%s)" % name)
    return p, port


def memory(procs, tmp, sluice_bin, ports, redis, idle_n):
    p, port = start_sluice(procs, tmp, sluice_bin, ports, "mem", "sluice-mem.yaml")
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
    out.update(idle_rss(p, port, idle_n))
    procs.stop(p)
    return out


# ------------------------------------------------------------------ results

def ratio(a, b):
    return a / b if a is not None and b else None


# The targets that compare proxy CPU per request of two rows: (target, row,
# the row it is compared with, the highest ratio met).
RATIO_TARGETS = (
    ("allowed_vs_nginx", "sluice1", "nginx", 0.8),
    ("allowed_vs_haproxy", "sluice1", "haproxy", 1.0),
    ("three_vs_one", "sluice3", "sluice1", 1.10),
    ("flood_vs_nginx", "sluiceflood", "nginxflood", 1.0),
    ("tls_keepalive_vs_nginx", "sluicetls", "nginxtls", 1.0),
    ("tls_newconn_vs_nginx", "sluicetlsnew", "nginxtlsnew", 1.1),
    ("h2_tls_vs_nginx", "sluiceh2", "nginxh2", 1.0),
    ("h2_flood_vs_nginx", "sluiceh2flood", "nginxh2flood", 1.0),
    ("grpc_vs_nginx", "sluicegrpc", "nginxgrpc", 1.0),
)
# Every target's rows: those of the ratios, then the others'.
TARGET_ROWS = dict([(t, (a, b)) for t, a, b, _ in RATIO_TARGETS] + [
    ("three_limits_one_call", ("sluice3",)), ("redis_calls_allowed", ("sluice1", "sluice3")),
    ("redis_cpu_allowed", ("sluice1",)), ("flood_no_redis", ("sluiceflood",)),
    ("h2_flood_no_redis", ("sluiceh2flood",)), ("rls_latency_half_rate", ("sluicerls",)),
])


def judge(rows, half, mem, conns, h2=None, unavailable=None):
    """Each target: value, limit, met. Script calls are counted by Redis for
    every request sluice decided, while wrk counts only those completed before
    it stopped: up to one request per connection is in flight at that moment,
    so the calls limits allow conns extra calls per run. Only the targets of
    the rows run are judged; a target of a row that could not run (sluice
    refused HTTP/2, say) is not met, with the reason in its note."""
    med = {k: v["median"] for k, v in rows.items()}
    unavailable = unavailable or {}

    def calls_limit(key):
        return 1.0 + conns / max(1, min(r["requests"] for r in rows[key]["reps"]))
    r = {}
    cpu = {k: med[k]["proxy_cpu_per_10k"] for k in med}
    # A ratio of a row that could not run is left without a value (issues
    # 20-22: sluice refused HTTP/2, say).
    for t, a, b, limit in RATIO_TARGETS:
        if a in med or a in unavailable:
            r[t] = (ratio(cpu.get(a), cpu.get(b)), limit)
    if "sluice1" in med:
        r["three_limits_one_call"] = (med["sluice3"]["redis_calls_per_req"], calls_limit("sluice3"))
        worst = max(("sluice1", "sluice3"),
                    key=lambda k: (med[k]["redis_calls_per_req"] or 0.0) - calls_limit(k))
        r["redis_calls_allowed"] = (med[worst]["redis_calls_per_req"], calls_limit(worst))
        r["redis_cpu_allowed"] = (med["sluice1"]["redis_cpu_per_10k"], 0.08)
        r["flood_no_redis"] = (med["sluiceflood"]["script_calls"], 0)
    if half:
        r["latency_half_rate"] = (half["sluice1"]["p99_ms"] - half["direct"]["p99_ms"], 0.5)
    if mem and mem.get("connected"):
        r["idle_rss"] = (mem["rss_kib_idle"] / 1024.0, 64.0)
    notes = {}
    if "sluiceh2flood" in med or "sluiceh2flood" in unavailable:
        r["h2_flood_no_redis"] = (med["sluiceh2flood"]["script_calls"]
                                  if "sluiceh2flood" in med else None, 0)
    if h2 is not None:
        r["idle_rss_h2"] = (h2["rss_kib_idle"] / 1024.0 if h2.get("connected") else None, 128.0)
        if h2.get("unavailable"):
            notes["idle_rss_h2"] = h2["unavailable"]
    if "sluicerls" in med or "sluicerls" in unavailable:
        rls_half = rows.get("sluicerls", {}).get("half_rate")
        r["rls_latency_half_rate"] = (rls_half["p99_ms"] if rls_half else None, 1.0)
    for t, keys in TARGET_ROWS.items():
        why = ["%s: %s" % (k, unavailable[k]) for k in keys if k in unavailable]
        if why:
            notes[t] = "; ".join(why)
    out = {}
    for k in TARGETS_DOC:               # in the order the targets are listed
        if k not in r:
            continue
        value, limit = r[k]
        out[k] = {"value": value, "limit": round(limit, 4), "target": TARGETS_DOC[k],
                  "met": value is not None and value <= limit + 1e-12}
        if k in notes:
            out[k]["note"] = "not measured: " + notes[k]
    # An allowed row that answered anything but 200 is not a valid figure.
    for k in ("sluice1", "sluice3"):
        if k in med and (med[k]["non2xx"] or med[k]["socket_errors"]):
            for t in ("allowed_vs_nginx", "allowed_vs_haproxy", "three_vs_one", "redis_cpu_allowed"):
                out[t]["met"] = False
                out[t]["note"] = "row %s had non-2xx responses or socket errors" % k
    for k, ts in (("sluiceh2", ("h2_tls_vs_nginx",)), ("sluicegrpc", ("grpc_vs_nginx",)),
                  ("sluicerls", ("rls_latency_half_rate",))):
        if k in med and (med[k]["non2xx"] or med[k]["socket_errors"]):
            for t in ts:
                out[t]["met"] = False
                out[t]["note"] = "row %s had non-2xx responses or stream errors" % k
    # A repetition that completed no request (a row that stalled) makes every
    # target of its row unmet, whatever the other repetitions gave.
    for t, ks in TARGET_ROWS.items():
        empty = [k for k in ks if med.get(k, {}).get("empty_reps")]
        if t in out and empty:
            out[t]["met"] = False
            out[t]["note"] = "a repetition of row %s completed no request" % ", ".join(empty)
    return out


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def table_md(res):
    lines = ["| row | req/s | p50 ms | p99 ms | proxy CPU-s/10k | Redis CPU-s/10k | Redis calls/req | non-2xx | socket errors |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key, label, _, _ in ROWS:
        if key not in res["rows"]:
            continue
        if "unavailable" in res["rows"][key]:
            lines.append("| %s (not measured) |%s" % (label, " - |" * 8))
            continue
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
    if any(k in H2LOAD_ROWS for k in res["rows"]):
        L += ["Rows 12-19: h2load -t1 -c%d -m10 (row 19: -m50) -D%ds, %d repetitions interleaved "
              "with the others, medians; p50 and p99 from h2load's per-request log." % (
                  H2_CONNS, res["h2_duration_s"], res["reps"]), ""]
    for key, row in res["rows"].items():
        if "unavailable" in row:
            L += ["%s: not measured: %s" % (row["label"], row["unavailable"]), ""]
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
    mem = res.get("memory_h2")
    if mem:
        if mem.get("unavailable"):
            L += ["HTTP/2 memory: not measured: %s." % mem["unavailable"], ""]
        else:
            L += ["HTTP/2 memory: sluice RSS %.1f MiB at start, %.1f MiB with %d h2c connections "
                  "past the preface and SETTINGS, %.1f MiB with them idle after one GET each "
                  "(%d answered 200)." % (
                      mem["rss_kib_start"] / 1024, mem["rss_kib_connected"] / 1024,
                      mem["connected"], mem["rss_kib_idle"] / 1024, mem["answered"]), ""]
    rls = res["rows"].get("sluicerls")
    if rls and "median" in rls:
        L += ["The decision service (row 19, RLS ShouldRateLimit, one descriptor) beside the proxy "
              "path (row 2, one limit, proxied); p99 at half of each one's peak rate:", "",
              "| row | calls per proxy CPU-s | Redis CPU-s/10k | Redis calls per call | "
              "p99 ms at half rate |", "|---|---:|---:|---:|---:|"]
        for key, half in (("sluicerls", rls.get("half_rate")),
                          ("sluice1", (res.get("half_rate") or {}).get("sluice1"))):
            if key not in res["rows"]:
                continue
            m = res["rows"][key]["median"]
            per_s = 10000 / m["proxy_cpu_per_10k"] if m["proxy_cpu_per_10k"] else None
            L.append("| %s | %s | %s | %s | %s |" % (
                res["rows"][key]["label"], fmt(per_s, ".0f"), fmt(m["redis_cpu_per_10k"], ".4f"),
                fmt(m["redis_calls_per_req"], ".4f"), fmt(half and half["p99_ms"], ".3f")))
        L.append("")
    L += ["| target | value | limit | met |", "|---|---:|---:|---|"]
    for k, t in res["targets"].items():
        L.append("| %s | %s | %s | %s |" % (t["target"], fmt(t["value"], ".3f"), t["limit"],
                                           "yes" if t["met"] else "**no**" + (
                                               " (%s)" % t["note"] if t.get("note") else "")))
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
    shown = [k for k, _, _, _ in ROWS if "median" in res["rows"].get(k, {})]
    with open(data, "w") as f:
        for i, key in enumerate(shown):
            v = res["rows"][key]["median"]["proxy_cpu_per_10k"] or 0.0
            f.write('%d "%s" %.6f\n' % (i, PLOT_LABELS[key], v))
    subprocess.run(["gnuplot", "-e", "datafile='%s'; outfile='%s'; subtitle='%s'; width=%d" % (
        data, png, "%s, %s, wrk -c%d%s, median of %d" % (
            res["started"][:10], res["machine"]["cpu_model"], res["conns"],
            ", h2load -c%d" % H2_CONNS if any(k in H2LOAD_ROWS for k in shown) else "", res["reps"]),
        max(1100, 100 * len(shown))),
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
            "redis": version(["redis-server", "--version"]), "wrk": version(["wrk", "-v"]),
            "h2load": version(["h2load", "--version"])}


# --------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description="sluice vs nginx vs HAProxy (issue 5)")
    ap.add_argument("--duration", type=int, default=int(os.environ.get("BENCH_DURATION", 10)),
                    help="seconds per measured wrk run (default 10)")
    ap.add_argument("--h2-duration", type=int, default=None,
                    help="seconds per measured h2load run, rows 12-19 (default: --duration, at most 4)")
    ap.add_argument("--warmup", type=int, default=2, help="seconds of warm-up before each run "
                    "(h2load's rows: at most 1)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--conns", type=int, default=64)
    ap.add_argument("--idle", type=int, default=10000, help="idle client connections for the RSS figure")
    ap.add_argument("--groups", default=",".join(GROUPS),
                    help="row groups to run, comma-separated (default: all): " + ", ".join(
                        "%s (%s)" % (g, " ".join(k for k, l, _, _ in ROWS if k in rows_) or "RSS")
                        for g, rows_ in GROUPS.items()))
    ap.add_argument("--sluice", default=os.environ.get("SLUICE_BIN", os.path.join(ROOT, "build", "sluice")))
    ap.add_argument("--out", default=os.path.join(BENCH, "results"))
    ap.add_argument("--png", default=os.path.join(ROOT, "docs", "performance.png"))
    args = ap.parse_args()
    groups = [g for g in args.groups.split(",") if g]
    if not groups or any(g not in GROUPS for g in groups):
        ap.error("--groups: one or more of " + ",".join(GROUPS))
    selected = {k for g in groups for k in GROUPS[g]}
    h2_duration = args.h2_duration or min(args.duration, 4)
    h2_warmup = min(args.warmup, 1)
    tools = ["nginx", "redis-server"]
    tools += ["wrk"] if {"http1", "tls", "memory"} & set(groups) else []
    tools += ["haproxy"] if {"http1", "h2"} & set(groups) else []
    tools += ["h2load"] if {"h2", "grpc", "rls"} & set(groups) else []
    for tool in tools:
        if not shutil.which(tool):
            sys.exit("bench: %s not found (make bench installs it)" % tool)
    for module, deb, needed in (("grpc", "python3-grpcio", {"grpc", "rls"}),
                                ("hpack", "python3-hpack", {"h2"})):
        if needed & set(groups):
            try:
                __import__(module)
            except ImportError:
                sys.exit("bench: %s not found (make bench installs it)" % deb)
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
           "conns": args.conns, "groups": groups, "h2_duration_s": h2_duration,
           "rows": {}, "problems": []}
    try:
        unavailable = {}
        ports, redis_pid, rows = start_everything(procs, tmp, args.sluice, selected, unavailable)
        redis = Redis(ports["redis"])
        res["problems"] += sanity(rows)
        for key, label, _, _ in ROWS:
            if key in unavailable:
                res["rows"][key] = {"label": label, "unavailable": unavailable[key]}
                res["problems"].append("%s: not measured: %s" % (label, unavailable[key]))
        active = [(k, label) for k, label, _, _ in ROWS if k in rows]
        reps = {k: [] for k, _ in active}
        for rep in range(args.reps):
            for key, label in active:
                port, pid = rows[key]
                h2 = key in H2LOAD_ROWS
                if h2 and h2_warmup:
                    run_h2load(procs, port, h2_warmup, key)
                elif args.warmup and not h2:
                    run_wrk(procs, port, args.warmup, args.conns, key=key)
                r = measure(procs, redis, port, pid, h2_duration if h2 else args.duration,
                            args.conns, key=key)
                reps[key].append(r)
                log("rep %d %-32s %8.0f req/s  p99 %s ms  cpu %s s/10k  redis %s s/10k  "
                    "calls %s/req  non2xx %d" % (rep + 1, label, r["rps"], fmt(r["p99_ms"], "7.3f"),
                                                 fmt(r["proxy_cpu_per_10k"], ".3f"),
                                                 fmt(r["redis_cpu_per_10k"], ".4f"),
                                                 fmt(r["redis_calls_per_req"], ".3f"), r["non2xx"]))
        for key, label in active:
            res["rows"][key] = {"label": label, "reps": reps[key], "median": medians(reps[key])}
            m = res["rows"][key]["median"]
            if m["empty_reps"]:
                res["problems"].append("%s: %d of %d repetitions completed no request" % (
                    label, m["empty_reps"], len(reps[key])))
            if key not in FLOOD_ROWS and (m["non2xx"] or m["socket_errors"]):
                res["problems"].append("%s: %d non-2xx responses, %d socket errors over %d requests" % (
                    label, m["non2xx"], m["socket_errors"], m["requests"]))
            if key in FLOOD_ROWS and m["non2xx"] < m["requests"] * 0.99:
                res["problems"].append("%s: only %d of %d requests were rejected" % (
                    label, m["non2xx"], m["requests"]))

        # Latency at half of sluice's peak rate, direct and through sluice.
        half = None
        if "sluice1" in rows and "direct" in rows:
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

        # The decision service at half of its peak rate: h2load --rps paces
        # each connection (sent on schedule, whatever the answers: open loop).
        if "sluicerls" in rows and not res["rows"]["sluicerls"]["median"]["rps"]:
            res["problems"].append("19: no calls answered, no half-rate figure")
        elif "sluicerls" in rows:
            port, pid = rows["sluicerls"]
            rate = res["rows"]["sluicerls"]["median"]["rps"] / 2
            runs = []
            for rep in range(args.reps):
                run_h2load(procs, port, 1, "sluicerls", rps=rate / H2_CONNS)
                r = measure(procs, redis, port, pid, h2_duration, args.conns, key="sluicerls",
                            rps=rate / H2_CONNS)
                runs.append(r)
                log("RLS half rate rep %d %8.0f calls/s  p50 %s ms  p99 %s ms" % (
                    rep + 1, r["rps"], fmt(r["p50_ms"], ".3f"), fmt(r["p99_ms"], ".3f")))
            res["rows"]["sluicerls"]["half_rate"] = dict(medians(runs), rate=rate)

        mem = None
        if "memory" in groups:
            res["memory"] = memory(procs, tmp, args.sluice, ports, redis, args.idle)
            mem = res["memory"]
            if mem["connected"] < args.idle or mem["answered"] < mem["connected"] or not mem["alive"]:
                res["problems"].append("memory: %d of %d connected, answers %s, sluice alive: %s" % (
                    mem["connected"], args.idle, json.dumps(mem["statuses"]), mem["alive"]))
            if mem["keys_without_ttl"]:
                res["problems"].append("memory: %d keys without a TTL" % mem["keys_without_ttl"])
        if "h2" in groups:
            res["memory_h2"] = m2 = memory_h2(procs, tmp, args.sluice, ports, args.idle)
            if m2.get("unavailable"):
                res["problems"].append("HTTP/2 memory: not measured: " + m2["unavailable"])
            elif m2["connected"] < args.idle or m2["answered"] < m2["connected"] or not m2["alive"]:
                res["problems"].append(
                    "HTTP/2 memory: %d of %d connected, handshakes %s, answers %s, sluice alive: %s"
                    % (m2["connected"], args.idle, json.dumps(m2["handshakes"]),
                       json.dumps(m2["statuses"]), m2["alive"]))
        redis.close()

        measured = {k: v for k, v in res["rows"].items() if "median" in v}
        res["targets"] = judge(measured, half, mem, args.conns, res.get("memory_h2"), unavailable)
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
        print("%-4s %-58s %s (limit %s)%s" % ("ok" if t["met"] else "MISS", t["target"],
                                              fmt(t["value"], ".3f"), t["limit"],
                                              " " + t["note"] if t.get("note") else ""))
    for p in res["problems"]:
        print("problem: " + p)
    print("\nbench: %.0fs; results in %s, plot in %s" % (res["elapsed_s"], args.out, args.png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
