# sluice - tests/integration/test_concurrency.py: concurrency limits (issue 13).
#
# `algorithm: concurrency` holds at most `limit` requests per key in flight,
# counted in Redis across every proxy (and in the memory backend within one
# process). Real processes only: one redis-server, two sluice processes on
# it, and the tests' upstream with its slow path (/slow/MS).

import socket
import struct
import time

import pytest

from conftest import (Conn, build_request, free_port, http_get, make_conf, parallel,
                      read_log, redis_cmd, redis_keys, rl_headers, stop_process, timed_get,
                      wait_until)
from proxylib import proxy_conf, top_keys

ROUTES = """\
  - name: exports
    match: { path: /slow }
    upstream: api
    limits:
      - { name: exports, algorithm: concurrency, limit: 3, key: ["header:X-Api-Key"], lease: @LEASE@ }
"""

KEY = [("X-Api-Key", "k1")]


def conf(lease="30s", backend=None, admin=None, access_log=None):
    return proxy_conf(ROUTES.replace("@LEASE@", lease), admin_port=admin,
                    top=top_keys(backend=backend, access_log=access_log))




def slot_keys(redis_port):
    return [k for k in redis_keys(redis_port) if b"exports" in k]


def held(redis_port):
    """Slots held now in Redis, over every key of the limit (live members)."""
    now_ms = int(time.time() * 1000)
    n = 0
    for k in slot_keys(redis_port):
        n += int(redis_cmd(redis_port, "ZCOUNT", k, "(%d" % now_ms, "+inf"))
    return n


def open_slow(port, ms, headers=KEY):
    """A request to /slow/MS left in flight on its own connection."""
    c = Conn(port, timeout_s=10)
    c.send(build_request("GET", "/slow/%d" % ms, headers))
    return c


def abort(c):
    """The client goes away at once: RST (SO_LINGER 0), not a half-close."""
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close()


def test_ten_at_once_over_two_proxies(sluice, redis):
    a = sluice(conf())
    b = sluice(conf())
    jobs = [(lambda p=(a if i % 2 else b).port: timed_get(p, "/slow/1500", KEY))
            for i in range(10)]
    out = parallel(jobs)
    assert not [o for o in out if isinstance(o, Exception)], out
    ok = [(r, t) for r, t in out if r.status == 200]
    limited = [(r, t) for r, t in out if r.status == 429]
    print("concurrency over 2 proxies: %d x 200, %d x 429, slowest 429 %.3f s"
          % (len(ok), len(limited), max(t for _, t in limited)))
    assert len(ok) == 3 and len(limited) == 7
    for r, t in limited:
        assert t < 1.0, "a 429 must be immediate, took %.3f s" % t
        assert r.header("Retry-After") == "1"
        assert r.header("RateLimit-Policy") == '"exports";q=3;qu="concurrent-requests"'
        assert r.header("RateLimit") == '"exports";r=0'
        assert r.json()["limit"] == "exports"
    for r, t in ok:
        assert t >= 1.4
        assert r.header("RateLimit-Policy") == '"exports";q=3;qu="concurrent-requests"'
        assert r.header("RateLimit") in ('"exports";r=0', '"exports";r=1', '"exports";r=2')
    # every slot went back when its response ended
    assert wait_until(lambda: held(redis.port) == 0, 1.0)[0], "slots still held after the responses"
    r = http_get(a.port, "/slow/0", headers=KEY)
    assert r.status == 200 and r.header("RateLimit") == '"exports";r=2'
    # another key has its own slots; a request without the key is not counted
    assert http_get(b.port, "/slow/0", headers=[("X-Api-Key", "k2")]).status == 200
    assert http_get(b.port, "/slow/0").status == 200
    for k in slot_keys(redis.port):         # the key never lives without a TTL
        assert int(redis_cmd(redis.port, "PTTL", k)) != -1


def test_slots_come_back_when_responses_end(sluice, redis):
    s = sluice(conf())
    held_conns = [open_slow(s.port, 600) for _ in range(3)]
    try:
        assert wait_until(lambda: held(redis.port) == 3, 2.0)[0]
        assert http_get(s.port, "/slow/0", headers=KEY).status == 429
        t0 = time.monotonic()
        for c in held_conns:
            assert c.read_response().status == 200
        ended = time.monotonic()
        ok, took = wait_until(lambda: held(redis.port) == 0, 1.0, step_s=0.002)
        assert ok
        print("release after the responses ended: %.1f ms (responses took %.3f s)"
              % (took * 1000, ended - t0))
        assert http_get(s.port, "/slow/0", headers=KEY).status == 200
    finally:
        for c in held_conns:
            c.close()


def test_slots_come_back_when_clients_go_away(sluice, redis):
    a = sluice(conf())
    b = sluice(conf())
    conns = [open_slow(a.port, 8000) for _ in range(3)]
    try:
        assert wait_until(lambda: held(redis.port) == 3, 2.0)[0]
        assert http_get(b.port, "/slow/0", headers=KEY).status == 429
        t0 = time.monotonic()
        for c in conns:
            abort(c)
        ok, _ = wait_until(lambda: http_get(b.port, "/slow/0", headers=KEY).status == 200, 1.0)
        print("slot free on the other proxy %.1f ms after the clients went away"
              % ((time.monotonic() - t0) * 1000))
        assert ok, "slots not back within 1 s of the clients' reset"
        assert wait_until(lambda: held(redis.port) == 0, 1.0)[0]
    finally:
        for c in conns:
            c.close()


def test_upstream_failure_gives_the_slot_back(sluice, redis):
    routes = ROUTES.replace("@LEASE@", "30s").replace("upstream: api", "upstream: dead")
    s = sluice(make_conf(routes))
    for _ in range(5):          # 502 each time: no slot may stay taken
        assert http_get(s.port, "/slow/0", headers=KEY).status == 502
    assert wait_until(lambda: held(redis.port) == 0, 1.0)[0]


def test_memory_backend_same_limits(sluice, redis, tmp_path):
    admin, log = free_port(), tmp_path / "access.log"
    s = sluice(conf(backend="memory", admin=admin, access_log=str(log)), wait_redis=False)
    out = parallel([lambda: timed_get(s.port, "/slow/1000", KEY) for _ in range(10)])
    assert not [o for o in out if isinstance(o, Exception)], out
    statuses = sorted(r.status for r, _ in out)
    print("memory backend, one process: %s" % statuses)
    assert statuses == [200] * 3 + [429] * 7
    # metrics and the access log as for the other limits
    body = http_get(admin, "/metrics").body.decode()
    assert 'sluice_requests_total{route="exports",decision="allowed"} 3' in body
    assert 'sluice_requests_total{route="exports",decision="limited"} 7' in body
    lines = read_log(log, 10)
    assert sorted((x["status"], x["decision"], x["limit"]) for x in lines) == \
        [(200, "allowed", "exports")] * 3 + [(429, "limited", "exports")] * 7
    for r, t in out:
        if r.status == 429:
            assert t < 0.8 and r.header("Retry-After") == "1"
    r = http_get(s.port, "/slow/0", headers=KEY)       # all three given back
    assert r.status == 200 and r.header("RateLimit") == '"exports";r=2'
    conns = [open_slow(s.port, 8000) for _ in range(3)]
    try:
        time.sleep(0.2)
        assert http_get(s.port, "/slow/0", headers=KEY).status == 429
        for c in conns:
            abort(c)
        assert wait_until(lambda: http_get(s.port, "/slow/0", headers=KEY).status == 200, 1.0)[0]
    finally:
        for c in conns:
            c.close()


def test_bad_config_is_refused(tmp_path):
    from conftest import sluice_bin
    import subprocess
    bad = conf().replace("lease: 30s", "lease: 30s, delay: 1s")
    p = tmp_path / "bad.yaml"
    p.write_text(bad.replace("@LISTEN_PORT@", "1").replace("@REDIS_PORT@", "1")
                 .replace("@UPSTREAM_PORT@", "1").replace("@DEAD_PORT@", "2"))
    r = subprocess.run([sluice_bin(), "-t", "-c", str(p)], capture_output=True, timeout=10)
    assert r.returncode == 1
    assert b"'delay' does not apply to concurrency" in r.stderr


@pytest.mark.slow
def test_lease_renewed_while_running_and_lost_with_a_killed_proxy(sluice, redis):
    """lease 2s: a request running 6 s keeps its slot past the lease (renewed
    every ~0.67 s); SIGKILL of its proxy loses the slots after the lease."""
    a = sluice(conf(lease="2s"))
    b = sluice(conf(lease="2s"))
    conns = [open_slow(a.port, 20000) for _ in range(3)]
    try:
        assert wait_until(lambda: held(redis.port) == 3, 2.0)[0]
        time.sleep(3.0)             # past the lease: renewed, still held
        assert held(redis.port) == 3
        assert http_get(b.port, "/slow/0", headers=KEY).status == 429
        a.proc.kill()
        a.proc.wait(5)
        t0 = time.monotonic()
        assert http_get(b.port, "/slow/0", headers=KEY).status == 429   # not before the lease
        ok, took = wait_until(lambda: http_get(b.port, "/slow/0", headers=KEY).status == 200, 4.0,
                              step_s=0.05)
        print("slots of the killed proxy free again %.2f s after SIGKILL (lease 2 s)" %
              (time.monotonic() - t0))
        assert ok and took <= 2.5
    finally:
        for c in conns:
            c.close()


WS_ROUTES = """\
  - name: ws
    match: { path: /ws }
    upstream: tiny
    upgrade: true
    limits:
      - { name: exports, algorithm: concurrency, limit: 1, key: ["header:X-Api-Key"], lease: 1s }
"""

UPGRADE = [("Connection", "Upgrade"), ("Upgrade", "websocket"),
           ("Sec-WebSocket-Version", "13"), ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")]


def test_websocket_tunnel_holds_its_slot_while_open(sluice, redis):
    """lease 1s: an open tunnel renews its slot (every ~0.33 s) and holds it
    past the lease; closing it gives the slot back."""
    from proxylib import TinyUpstream, read_head, recv_exact, start_proxy
    tiny = TinyUpstream()
    try:
        s = start_proxy(sluice, WS_ROUTES, extra_upstreams={"tiny": tiny.port})
        c = Conn(s.port, timeout_s=5)
        c.send(build_request("GET", "/ws", UPGRADE + KEY))
        status, _ = read_head(c)
        assert status == 101
        assert recv_exact(c, 6) == b"hello\n"
        time.sleep(1.6)                             # past the lease: renewed
        assert held(redis.port) == 1
        r = http_get(s.port, "/ws", headers=UPGRADE + KEY)
        assert r.status == 429 and r.header("Retry-After") == "1"
        c.send(b"ping")                             # the tunnel still works
        assert recv_exact(c, 4) == b"ping"
        c.close()
        assert wait_until(lambda: held(redis.port) == 0, 1.0)[0], \
            "the tunnel's slot stayed taken after it closed"
        c2 = Conn(s.port, timeout_s=5)
        c2.send(build_request("GET", "/ws", UPGRADE + KEY))
        assert read_head(c2)[0] == 101
        c2.close()
    finally:
        tiny.stop()


# ---- a reload that replaces the Redis connection -------------------------

RELOAD_ROUTES = """\
  - name: rl
    match: { path: /slow }
    upstream: api
    limits:
      - { name: reloadslot, algorithm: concurrency, limit: 1, key: ["header:X-Api-Key"] }
  - name: held
    match: { path: /held }
    upstream: api
    limits:
      - { name: reloadheld, algorithm: gcra, rate: 1/10s, burst: 1, delay: 15s,
          key: ["header:X-Api-Key"] }
"""


def reload_with_other_redis_timeout(s):
    """SIGHUP with a changed redis.timeout: the workers' stores are replaced;
    the old ones keep only the requests started before. Returns when the
    reload is logged."""
    import signal
    text = s.conf_path.read_text()
    assert "  timeout: 1s\n  prefix:" in text
    s.conf_path.write_text(text.replace("  timeout: 1s\n  prefix:", "  timeout: 900ms\n  prefix:"))
    s.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: "main: reloaded" in s.stderr, 5.0)[0], s.stderr


def own_keys(redis_port, name, key):
    return [k for k in redis_keys(redis_port) if name in k and key.encode() in k]


def test_slot_given_back_after_a_reload_that_replaced_redis(sluice, redis):
    """The request in flight ends on the old runtime, whose store is freed
    with it: its slot's give-back must reach Redis first (it was dropped, and
    the key got 429 until the lease ended, 15 s here)."""
    import uuid
    k = uuid.uuid4().hex
    hdr = [("X-Api-Key", k)]
    s = sluice(proxy_conf(RELOAD_ROUTES))
    c = open_slow(s.port, 1500, hdr)
    try:
        def slots():
            now_ms = int(time.time() * 1000)
            return sum(int(redis_cmd(redis.port, "ZCOUNT", x, "(%d" % now_ms, "+inf"))
                       for x in own_keys(redis.port, b"reloadslot", k))
        assert wait_until(lambda: slots() == 1, 2.0)[0]
        reload_with_other_redis_timeout(s)
        assert c.read_response().status == 200
    finally:
        c.close()
    assert wait_until(lambda: slots() == 0, 3.0)[0], "the slot stayed taken"
    assert http_get(s.port, "/slow/0", headers=hdr).status == 200


def test_reservation_refunded_after_a_reload_that_replaced_redis(sluice, redis):
    """gcra 1 per 10 s, delay 15 s: the second request is held 10 s with its
    reservation taken (TAT + 10 s). Its client goes away after a reload that
    replaced the store: the refund must reach Redis through the old one."""
    import uuid
    k = uuid.uuid4().hex
    hdr = [("X-Api-Key", k)]
    s = sluice(proxy_conf(RELOAD_ROUTES))
    assert http_get(s.port, "/held", headers=hdr).status == 200

    def tat():
        keys = own_keys(redis.port, b"reloadheld", k)
        return int(redis_cmd(redis.port, "GET", keys[0])) if keys else None
    first = tat()
    c = Conn(s.port, timeout_s=5)
    c.send(build_request("GET", "/held", hdr))
    assert wait_until(lambda: tat() == first + 10000000, 2.0)[0], (first, tat())
    reload_with_other_redis_timeout(s)
    abort(c)
    assert wait_until(lambda: tat() == first, 3.0)[0], (first, tat())


# ---- a graceful stop with requests in flight -------------------------------

def key_slots(redis_port, k):
    """Live slots of RELOAD_ROUTES' reloadslot limit for key k."""
    now_ms = int(time.time() * 1000)
    return sum(int(redis_cmd(redis_port, "ZCOUNT", x, "(%d" % now_ms, "+inf"))
               for x in own_keys(redis_port, b"reloadslot", k))


def stop_with_one_in_flight(sluice, redis, reload_first):
    """SIGTERM while a request holds its slot: the request finishes (the stop
    is graceful) and the worker's loop ends with the last client, and the
    slot's give-back must still reach Redis (it was left queued, and a
    rolling restart kept every key with a request in flight at 429 until
    the lease ended). Returns the slots the key still holds."""
    import signal
    import uuid
    k = uuid.uuid4().hex
    hdr = [("X-Api-Key", k)]
    s = sluice(proxy_conf(RELOAD_ROUTES))
    c = open_slow(s.port, 1000, hdr)

    def slots():
        return key_slots(redis.port, k)
    try:
        assert wait_until(lambda: slots() == 1, 2.0)[0]
        if reload_first:
            reload_with_other_redis_timeout(s)
        s.proc.send_signal(signal.SIGTERM)
        assert c.read_response().status == 200
    finally:
        c.close()
    assert s.proc.wait(timeout=8) == 0, s.stderr[-2000:]
    return slots()


def test_slot_given_back_at_a_graceful_stop(sluice, redis):
    assert stop_with_one_in_flight(sluice, redis, False) == 0, "the slot stayed taken"


def test_slot_given_back_at_a_stop_after_a_reload(sluice, redis):
    """The request's runtime is the one a reload replaced: its store drains
    while the worker stops."""
    assert stop_with_one_in_flight(sluice, redis, True) == 0, "the slot stayed taken"



def test_slot_given_back_when_shutdown_timeout_cuts_a_request(sluice, redis):
    """shutdown_timeout: 1s with a 4 s request in flight: the request is cut
    when the worker's loop has already ended; its slot still goes back."""
    import signal
    import uuid
    k = uuid.uuid4().hex
    hdr = [("X-Api-Key", k)]
    s = sluice(proxy_conf(RELOAD_ROUTES, top="shutdown_timeout: 1s\n"))
    c = open_slow(s.port, 4000, hdr)

    def slots():
        return key_slots(redis.port, k)
    try:
        assert wait_until(lambda: slots() == 1, 2.0)[0]
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(timeout=8) == 0, s.stderr[-2000:]
    finally:
        c.close()
    assert slots() == 0, "the slot stayed taken"

# ---- a config override of a concurrency limit -----------------------------

OVERRIDE_ROUTES = """\
  - name: ov
    match: { path: /slow }
    upstream: api
    limits:
      - { name: ovslot, algorithm: concurrency, limit: 1, key: ["header:X-Api-Key"],
          overrides: [ { key: ["vip"], limit: 2 } ] }
"""


@pytest.mark.parametrize("backend", ["redis", "memory"])
def test_config_override_of_a_concurrency_limit_counts(sluice, redis, backend):
    """An override's parameters were copied from the limit before the
    default lease (the upstream's timeout + 10 s) was filled in: the
    overridden key was decided with a lease of 0, which limit.lua refuses
    ("bad window"), so with on_error: allow that key had no limit at all, and
    the admin API's state of it was a 503."""
    admin = free_port()
    s = sluice(proxy_conf(OVERRIDE_ROUTES, admin_port=admin,
                          top=top_keys(backend=backend if backend == "memory" else None)))
    hdr = [("X-Api-Key", "vip")]
    held_now = [open_slow(s.port, 1500, hdr) for _ in range(2)]
    try:
        time.sleep(0.3)
        r = http_get(s.port, "/slow/0", headers=hdr)
        assert r.status == 429, (r.status, r.headers)
        assert rl_headers(r).get("X-RateLimit-Limit") == "2", r.headers
        st = http_get(admin, "/api/limits/ov/ovslot?key=vip")
        assert st.status == 200, st
        assert b'"lease_ms": 15000' in st.body, st.body
        for c in held_now:
            assert c.read_response().status == 200
    finally:
        for c in held_now:
            c.close()
