# sluice - tests/integration/test_delay.py: `delay` on gcra and token_bucket (issue 13).
#
# A request that would pass within the delay is admitted now, its future
# slot reserved in the same atomic decision in Redis, and forwarded when its
# time comes; beyond the delay it gets 429 as before. Two sluice processes
# on one redis-server; the tests' upstream records when each request arrived
# ("arrived" in its echo).

import json
import re
import socket
import struct
import time

from conftest import Conn, build_request, free_port, http_get, parallel, timed_get
from opslib import ops_conf, top_keys

ROUTES = """\
  - name: warm
    match: { path: /warm }
    upstream: api
  - name: smooth
    match: { path: / }
    upstream: api
    limits:
      - { name: smooth, algorithm: @ALGO@, rate: 10/s, burst: 1, key: ["header:X-Api-Key"], delay: 1s }
"""

KEY = [("X-Api-Key", "k1")]


def conf(algo="gcra", backend=None, access_log=None, admin=None):
    return ops_conf(ROUTES.replace("@ALGO@", algo), admin_port=admin,
                    top=top_keys(backend=backend, access_log=access_log))


def warm(*proxies):
    """One unlimited request through each proxy first, so the burst finds an
    idle upstream connection: the gaps measured are sluice's spacing, not a
    first connect (slow under ASan on a loaded machine)."""
    for s in proxies:
        assert http_get(s.port, "/warm").status == 200




def arrivals(out):
    return sorted(r.json()["arrived"] for r, _ in out if r.status == 200)


def gaps_ms(ts):
    return [round((b - a) * 1000, 1) for a, b in zip(ts, ts[1:])]


def metric(port, name, labels):
    body = http_get(port, "/metrics").body.decode()
    pat = re.compile(r"^%s\{%s\} (\S+)$" % (re.escape(name), re.escape(labels)), re.M)
    m = pat.search(body)
    return float(m.group(1)) if m else None


def burst_of_eight(a, b, key):
    hdrs = [("X-Api-Key", key)]
    out = parallel([(lambda p=(a if i % 2 else b).port: timed_get(p, "/", hdrs))
                    for i in range(8)])
    assert not [o for o in out if isinstance(o, Exception)], out
    assert [r.status for r, _ in out] == [200] * 8      # none over the delay budget
    ts = arrivals(out)
    waits = sorted(t for _, t in out)
    assert waits[0] < 0.2 and waits[-1] >= 0.6          # held, not sent at once
    assert (ts[-1] - ts[0]) <= 1.0                      # all within the delay budget
    return gaps_ms(ts), ts


def test_eight_at_once_over_two_proxies_are_smoothed(sluice, redis, tmp_path):
    """The gaps are spacing sluice keeps (a request is never forwarded
    before its reserved time), minus any lateness of the one before: on a
    saturated machine (load 13 on 2 cores: +-50 ms seen) a process can be
    descheduled for tens of ms. Every burst must show the spacing (median
    gap >= 80 ms, spread 600..1000 ms: a request sent at once fails this
    every time); a burst with a gap under 60 ms is tried again on a fresh
    key, at most 3 times, and the last must have none."""
    a = sluice(conf())
    b = sluice(conf())
    warm(a, b)
    tries = []
    for key in ("k1", "k2", "k3"):
        g, ts = burst_of_eight(a, b, key)
        tries.append(g)
        print("gcra 10/s burst 1 delay 1s, 8 at once over 2 proxies: upstream gaps %s ms, "
              "spread %.0f ms" % (g, (ts[-1] - ts[0]) * 1000))
        assert sorted(g)[len(g) // 2] >= 80 and 0.6 <= ts[-1] - ts[0] <= 1.0, g
        if min(g) >= 60:
            break
    assert min(tries[-1]) >= 60, tries


def test_a_larger_burst_gets_429_beyond_the_delay(sluice, redis):
    admins = [free_port(), free_port()]
    a = sluice(conf(admin=admins[0]))
    b = sluice(conf(admin=admins[1]))
    warm(a, b)
    out = parallel([(lambda p=(a if i % 2 else b).port: timed_get(p, "/", KEY))
                    for i in range(16)])
    assert not [o for o in out if isinstance(o, Exception)], out
    ok = [(r, t) for r, t in out if r.status == 200]
    limited = [(r, t) for r, t in out if r.status == 429]
    print("16 at once, delay 1s: %d passed (held up to %.2f s), %d x 429 (slowest %.3f s)"
          % (len(ok), max(t for _, t in ok), len(limited), max(t for _, t in limited)))
    # 1 now + 10 within 1 s at 10/s; decisions spread over the burst's own
    # time (longer on a loaded machine) fit one more per 100 ms of it
    spread = max(t for _, t in limited)
    assert 11 <= len(ok) <= 12 + int(spread / 0.1) and len(limited) == 16 - len(ok)
    for r, t in limited:
        assert t < 0.5, "a 429 is answered at once, not held"
        assert int(r.header("Retry-After")) >= 1
    delayed = sum(metric(p, "sluice_requests_total", 'route="smooth",decision="delayed"')
                  for p in admins)
    limited_n = sum(metric(p, "sluice_requests_total", 'route="smooth",decision="limited"')
                    for p in admins)
    assert delayed == len(ok) - 1 and limited_n == len(limited)


def test_token_bucket_delay_and_metrics_and_log(sluice, redis, tmp_path):
    log = tmp_path / "access.log"
    admin = free_port()
    s = sluice(conf(algo="token_bucket", access_log=str(log), admin=admin))
    warm(s)
    out = parallel([lambda: timed_get(s.port, "/", KEY) for _ in range(5)])
    assert [r.status for r, _ in out] == [200] * 5
    assert min(gaps_ms(arrivals(out))) >= 60
    body = http_get(admin, "/metrics").body.decode()
    assert 'sluice_requests_total{route="smooth",decision="delayed"} 4' in body
    assert re.search(r"^sluice_delay_seconds_count 4$", body, re.M), body[-2000:]
    assert "sluice_delay_seconds_bucket{le=" in body
    lines = []
    for _ in range(100):
        lines = [json.loads(x) for x in log.read_text().splitlines() if x.strip()] \
            if log.exists() else []
        lines = [x for x in lines if x["route"] == "smooth"]
        if len(lines) >= 5:
            break
        time.sleep(0.02)
    assert len(lines) == 5
    delayed = sorted(x["delay_ms"] for x in lines if x["decision"] == "delayed")
    assert len(delayed) == 4 and [x["decision"] for x in lines].count("allowed") == 1
    assert all(d >= 1 for d in delayed) and delayed[-1] >= 300, delayed


def test_a_client_gone_while_held_gives_its_reservation_back(sluice, redis):
    s = sluice(conf())
    assert http_get(s.port, "/", headers=KEY).status == 200      # TAT = now + 100 ms
    held = []
    for _ in range(6):                  # reserved at +100..+600 ms
        c = Conn(s.port, timeout_s=5)
        c.send(build_request("GET", "/", KEY))
        held.append(c)
    time.sleep(0.05)
    for c in held[1:]:                  # five go away (RST): five slots come back
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        c.close()
    time.sleep(0.05)
    r, t = timed_get(s.port, "/", KEY)
    print("after 5 of 6 held clients left: the next request waited %.0f ms "
          "(without refunds about 550 ms)" % (t * 1000))
    assert r.status == 200
    assert t < 0.35, t
    assert held[0].read_response().status == 200
    held[0].close()


def test_memory_backend_smooths_within_one_process(sluice, redis):
    s = sluice(conf(backend="memory"), wait_redis=False)
    warm(s)
    tries = []
    for key in ("m1", "m2", "m3"):      # as above: load may make one burst late
        g, ts = burst_of_eight(s, s, key)
        tries.append(g)
        print("memory backend, 8 at once: gaps %s ms" % g)
        assert sorted(g)[len(g) // 2] >= 80 and 0.6 <= ts[-1] - ts[0] <= 1.0, g
        if min(g) >= 60:
            break
    assert min(tries[-1]) >= 60, tries
    out = parallel([lambda: timed_get(s.port, "/", KEY) for _ in range(16)])
    assert [r.status for r, _ in out].count(429) >= 4
