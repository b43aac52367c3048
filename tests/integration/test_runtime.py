# sluice - tests/integration/test_runtime.py: a reload builds a new runtime.
#
# Issue 10, defect 4. A reload that changes the backend settings (redis.url,
# redis.timeout, a cluster: or sentinel: section) makes new Redis
# connections; the old ones close as soon as the last request that started
# under the old config ends, and /readyz and sluice_redis_connected describe
# the current config only. Each test has a redis-server of its own, so its
# CLIENT LIST holds sluice's connections and the one asking. The slow test
# reloads onto a real Sentinel set (clusterlib.SentinelSet) and back.

import os
import re
import signal
import time

import pytest

from conftest import (Conn, build_request, free_port, http_get, redis_clients, redis_keys,
                      wait_until)
from proxylib import metrics, mval, start_proxy, wait_metric

ROUTES = """\
  - name: lim
    match: { path: /lim }
    upstream: api
    limits:
      - { name: per-ip, algorithm: sliding_log, limit: 1000000, window: 1m, key: [ip] }
  - name: slow
    match: { path: /slow }
    upstream: api
    limits:
      - { name: per-ip, algorithm: sliding_log, limit: 1000000, window: 1m, key: [ip] }
"""

WAIT_S = 5.0


def sluice_conns(redis_port):
    """Connections to the Redis other than the one asking CLIENT LIST."""
    clients = redis_clients(redis_port)
    assert clients is not None, "redis on %d does not answer" % redis_port
    return len(clients) - 1


def wait_conns(redis_port, want, timeout_s=WAIT_S):
    """Poll (bounded) until sluice holds `want` connections; the last count."""
    return wait_until(lambda: sluice_conns(redis_port), timeout_s, until=lambda n: n == want,
                      step_s=0.05)[0]


def reload(s, text):
    """Write the config and SIGHUP; returns once the reload is counted."""
    want = mval(metrics(s.admin_port), "sluice_config_reloads_total", result="ok") + 1
    s.conf_path.write_text(text)
    os.kill(s.proc.pid, signal.SIGHUP)
    got = wait_metric(s.admin_port, "sluice_config_reloads_total", want, result="ok")
    assert got == want, "reload not applied; stderr:\n%s" % s.stderr[-2000:]


def with_redis_timeout(text, timeout):
    out, n = re.subn(r"(?m)^  timeout: \S+$", "  timeout: %s" % timeout, text)
    assert n == 1, text
    return out


def with_redis_url(text, port):
    out, n = re.subn(r"(?m)^  url: redis://127\.0\.0\.1:\d+/0$",
                     "  url: redis://127.0.0.1:%d/0" % port, text)
    assert n == 1, text
    return out


def readyz(s):
    return http_get(s.admin_port, "/readyz").status


def wait_readyz(s, want, timeout_s=WAIT_S):
    return wait_until(lambda: readyz(s), timeout_s, until=lambda st: st == want, step_s=0.05)[0]


def connected(s):
    return mval(metrics(s.admin_port), "sluice_redis_connected")


def wait_connected(s, want, timeout_s=WAIT_S):
    return wait_until(lambda: connected(s), timeout_s, until=lambda v: v == want, step_s=0.05)[0]


def close_get(port, path):
    return http_get(port, path, headers=[("Connection", "close")]).status


def test_six_reloads_leave_only_the_current_connections(sluice, own_redis):
    s = start_proxy(sluice, ROUTES, workers=2, redis_port=own_redis.port)
    base = s.conf_path.read_text()
    assert wait_conns(own_redis.port, 2) == 2
    for i in range(6):
        reload(s, with_redis_timeout(base, "900ms" if i % 2 == 0 else "1s"))
        assert close_get(s.port, "/lim") == 200
    n = wait_conns(own_redis.port, 2)
    print("6 reloads alternating redis.timeout, 2 workers: %d sluice connections to Redis" % n)
    assert n == 2, "old stores kept connected after their runtimes ended"
    assert wait_connected(s, 2) == 2
    assert close_get(s.port, "/lim") == 200


def test_reload_to_dead_redis_is_not_ready_and_back(sluice, own_redis):
    s = start_proxy(sluice, ROUTES, workers=2, redis_port=own_redis.port, on_error="deny")
    base = s.conf_path.read_text()
    assert readyz(s) == 200
    assert wait_connected(s, 2) == 2
    reload(s, with_redis_url(base, free_port()))
    st = wait_readyz(s, 503)
    print("after a reload to a dead Redis (on_error deny): /readyz %d, "
          "sluice_redis_connected %g" % (st, connected(s)))
    assert st == 503, "/readyz still counts the replaced stores"
    assert connected(s) == 0
    assert close_get(s.port, "/lim") == 503
    assert wait_conns(own_redis.port, 0) == 0
    reload(s, base)
    assert wait_readyz(s, 200) == 200
    assert wait_connected(s, 2) == 2
    assert close_get(s.port, "/lim") == 200
    assert wait_conns(own_redis.port, 2) == 2


def _to_sentinel(text, port):
    return re.sub(r"(?m)^  url: .*$",
                  "  sentinel:\n    master: mymaster\n    nodes: [127.0.0.1:%d]" % port, text)


def _to_cluster(text, port):
    return re.sub(r"(?m)^  url: .*$", "  cluster: [127.0.0.1:%d]" % port, text)


def _section_change_is_noticed(sluice, own_redis, change):
    s = start_proxy(sluice, ROUTES, workers=2, redis_port=own_redis.port, on_error="deny")
    base = s.conf_path.read_text()
    assert wait_conns(own_redis.port, 2) == 2
    # nothing answers there: the new backend never connects
    reload(s, change(base, free_port()))
    assert wait_readyz(s, 503) == 503, "the changed section was not noticed"
    assert connected(s) == 0
    assert wait_conns(own_redis.port, 0) == 0
    reload(s, base)
    assert wait_readyz(s, 200) == 200
    assert wait_conns(own_redis.port, 2) == 2
    assert close_get(s.port, "/lim") == 200


def test_reload_to_a_sentinel_section_and_back(sluice, own_redis):
    _section_change_is_noticed(sluice, own_redis, _to_sentinel)


def test_reload_to_a_cluster_section_and_back(sluice, own_redis):
    _section_change_is_noticed(sluice, own_redis, _to_cluster)


def test_request_in_flight_keeps_its_runtime_until_it_ends(sluice, own_redis):
    """A slow request decided before a reload finishes on its old runtime;
    that runtime's Redis connection closes when the request ends, even though
    its keep-alive connection stays open."""
    s = start_proxy(sluice, ROUTES, workers=1, redis_port=own_redis.port)
    base = s.conf_path.read_text()
    assert wait_conns(own_redis.port, 1) == 1
    with Conn(s.port) as c:
        c.send(build_request("GET", "/slow/1500"))
        time.sleep(0.3)         # decided, now at the upstream
        reload(s, with_redis_timeout(base, "900ms"))
        during = wait_conns(own_redis.port, 2)
        assert during == 2, "old runtime or new store missing while the request runs"
        r = c.read_response()
        assert r.status == 200
        after = wait_conns(own_redis.port, 1)
        print("request in flight across a reload: %d connections during, %d after"
              % (during, after))
        assert after == 1, "the old runtime outlived its last request"
        # the same keep-alive connection goes on, under the new runtime
        c.send(build_request("GET", "/lim"))
        assert c.read_response().status == 200
        assert sluice_conns(own_redis.port) == 1


@pytest.mark.slow
def test_reload_to_a_live_sentinel_and_back(sluice, own_redis, tmp_path):
    """With real sentinels: the new backend decides through the master they
    name, the single Redis's connections close, and a reload back reconnects."""
    from clusterlib import SentinelSet
    ss = SentinelSet(tmp_path).start()
    try:
        s = start_proxy(sluice, ROUTES, workers=2, redis_port=own_redis.port, on_error="deny")
        base = s.conf_path.read_text()
        assert wait_conns(own_redis.port, 2) == 2
        text = re.sub(r"(?m)^  url: .*$", "  sentinel:\n    master: mymaster\n    nodes: [%s]"
                      % ", ".join("127.0.0.1:%d" % p for p in ss.sentinel_ports), base)
        reload(s, text)
        assert wait_conns(own_redis.port, 0) == 0
        assert wait_readyz(s, 200) == 200
        assert wait_connected(s, 2) == 2
        assert close_get(s.port, "/lim") == 200     # on_error deny: decided by the master
        assert any(k.startswith(b"itest:") for k in redis_keys(ss.master_port))
        assert not any(k.startswith(b"itest:") for k in redis_keys(own_redis.port))
        reload(s, base)
        assert wait_conns(own_redis.port, 2) == 2
        assert wait_connected(s, 2) == 2
        assert close_get(s.port, "/lim") == 200
        assert any(k.startswith(b"itest:") for k in redis_keys(own_redis.port))
    finally:
        ss.stop()
