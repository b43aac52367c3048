# sluice - tests/integration/test_smuggling.py: ambiguous framing is refused.
#
# Every request here could be read two ways by two HTTP implementations. Each
# must get 400 and a closed connection, and the echo upstream must not have
# seen a single request head (its /__stats counter is read before and after).

import time

import pytest

from conftest import Conn, make_conf

ROUTES = """\
  - name: all
    match: { path: / }
    upstream: api
"""

H = b"POST /s HTTP/1.1\r\nHost: x\r\n"

CASES = {
    "cl_te": H + b"Content-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nG",
    "te_cl": H + b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n1\r\nA\r\n0\r\n\r\n",
    "cl_conflicting": H + b"Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
    "cl_duplicate_same": H + b"Content-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
    "cl_list": H + b"Content-Length: 5, 6\r\n\r\nhello!",
    "cl_plus": H + b"Content-Length: +5\r\n\r\nhello",
    "cl_hex": H + b"Content-Length: 0x5\r\n\r\nhello",
    "cl_negative": H + b"Content-Length: -1\r\n\r\n",
    "cl_overflow": H + b"Content-Length: 99999999999999999999999\r\n\r\n",
    "te_xchunked": H + b"Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
    "te_chunked_identity": H + b"Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
    "te_duplicate_second_unknown": H + b"Transfer-Encoding: chunked\r\n"
                                       b"Transfer-Encoding: x\r\n\r\n0\r\n\r\n",
    "te_chunked_twice": H + b"Transfer-Encoding: chunked\r\nTransfer-Encoding:  chunked\r\n"
                            b"\r\n0\r\n\r\n",
    "te_space_before_colon": H + b"Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
    "te_obs_fold": H + b"Transfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n",
    "obs_fold": b"GET /s HTTP/1.1\r\nHost: x\r\nX-Foo: a\r\n b\r\n\r\n",
    "bare_lf": b"GET /s HTTP/1.1\nHost: x\n\n",
    "bare_lf_mixed": b"GET /s HTTP/1.1\r\nHost: x\nX-A: 1\r\n\r\n",
    "bare_cr": b"GET /s HTTP/1.1\r\nHost: x\rX-A: 1\r\n\r\n",
    "missing_host_11": b"GET /s HTTP/1.1\r\nX-A: 1\r\n\r\n",
    "two_hosts": b"GET /s HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    "nul_in_header_value": b"GET /s HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",
    "space_in_header_name": b"GET /s HTTP/1.1\r\nHost: x\r\nX A: 1\r\n\r\n",
    "http_2_0": b"GET /s HTTP/2.0\r\nHost: x\r\n\r\n",
    "http_0_9": b"GET /s\r\n\r\n",
    "bad_version": b"GET /s HTTP/1.x\r\nHost: x\r\n\r\n",
    "garbage": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",
    "no_method": b" /s HTTP/1.1\r\nHost: x\r\n\r\n",
    "invalid_method_chars": b"G(T /s HTTP/1.1\r\nHost: x\r\n\r\n",
    "space_in_target": b"GET /a b HTTP/1.1\r\nHost: x\r\n\r\n",
    "header_without_colon": b"GET /s HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
}


@pytest.fixture
def proxy(sluice, redis):
    return sluice(make_conf(ROUTES))


def heads_seen(upstream):
    return upstream.stats()["heads"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_ambiguous_request_rejected(proxy, upstream, name):
    before = heads_seen(upstream)
    with Conn(proxy.port) as c:
        c.send(CASES[name])
        try:
            r = c.read_response()
        except (EOFError, ConnectionResetError):
            pytest.fail("%s: connection closed without a 400" % name)
        assert r.status == 400, (name, r)
        assert c.is_closed(), "%s: connection left open after a 400" % name
    time.sleep(0.1)
    assert heads_seen(upstream) == before, "%s reached the upstream" % name


def test_smuggled_second_request_never_runs(proxy, upstream):
    # CL.TE classic: a front end trusting CL would pass "GPOST" as a new request
    before = heads_seen(upstream)
    payload = (b"POST /s HTTP/1.1\r\nHost: x\r\nContent-Length: 13\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nSMUGGLED"
               b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n")
    with Conn(proxy.port) as c:
        c.send(payload)
        r = c.read_response()
        assert r.status == 400
        assert c.is_closed()
    time.sleep(0.1)
    stats = upstream.stats()
    assert stats["heads"] == before
    assert "/smuggled" not in stats["targets"]


@pytest.mark.parametrize("size_line", [b"ffffffffffffffffff", b"zz", b"-1", b"1 2", b""])
def test_bad_chunk_size_never_completes_upstream(proxy, upstream, size_line):
    before = upstream.stats()["requests"]
    with Conn(proxy.port) as c:
        c.send(H + b"Transfer-Encoding: chunked\r\n\r\n" + size_line + b"\r\nAAAA\r\n0\r\n\r\n")
        try:
            r = c.read_response()
        except (EOFError, ConnectionResetError):
            r = None
        if r is not None:
            assert r.status == 400, r
            assert c.is_closed()
    time.sleep(0.1)
    assert upstream.stats()["requests"] == before


def test_valid_request_after_rejections_still_served(proxy, upstream):
    with Conn(proxy.port) as c:
        c.send(CASES["cl_te"])
        assert c.read_response().status == 400
    with Conn(proxy.port) as c:
        c.send(b"GET /fine HTTP/1.1\r\nHost: x\r\n\r\n")
        assert c.read_response().status == 200
