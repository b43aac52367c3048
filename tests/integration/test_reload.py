# sluice - tests/integration/test_reload.py: change without downtime.
#
# SIGHUP while a threaded keep-alive load generator runs: a valid file applies
# (a lowered limit bites new keys) and an invalid one is reported as
# FILE:LINE:COL: with the old config kept; either way the load generator sees
# zero failed requests. SIGTERM with a slow request in flight: it completes,
# then the process exits 0; shutdown_timeout bounds the wait.

import os
import signal
import time
import uuid

import pytest

from conftest import Conn, build_request, http_get, wait_port
from proxylib import LoadGen, metrics, mval, start_proxy, statuses, wait_metric


def routes(probe_limit):
    return """\
  - name: load
    match: { path: /load }
    upstream: api
    limits:
      - { name: big, algorithm: sliding_log, limit: 10000000, window: 1m, key: [ip] }
  - name: probe
    match: { path: /probe }
    upstream: api
    limits:
      - { name: p, algorithm: sliding_log, limit: %d, window: 1m, key: ["header:X-K"] }
  - name: slow
    match: { path: /slow }
    upstream: api
""" % probe_limit


def probe(port, n):
    return statuses(port, "/probe", n, [("X-K", uuid.uuid4().hex)])


def reload_under_load(s, new_text, result):
    """Run the load generator, SIGHUP with new_text in the middle; returns
    the generator once stopped."""
    b = metrics(s.admin_port)
    want = mval(b, "sluice_config_reloads_total", result=result) + 1
    gen = LoadGen(s.port, "/load", conns=6, duration_s=6.0).start()
    time.sleep(0.8)
    s.conf_path.write_text(new_text)
    os.kill(s.proc.pid, signal.SIGHUP)
    got = wait_metric(s.admin_port, "sluice_config_reloads_total", want, result=result)
    time.sleep(0.8)
    gen.stop()
    assert got == want, "reload %s not counted" % result
    return gen


def test_sighup_valid_file_under_load(sluice, redis):
    s = start_proxy(sluice, routes(100), workers=2)
    assert probe(s.port, 4) == [200] * 4
    new = s.conf_path.read_text().replace("limit: 100,", "limit: 2,")
    assert "limit: 2," in new
    gen = reload_under_load(s, new, "ok")
    print("reload (valid): %d requests served, %d failed" % (gen.ok, len(gen.failures)))
    assert gen.failures == [], gen.failures[:10]
    assert gen.ok > 50
    # the new limit applies to new requests
    assert probe(s.port, 4) == [200, 200, 429, 429]
    assert "reload failed" not in s.stderr


def test_sighup_invalid_file_under_load(sluice, redis):
    s = start_proxy(sluice, routes(100), workers=2)
    good = s.conf_path.read_text()
    lines = good.split("\n")
    # a lowered limit (would bite if applied) and an unknown key on line 3
    bad = "\n".join(lines[:2] + ["no_such_key: 1"] + lines[2:]).replace(
        "limit: 100,", "limit: 2,")
    gen = reload_under_load(s, bad, "error")
    print("reload (invalid): %d requests served, %d failed" % (gen.ok, len(gen.failures)))
    assert gen.failures == [], gen.failures[:10]
    assert gen.ok > 50
    assert "%s:3:1:" % s.conf_path in s.stderr, s.stderr[-2000:]
    # the old config still applies
    assert probe(s.port, 4) == [200] * 4
    s.conf_path.write_text(good)


def test_many_reloads_lose_no_request(sluice, redis):
    s = start_proxy(sluice, routes(100), workers=2)
    b = metrics(s.admin_port)
    gen = LoadGen(s.port, "/load", conns=6, duration_s=8.0).start()
    for _ in range(10):
        time.sleep(0.2)
        os.kill(s.proc.pid, signal.SIGHUP)
    want = mval(b, "sluice_config_reloads_total", result="ok") + 10
    got = wait_metric(s.admin_port, "sluice_config_reloads_total", want, result="ok")
    gen.stop()
    print("10 reloads: %d requests served, %d failed" % (gen.ok, len(gen.failures)))
    assert gen.failures == [], gen.failures[:10]
    assert got == want


def test_sighup_changed_upstream_and_inflight_request_finishes(sluice, redis):
    """A request in flight under the old config finishes after a reload."""
    s = start_proxy(sluice, routes(100))
    with Conn(s.port) as c:
        c.send(build_request("GET", "/slow/800"))
        time.sleep(0.2)
        os.kill(s.proc.pid, signal.SIGHUP)
        r = c.read_response()
        assert r.status == 200
        # and the keep-alive connection goes on serving under the new config
        c.send(build_request("GET", "/load"))
        assert c.read_response().status == 200


def test_sigterm_finishes_slow_request_then_exits_0(sluice, redis):
    s = start_proxy(sluice, routes(100))
    c2 = None
    with Conn(s.port) as c:
        c.send(build_request("GET", "/slow/1500"))
        time.sleep(0.3)
        t0 = time.monotonic()
        os.kill(s.proc.pid, signal.SIGTERM)
        time.sleep(0.2)
        # stopped accepting: a new connection is refused, or never served
        try:
            c2 = Conn(s.port, timeout_s=3.0)
            c2.send(build_request("GET", "/load"))
        except (ConnectionRefusedError, ConnectionResetError, BrokenPipeError):
            c2 = None
        r = c.read_response()
        assert r.status == 200
        assert r.json()["target"] == "/slow/1500"
    rc = s.proc.wait(timeout=5)
    assert rc == 0
    assert time.monotonic() - t0 < 4.0
    if c2 is not None:
        with c2:
            with pytest.raises((EOFError, ConnectionResetError)):
                c2.read_response()


def test_sigterm_shutdown_timeout_bounds_the_wait(sluice, redis):
    s = start_proxy(sluice, routes(100), top="shutdown_timeout: 1s\n")
    with Conn(s.port, timeout_s=10) as c:
        c.send(build_request("GET", "/slow/6000"))
        time.sleep(0.3)
        t0 = time.monotonic()
        os.kill(s.proc.pid, signal.SIGTERM)
        rc = s.proc.wait(timeout=5)
        took = time.monotonic() - t0
    assert rc == 0
    assert 0.7 < took < 3.0, took


def test_sigint_idle_exits_0_quickly(sluice, redis):
    s = start_proxy(sluice, routes(100))
    assert http_get(s.port, "/load").status == 200
    t0 = time.monotonic()
    os.kill(s.proc.pid, signal.SIGINT)
    assert s.proc.wait(timeout=5) == 0
    assert time.monotonic() - t0 < 2.0
    assert not wait_port(s.port, timeout_s=0.3)


@pytest.mark.slow
def test_reload_soak_valid_and_invalid_alternating(sluice, redis):
    """20 keep-alive clients for ~12 s while the file flips between valid and
    invalid every 0.5 s: no failed request, every reload counted."""
    s = start_proxy(sluice, routes(100), workers=2)
    good = s.conf_path.read_text()
    bad = "no_such_key: 1\n" + good
    b = metrics(s.admin_port)
    gen = LoadGen(s.port, "/load", conns=20, duration_s=14.0).start()
    n = 0
    t_end = time.monotonic() + 12.0
    while time.monotonic() < t_end:
        s.conf_path.write_text(bad if n % 2 else good)
        os.kill(s.proc.pid, signal.SIGHUP)
        n += 1
        time.sleep(0.5)
    s.conf_path.write_text(good)
    n_ok, n_err = (n + 1) // 2, n // 2
    ok = wait_metric(s.admin_port, "sluice_config_reloads_total",
                     mval(b, "sluice_config_reloads_total", result="ok") + n_ok, result="ok")
    err = wait_metric(s.admin_port, "sluice_config_reloads_total",
                      mval(b, "sluice_config_reloads_total", result="error") + n_err,
                      result="error")
    gen.stop()
    print("reload soak: %d reloads, %d requests served, %d failed"
          % (n, gen.ok, len(gen.failures)))
    assert gen.failures == [], gen.failures[:10]
    assert ok - mval(b, "sluice_config_reloads_total", result="ok") == n_ok
    assert err - mval(b, "sluice_config_reloads_total", result="error") == n_err
