# sluice - tests/integration/test_upstream_pool.py: the upstream connection
# pool under bursts above `keepalive` (docs/proxying.md, "Upstream connection
# pools").
#
# Bursts of slow requests, all in flight at once, through sluice to the test
# upstream, which names the connection each request came on
# (X-Upstream-Conn). A burst that finds the pool's idle connections gone to
# `keepalive` reconnects: churn. From then on a burst's surplus stays idle
# (up to `keepalive` more) and the next burst reuses it, until it has idled
# a second.

import time

from conftest import http_get, make_conf, parallel

ROUTES = """\
  - name: all
    match: { path: / }
    upstream: api
"""

BURST = 6
KEEPALIVE = 2
SLOW_MS = 400


def burst(port):
    """BURST requests at once; the upstream connection numbers they used."""
    got = parallel([lambda: http_get(port, "/slow/%d" % SLOW_MS, timeout_s=10.0)
                    for _ in range(BURST)])
    for r in got:
        assert not isinstance(r, Exception), got
        assert r.status == 200, r.status
    return [int(r.header("X-Upstream-Conn")) for r in got]


def reused(before, now):
    return len(set(now) & set(before))


def test_burst_surplus_is_reused_while_the_pool_churns(sluice, redis):
    s = sluice(make_conf(ROUTES).replace("keepalive: 8", "keepalive: %d" % KEEPALIVE))
    first = burst(s.port)
    assert len(set(first)) == BURST
    # Only keepalive stayed: two reused, four connected anew (churn).
    second = burst(s.port)
    assert len(set(second)) == BURST
    assert reused(first, second) == KEEPALIVE
    # The surplus stayed, up to keepalive more: four reused.
    third = burst(s.port)
    assert reused(second, third) == 2 * KEEPALIVE
    # Idle more than a second: the surplus closed, keepalive stayed.
    time.sleep(1.6)
    fourth = burst(s.port)
    assert reused(third, fourth) == KEEPALIVE
