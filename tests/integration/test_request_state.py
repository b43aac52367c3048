# sluice - tests/integration/test_request_state.py: a request owns what it
# computed (issue 10).
#
# The defects of per-request state kept on the connection and in worker
# scratch: keys rebuilt after a Redis wait into a buffer a reload resized
# (run it with the ASan build: the factory fails on a sanitizer report), a
# body being discarded after a local answer with no timer (it held a
# keep-alive connection and graceful shutdown forever), and a 408 carrying
# the previous request's X-Request-Id.

import os
import signal
import time

from conftest import Conn, build_request, redis_cmd
from proxylib import proxy_conf, start_proxy, wait_metric, metrics, mval
from loadlib import client_conf

IP_LIMIT = """\
  - name: ip1
    match: { path: /r }
    upstream: api
    limits:
      - { name: ip1, algorithm: fixed_window, limit: 1, window: 1h, key: [ip] }
"""


def test_reload_lowering_max_header_bytes_while_a_long_path_waits_on_redis(sluice, redis):
    """A request with a 12 kB path waits on a paused Redis while a SIGHUP
    lowers client.max_header_bytes to 1 kB; Redis then denies it. The
    denial fills the deny cache from the request's own keys: no write into
    the worker's (resized) scratch, no sanitizer report, a 429."""
    s = start_proxy(sluice, IP_LIMIT, redis_timeout="5s", max_header_bytes=32768)
    with Conn(s.port) as c:       # the one allowed request: the key now denies in Redis
        c.send(build_request("GET", "/r/first"))
        assert c.read_response().status == 200
    lowered = proxy_conf(IP_LIMIT, admin_port=s.admin_port, redis_timeout="5s",
                       max_header_bytes=1024)
    text = (lowered.replace("@LISTEN_PORT@", str(s.port))
            .replace("@REDIS_PORT@", str(redis.port)))
    before = mval(metrics(s.admin_port), "sluice_config_reloads_total", result="ok")
    long_path = "/r/" + "a" * 12000
    with Conn(s.port, timeout_s=10) as c:
        redis_cmd(redis.port, "CLIENT", "PAUSE", 1500, "ALL")
        t0 = time.monotonic()
        c.send(build_request("GET", long_path))
        time.sleep(0.1)     # the decision is on its way to the paused Redis
        # the running config's upstream ports: only max_header_bytes changes
        s.conf_path.write_text(_keep_ports(s.conf_path.read_text(), text))
        os.kill(s.proc.pid, signal.SIGHUP)
        got = wait_metric(s.admin_port, "sluice_config_reloads_total", before + 1, result="ok")
        assert got == before + 1, "reload not applied; stderr:\n%s" % s.stderr[-2000:]
        assert time.monotonic() - t0 < 1.4, "reload took longer than the Redis pause"
        resp = c.read_response()
    assert resp.status == 429, resp
    assert "AddressSanitizer" not in s.stderr, s.stderr[-5000:]
    # the deny cache answers the next one, keyed by the request's own key
    with Conn(s.port) as c:
        c.send(build_request("GET", "/r/again"))
        assert c.read_response().status == 429


def _keep_ports(old, new):
    """new with the upstream servers lines of old (the factory filled them)."""
    olds = [l for l in old.splitlines() if "servers:" in l]
    out, k = [], 0
    for line in new.splitlines():
        if "servers:" in line and k < len(olds):
            line = olds[k]
            k += 1
        out.append(line)
    return "\n".join(out) + "\n"


NOT_FOUND = """\
  - name: only
    match: { path: /only }
    upstream: api
"""


def test_discarded_body_times_out_after_body_timeout(sluice, redis):
    """A POST answered 404 whose announced body never comes: the connection
    closes after client.body_timeout instead of staying open."""
    s = sluice(client_conf(NOT_FOUND, client={"body_timeout": "1s", "idle_timeout": "30s"}))
    with Conn(s.port, timeout_s=5) as c:
        c.send(build_request("POST", "/nowhere", headers=[("Content-Length", "100")]))
        t0 = time.monotonic()
        assert c.read_response().status == 404
        closed = c.is_closed(wait_s=3.0)
        elapsed = time.monotonic() - t0
    print("discarded body: closed after %.3f s (body_timeout 1s)" % elapsed)
    assert closed, "connection still open 3 s after a 404 with an unsent body"
    assert 0.8 <= elapsed <= 2.5, "closed after %.2f s with body_timeout 1s" % elapsed


def test_discarded_body_does_not_hold_up_sigterm(sluice, redis):
    """SIGTERM while a connection waits for the rest of a discarded body:
    sluice exits within body_timeout, not after shutdown_timeout."""
    s = sluice(client_conf(NOT_FOUND, client={"body_timeout": "1s", "idle_timeout": "30s"},
                         top={"shutdown_timeout": "20s"}))
    with Conn(s.port, timeout_s=5) as c:
        c.send(build_request("POST", "/nowhere", headers=[("Content-Length", "100")]))
        assert c.read_response().status == 404
        t0 = time.monotonic()
        os.kill(s.proc.pid, signal.SIGTERM)
        try:
            rc = s.proc.wait(timeout=4.0)
        except Exception:
            rc = None
        elapsed = time.monotonic() - t0
    print("SIGTERM while discarding: exit %r after %.3f s (body_timeout 1s)" % (rc, elapsed))
    assert rc == 0, "sluice still running %.1f s after SIGTERM (discarding a body)" % elapsed
    assert elapsed <= 2.5, "SIGTERM took %.2f s with body_timeout 1s" % elapsed


def test_408_does_not_carry_the_previous_request_id(sluice, redis):
    """On one keep-alive connection: a request with X-Request-Id, then a head
    that never ends: the 408 has an id of its own (or none), never the one
    before."""
    s = sluice(client_conf(NOT_FOUND, client={"header_timeout": "1s"}))
    with Conn(s.port, timeout_s=5) as c:
        c.send(build_request("GET", "/only", headers=[("X-Request-Id", "first-request-id")]))
        r1 = c.read_response()
        assert r1.status == 200
        assert r1.header("X-Request-Id") == "first-request-id"
        c.send(b"GET /only HTTP/1.1\r\nHost: localhost\r\n")
        r2 = c.read_response()
    assert r2.status == 408, r2
    assert r2.header("X-Request-Id") != "first-request-id", r2
    assert b"first-request-id" not in r2.body, r2


def rid_ok(r):
    rid = r.header("X-Request-Id") or ""
    return len(rid) == 32 and all(ch in "0123456789abcdef" for ch in rid)


EARLY = {
    "cl_with_te": (400, b"POST /only HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
    "bad_request_line": (400, b"G(T /only HTTP/1.1\r\nHost: localhost\r\n\r\n"),
    "obs_fold": (400, b"GET /only HTTP/1.1\r\nHost: localhost\r\nX-A: 1\r\n  2\r\n\r\n"),
    "bad_chunked_te": (400, b"POST /only HTTP/1.1\r\nHost: localhost\r\n"
                            b"Transfer-Encoding: gzip\r\n\r\n"),
    "uri_too_long": (414, b"GET /only?" + b"q" * 3000 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n"),
    "head_too_large": (431, b"GET /only HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"b" * 3000 +
                            b"\r\n\r\n"),
    "too_many_fields": (431, b"GET /only HTTP/1.1\r\nHost: localhost\r\n" +
                             b"".join(b"X-%d: 1\r\n" % i for i in range(200)) + b"\r\n"),
    "head_timeout": (408, b"GET /only HTTP/1.1\r\nHost: localhost\r\n"),
}


def test_every_early_reject_carries_a_request_id(sluice, redis):
    """issue 18 item 10a: the answers sluice gives before a head is read
    (the parser's 400/414/431, the head timeout's 408) carry an
    X-Request-Id like every other answer (README: Request ids)."""
    s = sluice(client_conf(NOT_FOUND, client={"header_timeout": "1s"}, max_header_bytes=2048))
    seen, answers = {}, {}
    for name, (status, data) in EARLY.items():
        with Conn(s.port, timeout_s=5) as c:
            c.send(data)
            r = c.read_response()
        seen[name] = (r.status, r.header("X-Request-Id"))
        answers[name] = r
        assert r.status == status, (name, r)
    print("early rejects: %s" % seen)
    assert all(rid_ok(r) for r in answers.values()), seen
    ids = [v[1] for v in seen.values()]
    assert len(set(ids)) == len(ids), seen          # each answer its own id
