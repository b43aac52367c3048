# sluice - tests/integration/test_redis_reply_bounds.py: numbers in Redis's replies bounded.
#
# A hostile Redis, or anyone on the path of a plain redis:// connection, can
# change the integers limit.lua answers. A relay in this file sits between
# sluice and a real redis-server, reads both directions as RESP, and
# rewrites the integers of each EVALSHA reply: a denial of -2^63, a reset of
# 2^62, a delay wait of 10^12 ms. What sluice does with them must stay within
# what the limit allows (README: "Numbers from Redis"): Retry-After and the
# reset fields at most two windows, remaining at most the limit, a delayed
# request held at most its delay. Under SANITIZE=1 a signed overflow aborts
# (the fixture fails on the report).

import socket
import threading
import time

from conftest import http_get, make_conf, rl_headers
from test_redis_replies import HostileRedis, _Cmds

ROUTES = """\
  - name: fw
    match: { path: /fw }
    upstream: api
    limits:
      - { name: fw, algorithm: fixed_window, limit: 5, window: 10s, key: ["header:X-K"] }
  - name: smooth
    match: { path: /smooth }
    upstream: api
    limits:
      - { name: smooth, algorithm: gcra, rate: 1/s, burst: 1, delay: 3s, key: ["header:X-K"] }
"""

INT64_MIN = -(1 << 63)


class _Stream(_Cmds):
    """RESP values read from a socket, each with its raw bytes; a read that
    times out is tried again until stopping() (a value is never cut)."""

    def __init__(self, sock, stopping):
        super().__init__(sock)
        self.stopping = stopping

    def _fill(self):
        while True:
            try:
                return super()._fill()
            except socket.timeout:
                if self.stopping():
                    raise ConnectionError("stopping")

    def value(self):
        """(python value, raw bytes): arrays as lists, integers as ints,
        bulk strings as bytes, simple strings and errors as their line."""
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"*":
            n = int(rest)
            if n < 0:
                return None, line + b"\r\n"
            raw, items = line + b"\r\n", []
            for _ in range(n):
                v, r = self.value()
                items.append(v)
                raw += r
            return items, raw
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None, line + b"\r\n"
            while len(self.buf) < n + 2:
                self._fill()
            data, self.buf = self.buf[:n], self.buf[n + 2:]
            return data, line + b"\r\n" + data + b"\r\n"
        if kind == b":":
            return int(rest), line + b"\r\n"
        return line, line + b"\r\n"


def _ints(values):
    return b"*%d\r\n" % len(values) + b"".join(b":%d\r\n" % v for v in values)


class RewritingRelay(HostileRedis):
    """Relays every connection to the real Redis (HostileRedis with nothing
    hostile); the reply to each EVALSHA/EVAL that is an array of integers
    goes through rewrite(ints) (which returns the integers to send, or None
    to leave it)."""

    def __init__(self, relay_port, rewrite):
        self.rewrite, self.rewritten = rewrite, 0
        super().__init__(None, relay_port)

    def _relay(self, c):
        try:
            r = socket.create_connection(("127.0.0.1", self.relay_port), timeout=2.0)
        except OSError:
            c.close()
            return
        names = []              # command names in order, for their replies
        cond = threading.Condition()
        t = threading.Thread(target=self._down, args=(r, c, names, cond), daemon=True)
        self.threads.append(t)
        t.start()
        self._up(c, r, names, cond)
        t.join(2.0)
        c.close()
        r.close()

    def _up(self, c, r, names, cond):
        def each(v, raw):
            with cond:
                names.append(v[0].upper() if isinstance(v, list) and v else b"")
                cond.notify()
            return raw
        self._pipe(c, r, each)

    def _down(self, r, c, names, cond):
        def each(v, raw):
            with cond:
                cond.wait_for(lambda: names or self.stopping, timeout=2.0)
                name = names.pop(0) if names else b""
            if name in (b"EVALSHA", b"EVAL") and isinstance(v, list) and \
                    all(isinstance(x, int) for x in v):
                new = self.rewrite(list(v))
                if new is not None:
                    self.rewritten += 1
                    return _ints(new)
            return raw
        self._pipe(r, c, each)

    def _pipe(self, src, dst, each):
        """RESP values from src to dst, each as each(value, raw) returns it."""
        rd = _Stream(src, lambda: self.stopping)
        src.settimeout(0.2)
        try:
            while not self.stopping:
                v, raw = rd.value()
                dst.sendall(each(v, raw))
        except (OSError, ConnectionError):
            pass
        finally:
            self._close(src, dst)

    @staticmethod
    def _close(*socks):
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def on_relay(sluice, redis, rewrite):
    relay = RewritingRelay(redis.port, rewrite)
    s = sluice(make_conf(ROUTES, redis_timeout="2s"), redis_port=relay.port, wait_redis=False)
    deadline = time.monotonic() + 5
    while "connected" not in s.stderr and time.monotonic() < deadline:
        time.sleep(0.02)
    return relay, s


def seconds(v):
    return int(v.split(";t=")[1].split(",")[0]) if ";t=" in v else int(v)


def test_hostile_denial_and_reset_are_bounded(sluice, redis):
    mode = {}

    def rewrite(ints):
        # { time_s, time_us, v, reset_ms }: one request of one limit
        if len(ints) != 4 or "how" not in mode:
            return None
        if mode["how"] == "deny":
            return ints[:2] + [INT64_MIN, 1 << 62]
        return ints[:2] + [1 << 62, 1 << 62]            # allowed, absurd numbers

    relay, s = on_relay(sluice, redis, rewrite)
    try:
        mode["how"] = "allow"
        r = http_get(s.port, "/fw", headers=[("X-K", "a")], timeout_s=8)
        h = rl_headers(r)
        assert relay.rewritten >= 1
        assert r.status == 200, (r.status, h)
        assert int(h["X-RateLimit-Remaining"]) <= 5, h
        assert 0 <= int(h["X-RateLimit-Reset"]) <= 20, h        # two windows of 10 s
        assert 0 <= seconds(h["RateLimit"]) <= 20, h
        mode["how"] = "deny"
        r = http_get(s.port, "/fw", headers=[("X-K", "d")], timeout_s=8)
        h = rl_headers(r)
        assert r.status == 429, (r.status, h)
        assert 1 <= int(h["Retry-After"]) <= 20, h
        assert 1 <= int(h["X-RateLimit-Reset"]) <= 20, h
        assert h["X-RateLimit-Remaining"] == "0", h
        assert s.proc.poll() is None, s.stderr[-3000:]
    finally:
        relay.stop()


def test_hostile_delay_wait_is_bounded_by_the_delay(sluice, redis):
    mode = {}

    def rewrite(ints):
        # { time_s, time_us, v, reset_ms, wait_ms }: a delay limit
        if len(ints) != 5 or "on" not in mode:
            return None
        return ints[:2] + [0, 1 << 40, 10 ** 12]        # admitted, held 31 years

    relay, s = on_relay(sluice, redis, rewrite)
    try:
        mode["on"] = True
        t0 = time.monotonic()
        r = http_get(s.port, "/smooth", headers=[("X-K", "w")], timeout_s=10)
        took = time.monotonic() - t0
        print("a wait of 10^12 ms from Redis held the request %.2f s (delay: 3s)" % took)
        assert relay.rewritten >= 1
        assert r.status == 200, r
        assert took < 3.0 + 2.5, took       # the delay, plus a loaded machine's margin
        assert 0 <= int(rl_headers(r)["X-RateLimit-Reset"]) <= 3 + 1 + 1, rl_headers(r)
    finally:
        relay.stop()
