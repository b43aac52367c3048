# sluice - tests/integration/loadlib.py: load, process figures and failing
# peers, for the tests of client limits, faults, scale and memory.
#
# Config with the client limits and max_connections, process figures read
# from /proc (CPU time, RSS, open fds), Redis INFO commandstats, a bounded
# threaded keep-alive load generator that records every outcome with its
# time, and a small upstream of our own that resets mid-response. Every loop
# is bounded in count and time; every process is ended by PID.

import os
import signal
import socket
import subprocess
import threading
import time

from proxylib import LoopbackServer
from conftest import (PYTHON, UPSTREAM_PY, Conn, build_request, make_conf, redis_cmd,
                      stop_process, wait_port)

CLK_TCK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------- config ----

def client_conf(routes, client=None, top=None, workers=1, **kw):
    """make_conf() plus `client:` keys (dict name -> YAML scalar) and
    top-level keys (dict), e.g. client={"header_timeout": "1s"},
    top={"max_connections": 20}."""
    text = make_conf(routes, **kw)
    if client:
        extra = "".join("  %s: %s\n" % (k, v) for k, v in client.items())
        assert "client:\n" in text
        text = text.replace("client:\n", "client:\n" + extra, 1)
    head = "workers: %d\n" % workers
    for k, v in (top or {}).items():
        head += "%s: %s\n" % (k, v)
    assert "workers: 1\n" in text
    return text.replace("workers: 1\n", head, 1)


# ------------------------------------------------------------ /proc bits ----

def proc_cpu_s(pid):
    """User + system CPU seconds of a process (all its threads)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK   # utime, stime


def proc_rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS for %d" % pid)


def proc_fds(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


# ---------------------------------------------------------------- redis ----

def commandstats(redis_port):
    """{command: calls} from INFO commandstats ("script|load" style names)."""
    info = redis_cmd(redis_port, "INFO", "commandstats").decode()
    out = {}
    for line in info.splitlines():
        if line.startswith("cmdstat_"):
            name, _, rest = line[len("cmdstat_"):].partition(":")
            out[name] = int(rest.split("calls=")[1].split(",")[0])
    return out


def kill_redis(srv):
    """SIGKILL a conftest.RedisServer by PID (no clean shutdown)."""
    if srv.proc is not None:
        os.kill(srv.proc.pid, signal.SIGKILL)
        srv.proc.wait(timeout=5)
        srv.proc = None


# ------------------------------------------------------ load generator ----

class Outcome:
    __slots__ = ("t_sent", "t_done", "status", "limited_by_redis", "error")

    def __init__(self, t_sent, t_done, status, limited_by_redis, error):
        self.t_sent = t_sent            # monotonic, when the request was written
        self.t_done = t_done            # monotonic, when the answer (or error) came
        self.status = status            # None on error
        self.limited_by_redis = limited_by_redis   # carried X-RateLimit-Limit
        self.error = error              # exception text, or None


class Load:
    """`conns` threads, each on its own keep-alive connection, sending GET
    path back to back for at most duration_s (or until stop()). Each request
    may carry a fresh X-K header (unique_key) so a per-key limit never denies.
    Every outcome is kept (bounded by max_outcomes) for the test to judge."""

    def __init__(self, port, path="/load", conns=4, duration_s=10.0, unique_key=True,
                 headers=None, max_outcomes=400000, pause_s=0.0):
        self.port, self.path, self.unique_key = port, path, unique_key
        self.headers = list(headers or [])
        self.deadline = time.monotonic() + duration_s
        self.stop_ev = threading.Event()
        self.lock = threading.Lock()
        self.outcomes = []
        self.max_outcomes = max_outcomes
        self.pause_s = pause_s
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                        for i in range(conns)]

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def _record(self, o):
        with self.lock:
            if len(self.outcomes) < self.max_outcomes:
                self.outcomes.append(o)

    def _run(self, tid):
        conn, n = None, 0
        while not self.stop_ev.is_set() and time.monotonic() < self.deadline:
            n += 1
            hdrs = list(self.headers)
            if self.unique_key:
                hdrs.append(("X-K", "t%d-%d-%d" % (tid, n, id(self))))
            t0 = time.monotonic()
            try:
                if conn is None:
                    conn = Conn(self.port, timeout_s=5.0)
                conn.send(build_request("GET", self.path, hdrs))
                r = conn.read_response()
            except (OSError, EOFError, ValueError, AssertionError) as e:
                self._record(Outcome(t0, time.monotonic(), None, False,
                                     "%s: %s" % (type(e).__name__, e)))
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.01)
                continue
            self._record(Outcome(t0, time.monotonic(), r.status,
                                 r.header("X-RateLimit-Limit") is not None, None))
            if (r.header("Connection") or "").lower() == "close":
                conn.close()
                conn = None
            if self.pause_s:
                time.sleep(self.pause_s)
        if conn is not None:
            conn.close()

    def stop(self):
        self.stop_ev.set()
        for t in self.threads:
            t.join(timeout=10)
        assert not any(t.is_alive() for t in self.threads), "load threads stuck"
        return self

    def snapshot(self):
        with self.lock:
            return list(self.outcomes)


def summarize(outcomes):
    """{"total", "errors", "status": {code: n}, "redis_decided"}."""
    out = {"total": len(outcomes), "errors": 0, "status": {}, "redis_decided": 0}
    for o in outcomes:
        if o.error:
            out["errors"] += 1
        else:
            out["status"][o.status] = out["status"].get(o.status, 0) + 1
        if o.limited_by_redis:
            out["redis_decided"] += 1
    return out


def percentile(values, p):
    if not values:
        return 0.0
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100.0 * (len(v) - 1))))]


# ------------------------------------------------------------ upstreams ----

class EchoUpstreamAt:
    """tests/upstream.py on a fixed port, so a test can kill it and bring it
    back on the same address."""

    def __init__(self, port):
        self.port = port
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen([PYTHON, UPSTREAM_PY, "--port", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not wait_port(self.port, self.proc):
            self.stop()
            raise RuntimeError("echo upstream did not start on %d" % self.port)
        return self

    def kill(self):
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)
            self.proc = None

    def stop(self):
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None


class ResetUpstream(LoopbackServer):
    """An HTTP/1.1 upstream in this process:
      /reset   head with Content-Length: RESET_TOTAL, RESET_SENT body bytes,
               then an RST (SO_LINGER 0) instead of the rest
      other    200 with OK_BYTES bytes after OK_DELAY_S, keep-alive."""

    RESET_TOTAL = 100000
    RESET_SENT = 50000
    OK_BYTES = 20000
    OK_DELAY_S = 0.005

    BACKLOG = 128

    def __init__(self):
        self.resets = 0
        super().__init__()

    def _serve(self, s):
        buf = b""
        try:
            for _ in range(100000):
                if self.stopping.is_set():
                    return
                while b"\r\n\r\n" not in buf:
                    data = s.recv(65536)
                    if not data or len(buf) > 65536:
                        return
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                target = head.split(b" ", 2)[1]
                if target.startswith(b"/reset"):
                    s.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n"
                              % self.RESET_TOTAL + b"r" * self.RESET_SENT)
                    time.sleep(0.05)
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                 b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    with self.lock:
                        self.resets += 1
                    return
                time.sleep(self.OK_DELAY_S)
                s.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % self.OK_BYTES
                          + b"k" * self.OK_BYTES)
        except OSError:
            return
        finally:
            s.close()


def report(name, **figures):
    """Print one line of measured figures (shown with pytest -s, and kept in
    the captured output of a failing test)."""
    print("HARD-FIGURES %s %s" % (name, " ".join("%s=%s" % kv for kv in figures.items())),
          flush=True)
