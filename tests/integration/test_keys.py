# sluice - tests/integration/test_keys.py: routing, key sources, X-Forwarded-For, TTLs.
#
# Which rule and which counter a request meets: path normalisation tricks,
# methods and host, each key source, an absent key source (counted under the
# client address), the client address behind trusted and untrusted peers, and
# the Redis keys sluice leaves behind.

import uuid

import pytest

from conftest import (Conn, build_request, http_get, make_conf, redis_cmd, redis_keys,
                      redis_time_s, rl_headers)

ROUTES = """\
  - name: login
    match: { path: /api/login }
    upstream: api
    limits:
      - { name: login5, algorithm: fixed_window, limit: 5, window: 1h, key: [ip] }
  - name: post-only
    match: { path: /m, methods: [POST, PUT] }
    upstream: api
    limits:
      - { name: post2, algorithm: fixed_window, limit: 2, window: 1h, key: [ip] }
  - name: hosted
    match: { path: /host, host: api.example.com }
    upstream: api
    limits:
      - { name: host2, algorithm: fixed_window, limit: 2, window: 1h, key: [ip] }
  - name: api
    match: { path: /api }
    upstream: api
    limits:
      - { name: api50, algorithm: fixed_window, limit: 50, window: 1h, key: [ip] }
  - name: by-header
    match: { path: /kh }
    upstream: api
    limits:
      - { name: kh, algorithm: fixed_window, limit: 2, window: 1h, key: ["header:X-Api-Key"] }
  - name: by-query
    match: { path: /kq }
    upstream: api
    limits:
      - { name: kq, algorithm: fixed_window, limit: 2, window: 1h, key: ["query:user"] }
  - name: by-cookie
    match: { path: /kc }
    upstream: api
    limits:
      - { name: kc, algorithm: fixed_window, limit: 2, window: 1h, key: ["cookie:sid"] }
  - name: by-method
    match: { path: /km }
    upstream: api
    limits:
      - { name: km, algorithm: fixed_window, limit: 2, window: 1h, key: [method] }
  - name: by-path
    match: { path: /kp }
    upstream: api
    limits:
      - { name: kp, algorithm: fixed_window, limit: 2, window: 1h, key: [path] }
  - name: joined
    match: { path: /kj }
    upstream: api
    limits:
      - { name: kj, algorithm: fixed_window, limit: 2, window: 1h, key: [ip, "header:X-A", "query:b"] }
  - name: xff
    match: { path: /xff }
    upstream: api
    limits:
      - { name: xff2, algorithm: fixed_window, limit: 2, window: 1h, key: [ip] }
"""


@pytest.fixture
def proxy(sluice, redis):
    return sluice(make_conf(ROUTES))


def get(port, target, headers=None, method="GET", host="localhost"):
    return http_get(port, target, method=method, headers=headers, host=host)


# ------------------------------------------------------------- routing ----

def test_url_tricks_meet_the_same_rule_and_counter(proxy):
    targets = ["/api/login", "/api/%6Cogin", "/api%2Flogin", "/api/./login", "//api//login",
               "/api/x/../login", "/api/login?q=1"]
    remaining = []
    for t in targets[:5]:
        r = get(proxy.port, t)
        assert r.status == 200, (t, r)
        assert r.json()["target"] == t, "the upstream must get the target unchanged"
        assert r.header("X-RateLimit-Limit") == "5", (t, r)
        remaining.append(int(r.header("X-RateLimit-Remaining")))
    assert remaining == [4, 3, 2, 1, 0]
    for t in targets[5:]:
        r = get(proxy.port, t)
        assert r.status == 429, (t, r)
        assert r.json()["route"] == "login"


def test_prefix_matches_on_segment_boundary(proxy):
    for t in ("/api", "/api/", "/api/x", "/api/loginx"):
        r = get(proxy.port, t)
        assert r.status == 200, (t, r)
        assert r.header("X-RateLimit-Limit") == "50", (t, r)   # route "api"
    r = get(proxy.port, "/apix")
    assert r.status == 404, r


def test_no_route_is_404_json(proxy):
    r = get(proxy.port, "/nowhere")
    assert r.status == 404
    assert r.header("Content-Type", "").startswith("application/json")
    r.json()


@pytest.mark.parametrize("target", ["/api/%00login", "/api/../../x", "/../x", "/api/%2e%2e/%2e%2e/x",
                                    "/api/%zz", "/api/%4"])
def test_bad_paths_are_400(proxy, upstream, target):
    before = upstream.stats()["heads"]
    with Conn(proxy.port) as c:
        c.send(build_request("GET", target))
        r = c.read_response()
        assert r.status == 400, (target, r)
        assert c.is_closed()
    assert upstream.stats()["heads"] == before


def test_methods_match(proxy):
    for m in ("POST", "PUT"):
        r = get(proxy.port, "/m", method=m)
        assert r.status == 200 and r.header("X-RateLimit-Limit") == "2", (m, r)
    r = get(proxy.port, "/m")   # GET matches no route
    assert r.status == 404, r


def test_host_match_ignores_case_and_port(proxy):
    for host in ("api.example.com", "API.Example.COM:8080"):
        r = get(proxy.port, "/host", host=host)
        assert r.status == 200 and r.header("X-RateLimit-Limit") == "2", (host, r)
    r = get(proxy.port, "/host", host="other.example.com")
    assert r.status == 404, r


# --------------------------------------------------------- key sources ----

def exhaust_then(port, target, headers, other_target, other_headers):
    """Two pass, the third is denied; a request with another key value passes."""
    for _ in range(2):
        r = get(port, target, headers)
        assert r.status == 200, r
    assert get(port, target, headers).status == 429
    r = get(port, other_target, other_headers)
    assert r.status == 200, r
    assert r.header("X-RateLimit-Remaining") == "1", r


def test_key_header(proxy):
    exhaust_then(proxy.port, "/kh", [("X-Api-Key", "k1")], "/kh", [("X-Api-Key", "k2")])


def test_key_header_name_case_insensitive(proxy):
    exhaust_then(proxy.port, "/kh", [("x-api-key", "k1")], "/kh", [("X-API-KEY", "k2")])
    assert get(proxy.port, "/kh", [("X-API-KEY", "k1")]).status == 429


def test_key_query(proxy):
    exhaust_then(proxy.port, "/kq?user=a&x=1", None, "/kq?x=1&user=b", None)
    assert get(proxy.port, "/kq?z=0&user=a").status == 429


def test_key_cookie(proxy):
    exhaust_then(proxy.port, "/kc", [("Cookie", "a=1; sid=s1")],
                 "/kc", [("Cookie", "sid=s2; a=1")])
    assert get(proxy.port, "/kc", [("Cookie", "sid=s1")]).status == 429


def test_key_method(proxy):
    for _ in range(2):
        assert get(proxy.port, "/km").status == 200
    assert get(proxy.port, "/km").status == 429
    r = get(proxy.port, "/km", method="POST")
    assert r.status == 200 and r.header("X-RateLimit-Remaining") == "1", r


def test_key_path(proxy):
    exhaust_then(proxy.port, "/kp/a", None, "/kp/b", None)


def test_key_joined_sources(proxy):
    exhaust_then(proxy.port, "/kj?b=1", [("X-A", "1")], "/kj?b=2", [("X-A", "1")])
    r = get(proxy.port, "/kj?b=1", [("X-A", "2")])
    assert r.status == 200, r


@pytest.mark.parametrize("target,headers", [
    ("/kh", None), ("/kq", None), ("/kq?other=1", None), ("/kc", None),
    ("/kc", [("Cookie", "a=1")]), ("/kj?b=1", None), ("/kj", [("X-A", "1")])])
def test_absent_key_source_counts_under_the_address(proxy, target, headers):
    # on_missing_key: ip (the default); test_key_spellings.py has deny and pass
    for left in ("1", "0"):
        r = get(proxy.port, target, headers)
        assert r.status == 200 and r.header("X-RateLimit-Remaining") == left, r
    assert get(proxy.port, target, headers).status == 429


def test_hostile_key_values_stay_separate(proxy):
    # bytes that could confuse a naive key join must not merge two clients
    exhaust_then(proxy.port, "/kj?b=1", [("X-A", "x|")], "/kj?b=|1", [("X-A", "x")])
    long_a = "a" * 5000
    exhaust_then(proxy.port, "/kh", [("X-Api-Key", long_a)],
                 "/kh", [("X-Api-Key", long_a + "b")])


# ----------------------------------------------------- X-Forwarded-For ----

def test_untrusted_xff_is_ignored(proxy):
    assert get(proxy.port, "/xff", [("X-Forwarded-For", "1.1.1.1")]).status == 200
    assert get(proxy.port, "/xff", [("X-Forwarded-For", "2.2.2.2")]).status == 200
    r = get(proxy.port, "/xff", [("X-Forwarded-For", "3.3.3.3")])
    assert r.status == 429, "spoofed X-Forwarded-For bypassed the limit: %r" % r


def test_trusted_proxy_uses_rightmost_untrusted(sluice, redis):
    s = sluice(make_conf(ROUTES, trusted=["127.0.0.0/8"]))
    xff = [("X-Forwarded-For", "9.9.9.9, 1.1.1.1")]
    assert get(s.port, "/xff", xff).status == 200
    assert get(s.port, "/xff", [("X-Forwarded-For", "8.8.8.8,1.1.1.1, 127.0.0.5")]).status == 200
    assert get(s.port, "/xff", [("X-Forwarded-For", "1.1.1.1")]).status == 429
    r = get(s.port, "/xff", [("X-Forwarded-For", "1.1.1.1, 2.2.2.2")])
    assert r.status == 200 and r.header("X-RateLimit-Remaining") == "1", r
    # two X-Forwarded-For fields form one list
    r = get(s.port, "/xff", [("X-Forwarded-For", "7.7.7.7"), ("X-Forwarded-For", "2.2.2.2")])
    assert r.status == 200 and r.header("X-RateLimit-Remaining") == "0", r


NET_ROUTES = """\
  - name: net
    match: { path: /net }
    upstream: api
    limits:
      - { name: net2, algorithm: fixed_window, limit: 2, window: 1h, key: ["ip/24/64"] }
"""


def test_ip_prefix_key_shares_one_budget_per_network(sluice, redis):
    # behind a trusted proxy, the client address taken from X-Forwarded-For
    # is keyed as its network: /64 for IPv6, /24 for IPv4 (mapped included)
    s = sluice(make_conf(NET_ROUTES, trusted=["127.0.0.0/8"]))

    def status(client):
        return get(s.port, "/net", [("X-Forwarded-For", client)]).status

    assert [status(a) for a in ("2001:db8:1:2::a", "2001:db8:1:2:ffff::1",
                                "2001:db8:1:2::b")] == [200, 200, 429]
    assert status("2001:db8:1:3::a") == 200          # the next /64
    assert [status(a) for a in ("198.51.100.1", "198.51.100.254",
                                "::ffff:198.51.100.7")] == [200, 200, 429]
    assert status("198.51.101.1") == 200             # the next /24
    keys = sorted(k.decode() for k in redis_keys(redis.port) if b"net2" in k)
    assert any("17:2001:db8:1:2::/64}" in k for k in keys), keys
    assert any("17:2001:db8:1:3::/64}" in k for k in keys), keys
    assert any("15:198.51.100.0/24}" in k for k in keys), keys
    assert any("15:198.51.101.0/24}" in k for k in keys), keys


def test_upstream_gets_forwarded_headers(proxy):
    r = get(proxy.port, "/api/x", [("X-Forwarded-For", "1.2.3.4")])
    hdrs = r.json()["headers"]
    xff = [v for n, v in hdrs if n.lower() == "x-forwarded-for"]
    assert len(xff) == 1, hdrs
    assert [p.strip() for p in xff[0].split(",")] == ["1.2.3.4", "127.0.0.1"], hdrs
    proto = [v for n, v in hdrs if n.lower() == "x-forwarded-proto"]
    assert proto == ["http"], hdrs
    r = get(proxy.port, "/api/x")
    hdrs = r.json()["headers"]
    assert [v for n, v in hdrs if n.lower() == "x-forwarded-for"] == ["127.0.0.1"], hdrs


def test_forwarded_proto_is_set_not_passed(proxy):
    r = get(proxy.port, "/api/x", [("X-Forwarded-Proto", "https")])
    hdrs = r.json()["headers"]
    assert [v for n, v in hdrs if n.lower() == "x-forwarded-proto"] == ["http"], hdrs


# ---------------------------------------------------------------- TTLs ----

TTL_ROUTES = """\
  - name: one-fw
    match: { path: /fw-only }
    upstream: api
    limits:
      - { name: fw, algorithm: fixed_window, limit: 3, window: 10s, key: ["header:X-K"] }
  - name: all
    match: { path: / }
    upstream: api
    limits:
      - { name: fw, algorithm: fixed_window, limit: 3, window: 10s, key: ["header:X-K"] }
      - { name: sw, algorithm: sliding_window, limit: 3, window: 10s, key: ["header:X-K"] }
      - { name: sl, algorithm: sliding_log, limit: 3, window: 10s, key: ["header:X-K"] }
      - { name: tb, algorithm: token_bucket, rate: 1/s, burst: 3, key: ["header:X-K"] }
      - { name: gc, algorithm: gcra, rate: 1/s, burst: 3, key: ["header:X-K"] }
"""


def test_every_key_has_prefix_and_ttl(sluice, redis):
    s = sluice(make_conf(TTL_ROUTES, prefix="ttl-test:"))
    with Conn(s.port) as c:
        for i in range(5):        # allowed and denied decisions
            for k in ("k1", "k2"):
                c.send(build_request("GET", "/x", [("X-K", k)]))
                assert c.read_response().status in (200, 429)
    keys = redis_keys(redis.port)
    assert keys, "no keys written"
    for k in keys:
        assert k.startswith(b"ttl-test:"), k
        pttl = redis_cmd(redis.port, "PTTL", k)
        assert pttl > 0, (k, pttl)
        assert pttl <= 2 * 10000 + 1000, (k, pttl)


def test_fixed_window_key_expires_at_window_end(sluice, redis):
    s = sluice(make_conf(TTL_ROUTES))
    key = uuid.uuid4().hex
    assert get(s.port, "/fw-only", [("X-K", key)]).status == 200
    now = redis_time_s(redis.port)
    keys = redis_keys(redis.port)
    assert len(keys) == 1, keys
    pttl = redis_cmd(redis.port, "PTTL", keys[0])
    window_end = (int(now // 10) + 1) * 10
    assert pttl > 0
    # expires when its 10 s window ends (a little slack), not 10 s after the hit
    assert abs((now + pttl / 1000.0) - window_end) < 1.5, (now, pttl, window_end)
