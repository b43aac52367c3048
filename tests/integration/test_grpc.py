# sluice - tests/integration/test_grpc.py: gRPC calls through sluice to a
# real gRPC server.
#
# The upstream is tests/grpc_upstream.py (Debian's python3-grpcio; service
# demo.Echo on raw bytes), over h2c or over TLS (ALPN h2), behind an
# upstream with protocol: h2. Here the calls are made by an HTTP/1.1 client
# speaking gRPC's framing on a raw socket, which sees the response's
# trailers as chunked trailers. Every process is stopped by PID.

import os
import subprocess

import pytest

from conftest import Conn, build_request, read_log, stop_process
from proxylib import proxy_conf
from tlslib import make_ca, make_cert

HERE = os.path.dirname(os.path.abspath(__file__))
GRPC_UPSTREAM = os.path.join(HERE, "..", "grpc_upstream.py")


def frame(msg):
    return b"\x00" + len(msg).to_bytes(4, "big") + msg


class GrpcServer:
    def __init__(self, tls=None):
        args = ["/usr/bin/python3", GRPC_UPSTREAM, "--port", "0"]
        if tls:
            args += ["--tls", tls[0], tls[1]]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        line = self.proc.stdout.readline()
        if not line:
            stop_process(self.proc)
            raise RuntimeError("grpc_upstream.py did not start")
        self.port = int(line)

    def stop(self):
        stop_process(self.proc)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("pki"))
    make_ca(d, "ca", "sluice test ca")
    make_cert(d, "server", "ca", "upstream.test",
              "subjectAltName=DNS:upstream.test,DNS:localhost,IP:127.0.0.1\n"
              "extendedKeyUsage=serverAuth")
    return d


@pytest.fixture
def grpc_server():
    started = []

    def start(tls=None):
        g = GrpcServer(tls)
        started.append(g)
        return g

    yield start
    for g in started:
        g.stop()


ROUTES = """\
  - name: calls
    match: { path: /demo.Echo, grpc: true }
    upstream: grpc
    limits:
      - { name: per-method, algorithm: fixed_window, limit: 100, window: 1m,
          key: [grpc_service, grpc_method] }
"""


def proxy(sluice, grpc_port, tmp_path, pki=None):
    """sluice with an upstream `grpc` (protocol h2) to grpc_port."""
    tls = ("    tls: { ca_file: %s/ca.pem, server_name: upstream.test }\n" % pki) if pki else ""
    text = proxy_conf(ROUTES, admin_port=None, top="access_log: %s\n" % (tmp_path / "access.log"))
    text = text.replace("upstreams:\n", "upstreams:\n  grpc:\n    servers: [127.0.0.1:%d]\n"
                        "    protocol: h2\n%s" % (grpc_port, tls), 1)
    s = sluice(text)
    s.log_path = str(tmp_path / "access.log")
    return s


def h1_call(port, path, msg, headers=()):
    """A gRPC call over HTTP/1.1: (Response, trailers as a dict)."""
    h = [("Content-Type", "application/grpc"), ("TE", "trailers")] + list(headers)
    with Conn(port, 10) as c:
        c.send(build_request("POST", path, h, frame(msg)))
        head = c._until(b"\r\n\r\n").split(b"\r\n")
        status = int(head[0].split()[1])
        fields = {}
        for line in head[1:]:
            n, _, v = line.decode("latin-1").partition(":")
            fields[n.strip().lower()] = v.strip()
        body, trailers = b"", {}
        if fields.get("transfer-encoding") == "chunked":
            while True:
                size = int(c._until(b"\r\n").split(b";")[0], 16)
                if size == 0:
                    break
                body += c._exact(size)
                assert c._exact(2) == b"\r\n"
            while True:
                line = c._until(b"\r\n")
                if line == b"":
                    break
                n, _, v = line.decode("latin-1").partition(":")
                trailers[n.strip().lower()] = v.strip()
        else:
            body = c._exact(int(fields.get("content-length", "0")))
        return status, fields, body, trailers


@pytest.mark.parametrize("tls", [False, True], ids=["h2c", "tls-alpn"])
def test_http1_client_gets_grpc_trailers(sluice, redis, grpc_server, pki, tmp_path, tls):
    g = grpc_server(tls=(os.path.join(pki, "server.pem"), os.path.join(pki, "server.key"))
                    if tls else None)
    s = proxy(sluice, g.port, tmp_path, pki if tls else None)
    status, head, body, trailers = h1_call(s.port, "/demo.Echo/Unary", b"hello",
                                           [("x-meta", "m1")])
    assert status == 200 and head["content-type"] == "application/grpc", head
    assert head["x-meta"] == "m1"                       # initial metadata
    assert body == frame(b"hello")
    assert trailers["grpc-status"] == "0", trailers
    assert trailers["x-trail"] == "done"               # custom trailing metadata
    assert trailers["x-trail-bin"] == "AAH/"           # base64 of b"\x00\x01\xff"
    # a Trailers-Only answer of the server: its status in the head, no body
    status, head, body, trailers = h1_call(s.port, "/demo.Echo/Fail", b"x")
    assert status == 200 and head["grpc-status"] == "3" and head["grpc-message"] == "bad thing"
    assert head["x-why"] == "because" and body == b"" and trailers == {}
    entries = read_log(s.log_path, 2)
    assert [e["grpc_status"] for e in entries] == [0, 3]
