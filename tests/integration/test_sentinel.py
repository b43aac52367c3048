# sluice - tests/integration/test_sentinel.py: sluice behind Redis Sentinel.
#
# One master, one replica and three sentinels (clusterlib.SentinelSet). sluice
# asks the sentinels for the master, limits through it, and when the master
# is killed follows the failover (+switch-master) and limits again on the
# promoted replica. Slow: run by `make test-slow`.

import time
import uuid

import pytest

from conftest import http_get, wait_until
from clusterlib import Load, SentinelSet

pytestmark = pytest.mark.slow

CONF = """\
listen: 127.0.0.1:@LISTEN_PORT@
workers: 1
redis:
  sentinel:
    master: mymaster
    nodes: [@SENTINELS@]
  timeout: 200ms
  prefix: "st:"
  on_error: allow
upstreams:
  api:
    servers: [127.0.0.1:@UPSTREAM_PORT@]
    keepalive: 8
    connect_timeout: 1s
    timeout: 5s
routes:
  - name: lim
    match: { path: /lim }
    upstream: api
    limits:
      - { name: three, algorithm: fixed_window, limit: 3, window: 1m, key: ["header:X-K"] }
"""


def limited(port, key):
    """Statuses of 4 requests for key, and whether they carried headers."""
    out = []
    for _ in range(4):
        r = http_get(port, "/lim", headers=[("X-K", key)])
        out.append((r.status, r.header("X-RateLimit-Limit") is not None))
    return out


def wait_limiting(port, timeout_s):
    """Seconds until a fresh key gets 200 200 200 429 with headers, or None."""
    ok, took = wait_until(lambda: limited(port, uuid.uuid4().hex) == [(200, True)] * 3 + [(429, True)],
                          timeout_s, step_s=0.1)
    return took if ok else None


def test_sentinel_follows_failover(tmp_path, sluice):
    ss = SentinelSet(tmp_path).start()
    try:
        conf = CONF.replace("@SENTINELS@", ", ".join("127.0.0.1:%d" % p
                                                      for p in ss.sentinel_ports))
        s = sluice(conf, redis_port=ss.master_port)
        assert wait_limiting(s.port, 10) is not None, s.stderr[-3000:]
        load = Load([s.port], "/lim", [("X-K", uuid.uuid4().hex)], threads=2,
                    max_requests=100000, max_s=40, pause_s=0.02).start()
        killed_at = time.monotonic()
        ss.kill(ss.master_port)
        def master():
            try:
                return ss.master()
            except Exception:
                return None
        wait_until(master, 30, until=lambda m: m == ss.replica_port, step_s=0.05,
                   what="the sentinels to fail over")
        switched_at = time.monotonic()
        resume_s = wait_limiting(s.port, 10)
        results = load.stop()
        errors = [r for r in results if r[1] not in (200, 429)]
        print("sentinel: failover %.2f s after the kill; limiting again %.2f s after it; "
              "%d requests under load, %d failed"
              % (switched_at - killed_at, resume_s if resume_s is not None else -1,
                 len(results), len(errors)))
        assert resume_s is not None, s.stderr[-3000:]
        assert resume_s < 5.0
        assert errors == []
        assert "127.0.0.1:%d" % ss.replica_port in s.stderr
    finally:
        ss.stop()


def test_sentinel_password_and_unknown_master(tmp_path, sluice):
    ss = SentinelSet(tmp_path, password="sentinel-secret").start()
    try:
        nodes = ", ".join("127.0.0.1:%d" % p for p in ss.sentinel_ports)
        conf = CONF.replace("@SENTINELS@", nodes).replace(
            "    nodes: [", "    password: sentinel-secret\n    nodes: [")
        s = sluice(conf, redis_port=ss.master_port)
        assert wait_limiting(s.port, 10) is not None, s.stderr[-3000:]
        # a master name the sentinels do not know: on_error (allow, no headers)
        bad = sluice(conf.replace("master: mymaster", "master: nosuch"),
                     redis_port=ss.master_port, wait_redis=False)
        r = http_get(bad.port, "/lim", headers=[("X-K", "x")])
        assert r.status == 200 and r.header("X-RateLimit-Limit") is None
        assert "nosuch" in bad.stderr or "does not know" in bad.stderr
    finally:
        ss.stop()


def test_admin_reads_through_the_sentinel_master(tmp_path, sluice):
    """The admin API's persistent connection (issue 18 item 7): key reads go
    to the master a sentinel names, and after a failover to the promoted
    replica."""
    import json
    from conftest import free_port, wait_port
    ss = SentinelSet(tmp_path).start()
    try:
        admin = free_port()
        conf = CONF.replace("@SENTINELS@", ", ".join("127.0.0.1:%d" % p
                                                      for p in ss.sentinel_ports))
        conf = conf.replace("routes:\n", "admin: { listen: 127.0.0.1:%d }\nroutes:\n" % admin, 1)
        s = sluice(conf, redis_port=ss.master_port)
        assert wait_port(admin, s.proc) and wait_limiting(s.port, 10) is not None

        def remaining(key):
            r = http_get(admin, "/api/limits/lim/three?key=" + key, timeout_s=10)
            return r.status, json.loads(r.body).get("remaining")

        key = uuid.uuid4().hex
        http_get(s.port, "/lim", headers=[("X-K", key)])
        assert [remaining(key) for _ in range(3)] == [(200, 2)] * 3
        ss.kill(ss.master_port)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if ss.master() == ss.replica_port:
                    break
            except Exception:
                pass
            time.sleep(0.05)
        assert ss.master() == ss.replica_port, "the sentinels did not fail over"
        fresh, got = uuid.uuid4().hex, None
        while time.monotonic() < deadline and got != (200, 3):
            got = remaining(fresh)
            time.sleep(0.1)
        assert got == (200, 3), (got, s.stderr[-3000:])
    finally:
        ss.stop()
