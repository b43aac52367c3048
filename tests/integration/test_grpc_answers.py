# sluice - tests/integration/test_grpc_answers.py: sluice's own answers to
# gRPC calls, routes and keys for them, seen over HTTP/1.1.
#
# A call is a POST with Content-Type application/grpc*; sluice answers it
# itself as Trailers-Only (200, grpc-status, grpc-message, no body), which
# an h2 front sends as one HEADERS frame: here the same answer is read as
# HTTP/1.1 from a raw socket. The upstream is the echo upstream (or none);
# Redis is the session's (or a port with nothing on it). End-to-end calls
# with real gRPC clients and servers are in test_grpc.py.

import json
import uuid

from conftest import Conn, build_request, free_port, http_get, read_log
from proxylib import metrics_text, proxy_conf, start_proxy

FRAME = b"\x00\x00\x00\x00\x03abc"      # one uncompressed message of 3 bytes


def call(port, path, headers=(), body=FRAME, timeout_s=10.0):
    h = [("Content-Type", "application/grpc"), ("TE", "trailers")] + list(headers)
    with Conn(port, timeout_s) as c:
        c.send(build_request("POST", path, h, body))
        return c.read_response()


ROUTES = """\
  - name: calls
    match: { path: /demo.Echo, grpc: true }
    upstream: api
    limits:
      - { name: per-method, algorithm: fixed_window, limit: 2, window: 1m,
          key: [grpc_service, grpc_method, "header:x-tenant"] }
  - name: calls14
    match: { path: /demo.Retry, grpc: true }
    upstream: api
    grpc_limited: unavailable
    limits:
      - { name: one, algorithm: fixed_window, limit: 1, window: 1m, key: ["header:x-tenant"] }
  - name: slow
    match: { path: /slow }
    upstream: api
  - name: gone
    match: { path: /demo.Gone }
    upstream: dead
"""


def test_limit_answers_resource_exhausted_with_pushback(sluice, redis, tmp_path):
    log = tmp_path / "access.log"
    s = start_proxy(sluice, ROUTES, top="access_log: %s\n" % log)
    t = uuid.uuid4().hex
    for _ in range(2):
        r = call(s.port, "/demo.Echo/Say", [("x-tenant", t)])
        assert r.status == 200 and r.json()["method"] == "POST", r
    r = call(s.port, "/demo.Echo/Say", [("x-tenant", t)])
    assert r.status == 200, r
    assert r.header("content-type") == "application/grpc"
    assert r.header("grpc-status") == "8"
    assert r.header("grpc-message") == "rate_limited"
    assert r.body == b"" and r.header("content-length") == "0"
    retry_s = int(r.header("retry-after"))
    pushback = int(r.header("grpc-retry-pushback-ms"))
    assert 1 <= retry_s <= 60 and 0 < pushback <= 60000 and retry_s == -(-pushback // 1000)
    assert r.header("ratelimit") and r.header("x-ratelimit-remaining") == "0"
    # the method is part of the key: another one has its own count
    r = call(s.port, "/demo.Echo/Other", [("x-tenant", t)])
    assert r.status == 200 and r.header("grpc-status") is None, r
    entries = read_log(str(log), 4)
    assert [e.get("grpc_status") for e in entries] == [None, None, 8, None]
    m = metrics_text(s.admin_port)
    assert 'sluice_grpc_responses_total{route="calls",grpc_status="8"} 1' in m


def test_route_may_answer_unavailable(sluice, redis):
    s = start_proxy(sluice, ROUTES)
    t = uuid.uuid4().hex
    assert call(s.port, "/demo.Retry/Go", [("x-tenant", t)]).header("grpc-status") is None
    r = call(s.port, "/demo.Retry/Go", [("x-tenant", t)])
    assert r.status == 200 and r.header("grpc-status") == "14", r
    assert int(r.header("grpc-retry-pushback-ms")) > 0


def test_grpc_route_takes_only_calls_and_no_route_is_unimplemented(sluice, redis):
    s = start_proxy(sluice, ROUTES)
    # not a call: the grpc route does not take it, and no other does
    r = http_get(s.port, "/demo.Echo/Say")
    assert r.status == 404 and r.json()["error"] == "no_route", r
    r = call(s.port, "/demo.Nothing/Here")
    assert r.status == 200 and r.header("grpc-status") == "12", r
    assert r.header("grpc-message") == "no_route"


def test_limiter_down_under_deny_is_unavailable(sluice):
    s = start_proxy(sluice, ROUTES, on_error="deny", wait_redis=False, redis_port=free_port())
    r = call(s.port, "/demo.Echo/Say", [("x-tenant", "a")])
    assert r.status == 200 and r.header("grpc-status") == "14", r
    assert r.header("grpc-message") == "limiter_unavailable"
    assert int(r.header("retry-after")) >= 1


def test_upstream_down_unavailable_timeout_deadline_exceeded(sluice, redis):
    s = start_proxy(sluice, ROUTES)
    r = call(s.port, "/demo.Gone/X")
    assert r.status == 200 and r.header("grpc-status") == "14", r
    # grpc-timeout caps the upstream's 5 s timeout: 300 ms
    r = call(s.port, "/slow/3000", [("grpc-timeout", "300m")])
    assert r.status == 200 and r.header("grpc-status") == "4", r


def test_message_over_body_limit_is_resource_exhausted(sluice, redis):
    text = proxy_conf(ROUTES).replace("client:\n", "client:\n  max_body_bytes: 1000\n", 1)
    s = sluice(text)
    # announced too large, or found too large while streaming (chunked)
    r = call(s.port, "/demo.Echo/Say", [("x-tenant", "big")], body=b"\x00" * 2000)
    assert r.status == 200 and r.header("grpc-status") == "8", r
    assert r.header("grpc-message") == "body_too_large"
    r = call(s.port, "/demo.Echo/Say", [("x-tenant", "big"), ("Transfer-Encoding", "chunked")],
             body=b"7d0\r\n" + b"\x00" * 2000 + b"\r\n0\r\n\r\n")
    assert r.status == 200 and r.header("grpc-status") == "8", r
