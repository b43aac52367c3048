# sluice - tests/integration/test_upstream.py: the echo upstream itself, directly.
#
# The other suites trust what tests/upstream.py reports, so its echo,
# numbering, body decoding and misbehaviours are checked here without sluice.

import hashlib

from conftest import Conn, build_request, http_get, raw_exchange
from upstream import CHUNKED_PARTS, big_body


def test_echo_reports_request(upstream):
    r = http_get(upstream.port, "/a%2Fb?x=1", method="PUT",
                 headers=[("X-B", "2"), ("x-a", "1")], body=b"hello")
    assert r.status == 200
    echo = r.json()
    assert echo["method"] == "PUT"
    assert echo["target"] == "/a%2Fb?x=1"
    assert echo["version"] == "HTTP/1.1"
    assert echo["headers"] == [["Host", "localhost"], ["X-B", "2"], ["x-a", "1"],
                               ["Content-Length", "5"]]
    assert echo["body_len"] == 5
    assert echo["body_sha1"] == hashlib.sha1(b"hello").hexdigest()
    assert echo["chunked"] is False
    assert r.header("X-Upstream-Conn") == str(echo["conn"])


def test_keepalive_seq_and_pipelining(upstream):
    with Conn(upstream.port) as c:
        c.send(build_request("GET", "/1") + build_request("GET", "/2"))
        a, b = c.read_response().json(), c.read_response().json()
        assert (a["seq"], b["seq"]) == (1, 2)
        assert a["conn"] == b["conn"]
        assert (a["target"], b["target"]) == ("/1", "/2")


def test_chunked_request(upstream):
    with Conn(upstream.port) as c:
        c.send(b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\nT: 1\r\n\r\n")
        echo = c.read_response().json()
        assert echo["chunked"] is True
        assert echo["body_sha1"] == hashlib.sha1(b"abcde").hexdigest()


def test_behaviours(upstream):
    assert http_get(upstream.port, "/status/418").status == 418
    r = http_get(upstream.port, "/big/1000")
    assert r.body == big_body(1000)
    assert http_get(upstream.port, "/chunked-response").body == b"".join(CHUNKED_PARTS)
    r, closed = raw_exchange(upstream.port, build_request("GET", "/no-length"))
    assert r.body == big_body(3000) and closed
    r = http_get(upstream.port, "/headers")
    assert r.header("X-Custom") == "1"
    with Conn(upstream.port) as c:
        c.send(build_request("GET", "/garbage"))
        data = c.sock.recv(100)
        assert not data.startswith(b"HTTP/")


def test_stats_count_requests(upstream):
    before = upstream.stats()
    http_get(upstream.port, "/counted")
    after = upstream.stats()
    assert after["heads"] == before["heads"] + 1
    assert after["requests"] == before["requests"] + 1
    assert after["targets"][-1] == "/counted"
