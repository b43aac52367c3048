# sluice - tests/integration/test_errors.py: the answers sluice writes itself.
#
# Malformed requests (400, then close), heads over client.max_header_bytes
# (431), over-long request lines, and that hostile input leaves the process
# running and serving.

import socket
import time

import pytest

from conftest import Conn, build_request, http_get, make_conf

ROUTES = """\
  - name: all
    match: { path: / }
    upstream: api
"""


@pytest.fixture
def proxy(sluice, redis):
    return sluice(make_conf(ROUTES, max_header_bytes=8192))


def assert_json_error(r, status):
    assert r.status == status, r
    assert r.header("Content-Type", "").startswith("application/json"), r
    r.json()


@pytest.mark.parametrize("raw", [
    b"GARBAGE\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\n: empty-name\r\n\r\n",
])
def test_malformed_is_400_and_closed(proxy, raw):
    with Conn(proxy.port) as c:
        c.send(raw)
        r = c.read_response()
        assert_json_error(r, 400)
        assert c.is_closed()


def test_malformed_after_good_request_on_same_connection(proxy):
    with Conn(proxy.port) as c:
        c.send(build_request("GET", "/ok") + b"NOT HTTP AT ALL\r\n\r\n")
        assert c.read_response().status == 200
        assert c.read_response().status == 400
        assert c.is_closed()


def test_head_too_large_is_431(proxy, upstream):
    before = upstream.stats()["heads"]
    big = [("X-Big-%d" % i, "v" * 1000) for i in range(10)]
    with Conn(proxy.port) as c:
        c.send(build_request("GET", "/big-head", big))
        r = c.read_response()
        assert_json_error(r, 431)
    assert upstream.stats()["heads"] == before


def test_head_too_large_without_end_is_431(proxy):
    # the client never finishes its head: sluice must not wait for more
    with Conn(proxy.port) as c:
        c.send(b"GET / HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 20000)
        r = c.read_response()
        assert r.status == 431, r


def test_head_just_under_limit_passes(proxy):
    headers = [("X-Fill-%d" % i, "v" * 500) for i in range(12)]   # ~6.3 KB
    r = http_get(proxy.port, "/fits", headers=headers)
    assert r.status == 200, r
    got = [[n, v] for n, v in r.json()["headers"] if n.startswith("X-Fill")]
    assert got == [[n, v] for n, v in headers]


def test_too_many_headers_is_431(proxy):
    headers = [("X-%d" % i, "1") for i in range(150)]              # ~1.5 KB, 150 fields
    with Conn(proxy.port) as c:
        c.send(build_request("GET", "/many", headers))
        r = c.read_response()
        assert r.status == 431, r


def test_request_line_too_long(proxy):
    with Conn(proxy.port) as c:
        c.send(build_request("GET", "/" + "a" * 10000))
        r = c.read_response()
        assert r.status in (414, 431), r


def test_no_route_404_keeps_connection(sluice, redis):
    s = sluice(make_conf("""\
  - name: only
    match: { path: /only }
    upstream: api
"""))
    with Conn(s.port) as c:
        c.send(build_request("GET", "/other"))
        assert_json_error(c.read_response(), 404)
        c.send(build_request("GET", "/only"))
        assert c.read_response().status == 200


def test_client_disconnects_mid_request_then_service_continues(proxy):
    for partial in (b"GET / HT", b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc",
                    b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab"):
        s = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
        s.sendall(partial)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()       # reset
    time.sleep(0.1)
    assert http_get(proxy.port, "/still-up").status == 200
    assert proxy.proc.poll() is None


def test_client_disconnects_while_upstream_slow(proxy):
    with Conn(proxy.port) as c:
        c.send(build_request("GET", "/slow/300"))
    time.sleep(0.5)
    assert http_get(proxy.port, "/still-up").status == 200
    assert proxy.proc.poll() is None


def test_random_bytes_never_crash(proxy):
    import random
    rng = random.Random(1234)
    for i in range(60):
        n = rng.randint(1, 600)
        data = bytes(rng.getrandbits(8) for _ in range(n))
        if i % 2:
            data = b"GET /" + data + b" HTTP/1.1\r\nHost: x\r\n\r\n"
        try:
            with Conn(proxy.port, timeout_s=2) as c:
                c.send(data)
                c.sock.shutdown(socket.SHUT_WR)
                try:
                    while c.sock.recv(65536):
                        pass
                except (socket.timeout, ConnectionResetError):
                    pass
        except (ConnectionResetError, BrokenPipeError):
            pass
        assert proxy.proc.poll() is None, "sluice died on input %r" % data
    assert http_get(proxy.port, "/still-up").status == 200


def test_404_discards_request_body(sluice, redis, upstream):
    s = sluice(make_conf("""\
  - name: only
    match: { path: /only }
    upstream: api
"""))
    smuggle = b"GET /only/smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
    with Conn(s.port) as c:
        c.send(b"POST /other HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
               % (len(smuggle), smuggle) + build_request("GET", "/only/next"))
        assert c.read_response().status == 404
        r = c.read_response()
        assert r.status == 200 and r.json()["target"] == "/only/next", r
    assert "/only/smuggled" not in upstream.stats()["targets"]
