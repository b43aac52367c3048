# sluice - tests/integration/test_access_log.py: access log and X-Request-Id.
#
# One JSON object per request with every field issue 3 names, values checked
# against what was sent and received (bytes counted on the wire); SIGUSR1
# reopens the file after a rename (logrotate); X-Request-Id passed through or
# generated, seen upstream and in the response, also on a 429.

import os
import signal
import time
import uuid

import pytest

from conftest import Conn, build_request, http_get, read_log, wait_until
from proxylib import start_proxy

ROUTES = """\
  - name: logged
    match: { path: /logged }
    upstream: api
    limits:
      - { name: two, algorithm: sliding_log, limit: 2, window: 1m, key: ["header:X-K"] }
  - name: open
    match: { path: /open }
    upstream: api
"""

FIELDS = ("time", "client", "method", "path", "status", "route", "decision", "limit",
          "remaining", "upstream_time", "total_time", "bytes_in", "bytes_out")


class WireConn(Conn):
    """A Conn that counts the bytes it received."""

    def __init__(self, port):
        super().__init__(port)
        self.received = 0

    def _fill(self):
        before = len(self.buf)
        super()._fill()
        self.received += len(self.buf) - before


@pytest.fixture
def logged(sluice, redis, tmp_path):
    path = tmp_path / "access.log"
    s = start_proxy(sluice, ROUTES, workers=2, top="access_log: %s\n" % path)
    s.log_path = str(path)
    return s


def test_one_json_line_per_request(logged):
    key = uuid.uuid4().hex
    reqs = [build_request("GET", "/logged?a=1&b=%22", [("X-K", key)]),
            build_request("POST", "/logged", [("X-K", key)], body=b"x" * 123),
            build_request("GET", "/logged", [("X-K", key), ("X-Request-Id", "rid-1")])]
    sizes = []
    t0 = time.monotonic()
    with WireConn(logged.port) as c:
        for req in reqs:
            c.received, start = 0, len(c.buf)
            c.send(req)
            r = c.read_response()
            assert len(c.buf) == 0
            sizes.append((len(req), c.received + start, r))
    elapsed = time.monotonic() - t0         # encloses every request sluice timed
    assert [x[2].status for x in sizes] == [200, 200, 429]
    lines = read_log(logged.log_path, 3)
    assert len(lines) == 3, lines
    now = time.time()
    for (n_in, n_out, resp), e, method, path in zip(
            sizes, lines, ["GET", "POST", "GET"], ["/logged?a=1&b=%22", "/logged", "/logged"]):
        for f in FIELDS:
            assert f in e, (f, e)
        assert e["client"] == "127.0.0.1"
        assert e["method"] == method
        assert e["path"] == path
        assert e["status"] == resp.status
        assert e["route"] == "logged"
        assert e["limit"] == "two"
        assert e["bytes_in"] == n_in, (e, n_in)
        assert e["bytes_out"] == n_out, (e, n_out)
        assert isinstance(e["total_time"], float) and 0 < e["total_time"] <= elapsed, (e, elapsed)
        assert abs(_epoch(e["time"]) - now) < 30, e["time"]
    assert [e["decision"] for e in lines] == ["allowed", "allowed", "limited"]
    assert [e["remaining"] for e in lines] == [1, 0, 0]
    for e in lines[:2]:                                 # forwarded: the upstream's part
        assert 0 < e["upstream_time"] <= e["total_time"], e
    assert lines[2]["upstream_time"] in (None, -1)        # never forwarded
    assert lines[2]["request_id"] == "rid-1"


def _epoch(t):
    """The time field as seconds since the epoch: a number or RFC 3339 text."""
    if isinstance(t, (int, float)):
        return t / 1e6 if t > 1e12 else t
    from datetime import datetime
    return datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp()


def test_no_route_and_odd_bytes_still_valid_json(logged):
    # a request with no route is still a request: logged, valid JSON even
    # with quotes and backslashes in the target
    target = b"/nowhere/%22\"\\x?q=\"1\\"
    with Conn(logged.port) as c:
        c.send(b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        r = c.read_response()
    assert r.status == 404
    lines = read_log(logged.log_path, 1)
    assert len(lines) == 1, r
    assert lines[0]["path"] == target.decode()
    assert lines[0]["status"] == r.status
    assert lines[0]["route"] is None
    assert lines[0]["decision"] in (None, "none")


def test_malformed_request_answered_400_is_logged(logged):
    with Conn(logged.port) as c:
        c.send(b"GET /open HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n")
        r = c.read_response()
    assert r.status == 400
    lines = read_log(logged.log_path, 1)
    assert [e["status"] for e in lines] == [400]


def test_sigusr1_reopens_after_rename(logged):
    http_get(logged.port, "/open?n=1")
    assert len(read_log(logged.log_path, 1)) == 1
    rotated = logged.log_path + ".1"
    os.rename(logged.log_path, rotated)
    http_get(logged.port, "/open?n=2")          # still into the renamed file
    assert len(read_log(rotated, 2)) == 2
    os.kill(logged.proc.pid, signal.SIGUSR1)
    wait_until(lambda: os.path.exists(logged.log_path), 3)
    http_get(logged.port, "/open?n=3")
    new = read_log(logged.log_path, 1)
    assert [e["path"] for e in new] == ["/open?n=3"]
    assert [e["path"] for e in read_log(rotated, 2)] == ["/open?n=1", "/open?n=2"]
    assert logged.proc.poll() is None


def upstream_rids(resp):
    return [v for n, v in resp.json()["headers"] if n.lower() == "x-request-id"]


def test_request_id_passed_through(sluice, redis):
    s = start_proxy(sluice, ROUTES)
    r = http_get(s.port, "/open", headers=[("X-Request-Id", "abc-123")])
    assert r.status == 200
    assert upstream_rids(r) == ["abc-123"]
    assert r.header_all("X-Request-Id") == ["abc-123"]


def test_request_id_generated(sluice, redis):
    s = start_proxy(sluice, ROUTES)
    seen = set()
    for _ in range(3):
        r = http_get(s.port, "/open")
        assert r.status == 200
        up = upstream_rids(r)
        assert len(up) == 1 and len(up[0]) >= 8, up
        assert r.header_all("X-Request-Id") == up
        seen.add(up[0])
    assert len(seen) == 3


def test_request_id_on_rejection(sluice, redis):
    s = start_proxy(sluice, ROUTES)
    key = [("X-K", uuid.uuid4().hex)]
    with Conn(s.port) as c:
        for _ in range(2):
            c.send(build_request("GET", "/logged", key))
            assert c.read_response().status == 200
        c.send(build_request("GET", "/logged", key + [("X-Request-Id", "deny-me")]))
        r = c.read_response()
        assert r.status == 429
        assert r.header("X-Request-Id") == "deny-me"
        c.send(build_request("GET", "/logged", key))
        r = c.read_response()
        assert r.status == 429
        assert len(r.header("X-Request-Id") or "") >= 8
