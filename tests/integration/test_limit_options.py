# sluice - tests/integration/test_limit_options.py: the limits people ask for.
#
# count_status, allow (route and top level), path_regex with capture:N,
# shadow, cost and cost_header, per-limit status and message, `headers:`
# modes, and merging with an upstream's own rate-limit fields (a tiny
# upstream of ours sends them). Each case uses fresh keys, and each has a
# control that would fail if the feature were ignored.

import re
import uuid

import pytest

from conftest import Conn, build_request, http_get, read_log, rl_headers
from proxylib import TinyUpstream, metrics, mval, start_proxy, statuses

ROUTES = """\
  - name: cs
    match: { path: /status, host: cs.test }
    upstream: api
    limits:
      - { name: fails, algorithm: sliding_log, limit: 2, window: 1m, key: ["header:X-K"], count_status: [401] }
  - name: cs4
    match: { path: /status, host: cs4.test }
    upstream: api
    limits:
      - { name: f4, algorithm: sliding_log, limit: 2, window: 1m, key: ["header:X-K"], count_status: [4xx] }
  - name: allowed
    match: { path: /allowed }
    upstream: api
    allow: [10.0.0.0/8, 127.0.0.0/24]
    limits:
      - { name: one, algorithm: sliding_log, limit: 1, window: 1m, key: ["header:X-K"] }
  - name: notallowed
    match: { path: /notallowed }
    upstream: api
    allow: [10.0.0.0/8]
    limits:
      - { name: one, algorithm: sliding_log, limit: 1, window: 1m, key: ["header:X-K"] }
  - name: users
    match: { path_regex: "^/users/([^/]+)/" }
    upstream: api
    limits:
      - { name: per-user, algorithm: sliding_log, limit: 2, window: 1m, key: ["capture:1", "header:X-K"] }
  - name: shadow
    match: { path: /shadow }
    upstream: api
    limits:
      - { name: trial, algorithm: sliding_log, limit: 1, window: 1m, key: ["header:X-K"], shadow: true }
  - name: shadowmix
    match: { path: /shadowmix }
    upstream: api
    limits:
      - { name: trial, algorithm: sliding_log, limit: 1, window: 1m, key: ["header:X-K"], shadow: true }
      - { name: real, algorithm: sliding_log, limit: 3, window: 1m, key: ["header:X-K"] }
  - name: cost
    match: { path: /cost }
    upstream: api
    cost: 3
    limits:
      - { name: ten, algorithm: sliding_log, limit: 10, window: 1m, key: ["header:X-K"] }
  - name: costh
    match: { path: /costh }
    upstream: api
    limits:
      - { name: ten, algorithm: fixed_window, limit: 10, window: 1h, key: ["header:X-K"], cost_header: X-Cost }
  - name: custom
    match: { path: /custom }
    upstream: api
    limits:
      - { name: polite, algorithm: sliding_log, limit: 1, window: 1m, key: ["header:X-K"], status: 503, message: "slow down, please" }
  - name: hfull
    match: { path: /hfull }
    upstream: api
    headers: full
    limits:
      - { name: h, algorithm: sliding_log, limit: 1, window: 1m, key: ["header:X-K"] }
  - name: hietf
    match: { path: /hietf }
    upstream: api
    headers: ietf
    limits:
      - { name: h, algorithm: sliding_log, limit: 1, window: 1m, key: ["header:X-K"] }
  - name: hlegacy
    match: { path: /hlegacy }
    upstream: api
    headers: legacy
    limits:
      - { name: h, algorithm: sliding_log, limit: 1, window: 1m, key: ["header:X-K"] }
  - name: hnone
    match: { path: /hnone }
    upstream: api
    headers: none
    limits:
      - { name: h, algorithm: sliding_log, limit: 1, window: 1m, key: ["header:X-K"] }
  - name: merge
    match: { path: /rl }
    upstream: tiny
    limits:
      - { name: ours, algorithm: sliding_log, limit: 10, window: 1m, key: ["header:X-K"] }
"""

LEGACY = ("X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset")
IETF = ("RateLimit", "RateLimit-Policy")


@pytest.fixture(scope="module")
def tiny():
    t = TinyUpstream()
    yield t
    t.stop()


@pytest.fixture
def proxy(sluice, redis, tiny, tmp_path):
    log = tmp_path / "access.log"
    s = start_proxy(sluice, ROUTES, workers=2, top="access_log: %s\n" % log,
                  extra_upstreams={"tiny": tiny.port})
    s.log_path = log
    return s


def k():
    return ("X-K", uuid.uuid4().hex)


def test_count_status_counts_only_listed_statuses(proxy, upstream):
    key = [k()]
    # successes alone never consume
    assert statuses(proxy.port, "/status/200", 5, key, host="cs.test") == [200] * 5
    # 403 is not listed either
    assert statuses(proxy.port, "/status/403", 3, key, host="cs.test") == [403] * 3
    # two failures consume the quota
    assert statuses(proxy.port, "/status/401", 2, key, host="cs.test") == [401, 401]
    before = upstream.stats()["heads"]
    # now even a request that would succeed is rejected, before forwarding
    r = http_get(proxy.port, "/status/200", headers=key, host="cs.test")
    assert r.status == 429, r
    assert r.json()["limit"] == "fails"
    assert statuses(proxy.port, "/status/401", 1, key, host="cs.test") == [429]
    assert upstream.stats()["heads"] == before
    # another key is untouched
    assert statuses(proxy.port, "/status/200", 1, [k()], host="cs.test") == [200]


def test_count_status_class(proxy):
    key = [k()]
    assert statuses(proxy.port, "/status/200", 3, key, host="cs4.test") == [200] * 3
    assert statuses(proxy.port, "/status/500", 2, key, host="cs4.test") == [500] * 2
    assert statuses(proxy.port, "/status/404", 1, key, host="cs4.test") == [404]
    assert statuses(proxy.port, "/status/403", 1, key, host="cs4.test") == [403]
    assert statuses(proxy.port, "/status/200", 1, key, host="cs4.test") == [429]


def test_route_allow_bypasses_limits(proxy):
    key = [k()]
    got = statuses(proxy.port, "/allowed", 6, key)
    assert got == [200] * 6
    # control: the same limit without 127.0.0.1 in allow does limit
    assert statuses(proxy.port, "/notallowed", 3, key) == [200, 429, 429]


def test_top_level_allow_bypasses_every_limit(sluice, redis, tiny):
    s = start_proxy(sluice, ROUTES, top="allow: [127.0.0.1/32]\n",
                  extra_upstreams={"tiny": tiny.port})
    key = [k()]
    assert statuses(s.port, "/notallowed", 5, key) == [200] * 5
    assert statuses(s.port, "/custom", 5, key) == [200] * 5


def test_path_regex_capture_keys(proxy):
    key = k()
    assert statuses(proxy.port, "/users/42/x", 2, [key]) == [200, 200]
    # the same user on another path shares the count
    assert statuses(proxy.port, "/users/42/y", 1, [key]) == [429]
    # another user has its own
    assert statuses(proxy.port, "/users/43/x", 3, [key]) == [200, 200, 429]
    # the capture comes from the normalised path
    assert statuses(proxy.port, "/users/%34%34/x", 2, [key]) == [200, 200]
    assert statuses(proxy.port, "/users/44/z", 1, [key]) == [429]
    # no match, no route
    assert statuses(proxy.port, "/users/", 1, [key]) == [404]


def test_shadow_never_rejects_but_reports(proxy):
    b = metrics(proxy.admin_port)
    key = [k()]
    with Conn(proxy.port) as c:
        rs = []
        for _ in range(4):
            c.send(build_request("GET", "/shadow", key))
            rs.append(c.read_response())
    assert [r.status for r in rs] == [200] * 4
    assert [r.header("X-RateLimit-Remaining") for r in rs] == ["0"] * 4
    assert all('r=0' in (r.header("RateLimit") or "") for r in rs), rs[-1]
    a = metrics(proxy.admin_port)
    assert (mval(a, "sluice_requests_total", route="shadow", decision="shadow_limited")
            - mval(b, "sluice_requests_total", route="shadow", decision="shadow_limited")) == 3
    assert (mval(a, "sluice_requests_total", route="shadow", decision="limited")
            - mval(b, "sluice_requests_total", route="shadow", decision="limited")) == 0
    lines = read_log(proxy.log_path, 4, keep=lambda e: e["path"] == "/shadow")
    assert [e["decision"] for e in lines] == ["allowed"] + ["shadow_limited"] * 3


def test_shadow_with_a_real_limit(proxy):
    key = [k()]
    # the shadow limit (1) never rejects; the real one (3) does
    assert statuses(proxy.port, "/shadowmix", 5, key) == [200, 200, 200, 429, 429]


def test_route_cost(proxy):
    key = [k()]
    with Conn(proxy.port) as c:
        got = []
        for _ in range(4):
            c.send(build_request("GET", "/cost", key))
            r = c.read_response()
            got.append((r.status, r.header("X-RateLimit-Remaining")))
    assert [g[0] for g in got] == [200, 200, 200, 429]
    assert [g[1] for g in got[:3]] == ["7", "4", "1"]


def test_cost_header(proxy):
    key = k()
    with Conn(proxy.port) as c:
        def send(cost):
            hdrs = [key] + ([("X-Cost", str(cost))] if cost is not None else [])
            c.send(build_request("GET", "/costh", hdrs))
            r = c.read_response()
            return r.status, r.header("X-RateLimit-Remaining")
        assert send(6) == (200, "4")
        assert send(5)[0] == 429            # denied: consumes nothing (next line)
        assert send(4) == (200, "0")
        assert send(1)[0] == 429


def test_custom_status_and_message(proxy):
    key = [k()]
    with Conn(proxy.port) as c:
        c.send(build_request("GET", "/custom", key))
        assert c.read_response().status == 200
        c.send(build_request("GET", "/custom", key))
        r = c.read_response()
        assert r.status == 503, r
        body = r.json()
        assert body["message"] == "slow down, please"
        assert body["limit"] == "polite"
        assert int(r.header("Retry-After")) >= 1
        # the rejection keeps the connection usable
        c.send(build_request("GET", "/allowed", key))
        assert c.read_response().status == 200


@pytest.mark.parametrize("path,want", [
    ("/hfull", LEGACY + IETF), ("/hietf", IETF), ("/hlegacy", LEGACY), ("/hnone", ())])
def test_headers_modes(proxy, path, want):
    key = [k()]
    with Conn(proxy.port) as c:
        for expect_status in (200, 429):
            c.send(build_request("GET", path, key))
            r = c.read_response()
            assert r.status == expect_status
            present = {n for n in LEGACY + IETF if r.header(n) is not None}
            assert present == set(want), (expect_status, rl_headers(r))
            if expect_status == 429:
                assert int(r.header("Retry-After")) >= 1


def _items(value):
    """'"a";r=1;t=2, "b";r=3' -> {"a": {"r": 1, "t": 2}, "b": {...}}."""
    out = {}
    for item in value.split(","):
        m = re.match(r'^\s*"([^"]+)"((?:;[a-z]+=\d+)*)\s*$', item)
        assert m, value
        out[m.group(1)] = {p.split("=")[0]: int(p.split("=")[1])
                           for p in m.group(2).split(";") if p}
    return out


def test_merge_with_stricter_upstream_fields(proxy):
    r = http_get(proxy.port, "/rl?l=100&r=1&t=30", headers=[k()])
    assert r.status == 200
    # one value per legacy field, never more permissive than the upstream's
    assert len(r.header_all("X-RateLimit-Remaining")) == 1, rl_headers(r)
    assert int(r.header("X-RateLimit-Remaining")) <= 1, rl_headers(r)
    # IETF fields are merged: the upstream's policy survives next to ours
    rl = _items(",".join(r.header_all("RateLimit")))
    assert rl.get("up", {}).get("r") == 1, rl
    assert rl.get("ours", {}).get("r") == 9, rl
    pol = _items(",".join(r.header_all("RateLimit-Policy")))
    assert pol.get("up", {}).get("q") == 100 and pol.get("ours", {}).get("q") == 10, pol


def test_merge_with_looser_upstream_fields(proxy):
    r = http_get(proxy.port, "/rl?l=5000&r=4999&t=3", headers=[k()])
    assert r.status == 200
    assert r.header_all("X-RateLimit-Remaining") == ["9"], rl_headers(r)
    assert r.header_all("X-RateLimit-Limit") == ["10"], rl_headers(r)
    rl = _items(",".join(r.header_all("RateLimit")))
    assert rl.get("ours", {}).get("r") == 9, rl
