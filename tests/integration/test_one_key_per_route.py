# sluice - tests/integration/test_one_key_per_route.py: a route's limits as
# parts of one Redis key per client (redis.pack_limits, issue 19).
#
# Real sluice processes on the session's real Redis: a route of three
# limits (token_bucket, gcra, fixed_window) on one key specification keeps
# one key per client, with a TTL, and decides as three keys did (the
# headers, the limit that denies, exact across two proxies under
# concurrency); the admin API inspects and resets one limit of it; a reload
# that adds a limit keeps the others' counts; redis.pack_limits: false and a
# route with a limit that cannot be a part keep a key per limit.

import os
import signal
import struct
import threading
import uuid

from apilib import api, get_k, start_api, start_pair
from conftest import http_get, redis_cmd, wait_until
from proxylib import proxy_conf

PREFIX = "itest:"

ROUTES = """\
  - name: three
    match: { path: /three }
    upstream: api
    limits:
      - name: bucket
        algorithm: token_bucket
        rate: 1/h
        burst: 50
        key: ["header:X-K"]
      - name: cell
        algorithm: gcra
        rate: 1/h
        burst: 40
        key: ["header:X-K"]
      - name: hourly
        algorithm: fixed_window
        limit: 3
        window: 1h
        key: ["header:X-K"]
"""

MIXED = """\
  - name: mixed
    match: { path: /mixed }
    upstream: api
    limits:
      - name: hourly
        algorithm: fixed_window
        limit: 3
        window: 1h
        key: ["header:X-K"]
      - name: inflight
        algorithm: concurrency
        limit: 5
        key: ["header:X-K"]
"""


def client():
    return "c" + uuid.uuid4().hex[:12]


def keys_of(redis, route, who):
    """The client's keys of the route, every layout: {route|LIMIT|...}."""
    pat = "%s{%s|*%s}*" % (PREFIX, route, who)
    return sorted(k.decode() for k in redis_cmd(redis.port, "KEYS", pat))


def route_key(route, who):
    return "%s{%s||%d:%s}" % (PREFIX, route, len(who), who)


def fnv(name):
    h = 2166136261
    for b in name.encode():
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h or 1


def tags(val):
    """The tags of a route key's records (30 bytes each: ';', the tag,
    the algorithm, three doubles), sorted."""
    assert len(val) % 30 == 0, val
    recs = [val[i:i + 30] for i in range(0, len(val), 30)]
    assert all(r[:1] == b";" for r in recs), val
    return sorted(struct.unpack(">I", r[1:5])[0] for r in recs)


def test_three_limits_one_key(sluice, redis):
    s = start_api(sluice, ROUTES)
    who = client()
    st = [get_k(s, "/three", who) for _ in range(5)]
    assert st == [200, 200, 200, 429, 429], st
    # one key, with a TTL, and a part per limit
    assert keys_of(redis, "three", who) == [route_key("three", who)]
    # the latest its parts need: 3 tokens and 3 cells take 3 h to come back
    ttl = redis_cmd(redis.port, "PTTL", route_key("three", who))
    assert 3 * 3600 * 1000 - 10000 < ttl <= 3 * 3600 * 1000, ttl
    assert tags(redis_cmd(redis.port, "GET", route_key("three", who))) == \
        sorted(fnv(n) for n in ("bucket", "cell", "hourly"))
    # the denial is the fixed window's; the rate-limit fields are as before
    r = http_get(s.port, "/three", headers=[("X-K", who)])
    assert r.status == 429 and r.header("Retry-After") is not None, r.headers
    r = http_get(s.port, "/three", headers=[("X-K", client())])
    assert r.status == 200 and r.header("X-RateLimit-Remaining") == "2", r.headers


def test_without_admin_token(sluice, redis):
    """No admin.token, no override keys: store.c sends a route's parts as a
    run (-(16 + m) and the first ref); the same decisions, one key."""
    s = sluice(proxy_conf(ROUTES))
    who = client()
    assert [get_k(s, "/three", who) for _ in range(5)] == [200, 200, 200, 429, 429]
    assert keys_of(redis, "three", who) == [route_key("three", who)]
    assert redis_cmd(redis.port, "PTTL", route_key("three", who)) > 0


def test_denied_requests_consume_nothing(sluice, redis):
    """After the window denies, the bucket and gcra parts still show the
    three admitted requests only (the admin API reads each part)."""
    s = start_api(sluice, ROUTES)
    who = client()
    st = [get_k(s, "/three", who) for _ in range(8)]
    assert st == [200] * 3 + [429] * 5, st
    code, doc, _ = api(s, "GET", "/api/limits/three/bucket?key=%s" % who)
    assert code == 200 and doc["remaining"] == 47, doc
    code, doc, _ = api(s, "GET", "/api/limits/three/cell?key=%s" % who)
    assert code == 200 and doc["remaining"] == 37, doc
    code, doc, _ = api(s, "GET", "/api/limits/three/hourly?key=%s" % who)
    assert code == 200 and doc["allowed"] is False and doc["remaining"] == 0, doc
    # inspecting writes nothing
    before = redis_cmd(redis.port, "GET", route_key("three", who))
    api(s, "GET", "/api/limits/three/bucket?key=%s" % who)
    assert redis_cmd(redis.port, "GET", route_key("three", who)) == before


def test_exact_across_two_proxies(sluice, redis):
    """Two proxies, four threads each, 60 requests of one client: exactly
    the fixed window's 3 pass, once the route's key is one key."""
    pair = start_pair(sluice, ROUTES)
    who = client()
    codes, lock = [], threading.Lock()

    def worker(s):
        got = [get_k(s, "/three", who) for _ in range(15)]
        with lock:
            codes.extend(got)
    threads = [threading.Thread(target=worker, args=(pair[i % 2],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(codes) == 60 and codes.count(200) == 3 and codes.count(429) == 57, codes


def test_a_record_no_decision_writes_reads_as_absent(sluice, redis):
    """A record whose numbers no decision writes (a TAT of +inf, a NaN
    bucket, written into Redis by someone else) reads as absent and is
    replaced, as a text value of another layout did: the client is not
    denied until the key expires."""
    s = start_api(sluice, ROUTES)
    who = client()
    inf, nan = float("inf"), float("nan")
    bad = b"".join(struct.pack(">cIBddd", b";", fnv(n), algo, a, b, 0.0)
                   for n, algo, a, b in (("bucket", 3, 0.0, nan), ("cell", 4, inf, 0.0),
                                         ("hourly", 0, nan, 5.0)))
    redis_cmd(redis.port, "SET", route_key("three", who), bad, "PX", 3600 * 1000)
    assert [get_k(s, "/three", who) for _ in range(4)] == [200, 200, 200, 429]
    val = redis_cmd(redis.port, "GET", route_key("three", who))
    assert tags(val) == sorted(fnv(n) for n in ("bucket", "cell", "hourly"))
    assert all(struct.unpack(">ddd", val[i + 6:i + 30]) == struct.unpack(">ddd", val[i + 6:i + 30])
               and all(abs(x) < 2 ** 53 for x in struct.unpack(">ddd", val[i + 6:i + 30]))
               for i in range(0, len(val), 30)), val


def test_reset_one_limit_of_the_key(sluice, redis):
    s = start_api(sluice, ROUTES)
    who = client()
    assert [get_k(s, "/three", who) for _ in range(4)] == [200, 200, 200, 429]
    code, doc, _ = api(s, "POST", "/api/limits/three/hourly/reset?key=%s" % who)
    assert code == 200 and doc["reset"] is True and doc["existed"] is True, doc
    # the window's part is gone, the others stay: the bucket keeps its count
    assert tags(redis_cmd(redis.port, "GET", route_key("three", who))) == \
        sorted(fnv(n) for n in ("bucket", "cell"))
    assert redis_cmd(redis.port, "PTTL", route_key("three", who)) > 0
    st, _ = wait_until(lambda: get_k(s, "/three", who), 3, until=lambda c: c == 200,
                       step_s=0.05)
    assert st == 200
    code, doc, _ = api(s, "GET", "/api/limits/three/bucket?key=%s" % who)
    assert code == 200 and doc["remaining"] == 46, doc
    # a reset of a part that is not there
    code, doc, _ = api(s, "POST", "/api/limits/three/hourly/reset?key=%s" % client())
    assert code == 200 and doc["existed"] is False, doc


def test_reload_that_adds_a_limit_keeps_the_counts(sluice, redis):
    s = start_api(sluice, ROUTES)
    who = client()
    assert [get_k(s, "/three", who) for _ in range(4)] == [200, 200, 200, 429]
    more = ROUTES + """\
      - name: daily
        algorithm: fixed_window
        limit: 100
        window: 24h
        key: ["header:X-K"]
"""
    s.conf_path.write_text(s.conf_path.read_text().replace(ROUTES, more))
    os.kill(s.proc.pid, signal.SIGHUP)
    # once the new config decides (a new client's key has daily's part too),
    # hourly still denies: its part kept its count
    fresh = client()
    val, _ = wait_until(lambda: (get_k(s, "/three", fresh),
                                 redis_cmd(redis.port, "GET", route_key("three", fresh)))[1],
                        5, until=lambda v: v is not None and len(tags(v)) == 4, step_s=0.1)
    assert val is not None and len(tags(val)) == 4, val
    assert get_k(s, "/three", who) == 429
    assert keys_of(redis, "three", who) == [route_key("three", who)]


def test_pack_limits_off_keeps_a_key_per_limit(sluice, redis):
    routes = ROUTES.replace("name: three", "name: three_off").replace("/three", "/three_off")
    text = proxy_conf(routes).replace("  on_error:", "  pack_limits: false\n  on_error:", 1)
    s = sluice(text)
    who = client()
    assert [get_k(s, "/three_off", who) for _ in range(4)] == [200, 200, 200, 429]
    assert keys_of(redis, "three_off", who) == sorted(
        "%s{three_off|%s|%d:%s}" % (PREFIX, n, len(who), who) for n in ("bucket", "cell", "hourly"))


def test_a_limit_that_is_no_part_keeps_a_key_each(sluice, redis):
    s = start_api(sluice, MIXED)
    who = client()
    assert [get_k(s, "/mixed", who) for _ in range(4)] == [200, 200, 200, 429]
    keys = keys_of(redis, "mixed", who)
    assert "%s{mixed|hourly|%d:%s}" % (PREFIX, len(who), who) in keys, keys
    assert route_key("mixed", who) not in keys, keys
