# sluice - tests/integration/test_overrides.py: per-client quotas and resets (issue 14).
#
# Two real sluice processes on one real Redis: a config override and a
# run-time override (the admin API's PUT) each change one key's quota on
# both at once; a reset key passes again on both within 1 s although both
# held it in their deny caches (the deny-cache hit counter says they did);
# the override key's TTL; the memory backend's overrides and resets, in
# process, across workers.

import time

import pytest

from apilib import api, deny_hits, get_k, start_api, start_pair
from conftest import http_get, redis_cmd, wait_until

ROUTES = """\
  - name: r
    match: { path: /r }
    upstream: api
    limits:
      - name: fw
        algorithm: fixed_window
        limit: 2
        window: 1h
        key: ["header:X-K"]
        overrides:
          - { key: [vip], limit: 5 }
  - name: b
    match: { path: /b }
    upstream: api
    limits:
      - name: tb
        algorithm: token_bucket
        rate: 1/h
        burst: 2
        key: ["header:X-K"]
        overrides:
          - { key: [gold], burst: 4 }
"""


def admitted(pair, path, key, n):
    """n requests for key, alternating between the proxies; the statuses."""
    return [get_k(pair[i % 2], path, key) for i in range(n)]


@pytest.mark.parametrize("path", ["/r", "/b"])
def test_config_override_on_two_proxies(sluice, redis, path):
    pair = start_pair(sluice, ROUTES)
    vip = "vip" if path == "/r" else "gold"
    want = 5 if path == "/r" else 4
    st = admitted(pair, path, vip, want + 2)
    assert st == [200] * want + [429, 429], st
    st = admitted(pair, path, "plain", 4)
    assert st == [200, 200, 429, 429], st
    # the GET names where the parameters come from
    code, doc, _ = api(pair[1], "GET", "/api/limits/%s/%s?key=%s"
                       % (path[1:], "fw" if path == "/r" else "tb", vip))
    assert code == 200 and doc["source"] == "config", doc
    assert doc["allowed"] is False and doc["remaining"] == 0 and doc["retry_ms"] > 0, doc


def test_runtime_override_on_two_proxies(sluice, redis):
    a, b = start_pair(sluice, ROUTES)
    assert admitted((a, b), "/r", "bob", 3) == [200, 200, 429]
    code, doc, _ = api(a, "PUT", "/api/limits/r/fw/override?key=bob", {"limit": 6})
    assert code == 200, doc
    assert doc["source"] == "runtime" and doc["params"]["limit"] == 6, doc
    # no reload: both proxies apply it on their next decision (2 used, 4 left),
    # and the rate-limit fields show the quota applied
    r = http_get(b.port, "/r", headers=[("X-K", "bob")])
    assert r.status == 200 and r.header("X-RateLimit-Limit") == "6", r.headers
    assert r.header("X-RateLimit-Remaining") == "3", r.headers
    st = admitted((a, b), "/r", "bob", 5)
    assert st == [200] * 3 + [429, 429], st
    code, doc, _ = api(b, "GET", "/api/limits/r/fw?key=bob")
    assert code == 200 and doc["source"] == "runtime" and doc["params"]["limit"] == 6, doc
    assert doc["config_params"]["limit"] == 2 and doc["override_ttl_ms"] is None, doc
    # run-time beats config: vip's config 5 becomes 1
    code, doc, _ = api(b, "PUT", "/api/limits/r/fw/override?key=vip", {"limit": 1})
    assert code == 200, doc
    assert admitted((a, b), "/r", "vip", 2) == [200, 429]
    # DELETE: back to the config (vip: 5, one used)
    code, doc, _ = api(a, "DELETE", "/api/limits/r/fw/override?key=vip")
    assert code == 200 and doc["existed"] is True, doc
    assert admitted((a, b), "/r", "vip", 5) == [200] * 4 + [429]
    code, doc, _ = api(a, "GET", "/api/limits/r/fw?key=vip")
    assert doc["source"] == "config", doc


def test_runtime_override_bucket_rate_and_ttl(sluice, redis):
    a, b = start_pair(sluice, ROUTES)
    code, doc, _ = api(a, "PUT", "/api/limits/b/tb/override?key=zed",
                       {"rate": "100/s", "burst": 3, "ttl": "30d"})
    assert code == 200, doc
    assert doc["params"] == {"burst": 3, "interval_us": 10000} and doc["ttl_ms"] == 30 * 86400000
    okey = "itest:{b|tb|3:zed}:ovr"
    assert redis_cmd(redis.port, "GET", okey) == b"3 3 10000"
    ttl = redis_cmd(redis.port, "PTTL", okey)
    assert 30 * 86400000 - 60000 < ttl <= 30 * 86400000, ttl
    st = admitted((a, b), "/b", "zed", 3)
    assert st == [200, 200, 200], st
    # refilled at 100/s, not 1/h: a denied one passes again within a second
    assert wait_until(lambda: get_k(b, "/b", "zed") == 200 or None, 1.5)[0]
    # without a ttl the override stays until deleted
    code, doc, _ = api(a, "PUT", "/api/limits/r/fw/override?key=k2", {"limit": 9})
    assert code == 200 and doc["ttl_ms"] is None, doc
    assert redis_cmd(redis.port, "PTTL", "itest:{r|fw|2:k2}:ovr") == -1


def test_reset_reaches_both_deny_caches(sluice, redis):
    a, b = start_pair(sluice, ROUTES)
    assert admitted((a, b), "/r", "eve", 2) == [200, 200]
    # each proxy denies once from Redis, then from its deny cache
    h0 = (deny_hits(a), deny_hits(b))
    for s in (a, b):
        assert [get_k(s, "/r", "eve") for _ in range(3)] == [429] * 3
    h1 = (deny_hits(a), deny_hits(b))
    assert h1[0] - h0[0] >= 2 and h1[1] - h0[1] >= 2, (h0, h1)
    code, doc, _ = api(a, "POST", "/api/limits/r/fw/reset?key=eve")
    assert code == 200 and doc["reset"] is True and doc["existed"] is True, doc
    t0 = time.monotonic()
    ok_a, _ = wait_until(lambda: get_k(a, "/r", "eve") == 200 or None, 1.0)
    ok_b, _ = wait_until(lambda: get_k(b, "/r", "eve") == 200 or None, 1.0)
    took = time.monotonic() - t0
    print("reset: passed again on both proxies %.3f s after the POST" % took)
    assert ok_a and ok_b and took < 1.0, took
    # the counter was cleared, not raised: a fresh quota of 2, used by 2 now
    assert get_k(a, "/r", "eve") == 429


def test_override_write_clears_deny_caches(sluice, redis):
    a, b = start_pair(sluice, ROUTES)
    assert admitted((a, b), "/r", "max", 2) == [200, 200]
    for s in (a, b):
        assert [get_k(s, "/r", "max") for _ in range(2)] == [429, 429]
    code, doc, _ = api(b, "PUT", "/api/limits/r/fw/override?key=max", {"limit": 3})
    assert code == 200, doc
    ok, _ = wait_until(lambda: get_k(a, "/r", "max") == 200 or None, 1.0)
    assert ok, "a still denies max from its deny cache"





def test_memory_backend_override_and_reset(sluice, redis):
    s = start_api(sluice, ROUTES, workers=2, top="backend: memory\n")
    st = [get_k(s, "/r", "mo") for _ in range(3)]
    assert st == [200, 200, 429], st
    code, doc, _ = api(s, "PUT", "/api/limits/r/fw/override?key=mo", {"limit": 4})
    assert code == 200, doc
    st = [get_k(s, "/r", "mo") for _ in range(3)]
    assert st == [200, 200, 429], st
    code, doc, _ = api(s, "GET", "/api/limits/r/fw?key=mo")
    assert doc["source"] == "runtime" and doc["params"]["limit"] == 4, doc
    assert doc["allowed"] is False and doc["remaining"] == 0, doc
    code, doc, _ = api(s, "POST", "/api/limits/r/fw/reset?key=mo")
    assert code == 200 and doc["existed"] is True, doc
    st = [get_k(s, "/r", "mo") for _ in range(5)]
    assert st == [200] * 4 + [429], st
    code, doc, _ = api(s, "DELETE", "/api/limits/r/fw/override?key=mo")
    assert code == 200 and doc["existed"] is True
    code, doc, _ = api(s, "GET", "/api/limits/r/fw?key=mo")
    assert doc["source"] == "limit" and doc["params"]["limit"] == 2, doc
    assert redis_cmd(redis.port, "DBSIZE") == 0     # nothing went to Redis


LONG = "x" * 300        # over 256 bytes: the key holds its SHA-1, the override too

KEYED_ROUTES = """\
  - name: q
    match: { path: /q }
    upstream: api
    limits:
      - name: per-q
        algorithm: sliding_log
        limit: 1
        window: 1h
        key: ["query:k", "cookie:c"]
        overrides:
          - { key: ["a b", "s1"], limit: 3 }
          - { key: ["%s", "s1"], limit: 2 }
""" % LONG


def test_config_override_matches_the_parts_as_sent(sluice, redis):
    """The override names the values the client sends; the request's key is
    built from the query and cookie decoded, so both spellings meet."""
    s = start_api(sluice, KEYED_ROUTES)

    def q(k, cookie):
        return http_get(s.port, "/q?k=" + k, headers=[("Cookie", "c=" + cookie)]).status
    assert [q("a%20b", "%73%31") for _ in range(4)] == [200] * 3 + [429]
    assert [q(LONG, '"s1"') for _ in range(3)] == [200, 200, 429]
    assert q("a+b", "s1") == 429        # the query's '+' is a space: the same key
    assert [q("zz", "s1") for _ in range(2)] == [200, 429]      # no override: 1
    code, doc, _ = api(s, "GET", "/api/limits/q/per-q?key=a+b&key=s1")
    assert doc["source"] == "config" and doc["remaining"] == 0, doc
    assert doc["key"] == ["a b", "s1"], doc


@pytest.mark.slow
def test_cluster_override_and_reset(sluice, tmp_path):
    """Redis Cluster: the override key shares its counter's slot, the admin
    API follows MOVED to the slot's master, and PUBLISH reaches the
    subscribers of both proxies through whichever node they are on."""
    from clusterlib import Cluster
    from conftest import free_port, wait_port
    c = Cluster(tmp_path, masters=3, replicas=0).start()
    try:
        procs = []
        for _ in range(2):
            admin_port = free_port()
            text = ("listen: 127.0.0.1:@LISTEN_PORT@\n"
                    "admin:\n  listen: 127.0.0.1:%d\n  token: ${SLUICE_TEST_TOKEN}\n"
                    "redis:\n  cluster: [127.0.0.1:%d]\n  timeout: 1s\n  prefix: \"ct:\"\n"
                    "upstreams:\n  api:\n    servers: [127.0.0.1:@UPSTREAM_PORT@]\n"
                    "routes:\n" % (admin_port, c.ports[0])) + ROUTES
            s = sluice(text, redis_port=c.masters()[0], wait_redis=False,
                       env={"SLUICE_TEST_TOKEN": "s3cret-token"})
            s.admin_port = admin_port
            assert wait_port(admin_port, s.proc)
            procs.append(s)
        a, b = procs
        for s in procs:         # connected: a decision answers with rate-limit fields
            ok, _ = wait_until(lambda: http_get(s.port, "/b", headers=[("X-K", "warm")])
                         .header("X-RateLimit-Limit"), 10.0)
            assert ok, s.stderr[-2000:]
        # keys on several slots, so some are on masters the seed is not
        keys = ["ck%d" % i for i in range(6)]
        for k in keys:
            assert [get_k(s, "/r", k) for s in (a, b)] == [200, 200]
            assert [get_k(s, "/r", k) for s in (a, b)] == [429, 429]
            code, doc, _ = api(a, "PUT", "/api/limits/r/fw/override?key=" + k, {"limit": 3})
            assert code == 200, doc
            assert wait_until(lambda: get_k(b, "/r", k) == 200 or None, 1.0)[0], k
            assert get_k(a, "/r", k) == 429
            code, doc, _ = api(b, "GET", "/api/limits/r/fw?key=" + k)
            assert doc["source"] == "runtime" and doc["remaining"] == 0, doc
            code, doc, _ = api(b, "POST", "/api/limits/r/fw/reset?key=" + k)
            assert code == 200 and doc["existed"] is True, doc
            assert wait_until(lambda: get_k(a, "/r", k) == 200 or None, 1.0)[0], k
    finally:
        c.stop()


def policy_and_remaining(s, path, key):
    r = http_get(s.port, path, headers=[("X-K", key)])
    return (r.status, r.header("RateLimit-Policy"), r.header("RateLimit"),
            r.header("X-RateLimit-Limit"))


def test_policy_describes_the_overridden_quota(sluice, redis):
    # issue 18 item 10c: under an override RateLimit-Policy kept the
    # configured quota (q=2) while RateLimit counted the override's
    s = start_api(sluice, ROUTES)
    st, pol, rl, lim = policy_and_remaining(s, "/r", "plain")
    assert pol == '"fw";q=2;w=3600' and rl.startswith('"fw";r=1;') and lim == "2", (pol, rl)
    # a config override: limit 5 in the window; burst 4 at 1/h (refill 4 h)
    st, pol, rl, lim = policy_and_remaining(s, "/r", "vip")
    assert pol == '"fw";q=5;w=3600' and rl.startswith('"fw";r=4;') and lim == "5", (pol, rl)
    st, pol, rl, lim = policy_and_remaining(s, "/b", "gold")
    assert pol == '"tb";q=4;w=14400' and rl.startswith('"tb";r=3;') and lim == "4", (pol, rl)
    # a run-time override: limit 50, then burst 9 (refill 9 h at 1/h)
    code, doc, _ = api(s, "PUT", "/api/limits/r/fw/override?key=k", {"limit": 50})
    assert code == 200, doc
    st, pol, rl, lim = policy_and_remaining(s, "/r", "k")
    assert pol == '"fw";q=50;w=3600' and rl.startswith('"fw";r=49;') and lim == "50", (pol, rl)
    code, doc, _ = api(s, "PUT", "/api/limits/b/tb/override?key=k", {"burst": 9})
    assert code == 200, doc
    st, pol, rl, lim = policy_and_remaining(s, "/b", "k")
    assert pol == '"tb";q=9;w=32400' and rl.startswith('"tb";r=8;') and lim == "9", (pol, rl)
