# sluice - tests/integration/test_delay_bounds.py: what a request held by
# `delay` may keep, and a held client that goes away (issue 18, item 9).
#
# While a request is decided or held, sluice reads no more of its client:
# the body waits in the kernel's socket buffer, not in sluice. A held client
# that closes is noticed at once: its connection ends and its reservation
# is given back.

import hashlib
import time

from conftest import Conn, build_request, timed_get, wait_until
from loadlib import proc_rss_kb
from proxylib import metrics, mval, start_proxy
from test_tls_listen import TLSConn
from tls_listen_lib import start_tls
from tlslib import CA

ROUTES = """\
  - name: long
    match: { path: /long }
    upstream: api
    limits:
      - { name: long, algorithm: gcra, rate: 1/s, burst: 1, key: ["header:X-Api-Key"], delay: 300s }
  - name: short
    match: { path: /short }
    upstream: api
    limits:
      - { name: short, algorithm: gcra, rate: 2/s, burst: 1, key: ["header:X-Api-Key"], delay: 5s }
  - name: ten
    match: { path: /ten }
    upstream: api
    limits:
      - { name: ten, algorithm: gcra, rate: 40/s, burst: 1, key: ["header:X-Api-Key"], delay: 10s }
"""

BODY = bytes(range(256)) * 240         # 61,440 bytes
HELD = 200
GONE = 300


def delayed(s, route):
    return mval(metrics(s.admin_port), "sluice_requests_total", route=route,
                decision="delayed")


def clients(s):
    return mval(metrics(s.admin_port), "sluice_connections", side="client")


def hold(s, n, path, key, body=None, connect=None):
    """n clients whose requests the delay holds (bounded wait for all n)."""
    conns = []
    for _ in range(n):
        c = connect() if connect else Conn(s.port, timeout_s=5)
        c.send(build_request("POST" if body else "GET", path, [("X-Api-Key", key)], body))
        conns.append(c)
    wait_until(lambda: delayed(s, path[1:]), timeout_s=20, until=lambda v: v >= n,
               what="%d requests held on %s" % (n, path))
    return conns


def held_growth_kb(s, key, body):
    """sluice's RSS growth per request held on /long, in KB (the clients
    stay open: closed by the caller)."""
    assert timed_get(s.port, "/long", [("X-Api-Key", key)])[0].status == 200
    time.sleep(0.3)
    before = proc_rss_kb(s.proc.pid)
    conns = hold(s, HELD, "/long", key, body)
    time.sleep(1.0)                                    # time to read more, if it would
    return (proc_rss_kb(s.proc.pid) - before) / HELD, conns


def test_held_requests_keep_their_bodies_in_the_kernel(sluice):
    """200 held requests with a 60 KB body each: sluice's RSS grows by what
    one read brought with each head (at most 16 KiB) more than for 200
    without a body, not by the bodies (before: 58-67 KB each against 11 KB).
    A held body still reaches the upstream whole after its hold."""
    s = start_proxy(sluice, ROUTES)
    bare, conns = held_growth_kb(s, "bare", None)
    with_body, more = held_growth_kb(s, "body", BODY)
    print("RSS growth per held request: %.1f KB without a body, %.1f KB with %d bytes"
          % (bare, with_body, len(BODY)))
    assert with_body - bare < 20, (bare, with_body)
    for c in conns + more:
        c.close()

    # The body of a held request goes up whole once its time comes.
    assert timed_get(s.port, "/short", [("X-Api-Key", "b")])[0].status == 200
    with Conn(s.port, timeout_s=10) as c:
        c.send(build_request("POST", "/short", [("X-Api-Key", "b")], BODY))
        r = c.read_response()
    assert r.status == 200, r
    assert r.json()["body_len"] == len(BODY)
    assert r.json()["body_sha1"] == hashlib.sha1(BODY).hexdigest()


def test_held_clients_that_close_are_gone_and_give_their_reservations_back(sluice):
    """300 clients held for up to 7.5 s close their connections (FIN): the
    connection gauge drops back within 2 s, and the 300 reservations are
    given back, so a new request for the key is admitted without waiting
    (before: it waited behind all 300, or got 429)."""
    s = start_proxy(sluice, ROUTES)
    key = [("X-Api-Key", "gone")]
    assert timed_get(s.port, "/ten", key)[0].status == 200
    base = clients(s)
    conns = hold(s, GONE, "/ten", "gone")
    assert clients(s) >= base + GONE - 20              # a few served already
    for c in conns:
        c.close()
    left, took = wait_until(lambda: clients(s), timeout_s=2.0, until=lambda v: v <= base)
    print("%d held clients closed: the gauge was back to %d after %.2f s (now %d)"
          % (GONE, base, took, left))
    assert left <= base, left
    r, t = timed_get(s.port, "/ten", key, timeout_s=3.0)
    print("the next request for the key waited %.0f ms" % (t * 1000))
    assert r.status == 200
    assert t < 1.0, t


def test_held_tls_clients_that_close_are_gone(sluice, tmp_path):
    """The same over TLS, with a 60 KB body behind each head: 20 TLS
    clients held up to 20 s (rate 1/s) close; their connections and
    reservations are gone at once, so the next request waits at most the
    one interval the first request took (before: behind all 20)."""
    ca = CA(tmp_path)
    leaf = ca.leaf("ec", "ec", ["api.test"])
    s = start_tls(sluice, ROUTES, [leaf])
    key = [("X-Api-Key", "tls")]
    assert timed_get(s.port, "/long", key)[0].status == 200
    base = clients(s)
    conns = hold(s, 20, "/long", "tls", BODY, connect=lambda: TLSConn(s.tls_port, ca.root))
    for c in conns:
        c.close()
    left, took = wait_until(lambda: clients(s), timeout_s=2.0, until=lambda v: v <= base)
    assert left <= base, left
    r, t = timed_get(s.port, "/long", key, timeout_s=3.0)
    print("20 held TLS clients closed: gone after %.2f s; the next request waited %.0f ms"
          % (took, t * 1000))
    assert r.status == 200
    assert t < 2.0, t
