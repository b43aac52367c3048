# sluice - tests/integration/test_faults.py: Redis and the upstream fail under load.
#
# A threaded keep-alive load generator (loadlib.Load) runs while Redis is
# killed and brought back, paused with CLIENT PAUSE, flushed of its scripts
# and restarted empty, and while the upstream is killed or resets in the
# middle of a response. Each test records what every request got and prints
# its figures (HARD-FIGURES lines, see docs/reliability.md). Slow: run by
# make test-slow.

import os
import socket
import threading
import time

import pytest

from conftest import Conn, build_request, free_port, http_get, make_conf, redis_cmd, wait_until
from loadlib import (EchoUpstreamAt, Load, ResetUpstream, kill_redis, percentile, report,
                     summarize)

pytestmark = pytest.mark.slow

# Each request carries one of the two keys; the other limit passes it.
ROUTES = """\
  - name: load
    match: { path: / }
    upstream: api
    limits:
      - { name: per-key, algorithm: fixed_window, limit: 1000000, window: 1h, key: ["header:X-K"],
          on_missing_key: pass }
      - { name: tiny, algorithm: fixed_window, limit: 2, window: 1h, key: ["header:X-Tiny"],
          on_missing_key: pass }
"""


def limited_now(port):
    """True when a fresh key hits its limit of 2 at the third request: the
    decisions come from Redis again."""
    key = os.urandom(8).hex()
    got = [http_get(port, "/probe", headers=[("X-Tiny", key)], timeout_s=2).status
           for _ in range(3)]
    return got == [200, 200, 429]


def first_redis_decision_after(outcomes, t):
    """Seconds from t to the first answer decided by Redis for a request sent
    after t, or None."""
    later = [o.t_done for o in outcomes if o.t_sent >= t and o.limited_by_redis]
    return (min(later) - t) if later else None


@pytest.mark.parametrize("on_error,down_status", [("allow", 200), ("deny", 503)])
def test_redis_killed_under_load(sluice, own_redis, on_error, down_status):
    s = sluice(make_conf(ROUTES, on_error=on_error, redis_timeout="100ms"),
               redis_port=own_redis.port)
    load = Load(s.port, conns=4, duration_s=20).start()
    try:
        time.sleep(1.5)
        t_kill = time.monotonic()
        kill_redis(own_redis)
        time.sleep(4.0)                      # long enough for the reconnect backoff to grow
        t_down_end = time.monotonic()
        own_redis.start()                    # returns once it answers PING
        t_back = time.monotonic()
        wait_until(lambda: first_redis_decision_after(load.snapshot(), t_back) is not None, 5.0)
        time.sleep(1.0)
    finally:
        load.stop()
    outs = load.outcomes
    recovery = first_redis_decision_after(outs, t_back)
    before = summarize([o for o in outs if o.t_done < t_kill])
    down = summarize([o for o in outs if t_kill + 0.2 < o.t_sent and o.t_done < t_down_end])
    after = summarize([o for o in outs if o.t_sent > t_back + (recovery or 0)])
    report("redis_killed_%s" % on_error, requests=len(outs), before=before["status"],
           down=down["status"], after=after["status"], errors=summarize(outs)["errors"],
           recovery_s="%.3f" % recovery if recovery is not None else "none")
    assert s.proc.poll() is None, "sluice died"
    assert summarize(outs)["errors"] == 0, [o.error for o in outs if o.error][:5]
    assert down["total"] > 0 and set(down["status"]) == {down_status}, down
    assert set(before["status"]) == {200} and set(after["status"]) == {200}, (before, after)
    assert recovery is not None and recovery < 1.0, \
        "limiting resumed %.3f s after Redis was back" % (recovery or -1)
    assert limited_now(s.port)


def test_redis_paused_decisions_within_timeout(sluice, own_redis):
    timeout_s = 0.1
    s = sluice(make_conf(ROUTES, on_error="allow", redis_timeout="100ms"),
               redis_port=own_redis.port)
    load = Load(s.port, conns=4, duration_s=15).start()
    try:
        time.sleep(1.0)
        t_pause = time.monotonic()
        redis_cmd(own_redis.port, "CLIENT", "PAUSE", "2000")
        time.sleep(2.0)
        t_resume = time.monotonic()
        time.sleep(1.5)
    finally:
        load.stop()
    outs = load.outcomes
    paused = [o for o in outs if t_pause + 0.05 < o.t_sent and o.t_done < t_resume - 0.05]
    lat = [o.t_done - o.t_sent for o in paused]
    p99, worst = percentile(lat, 99), max(lat) if lat else 0
    recovery = first_redis_decision_after(outs, t_resume)
    report("redis_paused", paused_requests=len(paused), p50_ms="%.1f" % (percentile(lat, 50) * 1000),
           p99_ms="%.1f" % (p99 * 1000), max_ms="%.1f" % (worst * 1000),
           errors=summarize(outs)["errors"], status=summarize(paused)["status"],
           recovery_s="%.3f" % recovery if recovery is not None else "none")
    assert summarize(outs)["errors"] == 0
    assert len(paused) >= 20, "too few requests during the pause to judge"
    assert set(summarize(paused)["status"]) == {200}
    assert not any(o.limited_by_redis for o in paused), "a paused Redis cannot decide"
    assert p99 <= timeout_s + 0.1, "p99 %.0f ms with redis.timeout 100ms" % (p99 * 1000)
    assert recovery is not None and recovery < 1.0, recovery
    assert limited_now(s.port)


def test_script_flush_under_load_fails_nothing(sluice, own_redis):
    # on_error deny: a NOSCRIPT that were not reloaded and retried would be a 503
    s = sluice(make_conf(ROUTES, on_error="deny", redis_timeout="200ms"),
               redis_port=own_redis.port)
    load = Load(s.port, conns=4, duration_s=10).start()
    try:
        for _ in range(5):
            time.sleep(0.5)
            redis_cmd(own_redis.port, "SCRIPT", "FLUSH")
        time.sleep(0.5)
    finally:
        load.stop()
    summ = summarize(load.outcomes)
    report("script_flush", flushes=5, requests=summ["total"], status=summ["status"],
           errors=summ["errors"], redis_decided=summ["redis_decided"])
    assert summ["errors"] == 0 and set(summ["status"]) == {200}, summ
    assert summ["redis_decided"] == summ["total"]


def test_redis_restarted_empty_under_load(sluice, own_redis):
    s = sluice(make_conf(ROUTES, on_error="allow", redis_timeout="100ms"),
               redis_port=own_redis.port)
    load = Load(s.port, conns=4, duration_s=20).start()
    recoveries = []
    try:
        for _ in range(3):
            time.sleep(1.0)
            own_redis.stop()                 # a clean shutdown: scripts and keys gone
            time.sleep(0.5)
            own_redis.start()
            t_back = time.monotonic()
            wait_until(lambda: first_redis_decision_after(load.snapshot(), t_back) is not None, 5.0)
            recoveries.append(first_redis_decision_after(load.snapshot(), t_back))
        time.sleep(1.0)
    finally:
        load.stop()
    outs = load.outcomes
    summ = summarize(outs)
    # once a decision came from the new Redis, none may fall back to on_error
    t_last = t_back + (recoveries[-1] or 0)
    tail = [o for o in outs if o.t_sent > t_last + 0.05]
    report("redis_restart_empty", restarts=3, requests=summ["total"], status=summ["status"],
           errors=summ["errors"], recovery_s=",".join("%.3f" % r if r is not None else "none"
                                                    for r in recoveries),
           after_last_restart=len(tail))
    assert summ["errors"] == 0 and set(summ["status"]) == {200}, summ
    assert all(r is not None and r < 1.0 for r in recoveries), recoveries
    assert tail and all(o.limited_by_redis for o in tail), \
        "%d of %d requests after the restart were not decided by Redis" % (
            sum(1 for o in tail if not o.limited_by_redis), len(tail))


def test_upstream_killed_under_load(sluice, redis):
    up = EchoUpstreamAt(free_port()).start()
    try:
        s = sluice(make_conf(ROUTES), upstream_port=up.port)
        load = Load(s.port, conns=4, duration_s=20).start()
        try:
            time.sleep(1.0)
            t_kill = time.monotonic()
            up.kill()
            time.sleep(2.0)
            t_down_end = time.monotonic()
            up.start()
            t_back = time.monotonic()
            time.sleep(2.0)
        finally:
            load.stop()
    finally:
        up.stop()
    outs = load.outcomes
    down = summarize([o for o in outs if t_kill + 0.2 < o.t_sent and o.t_done < t_down_end])
    back = [o.t_done for o in outs if o.t_sent >= t_back and o.status == 200]
    recovery = (min(back) - t_back) if back else None
    summ = summarize(outs)
    late = summarize([o for o in outs if o.t_sent > t_back + (recovery or 0)])
    report("upstream_killed", requests=summ["total"], status=summ["status"],
           errors=summ["errors"], down=down["status"],
           recovery_s="%.3f" % recovery if recovery is not None else "none")
    assert s.proc.poll() is None
    assert set(summ["status"]) <= {200, 502}, summ
    assert down["total"] > 0 and set(down["status"]) == {502}, down
    # a request in flight at the kill may see its connection cut; nothing else
    assert summ["errors"] <= 4, [o.error for o in outs if o.error][:5]
    assert recovery is not None and recovery < 1.0, recovery
    assert set(late["status"]) == {200} and late["errors"] == 0, late


def test_upstream_reset_mid_response_only_that_client(sluice, redis):
    up = ResetUpstream()
    try:
        s = sluice(make_conf(ROUTES), upstream_port=up.port)
        others_ok, others_bad = [0], []
        stop = threading.Event()

        def other(i):
            with Conn(s.port, timeout_s=5) as c:
                for n in range(10000):
                    if stop.is_set():
                        return
                    try:
                        c.send(build_request("GET", "/ok/%d/%d" % (i, n), [("X-K", "o%d" % i)]))
                        r = c.read_response()
                    except (OSError, EOFError) as e:
                        others_bad.append(repr(e))
                        return
                    if r.status != 200 or len(r.body) != ResetUpstream.OK_BYTES:
                        others_bad.append((r.status, len(r.body)))
                        return
                    others_ok[0] += 1

        threads = [threading.Thread(target=other, args=(i,), daemon=True) for i in range(6)]
        for t in threads:
            t.start()
        cut = 0
        try:
            for _ in range(10):
                with Conn(s.port, timeout_s=5) as c:
                    c.send(build_request("GET", "/reset", [("X-K", "resetter")]))
                    try:
                        r = c.read_response()
                        got = len(r.body)
                    except (EOFError, ConnectionResetError):
                        got = None
                    assert got is None, "a reset response arrived 'complete' (%d bytes)" % got
                    cut += 1
                time.sleep(0.1)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=10)
        report("upstream_reset", resets=up.resets, cut_clients=cut,
               other_requests_ok=others_ok[0], other_failures=len(others_bad))
        assert not others_bad, others_bad[:5]
        assert others_ok[0] > 50
        assert s.proc.poll() is None
        assert http_get(s.port, "/ok/after").status == 200
    finally:
        up.stop()
