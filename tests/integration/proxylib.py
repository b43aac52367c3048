# sluice - tests/integration/proxylib.py: sluice with its admin endpoint, for
# the tests of operators' keys, metrics, reload, workers and the like.
#
# Config with the operator's top-level keys (workers, admin, access_log...),
# a Prometheus text parser for the admin endpoint, Redis INFO commandstats,
# a bounded threaded keep-alive load generator, and a tiny upstream of our
# own (rate-limit fields of its own, a 101 that then echoes bytes) for what
# tests/upstream.py does not do. Everything is bounded in time.

import re
import socket
import threading
import time

from conftest import (Conn, build_request, free_port, http_get, make_conf, redis_cmd,
                      wait_port, wait_until)


# --------------------------------------------------------------- config ----

def proxy_conf(routes, workers=1, top="", admin_port=None, extra_upstreams=None, **kw):
    """make_conf() plus top-level operator keys. `top` is raw YAML (each line
    at column 0, ending in a newline); extra_upstreams is {name: port}."""
    text = make_conf(routes, **kw)
    for name, port in (extra_upstreams or {}).items():
        text = text.replace("upstreams:\n", "upstreams:\n  %s:\n    servers: [127.0.0.1:%d]\n"
                            % (name, port), 1)
    extra = "workers: %s\n" % workers
    if admin_port:
        extra += "admin: { listen: 127.0.0.1:%d }\n" % admin_port
    extra += top
    assert "workers: 1\n" in text
    return text.replace("workers: 1\n", extra, 1)


def top_keys(**keys):
    """Top-level `key: value` lines for proxy_conf(top=...), the ones not None."""
    return "".join("%s: %s\n" % (k, v) for k, v in keys.items() if v)


def start_proxy(sluice, routes, workers=1, top="", admin=True, wait_redis=True,
              redis_port=None, upstream_port=None, extra_upstreams=None, **kw):
    """Start sluice with an admin listener; returns the Sluice with
    .admin_port set (None when admin=False)."""
    admin_port = free_port() if admin else None
    text = proxy_conf(routes, workers=workers, top=top, admin_port=admin_port,
                    extra_upstreams=extra_upstreams, **kw)
    s = sluice(text, wait_redis=wait_redis, redis_port=redis_port,
               upstream_port=upstream_port)
    s.admin_port = admin_port
    if admin_port and not wait_port(admin_port, s.proc):
        raise AssertionError("admin endpoint not listening on %d; stderr:\n%s"
                             % (admin_port, s.stderr))
    return s


# -------------------------------------------------------------- metrics ----

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text):
    """Prometheus text -> {(name, ((label, value), ...)): float}. Malformed
    sample lines raise: the exposition must be parseable."""
    out = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        assert m, "bad metrics line %r" % line
        labels = tuple(sorted(_LABEL.findall(m.group(2) or "")))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def metrics_text(admin_port):
    r = http_get(admin_port, "/metrics")
    assert r.status == 200, r
    return r.body.decode()


def metrics(admin_port):
    return parse_metrics(metrics_text(admin_port))


def mval(ms, name, **labels):
    """One series' value, 0.0 when absent (use has_series to tell)."""
    return ms.get((name, tuple(sorted(labels.items()))), 0.0)


def has_series(ms, name, **labels):
    return (name, tuple(sorted(labels.items()))) in ms


def series(ms, name):
    """{labels dict as tuple: value} of every series of one name."""
    return {k[1]: v for k, v in ms.items() if k[0] == name}


def wait_metric(admin_port, name, at_least, timeout_s=5.0, **labels):
    """Poll until the series reaches at_least; returns the last value."""
    return wait_until(lambda: mval(metrics(admin_port), name, **labels), timeout_s,
                      until=lambda v: v >= at_least, step_s=0.05)[0]


# ---------------------------------------------------------------- redis ----

def script_calls(redis_port):
    """Calls of EVALSHA plus EVAL so far, from INFO commandstats."""
    info = redis_cmd(redis_port, "INFO", "commandstats").decode()
    total = 0
    for line in info.splitlines():
        m = re.match(r"cmdstat_(evalsha|eval):calls=(\d+)", line)
        if m:
            total += int(m.group(2))
    return total


# ----------------------------------------------------------- http bits ----

def get(port, path, headers=None, host="localhost"):
    return http_get(port, path, headers=headers, host=host)


def statuses(port, path, n, headers=None, host="localhost"):
    """n requests on one keep-alive connection; their statuses."""
    out = []
    with Conn(port) as c:
        for _ in range(n):
            c.send(build_request("GET", path, headers, host=host))
            out.append(c.read_response().status)
    return out


def read_head(conn):
    """Read one response head only (for a 101 after which bytes flow).
    Returns (status, [(name, value)])."""
    head = conn._until(b"\r\n\r\n", limit=65536)
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ")[1])
    headers = []
    for line in lines[1:]:
        n, _, v = line.decode("latin-1").partition(":")
        headers.append((n.strip(), v.strip()))
    return status, headers


def recv_exact(conn, n, timeout_s=5.0):
    """n bytes from a Conn (its buffer first), bounded by timeout_s."""
    deadline = time.monotonic() + timeout_s
    while len(conn.buf) < n:
        if time.monotonic() > deadline:
            raise AssertionError("got %d of %d bytes" % (len(conn.buf), n))
        conn._fill()
    out, conn.buf = conn.buf[:n], conn.buf[n:]
    return out


# ------------------------------------------------------ load generator ----

class LoadGen:
    """Threads, each on its own keep-alive connection, sending GET `path`
    back to back until stop() or duration_s. A failure is any exception (refused,
    reset, timeout, a connection closed without an announced close) or a status
    not in ok_status. A response announcing `Connection: close` is fine: the
    thread reconnects."""

    def __init__(self, port, path, conns=4, duration_s=5.0, host="localhost",
                 headers=None, ok_status=(200,)):
        self.port, self.path, self.host = port, path, host
        self.headers = headers or []
        self.ok_status = ok_status
        self.deadline = time.monotonic() + duration_s
        self.stop_ev = threading.Event()
        self.lock = threading.Lock()
        self.ok = 0
        self.failures = []
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(conns)]

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def _fail(self, what):
        with self.lock:
            if len(self.failures) < 100:
                self.failures.append(what)
            else:
                self.failures.append("...")
                self.stop_ev.set()

    def _run(self):
        conn = None
        req = build_request("GET", self.path, self.headers, host=self.host)
        while not self.stop_ev.is_set() and time.monotonic() < self.deadline:
            try:
                if conn is None:
                    conn = Conn(self.port, timeout_s=5.0)
                conn.send(req)
                r = conn.read_response()
            except (OSError, EOFError, ValueError, AssertionError) as e:
                self._fail("%s: %s" % (type(e).__name__, e))
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.01)
                continue
            if r.status in self.ok_status:
                with self.lock:
                    self.ok += 1
            else:
                self._fail("status %d" % r.status)
            if (r.header("Connection") or "").lower() == "close":
                conn.close()
                conn = None
        if conn is not None:
            conn.close()

    def stop(self):
        self.stop_ev.set()
        for t in self.threads:
            t.join(timeout=10)
        assert not any(t.is_alive() for t in self.threads), "load threads stuck"
        return self


# -------------------------------------------------------- tiny upstream ----

class LoopbackServer:
    """A threaded test server on 127.0.0.1:<free port>: one thread accepts,
    one thread per connection runs self._serve(sock). stop() closes the
    listener and shuts every accepted socket down."""

    BACKLOG = 64

    def __init__(self):
        self.ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(self.BACKLOG)
        self.ls.settimeout(0.2)
        self.port = self.ls.getsockname()[1]
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.socks = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while not self.stopping.is_set():
            try:
                s, _ = self.ls.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            s.settimeout(10)
            with self.lock:
                self.socks.append(s)
            threading.Thread(target=self._serve, args=(s,), daemon=True).start()

    def _serve(self, s):
        raise NotImplementedError

    def stop(self):
        self.stopping.set()
        self.ls.close()
        with self.lock:
            for s in self.socks:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        self.thread.join(timeout=2)


class TinyUpstream(LoopbackServer):
    """An HTTP/1.1 upstream in this process, on threads, for what the echo
    upstream lacks:
      /rl?l=L&r=R&t=T  200 with its own X-RateLimit-* (L, R, T) and
                       RateLimit-Policy / RateLimit fields for a policy "up"
      /ws              with `Upgrade: websocket`: 101, sends b"hello\\n",
                       then echoes every byte back until the peer closes;
                       without it: 426
      anything else    200 "ok"
    It records the head of every request it read (self.heads)."""

    def __init__(self):
        self.heads = []
        super().__init__()

    def _serve(self, s):
        buf = b""
        try:
            while not self.stopping.is_set():
                while b"\r\n\r\n" not in buf:
                    data = s.recv(65536)
                    if not data:
                        return
                    buf += data
                    if len(buf) > 65536:
                        return
                head, buf = buf.split(b"\r\n\r\n", 1)
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                hdrs = [(n.strip().lower(), v.strip()) for n, _, v in
                        (line.partition(":") for line in lines[1:])]
                with self.lock:
                    self.heads.append((method, target, hdrs))
                path, _, query = target.partition("?")
                if path == "/ws":
                    if self._ws(s, hdrs, buf):
                        return
                    continue
                if path == "/rl":
                    q = dict(p.split("=", 1) for p in query.split("&") if "=" in p)
                    lim, rem, t = q.get("l", "100"), q.get("r", "1"), q.get("t", "30")
                    extra = ("X-RateLimit-Limit: %s\r\nX-RateLimit-Remaining: %s\r\n"
                             "X-RateLimit-Reset: %s\r\n"
                             "RateLimit-Policy: \"up\";q=%s;w=60\r\n"
                             "RateLimit: \"up\";r=%s;t=%s\r\n" % (lim, rem, t, lim, rem, t))
                else:
                    extra = ""
                s.sendall(("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n%s\r\nok"
                           % extra).encode())
        except OSError:
            return
        finally:
            s.close()

    def _ws(self, s, hdrs, rest):
        """True when the connection was upgraded (and is now finished)."""
        h = dict(hdrs)
        if h.get("upgrade", "").lower() != "websocket" or \
                "upgrade" not in h.get("connection", "").lower():
            s.sendall(b"HTTP/1.1 426 Upgrade Required\r\nContent-Length: 2\r\n\r\nno")
            return False
        s.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                  b"Connection: Upgrade\r\n\r\nhello\n")
        if rest:
            s.sendall(rest)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            data = s.recv(65536)
            if not data:
                break
            s.sendall(data)
        return True
