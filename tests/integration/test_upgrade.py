# sluice - tests/integration/test_upgrade.py: Upgrade (WebSocket) tunnelling.
#
# On a route with `upgrade: true`, a request with Connection: Upgrade and
# Upgrade: websocket gets the upstream's 101, then bytes flow both ways
# (the tiny upstream greets, then echoes). The upgrade is counted once by the
# route's limits, however many bytes flow. Without `upgrade: true`, the
# Upgrade field is hop-by-hop and never reaches the upstream.

import os
import uuid

import pytest

from conftest import Conn, build_request, wait_until
from proxylib import TinyUpstream, metrics, mval, read_head, recv_exact, start_proxy

ROUTES = """\
  - name: ws
    match: { path: /ws, host: ws.test }
    upstream: tiny
    upgrade: true
    limits:
      - { name: two, algorithm: sliding_log, limit: 2, window: 1m, key: ["header:X-K"] }
  - name: plain
    match: { path: /ws }
    upstream: tiny
"""

UPGRADE = [("Connection", "Upgrade"), ("Upgrade", "websocket"),
           ("Sec-WebSocket-Version", "13"), ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")]


@pytest.fixture(scope="module")
def tiny():
    t = TinyUpstream()
    yield t
    t.stop()


@pytest.fixture
def proxy(sluice, redis, tiny):
    return start_proxy(sluice, ROUTES, workers=2, extra_upstreams={"tiny": tiny.port})


def open_tunnel(port, key):
    c = Conn(port, timeout_s=5)
    c.send(build_request("GET", "/ws", UPGRADE + [key], host="ws.test"))
    status, headers = read_head(c)
    return c, status, dict((n.lower(), v) for n, v in headers)


def test_upgrade_tunnels_both_ways(proxy, tiny):
    key = ("X-K", uuid.uuid4().hex)
    c, status, h = open_tunnel(proxy.port, key)
    with c:
        assert status == 101, (status, h)
        assert h.get("upgrade", "").lower() == "websocket"
        assert "upgrade" in h.get("connection", "").lower()
        # upstream -> client, unprompted
        assert recv_exact(c, 6) == b"hello\n"
        # client -> upstream -> client, small and large, binary
        c.send(b"ping\x00\xff")
        assert recv_exact(c, 6) == b"ping\x00\xff"
        blob = os.urandom(256 * 1024)
        c.send(blob)
        assert recv_exact(c, len(blob), timeout_s=10) == blob
    # the upstream saw the upgrade request with its Upgrade field
    method, target, hdrs = tiny.heads[-1]
    assert target == "/ws"
    assert dict(hdrs).get("upgrade", "").lower() == "websocket"


def test_upgrade_counted_once(proxy):
    key = ("X-K", uuid.uuid4().hex)
    b = metrics(proxy.admin_port)
    tunnels = []
    try:
        for _ in range(2):
            c, status, _ = open_tunnel(proxy.port, key)
            tunnels.append(c)
            assert status == 101
            assert recv_exact(c, 6) == b"hello\n"
            for i in range(20):             # traffic in the tunnel is not counted
                c.send(b"msg%02d" % i)
                assert recv_exact(c, 5) == b"msg%02d" % i
        c = Conn(proxy.port)
        tunnels.append(c)
        c.send(build_request("GET", "/ws", UPGRADE + [key], host="ws.test"))
        r = c.read_response()
        assert r.status == 429, r
    finally:
        for c in tunnels:
            c.close()
    a = metrics(proxy.admin_port)
    assert (mval(a, "sluice_requests_total", route="ws", decision="allowed")
            - mval(b, "sluice_requests_total", route="ws", decision="allowed")) == 2


def test_tunnel_closes_when_client_closes(proxy):
    key = ("X-K", uuid.uuid4().hex)
    c, status, _ = open_tunnel(proxy.port, key)
    assert status == 101
    assert recv_exact(c, 6) == b"hello\n"
    c.close()
    # the upstream side is released: the gauge returns to what it was
    n, _ = wait_until(lambda: mval(metrics(proxy.admin_port), "sluice_connections", side="client"),
                      3, until=lambda n: n == 0, step_s=0.05)
    assert n == 0
    assert proxy.proc.poll() is None


def test_no_upgrade_without_route_opt_in(proxy, tiny):
    seen = len(tiny.heads)
    with Conn(proxy.port) as c:
        c.send(build_request("GET", "/ws", UPGRADE))
        r = c.read_response()
        # Upgrade is hop-by-hop: the upstream never saw it, so no 101
        assert r.status == 426, r
        assert r.body == b"no"
        # and the connection stays plain HTTP
        c.send(build_request("GET", "/ws"))
        assert c.read_response().status == 426
    method, target, hdrs = tiny.heads[seen]
    assert target == "/ws"
    assert "upgrade" not in dict(hdrs)
