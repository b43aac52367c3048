# sluice - tests/integration/test_sec_misc.py: issue 9, memory eviction.
#
# backend: memory with a small memory.max_keys: a denied key, and a key
# whose quota is used up, stay denied while a flood of other keys goes
# through the table; the deny cache may drop a key, Redis still denies it.

import time
import uuid

from conftest import Conn, build_request, free_port
from opslib import metrics, mval, start_ops

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
    s = start_ops(sluice, MEMORY_ROUTES, top="backend: memory\nmemory: { max_keys: 32 }\n",
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
    s = start_ops(sluice, LIMITED, top="deny_cache: { max_keys: 4 }\n")
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


