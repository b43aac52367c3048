# sluice - tests/integration/test_limiter_pressure.py: issue 9, Redis full, memory eviction, 503.
#
# A redis-server at maxmemory under noeviction (filled past it): every
# decision that writes fails with -OOM, sluice counts it as
# sluice_redis_errors_total{reason="oom"} and on_error applies (allow: 200
# without rate-limit fields, deny: 503 with Retry-After, local: the memory
# limiter still limits). backend: memory with a small memory.max_keys: a
# denied key, and a key whose quota is used up, stay denied while a flood of
# other keys goes through the table; the deny cache may drop a key, Redis
# still denies it. Redis down under on_error deny: the 503
# limiter_unavailable carries Retry-After >= 1.

import time
import uuid

import pytest

from conftest import Conn, RedisError, RedisServer, build_request, free_port, redis_cmd
from proxylib import metrics, mval, start_proxy

LIMITED = """\
  - name: lim
    match: { path: /lim }
    upstream: api
    limits:
      - { name: two, algorithm: fixed_window, limit: 2, window: 1h, key: ["header:X-K"] }
"""

RL_FIELDS = ("x-ratelimit-limit", "ratelimit", "ratelimit-policy", "retry-after")


def responses(port, path, n, headers):
    """n requests on one keep-alive connection; their responses."""
    out = []
    with Conn(port) as c:
        for _ in range(n):
            c.send(build_request("GET", path, headers))
            out.append(c.read_response())
    return out


def retry_after(r):
    v = r.header("Retry-After")
    assert v is not None and v.isdigit(), r
    return int(v)


# ------------------------------------------------------------ Redis full ----

def used_memory(port):
    info = redis_cmd(port, "INFO", "memory").decode()
    for line in info.splitlines():
        if line.startswith("used_memory:"):
            return int(line.split(":")[1])
    raise AssertionError("no used_memory in INFO")


def fill_redis(port):
    """maxmemory just above what is used now, then values until a write gets
    -OOM (bounded): the server is full under noeviction. maxmemory then goes
    1 MB below what the data holds, so that a client connection closing or
    going idle (its buffers freed) does not make room again. Returns the keys written."""
    redis_cmd(port, "CONFIG", "SET", "maxmemory-policy", "noeviction")
    redis_cmd(port, "CONFIG", "SET", "maxmemory", used_memory(port) + 256 * 1024)
    value = b"x" * 8192
    for i in range(2000):
        try:
            redis_cmd(port, "SET", "fill:%d" % i, value)
        except RedisError as e:
            assert str(e).startswith("OOM"), e
            # well below: Redis frees an idle client's query buffer (clientsCron,
            # 16-32 KB each, six or more sluice connections here) on its own
            redis_cmd(port, "CONFIG", "SET", "maxmemory", max(1, used_memory(port) - 1024 * 1024))
            return i
    raise AssertionError("redis never reported OOM")


@pytest.fixture
def full_redis(tmp_path):
    srv = RedisServer(tmp_path, extra_args=["--maxmemory-policy", "noeviction"])
    srv.start()
    yield srv
    srv.stop()


def start_on(sluice, redis_port, on_error):
    return start_proxy(sluice, LIMITED, on_error=on_error, redis_port=redis_port,
                     top="memory: { max_keys: 1000 }\n")


def test_redis_full_counts_oom_and_applies_on_error(sluice, full_redis):
    port = full_redis.port
    # sluice connects (and loads its script) first; SCRIPT LOAD would pass
    # under OOM too, but a fresh start must not depend on it
    allow = start_on(sluice, port, "allow")
    deny = start_on(sluice, port, "deny")
    local = start_on(sluice, port, "local")
    assert fill_redis(port) > 0

    # on_error allow: everyone admitted, without rate-limit fields; each
    # decision counted as an oom error
    b = metrics(allow.admin_port)
    got = responses(allow.port, "/lim", 5, [("X-K", uuid.uuid4().hex)])
    a = metrics(allow.admin_port)
    assert [r.status for r in got] == [200] * 5, got
    for r in got:
        assert not any(r.header(h) for h in RL_FIELDS), r
    oom = mval(a, "sluice_redis_errors_total", reason="oom") - \
        mval(b, "sluice_redis_errors_total", reason="oom")
    total = mval(a, "sluice_redis_errors_total") - mval(b, "sluice_redis_errors_total")
    assert oom == 5 and total == 5, (oom, total)
    assert mval(a, "sluice_requests_total", route="lim", decision="error") - \
        mval(b, "sluice_requests_total", route="lim", decision="error") == 5

    # on_error deny: 503 limiter_unavailable with Retry-After (connected: 1 s)
    got = responses(deny.port, "/lim", 3, [("X-K", uuid.uuid4().hex)])
    assert [r.status for r in got] == [503] * 3, got
    for r in got:
        assert r.json() == {"error": "limiter_unavailable"}
        assert retry_after(r) == 1, r
    assert mval(metrics(deny.admin_port), "sluice_redis_errors_total", reason="oom") == 3

    # on_error local: the memory limiter keeps limiting (limit 2)
    got = responses(local.port, "/lim", 4, [("X-K", uuid.uuid4().hex)])
    assert [r.status for r in got] == [200, 200, 429, 429], got
    assert retry_after(got[2]) >= 1
    assert mval(metrics(local.admin_port), "sluice_redis_errors_total", reason="oom") >= 2

    # room again: decisions go back to Redis, and the oom count stops
    redis_cmd(port, "CONFIG", "SET", "maxmemory", 0)
    before = mval(metrics(allow.admin_port), "sluice_redis_errors_total", reason="oom")
    got = responses(allow.port, "/lim", 3, [("X-K", uuid.uuid4().hex)])
    assert [r.status for r in got] == [200, 200, 429], got
    assert mval(metrics(allow.admin_port), "sluice_redis_errors_total", reason="oom") == before


def test_redis_error_reasons_exposed(sluice, redis):
    """Every reason has a series from the start, beside the unlabelled total."""
    s = start_proxy(sluice, LIMITED)
    ms = metrics(s.admin_port)
    assert ("sluice_redis_errors_total", ()) in ms
    for reason in ("oom", "timeout", "unavailable", "error"):
        assert ("sluice_redis_errors_total", (("reason", reason),)) in ms, reason


# -------------------------------------------------- memory backend eviction ----

MEMORY_ROUTES = """\
  - name: fw
    match: { path: /fw }
    upstream: api
    limits:
      - { name: l, algorithm: fixed_window, limit: 1, window: 1h, key: ["header:X-K"] }
  - name: sw
    match: { path: /sw }
    upstream: api
    limits:
      - { name: l, algorithm: sliding_window, limit: 1, window: 1h, key: ["header:X-K"] }
  - name: sl
    match: { path: /sl }
    upstream: api
    limits:
      - { name: l, algorithm: sliding_log, limit: 1, window: 1h, key: ["header:X-K"] }
  - name: tb
    match: { path: /tb }
    upstream: api
    limits:
      - { name: l, algorithm: token_bucket, rate: 1/h, burst: 1, key: ["header:X-K"] }
  - name: gcra
    match: { path: /gcra }
    upstream: api
    limits:
      - { name: l, algorithm: gcra, rate: 1/h, burst: 1, key: ["header:X-K"] }
  - name: flood
    match: { path: /flood }
    upstream: api
    limits:
      - { name: l, algorithm: fixed_window, limit: 1000, window: 1h, key: ["header:X-K"] }
"""

ALGOS = ("/fw", "/sw", "/sl", "/tb", "/gcra")
FLOOD = 400


def test_memory_flood_keeps_denied_keys(sluice):
    # 32 keys: two stripes of 16; the flood puts about 200 new keys in each
    s = start_proxy(sluice, MEMORY_ROUTES, top="backend: memory\nmemory: { max_keys: 32 }\n",
                  wait_redis=False, redis_port=free_port())
    tag = uuid.uuid4().hex
    with Conn(s.port) as c:
        def status(path, key):
            c.send(build_request("GET", path, [("X-K", key)]))
            return c.read_response().status

        for p in ALGOS:
            # denied: one request passes, the next is refused
            assert [status(p, "denied" + p), status(p, "denied" + p)] == [200, 429], p
            # spent: its one request passed, nothing refused yet
            assert status(p, "spent" + p) == 200, p
        t0 = time.monotonic()
        for i in range(FLOOD):
            assert status("/flood", "%s:%d" % (tag, i)) == 200
        flood_s = time.monotonic() - t0
        for p in ALGOS:
            assert status(p, "denied" + p) == 429, (p, "denied key got a fresh quota")
            assert status(p, "spent" + p) == 429, (p, "spent key got a fresh quota")
    print("memory flood: %d keys through a 32-key table in %.2f s; 10 denying keys kept"
          % (FLOOD, flood_s))


def test_deny_cache_flood_still_denied(sluice, redis):
    """The deny cache is an LRU of denials: a flood of other denied keys
    pushes key A out of a 4-entry cache, and A's next request is asked of
    Redis, which still denies it (the cache only saves calls)."""
    s = start_proxy(sluice, LIMITED, top="deny_cache: { max_keys: 4 }\n")
    tag = uuid.uuid4().hex
    a = [("X-K", tag + ":A")]
    assert [r.status for r in responses(s.port, "/lim", 3, a)] == [200, 200, 429]
    for i in range(20):
        got = responses(s.port, "/lim", 3, [("X-K", "%s:%d" % (tag, i))])
        assert [r.status for r in got] == [200, 200, 429]
    b = metrics(s.admin_port)
    got = responses(s.port, "/lim", 1, a)
    after = metrics(s.admin_port)
    assert got[0].status == 429, got
    # answered by Redis, not by the cache
    assert mval(after, "sluice_redis_requests_total") - mval(b, "sluice_redis_requests_total") == 1
    assert mval(after, "sluice_deny_cache_hits_total") == mval(b, "sluice_deny_cache_hits_total")


# ------------------------------------------------------- 503 Retry-After ----

def test_unavailable_503_has_retry_after(sluice):
    s = start_proxy(sluice, LIMITED, on_error="deny", redis_port=free_port(), wait_redis=False)
    got = responses(s.port, "/lim", 3, [("X-K", uuid.uuid4().hex)])
    assert [r.status for r in got] == [503] * 3, got
    for r in got:
        assert r.json() == {"error": "limiter_unavailable"}
        # the reconnect backoff (at most 0.5 s) rounds up to 1 s
        assert retry_after(r) == 1, r
    ms = metrics(s.admin_port)
    assert mval(ms, "sluice_redis_errors_total", reason="unavailable") >= 3
