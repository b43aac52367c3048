# sluice - tests/integration/test_headers.py: rate-limit headers and the 429 answer.
#
# X-RateLimit-*, RateLimit-Policy and RateLimit (draft-ietf-httpapi-ratelimit-
# headers-10) on proxied and rejected responses, Retry-After, the exact 429
# body, the most restrictive limit, and multi-limit all-or-nothing.

import json
import re
import uuid

import pytest

from conftest import Conn, build_request, http_get, make_conf, rl_headers

ROUTES = """\
  - name: h
    match: { path: /h }
    upstream: api
    limits:
      - { name: per-ip, algorithm: fixed_window, limit: 3, window: 1h, key: ["header:X-K"] }
  - name: multi
    match: { path: /multi }
    upstream: api
    limits:
      - { name: a, algorithm: fixed_window, limit: 10, window: 1m, key: ["header:X-K"] }
      - { name: b, algorithm: sliding_log, limit: 20, window: 30s, key: ["header:X-K"] }
      - { name: c, algorithm: token_bucket, rate: 10/s, burst: 20, key: ["header:X-K"] }
      - { name: d, algorithm: gcra, rate: 1/s, burst: 4, key: ["header:X-K"] }
      - { name: e, algorithm: sliding_window, limit: 50, window: 2m, key: ["header:X-K"] }
  - name: deny
    match: { path: /deny }
    upstream: api
    limits:
      - { name: A, algorithm: fixed_window, limit: 1, window: 1h, key: ["header:X-User"] }
      - { name: B, algorithm: fixed_window, limit: 2, window: 1h, key: ["header:X-K"] }
  - name: aon
    match: { path: /aon }
    upstream: api
    limits:
      - { name: A, algorithm: fixed_window, limit: 2, window: 1h, key: ["header:X-User"],
          on_missing_key: pass }
      - { name: B, algorithm: fixed_window, limit: 100, window: 1h, key: ["header:X-K"] }
  - name: aon2
    match: { path: /aon2 }
    upstream: api
    limits:
      - { name: A, algorithm: sliding_log, limit: 2, window: 10s, key: ["header:X-User"],
          on_missing_key: pass }
      - { name: B, algorithm: token_bucket, rate: 1/s, burst: 50, key: ["header:X-K"] }
      - { name: C, algorithm: gcra, rate: 1/s, burst: 50, key: ["header:X-K"] }
      - { name: D, algorithm: sliding_window, limit: 100, window: 10s, key: ["header:X-K"] }
"""

ITEM = re.compile(r'^"([^"]+)";(.*)$')


def parse_sf_list(value):
    """'"a";q=1;w=2, "b";q=3;w=4' -> {"a": {"q": 1, "w": 2}, ...} (order kept)."""
    out = {}
    for item in value.split(","):
        m = ITEM.match(item.strip())
        assert m, value
        params = {}
        for p in m.group(2).split(";"):
            k, _, v = p.strip().partition("=")
            params[k] = int(v)
        out[m.group(1)] = params
    return out


@pytest.fixture
def proxy(sluice, redis):
    return sluice(make_conf(ROUTES))


def send(conn, path, headers):
    conn.send(build_request("GET", path, headers))
    return conn.read_response()


def test_headers_on_proxied_responses(proxy):
    key = uuid.uuid4().hex
    with Conn(proxy.port) as c:
        for expect_remaining in (2, 1, 0):
            r = send(c, "/h", [("X-K", key)])
            assert r.status == 200
            h = rl_headers(r)
            assert h["X-RateLimit-Limit"] == "3", r
            assert h["X-RateLimit-Remaining"] == str(expect_remaining), r
            reset = int(h["X-RateLimit-Reset"])
            assert 0 <= reset <= 3600, r
            assert parse_sf_list(h["RateLimit-Policy"]) == {"per-ip": {"q": 3, "w": 3600}}
            assert parse_sf_list(h["RateLimit"]) == {
                "per-ip": {"r": expect_remaining, "t": reset}}
            assert "Retry-After" not in h
            assert r.json()["target"] == "/h"


def test_429_headers_body_and_keepalive(proxy):
    key = uuid.uuid4().hex
    with Conn(proxy.port) as c:
        for _ in range(3):
            assert send(c, "/h", [("X-K", key)]).status == 200
        for _ in range(2):     # the connection stays open after a 429
            r = send(c, "/h", [("X-K", key)])
            assert r.status == 429, r
            h = rl_headers(r)
            retry = int(h["Retry-After"])
            assert 1 <= retry <= 3600
            assert h["X-RateLimit-Reset"] == h["Retry-After"]
            assert h["X-RateLimit-Limit"] == "3"
            assert h["X-RateLimit-Remaining"] == "0"
            assert parse_sf_list(h["RateLimit"]) == {"per-ip": {"r": 0, "t": retry}}
            assert parse_sf_list(h["RateLimit-Policy"]) == {"per-ip": {"q": 3, "w": 3600}}
            assert r.header("Content-Type", "").split(";")[0].strip() == "application/json"
            expected = json.dumps({"error": "rate_limited", "route": "h", "limit": "per-ip",
                                   "retry_after": retry}, separators=(",", ":"))
            assert r.body.strip() == expected.encode(), r.body
        # and serves another route on the same connection
        r = send(c, "/multi", [("X-K", key)])
        assert r.status == 200


def test_429_without_keepalive_request_still_answers(proxy):
    key = uuid.uuid4().hex
    for _ in range(3):
        assert http_get(proxy.port, "/h", headers=[("X-K", key)]).status == 200
    r = http_get(proxy.port, "/h", headers=[("X-K", key), ("Connection", "close")])
    assert r.status == 429


def test_policy_lists_every_limit_and_most_restrictive_shown(proxy):
    key = uuid.uuid4().hex
    r = http_get(proxy.port, "/multi", headers=[("X-K", key)])
    assert r.status == 200
    h = rl_headers(r)
    policy = parse_sf_list(h["RateLimit-Policy"])
    assert policy == {"a": {"q": 10, "w": 60}, "b": {"q": 20, "w": 30},
                      "c": {"q": 20, "w": 2}, "d": {"q": 4, "w": 4},
                      "e": {"q": 50, "w": 120}}, h
    # remaining after one request: a 9, b 19, c 19, d 3, e 49 -> d is the least
    rl = parse_sf_list(h["RateLimit"])
    assert list(rl) == ["d"], h
    assert rl["d"]["r"] == 3
    assert h["X-RateLimit-Limit"] == "4"
    assert h["X-RateLimit-Remaining"] == "3"
    assert int(h["X-RateLimit-Reset"]) == rl["d"]["t"]
    assert 0 <= rl["d"]["t"] <= 4


def test_429_names_the_denying_limit(proxy):
    key = uuid.uuid4().hex
    with Conn(proxy.port) as c:
        r1 = send(c, "/deny", [("X-K", key), ("X-User", "u1")])
        assert r1.status == 200
        assert list(parse_sf_list(r1.header("RateLimit"))) == ["A"], r1  # A 0 < B 1
        assert send(c, "/deny", [("X-K", key), ("X-User", "u2")]).status == 200
        # u3 is fresh for A (would pass), B is spent: B denies and is named
        r3 = send(c, "/deny", [("X-K", key), ("X-User", "u3")])
        assert r3.status == 429, r3
        assert r3.json()["limit"] == "B"
        assert r3.json()["route"] == "deny"
        assert list(parse_sf_list(r3.header("RateLimit"))) == ["B"], r3
        assert r3.header("X-RateLimit-Limit") == "2"
        # u1 with a fresh B key: A denies
        r4 = send(c, "/deny", [("X-K", key + "x"), ("X-User", "u1")])
        assert r4.status == 429
        assert r4.json()["limit"] == "A"
        assert r4.header("X-RateLimit-Limit") == "1"


@pytest.mark.parametrize("path", ["/aon", "/aon2"])
def test_denied_request_consumes_nothing(proxy, path):
    key = uuid.uuid4().hex
    with Conn(proxy.port) as c:
        assert send(c, path, [("X-K", key), ("X-User", "u1")]).status == 200
        assert send(c, path, [("X-K", key), ("X-User", "u1")]).status == 200
        for _ in range(5):
            r = send(c, path, [("X-K", key), ("X-User", "u1")])
            assert r.status == 429
            assert r.json()["limit"] == "A"
        # no X-User: A passes it (on_missing_key: pass), only B..D count it, and they
        # show that only the 2 allowed requests were taken from them
        r = send(c, path, [("X-K", key)])
        assert r.status == 200, r
        h = rl_headers(r)
        assert "A" not in parse_sf_list(h["RateLimit"])
        remaining = parse_sf_list(h["RateLimit"])
        (name, params), = remaining.items()
        if path == "/aon":
            # B: 100 - 3 counted requests, never 100 - 8
            assert (name, params["r"]) == ("B", 97), h
            assert h["X-RateLimit-Limit"] == "100"
        else:
            # B/C (burst 50, 1 token/s back): 3 taken, at most 1 refilled
            assert name in ("B", "C"), h
            assert 47 <= params["r"] <= 48, h
            assert h["X-RateLimit-Limit"] == "50"


def test_no_limit_route_has_no_ratelimit_headers(sluice, redis):
    s = sluice(make_conf("""\
  - name: open
    match: { path: / }
    upstream: api
"""))
    r = http_get(s.port, "/anything")
    assert r.status == 200
    assert rl_headers(r) == {}


SMUGGLE = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_429_discards_request_body(proxy, upstream, framing):
    # the body of a rejected request must be skipped, never read as a request
    key = uuid.uuid4().hex
    if framing == "length":
        denied = (b"POST /h HTTP/1.1\r\nHost: x\r\nX-K: %s\r\nContent-Length: %d\r\n\r\n"
                  % (key.encode(), len(SMUGGLE)) + SMUGGLE)
    else:
        denied = (b"POST /h HTTP/1.1\r\nHost: x\r\nX-K: %s\r\nTransfer-Encoding: chunked\r\n"
                  b"\r\n%x\r\n%s\r\n0\r\n\r\n" % (key.encode(), len(SMUGGLE), SMUGGLE))
    with Conn(proxy.port) as c:
        for _ in range(3):
            assert send(c, "/h", [("X-K", key)]).status == 200
        c.send(denied)
        assert c.read_response().status == 429
        c.send(denied + build_request("GET", "/multi?after", [("X-K", key)]))
        assert c.read_response().status == 429
        r = c.read_response()
        assert r.status == 200 and r.json()["target"] == "/multi?after", r
    assert "/smuggled" not in upstream.stats()["targets"]


def test_pipelined_429_and_proxied_in_order(proxy):
    key = uuid.uuid4().hex
    with Conn(proxy.port) as c:
        for _ in range(3):
            assert send(c, "/h", [("X-K", key)]).status == 200
        c.send(build_request("GET", "/multi?1", [("X-K", key)]) +
               build_request("GET", "/h", [("X-K", key)]) +
               build_request("GET", "/multi?2", [("X-K", key)]) +
               build_request("GET", "/h", [("X-K", key)]))
        r1, r2, r3, r4 = (c.read_response() for _ in range(4))
        assert (r1.status, r2.status, r3.status, r4.status) == (200, 429, 200, 429)
        assert r1.json()["target"] == "/multi?1"
        assert r3.json()["target"] == "/multi?2"


def test_bucket_reset_is_time_to_full(sluice, redis):
    s = sluice(make_conf("""\
  - name: tb
    match: { path: /tb }
    upstream: api
    limits:
      - { name: tb, algorithm: token_bucket, rate: 1/s, burst: 3, key: ["header:X-K"] }
  - name: gc
    match: { path: /gc }
    upstream: api
    limits:
      - { name: gc, algorithm: gcra, rate: 1/s, burst: 3, key: ["header:X-K"] }
"""))
    for path in ("/tb", "/gc"):
        key = uuid.uuid4().hex
        with Conn(s.port) as c:
            seen = []
            for _ in range(3):
                r = send(c, path, [("X-K", key)])
                assert r.status == 200
                seen.append((r.header("X-RateLimit-Remaining"), r.header("X-RateLimit-Reset")))
            # one token short: full in 1 s; two short: 2 s; empty: 3 s
            assert seen == [("2", "1"), ("1", "2"), ("0", "3")], (path, seen)
            assert parse_sf_list(r.header("RateLimit-Policy")) == {path[1:]: {"q": 3, "w": 3}}
