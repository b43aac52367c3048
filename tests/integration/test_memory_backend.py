# sluice - tests/integration/test_memory_backend.py: the embedded limiter.
#
# `backend: memory` against the same seed cases as the Redis algorithms, timed
# against this host's clock (the proxy's clock, which the memory backend
# uses), plus all-or-nothing across limits; and `on_error: local`: with
# redis-server stopped, the in-process limiter still limits, and decisions go
# back to Redis once it returns.

import time
import uuid

import pytest

from conftest import Conn, build_request, free_port, redis_keys, wait_until
from proxylib import metrics, mval, start_proxy, statuses

ROUTES = """\
  - name: fw
    match: { path: /fw }
    upstream: api
    limits:
      - { name: fw5, algorithm: fixed_window, limit: 5, window: 1s, key: ["header:X-K"] }
  - name: sl
    match: { path: /sl }
    upstream: api
    limits:
      - { name: sl5, algorithm: sliding_log, limit: 5, window: 10s, key: ["header:X-K"] }
  - name: sw
    match: { path: /sw }
    upstream: api
    limits:
      - { name: sw5, algorithm: sliding_window, limit: 5, window: 10s, key: ["header:X-K"] }
  - name: tb
    match: { path: /tb }
    upstream: api
    limits:
      - { name: tb3, algorithm: token_bucket, rate: 1/s, burst: 3, key: ["header:X-K"] }
  - name: gcra
    match: { path: /gcra }
    upstream: api
    limits:
      - { name: gcra3, algorithm: gcra, rate: 1/s, burst: 3, key: ["header:X-K"] }
  - name: aon
    match: { path: /aon }
    upstream: api
    limits:
      - { name: a, algorithm: sliding_log, limit: 2, window: 1m, key: ["header:X-A"] }
      - { name: b, algorithm: fixed_window, limit: 4, window: 1h, key: ["header:X-B"] }
"""

MEMORY_TOP = "backend: memory\nmemory: { max_keys: 10000 }\n"


@pytest.fixture
def mem(sluice):
    # the Redis url points at a port with nothing on it: the memory backend
    # must not need Redis at all
    return start_proxy(sluice, ROUTES, workers=2, top=MEMORY_TOP, wait_redis=False,
                     redis_port=free_port())


def key():
    return [("X-K", uuid.uuid4().hex)]


def sleep_until_phase(window_s, phase_s):
    """Sleep until time.time() is phase_s past a multiple of window_s, at
    least 50 ms from now. Returns that edge."""
    now = time.time()
    edge = (int(now // window_s) + 1) * window_s
    while edge + phase_s - now < 0.05:
        edge += window_s
    time.sleep(edge + phase_s - now)
    return edge


def test_memory_fixed_window_10_of_10_across_edge(mem):
    for _ in range(3):
        hdr = key()
        with Conn(mem.port) as c:
            edge = sleep_until_phase(1.0, -0.30)
            first = []
            for _ in range(5):
                c.send(build_request("GET", "/fw", hdr))
                first.append(c.read_response().status)
            t1 = time.time()
            sleep_until_phase(1.0, 0.10)
            second = []
            for _ in range(6):
                c.send(build_request("GET", "/fw", hdr))
                second.append(c.read_response().status)
            t2 = time.time()
        if t1 >= edge or t2 >= edge + 1.0:
            continue        # a stalled machine straddled an edge: try again
        # 10 of 10 pass around the edge; the window really holds 5: the 6th
        # in the second window is refused
        assert first + second == [200] * 10 + [429]
        return
    pytest.fail("no attempt landed inside the windows")


def test_memory_fixed_window_limits_within_window(mem):
    for _ in range(3):
        hdr = key()
        sleep_until_phase(1.0, 0.05)
        t0 = time.time()
        got = statuses(mem.port, "/fw", 7, hdr)
        if int(time.time()) != int(t0):
            continue
        assert got == [200] * 5 + [429] * 2
        return
    pytest.fail("no attempt fitted in one window")


def test_memory_sliding_log_5_of_10(mem):
    assert statuses(mem.port, "/sl", 10, key()) == [200] * 5 + [429] * 5


def test_memory_sliding_window_5_of_10(mem):
    assert statuses(mem.port, "/sw", 10, key()) == [200] * 5 + [429] * 5


@pytest.mark.parametrize("path", ["/tb", "/gcra"])
def test_memory_bucket_seed_case(mem, path):
    hdr = key()
    with Conn(mem.port) as c:
        got = []
        for _ in range(5):
            c.send(build_request("GET", path, hdr))
            r = c.read_response()
            got.append(r.status)
        assert got == [200, 200, 200, 429, 429]
        assert r.header("Retry-After") == "1", r
        assert r.header("X-RateLimit-Remaining") == "0", r
        assert r.json()["limit"] in ("tb3", "gcra3")
        time.sleep(1.1)
        c.send(build_request("GET", path, hdr))
        assert c.read_response().status == 200
        c.send(build_request("GET", path, hdr))
        assert c.read_response().status == 429


def test_memory_all_or_nothing(mem):
    b = ("X-B", uuid.uuid4().hex)
    got = statuses(mem.port, "/aon", 3, [("X-A", uuid.uuid4().hex), b])
    got += statuses(mem.port, "/aon", 3, [("X-A", uuid.uuid4().hex), b])
    # the denied requests consumed nothing from b: b still had 2 for the 2nd A
    assert got == [200, 200, 429, 200, 200, 429]
    # now b is spent: a fresh A is refused by b
    r_hdr = [("X-A", uuid.uuid4().hex), b]
    assert statuses(mem.port, "/aon", 1, r_hdr) == [429]


def test_memory_headers_on_proxied_response(mem):
    from conftest import http_get
    r = http_get(mem.port, "/sl", headers=key())
    assert r.status == 200
    assert r.header("X-RateLimit-Limit") == "5"
    assert r.header("X-RateLimit-Remaining") == "4"
    assert r.header("RateLimit-Policy") == '"sl5";q=5;w=10'


def test_memory_readyz_without_redis(mem):
    from conftest import http_get
    assert http_get(mem.admin_port, "/readyz").status == 200


LOCAL_ROUTES = """\
  - name: loc
    match: { path: /loc }
    upstream: api
    limits:
      - { name: three, algorithm: sliding_log, limit: 3, window: 10s, key: ["header:X-K"] }
"""


def test_on_error_local_limits_while_redis_is_down(sluice, own_redis):
    s = start_proxy(sluice, LOCAL_ROUTES, on_error="local", redis_port=own_redis.port)
    before = metrics(s.admin_port)
    own_redis.stop()
    hdr = key()
    t0 = time.monotonic()
    got = statuses(s.port, "/loc", 6, hdr)
    assert got == [200, 200, 200, 429, 429, 429], got
    assert time.monotonic() - t0 < 5.0
    after = metrics(s.admin_port)
    assert (mval(after, "sluice_requests_total", route="loc", decision="limited")
            - mval(before, "sluice_requests_total", route="loc", decision="limited")) == 3

    # Redis back: decisions return to it (a key appears there), bounded
    own_redis.start()
    fresh = key()
    wait_until(lambda: statuses(s.port, "/loc", 1, key()) and redis_keys(own_redis.port), 8.0,
               step_s=0.1, what="decisions to go back to Redis")
    assert statuses(s.port, "/loc", 4, fresh) == [200, 200, 200, 429]


def test_memory_limit_shared_by_all_workers(mem):
    """20 fresh connections (spread over both workers by SO_REUSEPORT) on one
    key: the memory limiter is one for the process, so exactly 5 pass."""
    from proxylib import series
    hdr = key()
    b = metrics(mem.admin_port)
    got = [statuses(mem.port, "/sl", 1, hdr)[0] for _ in range(20)]
    a = metrics(mem.admin_port)
    per_worker = {k: v - b.get(("sluice_worker_requests_total", k), 0)
                  for k, v in series(a, "sluice_worker_requests_total").items()}
    assert sum(1 for v in per_worker.values() if v > 0) == 2, per_worker
    assert got.count(200) == 5 and got.count(429) == 15, got


def test_memory_many_keys_bounded(sluice):
    """More distinct keys than memory.max_keys: the process stays up and a
    fresh key is still limited exactly."""
    s = start_proxy(sluice, ROUTES, top="backend: memory\nmemory: { max_keys: 50 }\n",
                  wait_redis=False, redis_port=free_port())
    with Conn(s.port) as c:
        for i in range(300):
            c.send(build_request("GET", "/sl", [("X-K", "churn-%d" % i)]))
            assert c.read_response().status == 200
    assert statuses(s.port, "/sl", 7, key()) == [200] * 5 + [429] * 2
    assert s.proc.poll() is None


# Limits whose limit x window_ms is beyond 2^53 (5,000,000 per 30 days,
# 300,000 per 365 days): the memory limiter counts them as Redis does. Each
# request costs X-Cost units, so the quota is spent in a few requests.
BIG = [(5000000, "30d", 1000000), (300000, "365d", 300000)]
BIG_ALGOS = ["fixed_window", "sliding_window", "sliding_log"]
BIG_ROUTES = "".join(
    "  - name: big%d%s\n"
    "    match: { path: /big%d/%s }\n"
    "    upstream: api\n"
    "    limits:\n"
    "      - { name: big, algorithm: %s, limit: %d, window: %s, key: [\"header:X-K\"],\n"
    "          cost_header: X-Cost }\n" % (i, a.replace("_", ""), i, a, a, lim, win)
    for i, (lim, win, _) in enumerate(BIG) for a in BIG_ALGOS)


@pytest.mark.parametrize("mode", ["memory", "on_error_local"])
def test_memory_limits_beyond_2_53_are_enforced(sluice, mode):
    if mode == "memory":
        s = start_proxy(sluice, BIG_ROUTES, top=MEMORY_TOP, wait_redis=False,
                      redis_port=free_port())
    else:       # Redis down: the local limiter decides
        s = start_proxy(sluice, BIG_ROUTES, on_error="local", wait_redis=False,
                      redis_port=free_port())
    for i, (lim, _, cost) in enumerate(BIG):
        for a in BIG_ALGOS:
            hdr = key()
            with Conn(s.port) as c:
                for n in range(lim // cost):
                    c.send(build_request("GET", "/big%d/%s" % (i, a), hdr + [("X-Cost", str(cost))]))
                    r = c.read_response()
                    assert r.status == 200, (a, lim, n, r)
                    assert r.header("X-RateLimit-Limit") == str(lim), (a, lim, r.headers)
                    assert r.header("X-RateLimit-Remaining") == str(lim - (n + 1) * cost), \
                        (a, lim, r.headers)
                c.send(build_request("GET", "/big%d/%s" % (i, a), hdr))
                r = c.read_response()
                assert r.status == 429, (a, lim, r)
                assert r.header("X-RateLimit-Limit") == str(lim), (a, lim, r.headers)
                assert r.header("X-RateLimit-Remaining") == "0"
                assert int(r.header("Retry-After")) >= 1
    assert "could not decide" not in s.stderr
