# sluice - tests/integration/test_admin_endpoint.py: the admin endpoint.
#
# /healthz, /readyz (Redis up, Redis down under on_error deny and allow),
# every metric name of issue 3 in a parseable exposition, counters that move
# by exactly the requests made, the histograms' shape, the connection gauges
# and the reload counters. The admin port is not the public listener.

import os
import signal
import time
import uuid

import pytest

from conftest import Conn, build_request, free_port, http_get, wait_until
from proxylib import (has_series, metrics, metrics_text, mval, parse_metrics, series,
                    start_proxy, statuses, wait_metric)

ROUTES = """\
  - name: m
    match: { path: /m }
    upstream: api
    limits:
      - { name: three, algorithm: sliding_log, limit: 3, window: 1m, key: ["header:X-K"] }
  - name: sh
    match: { path: /sh }
    upstream: api
    limits:
      - { name: one, algorithm: sliding_log, limit: 1, window: 1m, key: ["header:X-K"], shadow: true }
  - name: up404
    match: { path: /status }
    upstream: api
"""

NAMES = {
    "sluice_requests_total": "counter",
    "sluice_responses_total": "counter",
    "sluice_redis_requests_total": "counter",
    "sluice_redis_errors_total": "counter",
    "sluice_redis_duration_seconds": "histogram",
    "sluice_deny_cache_hits_total": "counter",
    "sluice_upstream_duration_seconds": "histogram",
    "sluice_connections": "gauge",
    "sluice_config_reloads_total": "counter",
    "sluice_worker_requests_total": "counter",
}


def delta(before, after, name, **labels):
    return mval(after, name, **labels) - mval(before, name, **labels)


def hist_ok(ms, name):
    """Buckets cumulative and ending in +Inf == _count."""
    buckets = sorted(((float(dict(k)["le"]), v) for k, v in series(ms, name + "_bucket").items()),
                     key=lambda x: x[0])
    assert buckets and buckets[-1][0] == float("inf"), buckets
    counts = [v for _, v in buckets]
    assert counts == sorted(counts), buckets
    assert buckets[-1][1] == mval(ms, name + "_count")
    assert has_series(ms, name + "_sum")


def test_healthz_readyz_and_not_public(sluice, redis):
    s = start_proxy(sluice, ROUTES)
    assert http_get(s.admin_port, "/healthz").status == 200
    assert http_get(s.admin_port, "/readyz").status == 200
    # the admin paths are not on the public listener: no route matches there
    assert http_get(s.port, "/metrics").status == 404
    assert http_get(s.port, "/healthz").status == 404


def test_every_metric_name_and_type(sluice, redis):
    s = start_proxy(sluice, ROUTES, workers=2)
    statuses(s.port, "/m", 4, [("X-K", uuid.uuid4().hex)])
    text = metrics_text(s.admin_port)
    for name, kind in NAMES.items():
        assert "# TYPE %s %s" % (name, kind) in text, name
    ms = parse_metrics(text)
    for d in ("allowed", "limited", "shadow_limited", "error"):
        assert has_series(ms, "sluice_requests_total", route="m", decision=d), d
    assert has_series(ms, "sluice_responses_total", route="m", code="200")
    assert has_series(ms, "sluice_responses_total", route="m", code="429")
    for side in ("client", "upstream"):
        assert has_series(ms, "sluice_connections", side=side), side
    for result in ("ok", "error"):
        assert has_series(ms, "sluice_config_reloads_total", result=result)
    hist_ok(ms, "sluice_redis_duration_seconds")
    hist_ok(ms, "sluice_upstream_duration_seconds")


def test_counters_are_exact(sluice, redis):
    s = start_proxy(sluice, ROUTES, workers=2)
    b = metrics(s.admin_port)
    n_ok, n_limited = 3, 4
    got = statuses(s.port, "/m", n_ok + n_limited, [("X-K", uuid.uuid4().hex)])
    assert got == [200] * n_ok + [429] * n_limited
    got = statuses(s.port, "/status/404", 5)
    assert got == [404] * 5
    a = metrics(s.admin_port)
    assert delta(b, a, "sluice_requests_total", route="m", decision="allowed") == n_ok
    assert delta(b, a, "sluice_requests_total", route="m", decision="limited") == n_limited
    assert delta(b, a, "sluice_requests_total", route="m", decision="error") == 0
    assert delta(b, a, "sluice_responses_total", route="m", code="200") == n_ok
    assert delta(b, a, "sluice_responses_total", route="m", code="429") == n_limited
    # the upstream's own 404 is counted under its code, on its route
    assert delta(b, a, "sluice_responses_total", route="up404", code="404") == 5
    # the 1st limited went to Redis; the deny cache may answer the rest
    redis_calls = delta(b, a, "sluice_redis_requests_total")
    hits = delta(b, a, "sluice_deny_cache_hits_total")
    assert redis_calls + hits == n_ok + n_limited, (redis_calls, hits)
    assert redis_calls >= n_ok + 1
    assert delta(b, a, "sluice_redis_errors_total") == 0
    assert delta(b, a, "sluice_redis_duration_seconds_count") == redis_calls
    assert delta(b, a, "sluice_upstream_duration_seconds_count") == n_ok + 5
    hist_ok(a, "sluice_redis_duration_seconds")
    hist_ok(a, "sluice_upstream_duration_seconds")


def test_shadow_limited_counter(sluice, redis):
    s = start_proxy(sluice, ROUTES)
    b = metrics(s.admin_port)
    got = statuses(s.port, "/sh", 4, [("X-K", uuid.uuid4().hex)])
    assert got == [200] * 4
    a = metrics(s.admin_port)
    assert delta(b, a, "sluice_requests_total", route="sh", decision="shadow_limited") == 3
    assert delta(b, a, "sluice_requests_total", route="sh", decision="limited") == 0
    assert delta(b, a, "sluice_responses_total", route="sh", code="200") == 4


def test_error_decisions_and_redis_errors(sluice):
    # Redis never reachable, on_error allow: forwarded, counted as error
    s = start_proxy(sluice, ROUTES, redis_port=free_port(), wait_redis=False)
    b = metrics(s.admin_port)
    got = statuses(s.port, "/m", 5, [("X-K", uuid.uuid4().hex)])
    assert got == [200] * 5
    a = metrics(s.admin_port)
    assert delta(b, a, "sluice_requests_total", route="m", decision="error") == 5
    assert delta(b, a, "sluice_requests_total", route="m", decision="allowed") == 0
    assert delta(b, a, "sluice_redis_errors_total") >= 5


def test_connection_gauges(sluice, redis):
    s = start_proxy(sluice, ROUTES, workers=2)
    base = mval(metrics(s.admin_port), "sluice_connections", side="client")
    conns = [Conn(s.port) for _ in range(5)]
    try:
        for c in conns:
            c.send(build_request("GET", "/m", [("X-K", uuid.uuid4().hex)]))
            assert c.read_response().status == 200
        ms = metrics(s.admin_port)
        assert mval(ms, "sluice_connections", side="client") == base + 5
        assert mval(ms, "sluice_connections", side="upstream") >= 1
    finally:
        for c in conns:
            c.close()
    n, _ = wait_until(lambda: mval(metrics(s.admin_port), "sluice_connections", side="client"), 3,
                      until=lambda n: n == base, step_s=0.05)
    assert n == base


def test_reload_counters(sluice, redis):
    s = start_proxy(sluice, ROUTES)
    b = metrics(s.admin_port)
    os.kill(s.proc.pid, signal.SIGHUP)
    assert wait_metric(s.admin_port, "sluice_config_reloads_total",
                       mval(b, "sluice_config_reloads_total", result="ok") + 1,
                       result="ok") == mval(b, "sluice_config_reloads_total", result="ok") + 1
    good = s.conf_path.read_text()
    s.conf_path.write_text("bogus_top_key: 1\n" + good)
    os.kill(s.proc.pid, signal.SIGHUP)
    v = wait_metric(s.admin_port, "sluice_config_reloads_total",
                    mval(b, "sluice_config_reloads_total", result="error") + 1, result="error")
    assert v == mval(b, "sluice_config_reloads_total", result="error") + 1
    assert "%s:1:1:" % s.conf_path in s.stderr
    s.conf_path.write_text(good)


def test_readyz_redis_down_on_error_deny(sluice, own_redis):
    s = start_proxy(sluice, ROUTES, on_error="deny", redis_port=own_redis.port)
    assert http_get(s.admin_port, "/readyz").status == 200
    own_redis.stop()
    code, _ = wait_until(lambda: http_get(s.admin_port, "/readyz").status, 5,
                         until=lambda code: code == 503, step_s=0.05)
    assert code == 503
    assert http_get(s.admin_port, "/healthz").status == 200
    own_redis.start()
    code, _ = wait_until(lambda: http_get(s.admin_port, "/readyz").status, 8,
                         until=lambda code: code == 200, step_s=0.1)
    assert code == 200


@pytest.mark.parametrize("on_error", ["allow", "local"])
def test_readyz_redis_down_serving_anyway(sluice, own_redis, on_error):
    s = start_proxy(sluice, ROUTES, on_error=on_error, redis_port=own_redis.port)
    own_redis.stop()
    time.sleep(0.3)
    statuses(s.port, "/m", 1, [("X-K", "x")])     # let sluice notice
    assert http_get(s.admin_port, "/readyz").status == 200
