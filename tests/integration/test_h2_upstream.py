# sluice - tests/integration/test_h2_upstream.py: upstreams with protocol h2.
#
# The h2 upstream is a real nginx (Debian's) started per test on 127.0.0.1:
# `listen ... http2` for h2c with prior knowledge, `ssl http2` for ALPN h2
# over TLS. nginx answers /static itself and proxies the rest (HTTP/1.1) to
# the echo upstream (tests/upstream.py), which reports the body it got
# (length and SHA-1), so request and response bodies are checked end to
# end. nginx logs $server_protocol and its connection number per request:
# the tests see HTTP/2.0 there, and how many connections the streams used.
# Clients are HTTP/1.1 (raw sockets). Every process is stopped by PID.

import hashlib
import os
import subprocess

import pytest

from conftest import Conn, build_request, free_port, parallel, stop_process, wait_port, wait_until
from nginxlib import NGINX, nginx_conf
from tlslib import make_upstream_pki


pytestmark = pytest.mark.skipif(not os.path.exists(NGINX), reason="nginx not installed")


class Nginx:
    """nginx speaking h2 (h2c, or h2 over TLS with pki), in front of the echo
    upstream; access log: connection, protocol, uri."""

    def __init__(self, tmp, echo_port, pki=None, keepalive_requests=10000,
                 max_streams=128):
        self.port = free_port()
        self.log = os.path.join(tmp, "access.log")
        conf = os.path.join(tmp, "nginx.conf")
        ssl = ("ssl http2;\n        ssl_certificate %s/server.pem;\n"
               "        ssl_certificate_key %s/server.key;" % (pki, pki)) if pki else "http2;"
        with open(conf, "w") as f:
            f.write(nginx_conf(tmp, """
    log_format h2 '$connection $server_protocol $request_uri';
    access_log %(log)s h2;
    keepalive_requests %(kr)d;
    http2_max_concurrent_streams %(ms)d;
    server {
        listen 127.0.0.1:%(port)d %(ssl)s
        client_max_body_size 64m;
        location /static {
            return 200 "h2 upstream $server_protocol\\n";
        }
        location / {
            proxy_pass http://127.0.0.1:%(echo)d;
            proxy_http_version 1.1;
            proxy_request_buffering off;
            proxy_buffering off;
        }
    }
""" % {"log": self.log, "port": self.port, "ssl": ssl, "echo": echo_port,
       "kr": keepalive_requests, "ms": max_streams}))
        self.errf = open(os.path.join(tmp, "nginx.stderr"), "wb")
        self.proc = subprocess.Popen([NGINX, "-p", tmp, "-c", conf], stdout=subprocess.DEVNULL,
                                     stderr=self.errf)
        if not wait_port(self.port, self.proc):
            self.stop()
            raise RuntimeError("nginx did not start: %s" % open(
                os.path.join(tmp, "error.log")).read()[-2000:])

    def lines(self, prefix="/", count=1):
        """[(connection, protocol, uri)] of the requests under prefix, once
        there are count of them or after 3 s."""
        def read():
            with open(self.log) as f:
                out = [ln.split() for ln in f.read().splitlines() if ln.strip()]
            return [ln for ln in out if len(ln) == 3 and ln[2].startswith(prefix)]
        return wait_until(read, 3, until=lambda out: len(out) >= count)[0]

    def stop(self):
        stop_process(self.proc)
        self.errf.close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_upstream_pki(str(tmp_path_factory.mktemp("pki")))


@pytest.fixture
def nginx(tmp_path, upstream):
    started = []

    def start(**kw):
        d = tmp_path / ("nginx%d" % len(started))
        d.mkdir()
        n = Nginx(str(d), upstream.port, **kw)
        started.append(n)
        return n

    yield start
    for n in started:
        n.stop()


CONF = """\
listen: 127.0.0.1:@LISTEN_PORT@
workers: 1
backend: memory
upstreams:
  h2:
    servers: [127.0.0.1:%(port)d]
    protocol: h2
    keepalive: %(keepalive)d
    connect_timeout: 2s
    timeout: 10s
%(tls)s
routes:
  - name: all
    match: { path: / }
    upstream: h2
"""


def start(sluice, port, pki=None, keepalive=4):
    tls = "    tls: { ca_file: %s/ca.pem, server_name: upstream.test }" % pki if pki else ""
    return sluice(CONF % {"port": port, "tls": tls, "keepalive": keepalive},
                  wait_redis=False, redis_port=free_port())


def request(port, method, target, body=None, headers=None, timeout_s=20.0):
    with Conn(port, timeout_s) as c:
        c.send(build_request(method, target, headers, body))
        return c.read_response(head_request=(method == "HEAD"))


def gets_at_once(port, targets):
    """GET every target at once, each on its own connection: True when each
    got its own 200 from the echo upstream (else the results, to show)."""
    out = parallel([lambda t=t: request(port, "GET", t) for t in targets])
    ok = [not isinstance(r, Exception) and r.status == 200 and r.json()["target"] == t
          for r, t in zip(out, targets)]
    return all(ok) or out


def sha1(b):
    return hashlib.sha1(b).hexdigest()


@pytest.mark.parametrize("tls", [False, True], ids=["h2c", "tls-alpn"])
def test_get_and_post_over_h2(sluice, nginx, pki, tls):
    n = nginx(pki=pki if tls else None)
    s = start(sluice, n.port, pki if tls else None)
    r = request(s.port, "GET", "/static/x")
    assert r.status == 200, r
    assert r.body == b"h2 upstream HTTP/2.0\n"
    body = b"hello h2 upstream" * 100
    r = request(s.port, "POST", "/echo?q=1", body=body, headers=[("X-Mine", "kept")])
    assert r.status == 200, r
    e = r.json()
    assert e["target"] == "/echo?q=1" and e["method"] == "POST"
    assert e["body_len"] == len(body) and e["body_sha1"] == sha1(body)
    assert ["X-Mine", "kept"] in e["headers"] or ["x-mine", "kept"] in e["headers"]
    lines = n.lines(count=2)
    assert [ln[1] for ln in lines] == ["HTTP/2.0", "HTTP/2.0"]


@pytest.mark.parametrize("tls", [False, True], ids=["h2c", "tls-alpn"])
def test_large_bodies_both_ways(sluice, nginx, pki, tls):
    n = nginx(pki=pki if tls else None)
    s = start(sluice, n.port, pki if tls else None)
    big = os.urandom(5 * 1000 * 1000)
    # chunked from the client: no length, streamed as DATA
    with Conn(s.port, 30) as c:
        head = ("POST /upload HTTP/1.1\r\nHost: localhost\r\n"
                "Transfer-Encoding: chunked\r\n\r\n").encode()
        c.send(head)
        for i in range(0, len(big), 100000):
            part = big[i:i + 100000]
            c.send(b"%x\r\n%s\r\n" % (len(part), part))
        c.send(b"0\r\n\r\n")
        r = c.read_response()
    assert r.status == 200, r
    assert r.json()["body_len"] == len(big) and r.json()["body_sha1"] == sha1(big)
    r = request(s.port, "POST", "/upload2", body=big)
    assert r.json()["body_len"] == len(big) and r.json()["body_sha1"] == sha1(big)
    r = request(s.port, "GET", "/big/5000000")
    assert r.status == 200, r
    assert len(r.body) == 5000000 and sha1(r.body) == r.header("X-Body-Sha1")


def test_parallel_requests_share_few_connections(sluice, nginx):
    n = nginx(max_streams=16)
    s = start(sluice, n.port)
    assert gets_at_once(s.port, ["/slow/300?i=%d" % i for i in range(48)])
    lines = n.lines("/slow/", count=48)
    conns = {ln[0] for ln in lines}
    # 48 at once over streams of at most 16 per connection: 3 connections,
    # a few more when sessions open while the server's SETTINGS are on the way
    assert 3 <= len(conns) <= 8, conns


def test_goaway_after_keepalive_requests_retries(sluice, nginx):
    # nginx sends GOAWAY after 5 requests on a connection: requests after
    # that go on a new connection, and none fails
    n = nginx(keepalive_requests=5)
    s = start(sluice, n.port)
    for i in range(23):
        r = request(s.port, "GET", "/static/%d" % i)
        assert r.status == 200, (i, r)
    conns = {ln[0] for ln in n.lines("/static/", count=23)}
    assert len(conns) >= 5, conns


def test_requests_refused_after_goaway_go_again(sluice, nginx):
    # 20 requests at once on one connection whose server stops after 5
    # (GOAWAY): the ones it did not process are sent again on new
    # connections; every client gets its answer
    n = nginx(keepalive_requests=5)
    s = start(sluice, n.port)
    assert gets_at_once(s.port, ["/slow/200?i=%d" % i for i in range(20)])
    lines = n.lines("/slow/", count=20)
    assert len(lines) == 20                 # each processed once
    assert len({ln[0] for ln in lines}) >= 4


def test_client_resets_while_upstream_headers_wait(sluice, nginx):
    # An HTTP/2 client sends a request and resets it in the same packet: the
    # request reaches the h2 upstream session (no limit to wait for) and its
    # HEADERS are queued there when the reset lets the exchange go, so
    # nghttp2 reports them not sent and then closes the stream. That close
    # once reached the stream already freed (a use after free that crashed
    # sluice under h2load's stop, bench row 17). Sluice stays up, and
    # answers on that connection and on a new one.
    from h2lib import H2Conn
    n = nginx()
    s = start(sluice, n.port)
    r = request(s.port, "GET", "/static/warm")      # the upstream session is up
    assert r.status == 200, r
    c = H2Conn(s.port)
    try:
        for i in range(40):
            sid = c.conn.get_next_available_stream_id()
            c.conn.send_headers(sid, [(":method", "GET"), (":scheme", "http"),
                                      (":authority", "localhost"),
                                      (":path", "/static/reset-%d" % i)], end_stream=True)
            c.conn.reset_stream(sid, error_code=8)
            c.flush()                   # HEADERS and RST_STREAM in one write
        sid = c.request("/static/after")
        status, _, body, reset = c.response(sid)
        assert (status, body, reset) == (200, b"h2 upstream HTTP/2.0\n", None)
    finally:
        c.close()
    assert s.proc.poll() is None, "sluice exited"
    r = request(s.port, "GET", "/static/again")
    assert r.status == 200, r
