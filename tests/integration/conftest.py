# sluice - tests/integration/conftest.py: real processes for the integration tests.
#
# Starts a real redis-server and the echo upstream (tests/upstream.py) on free
# loopback ports, and a factory that runs the sluice binary (SLUICE_BIN) with
# a config written to tmp_path. Every process is ended by PID in a finalizer,
# so nothing is left running even when a test fails. Also holds the small
# clients the tests share: a RESP client (python3-redis is not installed) and
# a raw-socket HTTP/1.1 client for exact bytes.

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
UPSTREAM_PY = os.path.join(ROOT, "tests", "upstream.py")
PYTHON = "/usr/bin/python3"
START_TIMEOUT_S = 5.0
STOP_TIMEOUT_S = 5.0
WAIT_STEP_S = 0.02
SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")

sys.path.insert(0, os.path.join(ROOT, "tests"))


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-running test, run by make test-slow")


def sluice_bin():
    path = os.environ.get("SLUICE_BIN") or os.path.join(ROOT, "build", "sluice")
    if not os.path.exists(path):
        pytest.fail("sluice binary not found at %s (set SLUICE_BIN)" % path)
    return path


_PORTS_GIVEN = set()


def free_port():
    """A free loopback port, never one this run handed out before: the kernel
    may give the same port to two calls in a row (both closed before either
    is bound), and a test's listen and admin ports must differ."""
    for _ in range(64):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        if port not in _PORTS_GIVEN:
            break
    _PORTS_GIVEN.add(port)
    return port


def wait_until(probe, timeout_s=START_TIMEOUT_S, until=bool, step_s=WAIT_STEP_S,
               proc=None, what=None):
    """The tests' one wait: call probe() every step_s until until(value) holds,
    timeout_s has passed or proc (a Popen) has exited. Returns (value, seconds
    taken): the first value until() accepted, else the last one read. With
    `what`, a timeout raises AssertionError("timed out waiting for WHAT")
    instead. probe runs at least once, the last time after the deadline."""
    t0 = time.monotonic()
    while True:
        value = probe()
        took = time.monotonic() - t0
        if until(value):
            return value, took
        if took >= timeout_s or (proc is not None and proc.poll() is not None):
            if what is not None:
                raise AssertionError("timed out waiting for %s (%.1f s); last: %r"
                                     % (what, took, value))
            return value, took
        time.sleep(step_s)


def port_open(port, host="127.0.0.1"):
    try:
        socket.create_connection((host, port), timeout=0.2).close()
        return True
    except OSError:
        return False


def wait_port(port, proc=None, timeout_s=START_TIMEOUT_S, host="127.0.0.1"):
    """True once host:port accepts; False on timeout or process exit."""
    return wait_until(lambda: port_open(port, host), timeout_s, step_s=0.03, proc=proc)[0]


def server_conns(port):
    """Connections the server on `port` still holds: sockets whose local port
    is `port` in ESTABLISHED or CLOSE_WAIT (a peer's close the server has not
    read yet), from /proc/net/tcp{,6}. TIME_WAIT and FIN_WAIT hold no
    descriptor and do not count."""
    n = 0
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if int(cols[1].rsplit(":", 1)[1], 16) == port and cols[3] in ("01", "08"):
                n += 1
    return n


def wait_conns_closed(port, proc=None, timeout_s=5.0):
    """Wait until the server on `port` has closed every connection made to it
    so far (wait_port's probe included), so that a test counting against
    max_connections starts from none (its accept loop may take a burst of new
    connections before it reads the probe's close)."""
    wait_until(lambda: server_conns(port), timeout_s, until=lambda n: n == 0,
               step_s=0.02, proc=proc, what="connections to port %d to close" % port)


def stop_process(proc, sig=signal.SIGTERM, timeout_s=STOP_TIMEOUT_S):
    """Signal proc by PID, wait; kill on timeout. Returns the exit code or None."""
    if proc.poll() is not None:
        return proc.returncode
    try:
        os.kill(proc.pid, sig)
    except ProcessLookupError:
        pass
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout_s)
        return None


# ---------------------------------------------------------------- Redis ----

class RedisError(Exception):
    pass


def _resp_encode(args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if not isinstance(a, bytes):
            a = str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class _RespReader:
    def __init__(self, sock):
        self.sock = sock
        self.buf = b""

    def _line(self):
        while b"\r\n" not in self.buf:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("redis closed the connection")
            self.buf += data
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exact(self, n):
        while len(self.buf) < n + 2:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("redis closed the connection")
            self.buf += data
        out, self.buf = self.buf[:n], self.buf[n + 2:]
        return out

    def reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            return RedisError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self._exact(n)
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.reply() for _ in range(n)]
        raise RedisError("bad RESP reply: %r" % line)


def redis_cmd(port, *args, timeout_s=3.0):
    """Run one Redis command on a fresh connection; raises RedisError on -ERR."""
    return redis_cmds(port, [args], timeout_s=timeout_s)[-1]


def redis_cmds(port, cmds, timeout_s=3.0):
    """Run commands in order on one fresh connection (for AUTH, SELECT...);
    returns their replies; raises RedisError on the first -ERR."""
    out = []
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        reader = _RespReader(s)
        for args in cmds:
            s.sendall(_resp_encode(args))
            r = reader.reply()
            if isinstance(r, RedisError):
                raise r
            out.append(r)
    return out


def redis_time_s(port):
    sec, usec = redis_cmd(port, "TIME")
    return int(sec) + int(usec) / 1e6


def redis_keys(port):
    """Every key, by SCAN (bounded)."""
    keys, cursor = [], b"0"
    for _ in range(10000):
        cursor, batch = redis_cmd(port, "SCAN", cursor, "COUNT", 1000)
        keys += batch
        if cursor == b"0":
            return keys
    raise AssertionError("SCAN did not finish")


def redis_clients(port):
    """{client id: last command} of the clients connected to a Redis, or None
    when it does not answer."""
    try:
        text = redis_cmd(port, "CLIENT", "LIST", timeout_s=0.5).decode()
    except (OSError, ConnectionError, RedisError):
        return None
    out = {}
    for line in text.splitlines():
        fields = dict(f.split("=", 1) for f in line.split(" ") if "=" in f)
        out[fields.get("id")] = fields.get("cmd", "")
    return out


def wait_script_loaded(port, before, timeout_s=START_TIMEOUT_S):
    """Wait (bounded) until a client that was not in `before` has run SCRIPT
    LOAD or a script: the spec's per-connection handshake, after which sluice
    decides through Redis. Without it the first requests would meet on_error
    while sluice is still connecting (slow under sanitizers)."""
    def loaded():
        return any(cid not in before and (cmd.startswith("script") or cmd.startswith("eval"))
                   for cid, cmd in (redis_clients(port) or {}).items())
    if not wait_until(loaded, timeout_s)[0]:
        return False
    time.sleep(0.05)    # the reply is on its way to sluice
    return True


class RedisServer:
    def __init__(self, workdir, port=None, extra_args=(), password=None):
        self.port = port or free_port()
        self.workdir = workdir
        self.extra_args = list(extra_args)
        self.password = password
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", str(self.workdir),
             "--loglevel", "warning", "--daemonize", "no"] + self.extra_args +
            (["--requirepass", self.password] if self.password else []),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        auth = [("AUTH", self.password)] if self.password else []

        def pong():
            try:
                return redis_cmds(self.port, auth + [("PING",)], timeout_s=0.5)[-1] == "PONG"
            except (OSError, ConnectionError, RedisError):
                return False
        if wait_until(pong, START_TIMEOUT_S, step_s=0.05, proc=self.proc)[0]:
            return self
        self.stop()
        raise RuntimeError("redis-server did not start on port %d" % self.port)

    def stop(self):
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    srv = RedisServer(tmp_path_factory.mktemp("redis"))
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def redis(redis_server):
    """The session redis, flushed before each test."""
    if redis_server.proc is None or redis_server.proc.poll() is not None:
        redis_server.start()
    redis_cmd(redis_server.port, "FLUSHALL")
    return redis_server


@pytest.fixture
def own_redis(tmp_path):
    """A redis-server of this test's own, which the test may stop and restart."""
    srv = RedisServer(tmp_path)
    srv.start()
    yield srv
    srv.stop()


# ------------------------------------------------------------- upstream ----

class Upstream:
    def __init__(self):
        self.proc = subprocess.Popen([PYTHON, UPSTREAM_PY, "--port", "0"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        line = self.proc.stdout.readline()
        if not line.strip().isdigit():
            stop_process(self.proc)
            raise RuntimeError("upstream did not report its port")
        self.port = int(line)
        if not wait_port(self.port, self.proc):
            stop_process(self.proc)
            raise RuntimeError("upstream does not accept")

    def stats(self):
        r = http_get(self.port, "/__stats")
        return r.json()

    def stop(self):
        stop_process(self.proc)


@pytest.fixture(scope="session")
def upstream():
    up = Upstream()
    yield up
    up.stop()


# --------------------------------------------------------------- sluice ----

BASE_CONF = """\
listen: 127.0.0.1:@LISTEN_PORT@
workers: 1
client:
  max_header_bytes: @MAX_HEADER_BYTES@
redis:
  url: redis://127.0.0.1:@REDIS_PORT@/0
  timeout: @REDIS_TIMEOUT@
  prefix: "@PREFIX@"
  on_error: @ON_ERROR@
upstreams:
  api:
    servers: [127.0.0.1:@UPSTREAM_PORT@]
    keepalive: 8
    connect_timeout: 1s
    timeout: @UPSTREAM_TIMEOUT@
  dead:
    servers: [127.0.0.1:@DEAD_PORT@]
    keepalive: 2
    connect_timeout: 500ms
    timeout: 2s
@TRUSTED@
routes:
"""


def make_conf(routes, on_error="allow", redis_timeout="1s", prefix="itest:",
              upstream_timeout="5s", trusted=None, max_header_bytes=16384):
    """A whole config: BASE_CONF plus the routes (a YAML block, indented by 2).
    Redis gets 1 s by default: a test machine under ASan and load can take
    longer than a production budget, and a timed-out decision would turn an
    exact count into an on_error one. Tests of timeouts set their own."""
    text = BASE_CONF
    subst = {"@ON_ERROR@": on_error, "@REDIS_TIMEOUT@": redis_timeout,
             "@PREFIX@": prefix, "@UPSTREAM_TIMEOUT@": upstream_timeout,
             "@MAX_HEADER_BYTES@": str(max_header_bytes),
             "@TRUSTED@": "trusted_proxies: [%s]" % ", ".join(trusted) if trusted else ""}
    for k, v in subst.items():
        text = text.replace(k, v)
    return text + routes


class Sluice:
    def __init__(self, proc, port, conf_path, stderr_path):
        self.proc = proc
        self.port = port
        self.conf_path = conf_path
        self.stderr_path = stderr_path

    @property
    def stderr(self):
        with open(self.stderr_path, "rb") as f:
            return f.read().decode("utf-8", "replace")


@pytest.fixture
def sluice(tmp_path, redis_server, upstream):
    """Factory: sluice(yaml_text, redis_port=, upstream_port=, env=) -> Sluice.

    When the Redis answers, waits (bounded) for sluice's connection to it.
    @LISTEN_PORT@, @REDIS_PORT@, @UPSTREAM_PORT@ and @DEAD_PORT@ (a port with
    nothing listening) are substituted. At teardown each instance gets SIGTERM
    and must exit 0 within 5 s."""
    started = []

    def start(yaml_text, redis_port=None, upstream_port=None, env=None,
              listen_port=None, wait_redis=True, listen_host="127.0.0.1"):
        port = listen_port or free_port()
        rport = redis_port or redis_server.port
        before = redis_clients(rport) if wait_redis else None
        text = (yaml_text.replace("@LISTEN_PORT@", str(port))
                .replace("@REDIS_PORT@", str(rport))
                .replace("@UPSTREAM_PORT@", str(upstream_port or upstream.port))
                .replace("@DEAD_PORT@", str(free_port())))
        n = len(started)
        conf_path = tmp_path / ("sluice%d.yaml" % n)
        conf_path.write_text(text)
        stderr_path = tmp_path / ("sluice%d.stderr" % n)
        full_env = dict(os.environ)
        full_env.update(env or {})
        with open(stderr_path, "wb") as errf:
            proc = subprocess.Popen([sluice_bin(), "-c", str(conf_path)],
                                    stdout=subprocess.DEVNULL, stderr=errf, env=full_env)
        s = Sluice(proc, port, conf_path, stderr_path)
        started.append(s)
        if not wait_port(port, proc, host=listen_host):
            pytest.fail("sluice did not start listening on %d (exit %r); stderr:\n%s"
                        % (port, proc.poll(), s.stderr))
        if before is not None:
            wait_script_loaded(rport, before)
        return s

    yield start

    failures = []
    for s in started:
        was_running = s.proc.poll() is None
        rc = stop_process(s.proc)
        if was_running and rc != 0:
            failures.append("sluice on %d exited %r after SIGTERM; stderr:\n%s"
                            % (s.port, rc, s.stderr[-3000:]))
        elif any(m in s.stderr for m in SANITIZER_MARKS):
            failures.append("sluice on %d: sanitizer report:\n%s" % (s.port, s.stderr[-5000:]))
    if failures:
        pytest.fail("\n".join(failures))


# ------------------------------------------------------------ raw HTTP ----

class Response:
    def __init__(self, version, status, reason, headers, body, chunked):
        self.version = version
        self.status = status
        self.reason = reason
        self.headers = headers          # [(name, value)] in received order
        self.body = body
        self.chunked = chunked

    def header(self, name, default=None):
        for n, v in self.headers:
            if n.lower() == name.lower():
                return v
        return default

    def header_all(self, name):
        return [v for n, v in self.headers if n.lower() == name.lower()]

    def json(self):
        return json.loads(self.body.decode())

    def __repr__(self):
        return "<Response %d %r %r>" % (self.status, self.headers, self.body[:300])


class Conn:
    """One client connection for exact bytes; every read is bounded by timeout."""

    def __init__(self, port, timeout_s=5.0, host="127.0.0.1"):
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.buf = b""
        self.timeout_s = timeout_s

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send(self, data):
        self.sock.sendall(data)

    def _fill(self):
        data = self.sock.recv(1 << 20)
        if not data:
            raise EOFError("connection closed")
        self.buf += data

    def _until(self, delim, limit=1 << 20):
        while delim not in self.buf:
            if len(self.buf) > limit:
                raise AssertionError("no %r in %d bytes" % (delim, limit))
            self._fill()
        out, self.buf = self.buf.split(delim, 1)
        return out

    def _exact(self, n):
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_response(self, head_request=False):
        while True:
            head = self._until(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            version, _, rest = lines[0].decode("latin-1").partition(" ")
            code, _, reason = rest.partition(" ")
            status = int(code)
            headers = []
            for line in lines[1:]:
                n, _, v = line.decode("latin-1").partition(":")
                headers.append((n, v.strip()))
            if 100 <= status < 200 and status != 101:
                continue
            break
        resp = Response(version, status, reason, headers, b"", False)
        te = ",".join(resp.header_all("Transfer-Encoding")).lower()
        if head_request or status in (204, 304):
            return resp
        if "chunked" in te:
            resp.chunked = True
            parts = []
            while True:
                size = int(self._until(b"\r\n").split(b";")[0], 16)
                if size == 0:
                    break
                parts.append(self._exact(size))
                assert self._exact(2) == b"\r\n"
            while self._until(b"\r\n") != b"":
                pass
            resp.body = b"".join(parts)
        elif resp.header("Content-Length") is not None:
            resp.body = self._exact(int(resp.header("Content-Length")))
        else:
            try:
                while True:
                    self._fill()
            except EOFError:
                pass
            resp.body, self.buf = self.buf, b""
        return resp

    def is_closed(self, wait_s=2.0):
        """True when the peer closes (EOF or reset) within wait_s with no more bytes."""
        self.sock.settimeout(wait_s)
        try:
            data = self.sock.recv(65536)
        except socket.timeout:
            return False
        except ConnectionResetError:
            return True
        finally:
            self.sock.settimeout(self.timeout_s)
        if data:
            self.buf += data
            return False
        return True


def build_request(method, target, headers=None, body=None, host="localhost",
                  version="HTTP/1.1"):
    lines = ["%s %s %s" % (method, target, version)]
    if host is not None:
        lines.append("Host: %s" % host)
    for n, v in (headers or []):
        lines.append("%s: %s" % (n, v))
    if body is not None and not any(n.lower() in ("content-length", "transfer-encoding")
                                    for n, _ in (headers or [])):
        lines.append("Content-Length: %d" % len(body))
    data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return data + (body or b"")


def http_get(port, target, method="GET", headers=None, body=None, host="localhost",
             timeout_s=5.0):
    """One request on a new connection; returns the Response."""
    with Conn(port, timeout_s) as c:
        c.send(build_request(method, target, headers, body, host))
        return c.read_response(head_request=(method == "HEAD"))


def served_again(port, path, timeout_s=3.0):
    """True once GET path answers 200 (bounded); connection errors are retried."""
    def status():
        try:
            return http_get(port, path, timeout_s=1).status
        except (OSError, EOFError):
            return None
    return wait_until(status, timeout_s, until=lambda st: st == 200, step_s=0.1)[0] == 200


def read_log(path, want, timeout_s=3.0, keep=None):
    """The access log's lines, parsed (those keep(entry) accepts), once there
    are at least `want` of them or timeout_s has passed."""
    def read():
        if not os.path.exists(path):
            return []
        with open(path, "rb") as f:
            entries = [json.loads(ln) for ln in f.read().split(b"\n") if ln.strip()]
        return [e for e in entries if keep is None or keep(e)]
    return wait_until(read, timeout_s, until=lambda lines: len(lines) >= want, step_s=0.03)[0]


def timed_get(port, target="/", headers=None, timeout_s=10.0):
    """http_get() and how long it took: (Response, seconds)."""
    t0 = time.monotonic()
    r = http_get(port, target, headers=headers, timeout_s=timeout_s)
    return r, time.monotonic() - t0


def parallel(jobs, start_timeout_s=30.0, join_timeout_s=30.0):
    """Run the callables at once (one thread each, released together by a
    barrier); their results in order, an exception in place of the result
    of a job that raised (reported by the caller)."""
    out = [None] * len(jobs)
    start = threading.Barrier(len(jobs), timeout=start_timeout_s)

    def run(i):
        try:
            start.wait()
            out[i] = jobs[i]()
        except Exception as e:      # noqa: BLE001 - reported by the caller
            out[i] = e
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_timeout_s)
    assert not any(t.is_alive() for t in threads), "a job did not finish"
    return out


def raw_exchange(port, data, timeout_s=5.0):
    """Send raw bytes; returns (Response or None, closed_afterwards)."""
    with Conn(port, timeout_s) as c:
        c.send(data)
        try:
            resp = c.read_response()
        except (EOFError, ConnectionResetError):
            return None, True
        return resp, c.is_closed()


def rl_headers(resp):
    """The rate-limit headers of a response, as a dict (absent ones missing)."""
    out = {}
    for name in ("X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset",
                 "RateLimit", "RateLimit-Policy", "Retry-After"):
        v = resp.header(name)
        if v is not None:
            out[name] = v
    return out


def sleep_until_redis_phase(redis_port, window_s, phase_s, min_wait_s=0.0):
    """Sleep until Redis time is phase_s past a multiple of window_s (at least
    min_wait_s from now). Returns the Redis time of that window edge."""
    now = redis_time_s(redis_port)
    offset = now - time.time()
    edge = (int(now // window_s) + 1) * window_s
    while edge + phase_s - now < min_wait_s:
        edge += window_s
    target = edge + phase_s
    delay = target - now
    assert 0 <= delay < window_s + min_wait_s + 1
    time.sleep(max(0.0, target - offset - time.time()))
    return edge


def redis_with_limit_script(tmp_path_factory, tag):
    """A redis-server of the calling module's own with src/store/scripts/limit.lua
    loaded; yields (port, sha) and stops it by PID (for module fixtures)."""
    srv = RedisServer(tmp_path_factory.mktemp(tag))
    srv.start()
    try:
        path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__)))), "src", "store", "scripts", "limit.lua")
        with open(path, "rb") as f:
            sha = redis_cmd(srv.port, "SCRIPT", "LOAD", f.read()).decode()
        yield srv.port, sha
    finally:
        srv.stop()
