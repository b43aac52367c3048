# sluice - tests/integration/test_proxy.py: forwarding to and from the upstream.
#
# Upstream failures (down, slow, garbage, broken framing), connection reuse,
# pipelining, bodies both ways (chunked and Content-Length, large ones
# streamed), HTTP/1.0 clients, and which headers reach the upstream.

import hashlib
import socket
import threading
import time

import pytest

from conftest import Conn, build_request, http_get, make_conf, raw_exchange
from upstream import CHUNKED_PARTS, big_body

ROUTES = """\
  - name: dead
    match: { path: /dead }
    upstream: dead
  - name: all
    match: { path: / }
    upstream: api
"""


@pytest.fixture
def proxy(sluice, redis):
    return sluice(make_conf(ROUTES, upstream_timeout="500ms"))


def assert_json_error(r, status):
    assert r.status == status, r
    assert r.header("Content-Type", "").startswith("application/json"), r
    r.json()


# ----------------------------------------------------- upstream errors ----

def test_upstream_down_is_502(proxy):
    r = http_get(proxy.port, "/dead")
    assert_json_error(r, 502)


def test_upstream_down_then_client_connection_usable_or_closed_cleanly(proxy):
    # the spec does not say whether a 502 ends the client connection; if it
    # does, the response must say so (RFC 9112 9.6), else the next request works
    with Conn(proxy.port) as c:
        c.send(build_request("GET", "/dead"))
        r = c.read_response()
        assert r.status == 502
        if "close" in (r.header("Connection") or "").lower():
            assert c.is_closed()
            return
        c.send(build_request("GET", "/ok"))
        assert c.read_response().status == 200, r


def test_upstream_slow_is_504(proxy):
    t0 = time.monotonic()
    r = http_get(proxy.port, "/slow/3000")
    elapsed = time.monotonic() - t0
    assert_json_error(r, 504)
    assert elapsed < 2.5, elapsed


def test_upstream_within_timeout_is_200(proxy):
    r = http_get(proxy.port, "/slow/100")
    assert r.status == 200


def test_upstream_garbage_is_502(proxy):
    assert_json_error(http_get(proxy.port, "/garbage"), 502)


def test_upstream_bad_chunk_is_not_a_complete_response(proxy):
    # the head may already be on its way: then the client connection must be
    # closed rather than a truncated body presented as complete
    with Conn(proxy.port) as c:
        c.send(build_request("GET", "/bad-chunk"))
        try:
            r = c.read_response()
        except (EOFError, ConnectionResetError, ValueError):
            return
        assert r.status == 502, r


def test_upstream_close_mid_body_is_not_complete(proxy):
    with Conn(proxy.port) as c:
        c.send(build_request("GET", "/close-mid-body"))
        try:
            r = c.read_response()
        except (EOFError, ConnectionResetError):
            return
        assert r.status == 502, r


def test_upstream_status_passes_through(proxy):
    for code in (201, 404, 500, 503):
        r = http_get(proxy.port, "/status/%d" % code)
        assert r.status == code, r
    r = http_get(proxy.port, "/status/204")
    assert r.status == 204 and r.body == b""


def test_upstream_no_length_body_until_close(proxy):
    r = http_get(proxy.port, "/no-length")
    assert r.status == 200
    assert r.body == big_body(3000)


def test_upstream_closing_connection_is_not_reused(proxy):
    with Conn(proxy.port) as c:
        c.send(build_request("GET", "/headers"))
        r = c.read_response()
        assert r.status == 200 and r.header("X-Custom") == "1", r
        first = r.header("X-Upstream-Conn")
    for _ in range(3):
        r = http_get(proxy.port, "/after")
        assert r.status == 200, r
        assert r.header("X-Upstream-Conn") != first


# -------------------------------------------------------- connections ----

def test_upstream_connection_reused(proxy):
    seen = set()
    with Conn(proxy.port) as c:
        for i in range(4):
            c.send(build_request("GET", "/ka?i=%d" % i))
            r = c.read_response()
            assert r.status == 200
            seen.add(r.header("X-Upstream-Conn"))
    for i in range(3):      # new client connections, one after another
        r = http_get(proxy.port, "/ka2?i=%d" % i)
        seen.add(r.header("X-Upstream-Conn"))
    assert len(seen) == 1, "upstream connections not reused: %r" % seen


def test_client_keepalive_many_requests(proxy):
    with Conn(proxy.port) as c:
        for i in range(50):
            c.send(build_request("GET", "/n?i=%d" % i))
            r = c.read_response()
            assert r.status == 200 and r.json()["target"] == "/n?i=%d" % i


def test_pipelined_requests_answered_in_order(proxy):
    reqs = (build_request("GET", "/slow/200?i=1") + build_request("GET", "/p?i=2") +
            build_request("POST", "/p?i=3", body=b"hello") + build_request("GET", "/p?i=4"))
    with Conn(proxy.port) as c:
        c.send(reqs)
        targets = []
        for _ in range(4):
            r = c.read_response()
            assert r.status == 200, r
            targets.append(r.json()["target"])
        assert targets == ["/slow/200?i=1", "/p?i=2", "/p?i=3", "/p?i=4"]
        c.send(build_request("GET", "/p?i=5"))
        assert c.read_response().json()["target"] == "/p?i=5"


def test_pipelined_byte_by_byte(proxy):
    reqs = build_request("GET", "/b?i=1") + build_request("GET", "/b?i=2")
    with Conn(proxy.port) as c:
        for i in range(len(reqs)):
            c.send(reqs[i:i + 1])
        assert c.read_response().json()["target"] == "/b?i=1"
        assert c.read_response().json()["target"] == "/b?i=2"


def test_http10_client(proxy):
    with Conn(proxy.port) as c:
        c.send(b"GET /chunked-response HTTP/1.0\r\nHost: x\r\n\r\n")
        r = c.read_response()
        assert r.status == 200
        assert r.version in ("HTTP/1.0", "HTTP/1.1")
        assert "chunked" not in (r.header("Transfer-Encoding") or "").lower(), \
            "chunked sent to an HTTP/1.0 client"
        assert r.body == b"".join(CHUNKED_PARTS)
        assert c.is_closed()


def test_http10_client_plain(proxy):
    resp, closed = raw_exchange(proxy.port, b"GET /ten HTTP/1.0\r\n\r\n")
    assert resp.status == 200 and resp.json()["target"] == "/ten"
    assert closed


def test_http11_connection_close(proxy):
    with Conn(proxy.port) as c:
        c.send(build_request("GET", "/c", [("Connection", "close")]))
        assert c.read_response().status == 200
        assert c.is_closed()


def test_head_request(proxy):
    with Conn(proxy.port) as c:
        c.send(build_request("HEAD", "/h1"))
        r = c.read_response(head_request=True)
        assert r.status == 200
        c.send(build_request("GET", "/h2"))
        assert c.read_response().json()["target"] == "/h2"


# -------------------------------------------------------------- bodies ----

def test_chunked_request_body_intact(proxy):
    body = b"".join(bytes([i % 256]) * (i * 37 + 1) for i in range(40))
    chunks = b""
    pos = 0
    for i in range(40):
        n = i * 37 + 1
        chunks += b"%x\r\n%s\r\n" % (n, body[pos:pos + n])
        pos += n
    chunks += b"0\r\n\r\n"
    req = (b"POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks)
    with Conn(proxy.port) as c:
        c.send(req)
        r = c.read_response()
        assert r.status == 200, r
        echo = r.json()
        assert echo["body_len"] == len(body)
        assert echo["body_sha1"] == hashlib.sha1(body).hexdigest()
        c.send(build_request("GET", "/after"))
        assert c.read_response().json()["target"] == "/after"


def test_chunked_request_with_extensions_and_trailers(proxy):
    req = (b"POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n")
    with Conn(proxy.port) as c:
        c.send(req)
        echo = c.read_response().json()
        assert echo["body_sha1"] == hashlib.sha1(b"hello world").hexdigest()
        c.send(build_request("GET", "/after"))
        assert c.read_response().json()["target"] == "/after"


def test_large_content_length_body_streams(proxy):
    body = big_body(5 * 1024 * 1024)
    head = b"POST /big-upload HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
    with Conn(proxy.port, timeout_s=20) as c:
        sender = threading.Thread(target=lambda: c.send(head + body), daemon=True)
        sender.start()
        r = c.read_response()
        sender.join(20)
        assert r.status == 200, r
        echo = r.json()
        assert echo["body_len"] == len(body)
        assert echo["body_sha1"] == hashlib.sha1(body).hexdigest()


def test_large_response_body_streams(proxy):
    n = 5 * 1024 * 1024 + 7
    with Conn(proxy.port, timeout_s=20) as c:
        c.send(build_request("GET", "/big/%d" % n))
        r = c.read_response()
        assert r.status == 200
        assert len(r.body) == n
        assert hashlib.sha1(r.body).hexdigest() == r.header("X-Body-Sha1")
        c.send(build_request("GET", "/after"))
        assert c.read_response().json()["target"] == "/after"


def test_chunked_response_intact(proxy):
    with Conn(proxy.port) as c:
        for _ in range(2):
            c.send(build_request("GET", "/chunked-response"))
            r = c.read_response()
            assert r.status == 200
            assert r.body == b"".join(CHUNKED_PARTS)


def test_expect_continue(proxy):
    with Conn(proxy.port) as c:
        c.send(b"POST /exp HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
               b"Expect: 100-continue\r\n\r\n")
        time.sleep(0.2)
        c.send(b"hello")
        r = c.read_response()
        assert r.status == 200, r
        assert r.json()["body_sha1"] == hashlib.sha1(b"hello").hexdigest()


# ------------------------------------------------------------- headers ----

def test_hop_by_hop_dropped_and_others_in_order(proxy):
    sent = [("X-First", "1"), ("Connection", "keep-alive, X-Hop-Named"),
            ("X-Hop-Named", "secret"), ("Keep-Alive", "timeout=5"), ("TE", "trailers"),
            ("Trailer", "X-T"), ("Upgrade", "h2c"), ("Proxy-Connection", "keep-alive"),
            ("x-lower", "a b  c"), ("X-Dup", "1"), ("Accept", "*/*"), ("X-Dup", "2"),
            ("Cookie", "a=1; b=2")]
    r = http_get(proxy.port, "/hdr", headers=sent)
    assert r.status == 200, r
    got = r.json()["headers"]
    names = [n.lower() for n, _ in got]
    for hop in ("x-hop-named", "keep-alive", "te", "trailer", "upgrade", "proxy-connection"):
        assert hop not in names, (hop, got)
    for n, v in got:
        if n.lower() == "connection":
            assert "x-hop-named" not in v.lower(), got
    ignore = {"x-forwarded-for", "x-forwarded-proto", "connection", "x-request-id",
              "content-length", "transfer-encoding"}
    kept = [[n, v] for n, v in got if n.lower() not in ignore]
    assert kept == [["Host", "localhost"], ["X-First", "1"], ["x-lower", "a b  c"],
                    ["X-Dup", "1"], ["Accept", "*/*"], ["X-Dup", "2"],
                    ["Cookie", "a=1; b=2"]], got


def test_request_line_goes_upstream_unchanged(proxy):
    r = http_get(proxy.port, "/a/%7Euser/./b?x=%20y&z", method="PATCH")
    echo = r.json()
    assert echo["method"] == "PATCH"
    assert echo["target"] == "/a/%7Euser/./b?x=%20y&z"
    assert echo["version"] == "HTTP/1.1"


def test_response_headers_pass_through(proxy):
    r = http_get(proxy.port, "/headers")
    assert r.header("X-Custom") == "1"
    assert r.header("Content-Type") == "application/json"


def test_round_robin_over_servers(sluice, redis, upstream):
    from conftest import Upstream
    second = Upstream()
    try:
        conf = make_conf(ROUTES).replace(
            "servers: [127.0.0.1:@UPSTREAM_PORT@]",
            "servers: [127.0.0.1:@UPSTREAM_PORT@, 127.0.0.1:%d]" % second.port)
        s = sluice(conf)
        # Concurrent requests need new upstream connections, which round robin
        # spreads over the servers. (Sequential requests may all reuse one
        # idle connection from the per-upstream pool: the spec allows both.)
        ports = []
        conns = [Conn(s.port) for _ in range(6)]
        try:
            for i, c in enumerate(conns):
                c.send(build_request("GET", "/slow/300?i=%d" % i))
            for c in conns:
                ports.append(c.read_response().json()["server_port"])
        finally:
            for c in conns:
                c.close()
        assert sorted(ports) == sorted([upstream.port, second.port] * 3), ports
    finally:
        second.stop()


def test_one_server_down_others_serve(sluice, redis, upstream):
    from conftest import free_port
    conf = make_conf(ROUTES).replace(
        "servers: [127.0.0.1:@UPSTREAM_PORT@]",
        "servers: [127.0.0.1:@UPSTREAM_PORT@, 127.0.0.1:%d]" % free_port())
    s = sluice(conf)
    statuses = [http_get(s.port, "/rr?i=%d" % i).status for i in range(6)]
    assert statuses.count(200) >= 3, statuses
    assert set(statuses) <= {200, 502}, statuses


def test_ipv6_listener(sluice, redis):
    try:
        probe = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        probe.bind(("::1", 0))
        port = probe.getsockname()[1]
        probe.close()
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    conf = make_conf("""\
  - name: v6
    match: { path: / }
    upstream: api
    limits:
      - { name: ip2, algorithm: fixed_window, limit: 2, window: 10s, key: [ip] }
""").replace("listen: 127.0.0.1:@LISTEN_PORT@", "listen: \"[::1]:%d\"" % port)
    s = sluice(conf, listen_port=port, listen_host="::1")
    with Conn(s.port, host="::1") as c:
        for expect in (200, 200, 429):
            c.send(build_request("GET", "/six"))
            r = c.read_response()
            assert r.status == expect, r


def test_ipv6_client_forwarded_for(sluice, redis):
    try:
        probe = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        probe.bind(("::1", 0))
        port = probe.getsockname()[1]
        probe.close()
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    conf = make_conf(ROUTES).replace("listen: 127.0.0.1:@LISTEN_PORT@",
                                     "listen: \"[::1]:%d\"" % port)
    s = sluice(conf, listen_port=port, listen_host="::1")
    with Conn(s.port, host="::1") as c:
        c.send(build_request("GET", "/v6"))
        hdrs = c.read_response().json()["headers"]
    assert [v for n, v in hdrs if n.lower() == "x-forwarded-for"] == ["::1"], hdrs
