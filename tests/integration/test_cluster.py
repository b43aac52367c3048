# sluice - tests/integration/test_cluster.py: sluice on a real Redis Cluster.
#
# A 3-master, 3-replica cluster started here (clusterlib.Cluster): the seed
# cases and multi-limit all-or-nothing through sluice; four sluice instances
# and 200 concurrent clients on one key admit exactly the limit; a slot
# migrated under load (ASK and MOVED) and a master killed under load. Slow:
# run by `make test-slow`.

import time
import uuid

import pytest

from apilib import TOKEN, api
from conftest import Conn, build_request, free_port, http_get, parallel, redis_cmd, redis_time_s, \
    sleep_until_redis_phase, wait_port, wait_until
from clusterlib import Cluster, Load, redirect_counts

pytestmark = pytest.mark.slow

CONF = """\
listen: 127.0.0.1:@LISTEN_PORT@
workers: @WORKERS@
redis:
  cluster: [@SEEDS@]
  timeout: @TIMEOUT@
  prefix: "ct:"
  on_error: @ON_ERROR@
upstreams:
  api:
    servers: [127.0.0.1:@UPSTREAM_PORT@]
    keepalive: 64
    connect_timeout: 1s
    timeout: 5s
routes:
  - name: fw
    match: { path: /fw }
    upstream: api
    limits:
      - { name: fw5, algorithm: fixed_window, limit: 5, window: 1s, key: ["header:X-K"] }
  - name: sl
    match: { path: /sl }
    upstream: api
    limits:
      - { name: sl5, algorithm: sliding_log, limit: 5, window: 1s, key: ["header:X-K"] }
  - name: tb
    match: { path: /tb }
    upstream: api
    limits:
      - { name: tb3, algorithm: token_bucket, rate: 1/s, burst: 3, key: ["header:X-K"] }
  - name: multi
    match: { path: /multi }
    upstream: api
    limits:
      - { name: wide, algorithm: fixed_window, limit: 100, window: 1m, key: ["header:X-K"] }
      - { name: narrow, algorithm: fixed_window, limit: 2, window: 1m, key: ["header:X-K", "header:X-J"] }
      - { name: log, algorithm: sliding_log, limit: 50, window: 1m, key: ["header:X-K"] }
  - name: many-sl
    match: { path: /many/sl }
    upstream: api
    limits:
      - { name: m, algorithm: sliding_log, limit: 50, window: 1m, key: ["header:X-K"] }
  - name: many-tb
    match: { path: /many/tb }
    upstream: api
    limits:
      - { name: m, algorithm: token_bucket, rate: 1/m, burst: 50, key: ["header:X-K"] }
  - name: many-gcra
    match: { path: /many/gcra }
    upstream: api
    limits:
      - { name: m, algorithm: gcra, rate: 1/m, burst: 50, key: ["header:X-K"] }
  - name: load
    match: { path: /load }
    upstream: api
    limits:
      - { name: m, algorithm: sliding_log, limit: 300, window: 10m, key: ["header:X-K"] }
  - name: free
    match: { path: /free }
    upstream: api
"""


def cluster_conf(cluster, on_error="deny", timeout="300ms", workers=1):
    seeds = ", ".join("127.0.0.1:%d" % p for p in cluster.ports[:2])
    return (CONF.replace("@SEEDS@", seeds).replace("@ON_ERROR@", on_error)
            .replace("@TIMEOUT@", timeout).replace("@WORKERS@", str(workers)))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("cluster")).start()
    yield c
    c.stop()


def start_on_cluster(sluice, cluster, **kw):
    s = sluice(cluster_conf(cluster, **kw), redis_port=cluster.masters()[0], wait_redis=False)
    # connected: a limited route answers with headers
    def limited(r):
        return r.status == 200 and r.header("X-RateLimit-Limit") is not None
    r, _ = wait_until(lambda: http_get(s.port, "/fw", headers=[("X-K", "warm-%s" % uuid.uuid4().hex)]),
                      10, until=limited, step_s=0.1)
    assert limited(r), "sluice did not reach the cluster; stderr:\n" + s.stderr[-3000:]
    return s


def statuses(port, path, key, n, extra=()):
    out = []
    with Conn(port) as c:
        for _ in range(n):
            c.send(build_request("GET", path, [("X-K", key)] + list(extra)))
            out.append(c.read_response().status)
    return out


def around_edge(port, redis_port, path):
    """5 requests just before a 1 s window edge and 5 just after (Redis
    time). None when a batch landed on the wrong side (a stalled machine)."""
    key = uuid.uuid4().hex
    with Conn(port) as c:
        edge = sleep_until_redis_phase(redis_port, 1.0, -0.30, min_wait_s=0.05)
        t0 = redis_time_s(redis_port)
        first = []
        for _ in range(5):
            c.send(build_request("GET", path, [("X-K", key)]))
            first.append(c.read_response().status)
        t1 = redis_time_s(redis_port)
        sleep_until_redis_phase(redis_port, 1.0, 0.10)
        t2 = redis_time_s(redis_port)
        second = []
        for _ in range(5):
            c.send(build_request("GET", path, [("X-K", key)]))
            second.append(c.read_response().status)
        t3 = redis_time_s(redis_port)
    if not (edge - 1 <= t0 and t1 < edge and edge <= t2 and t3 < edge + 0.9):
        return None
    return first + second


def run_timed(*args):
    for _ in range(3):
        out = around_edge(*args)
        if out is not None:
            return out
    pytest.fail("the machine was too slow to place a batch inside a window 3 times")


def test_seed_fixed_window(cluster, sluice):
    s = start_on_cluster(sluice, cluster)
    assert run_timed(s.port, cluster.masters()[0], "/fw") == [200] * 10


def test_seed_sliding_log(cluster, sluice):
    s = start_on_cluster(sluice, cluster)
    assert run_timed(s.port, cluster.masters()[0], "/sl") == [200] * 5 + [429] * 5


def test_seed_token_bucket(cluster, sluice):
    s = start_on_cluster(sluice, cluster)
    key = uuid.uuid4().hex
    got = [1 if st == 200 else 0 for st in statuses(s.port, "/tb", key, 5)]
    assert got == [1, 1, 1, 0, 0]
    time.sleep(1.1)
    assert statuses(s.port, "/tb", key, 1) == [200]


def test_multi_limit_all_or_nothing_across_slots(cluster, sluice):
    s = start_on_cluster(sluice, cluster)
    k, j = uuid.uuid4().hex, uuid.uuid4().hex
    assert statuses(s.port, "/multi", k, 2, [("X-J", j)]) == [200, 200]
    keys = sorted(cluster.keys("ct:{multi|*"))
    wide = [x for x in keys if x.startswith(b"ct:{multi|wide|")]
    narrow = [x for x in keys if x.startswith(b"ct:{multi|narrow|")]
    log = [x for x in keys if x.startswith(b"ct:{multi|log|")]
    assert len(wide) == len(narrow) == len(log) == 1
    slots = {cluster.keyslot(wide[0]), cluster.keyslot(narrow[0]), cluster.keyslot(log[0])}
    assert len(slots) == 3, "the route's keys should span slots"
    # narrow is spent: denied, and the others get back what they consumed
    for _ in range(5):
        r = http_get(s.port, "/multi", headers=[("X-K", k), ("X-J", j)])
        assert r.status == 429
        assert r.json()["limit"] == "narrow"
    time.sleep(0.3)                         # refunds are fire and forget
    assert cluster.cmd_for_key(wide[0], "GET", wide[0]).split()[1] == b"2"  # "F<window> <count>"
    assert cluster.cmd_for_key(log[0], "ZCARD", log[0]) == 2
    for key in (wide[0], log[0], narrow[0]):
        assert cluster.cmd_for_key(key, "PTTL", key) > 0
    # another X-J: a fresh narrow; wide and log count on from 2
    r = http_get(s.port, "/multi", headers=[("X-K", k), ("X-J", "other")])
    assert r.status == 200
    assert cluster.cmd_for_key(wide[0], "GET", wide[0]).split()[1] == b"3"  # "F<window> <count>"


@pytest.mark.parametrize("algo", ["sl", "tb", "gcra"])
def test_four_proxies_200_clients_exact(cluster, sluice, algo):
    proxies = [start_on_cluster(sluice, cluster, timeout="2s", workers=2) for _ in range(4)]
    key = uuid.uuid4().hex
    results = parallel([lambda i=i: http_get(proxies[i % 4].port, "/many/" + algo,
                                             headers=[("X-K", key)], timeout_s=10).status
                        for i in range(200)])
    assert len(results) == 200
    admitted = results.count(200)
    print("%s: 4 proxies, 200 clients: %d admitted, %d limited" %
          (algo, admitted, results.count(429)))
    assert results.count(429) == 150 and admitted == 50, results


def test_slot_migration_under_load(cluster, sluice):
    proxies = [start_on_cluster(sluice, cluster, timeout="1s") for _ in range(2)]
    key = uuid.uuid4().hex
    assert http_get(proxies[0].port, "/load", headers=[("X-K", key)]).status == 200
    rkey = [k for k in cluster.keys("ct:{load|*") if key.encode() in k][0]
    slot = cluster.keyslot(rkey)
    src = cluster.owner(slot)
    dst = [m for m in cluster.masters() if m != src][0]
    # below the limit while the slot moves (a denied key would stop at the
    # deny cache and never meet a redirect), past it by the end
    load = Load([p.port for p in proxies], "/load", [("X-K", key)], threads=4,
                max_requests=450, max_s=30, pause_s=0.05).start()
    time.sleep(1.0)
    cluster.migrate_slot(slot, src, dst, between=lambda: time.sleep(1.0))
    during = len(load.results)
    wait_until(lambda: len(load.results) >= 450, 30, step_s=0.1)
    results = load.stop()
    assert cluster.owner(slot) == dst
    failed = [r for r in results if r[1] not in (200, 429)]
    admitted = 1 + sum(1 for r in results if r[1] == 200)
    asks = moves = 0
    for p in proxies:
        a, m = redirect_counts(p.stderr)
        asks += a
        moves += m
    print("migration: %d requests (%d until the slot moved), %d failed, %d admitted of "
          "300, ask %d, moved %d" % (len(results), during, len(failed), admitted, asks, moves))
    assert failed == []
    assert during < 299, "the limit was reached before the slot moved"
    # the load's threads may each finish the request they started: 450 or
    # a few more, well past the limit of 300 either way
    assert len(results) >= 450, "the load should exceed the limit"
    assert admitted == 300
    assert cluster.cmd_for_key(rkey, "ZCARD", rkey) == 300
    assert asks >= 1 and moves >= 1


def test_master_killed_under_load(tmp_path, sluice):
    c = Cluster(tmp_path, node_timeout_ms=1000).start()
    try:
        proxies = [start_on_cluster(sluice, c, on_error="allow", timeout="200ms")]
        key = uuid.uuid4().hex
        assert http_get(proxies[0].port, "/load", headers=[("X-K", key)]).status == 200
        rkey = [k for k in c.keys("ct:{load|*") if key.encode() in k][0]
        slot = c.keyslot(rkey)
        victim = c.owner(slot)
        load = Load([proxies[0].port], "/load", [("X-K", key)], threads=2,
                    max_requests=100000, max_s=30, pause_s=0.02).start()
        time.sleep(1.0)
        killed_at = time.monotonic()
        c.kill(victim)
        def owner():
            try:
                return c.owner(slot)
            except Exception:
                return None
        wait_until(owner, 20, until=lambda o: o is not None and o != victim, step_s=0.05,
                   what="a replica to be promoted")
        promoted_at = time.monotonic()
        time.sleep(4.0)
        results = load.stop()
        after = [r for r in results if r[0] > promoted_at]
        limited_again = [r for r in after if r[2]]
        assert limited_again, "sluice did not limit again after the promotion"
        resume_s = limited_again[0][0] - promoted_at
        errors = [r for r in results if r[1] not in (200, 429)]
        no_headers = [r for r in results if r[1] == 200 and not r[2]]
        print("failover: promoted %.2f s after the kill, limiting resumed %.2f s after the "
              "promotion; %d requests, %d on_error (allowed without headers), %d failed"
              % (promoted_at - killed_at, resume_s, len(results), len(no_headers), len(errors)))
        assert errors == []
        assert resume_s < 3.0
        # once resumed, every answer carries the limit again
        assert all(r[2] for r in after if r[0] > limited_again[0][0] + 0.5)
    finally:
        c.stop()


PLANS = """\
plans:
  default: free
  free:
    limits:
      - { name: per-hour, algorithm: fixed_window, limit: 2, window: 1h, key: ["header:X-K"] }
  pro:
    limits:
      - { name: per-hour, algorithm: fixed_window, limit: 5, window: 1h, key: ["header:X-K"] }
"""


def test_plan_assignments_are_read_from_the_node_that_holds_them(cluster, sluice):
    """The run-time plan assignments (hash ct:plans) are read whole by a
    proxy that starts later, though its first seed is a node that does not
    hold the hash (MOVED): its subscriber goes to the node that does."""
    slot = int(redis_cmd(cluster.masters()[0], "CLUSTER", "KEYSLOT", "ct:plans"))
    owner = cluster.slot_owners()[slot]
    other = [p for p in cluster.masters() if p != owner][0]
    admin_ports = []

    def start():
        admin_port = free_port()
        admin_ports.append(admin_port)
        text = cluster_conf(cluster).replace(
            "cluster: [%s]" % ", ".join("127.0.0.1:%d" % p for p in cluster.ports[:2]),
            "cluster: [127.0.0.1:%d, 127.0.0.1:%d]" % (other, owner))
        text = PLANS + text.replace(
            "routes:\n", "admin:\n  listen: 127.0.0.1:%d\n  token: ${SLUICE_TEST_TOKEN}\n"
            "routes:\n  - name: planned\n    match: { path: /planned }\n    upstream: api\n"
            "    plan_key: \"header:X-K\"\n" % admin_port, 1)
        s = sluice(text, env={"SLUICE_TEST_TOKEN": TOKEN}, redis_port=owner, wait_redis=False)
        s.admin_port = admin_port
        assert wait_port(admin_port, s.proc), s.stderr
        return s

    a = start()
    key = "k-%s" % uuid.uuid4().hex
    code, doc, _ = wait_until(lambda: api(a, "PUT", "/api/plans?key=" + key, {"plan": "pro"}),
                              10, until=lambda r: r[0] == 200)[0]
    assert code == 200 and doc["source"] == "runtime", doc
    b = start()
    doc = wait_until(lambda: api(b, "GET", "/api/plans?key=" + key)[1], 10,
                     until=lambda d: d and d.get("source") == "runtime")[0]
    assert doc and doc["plan"] == "pro" and doc["source"] == "runtime", (doc, b.stderr[-2000:])
    assert "HGETALL" not in b.stderr, b.stderr[-2000:]
    got = [http_get(b.port, "/planned", headers=[("X-K", key)]).status for _ in range(6)]
    assert got == [200] * 5 + [429], got
