# sluice - tests/integration/test_grpc.py: gRPC calls through sluice to a
# real gRPC server.
#
# The upstream is tests/grpc_upstream.py (Debian's python3-grpcio; service
# demo.Echo on raw bytes), over h2c or over TLS (ALPN h2), behind an
# upstream with protocol: h2. The clients are grpcio's (h2c with prior
# knowledge to sluice's plain listener; generic stubs on raw bytes, no
# generated code), Node's @grpc/grpc-js (tests/node, installed by make deps)
# and an HTTP/1.1 client speaking gRPC's framing on a raw socket, which sees
# the response's trailers as chunked trailers. Every process is stopped by
# PID; every call has a deadline.

import hashlib
import json
import os
import shutil
import subprocess
import threading
import time

import grpc

import pytest

from conftest import Conn, build_request, free_port, read_log, stop_process, wait_until
from proxylib import proxy_conf
from tlslib import make_upstream_pki

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
    return make_upstream_pki(str(tmp_path_factory.mktemp("pki")))


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


def proxy(sluice, grpc_port, tmp_path, pki=None, routes=ROUTES, **kw):
    """sluice with an upstream `grpc` (protocol h2) to grpc_port."""
    tls = ("    tls: { ca_file: %s/ca.pem, server_name: upstream.test }\n" % pki) if pki else ""
    text = proxy_conf(routes, admin_port=None, top="access_log: %s\n" % (tmp_path / "access.log"),
                      **kw)
    text = text.replace("upstreams:\n", "upstreams:\n  grpc:\n    servers: [127.0.0.1:%d]\n"
                        "    protocol: h2\n%s" % (grpc_port, tls), 1)
    down = kw.get("on_error") == "deny"         # with Redis down
    s = sluice(text, wait_redis=not down, redis_port=free_port() if down else None)
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


# ------------------------------------------------------- grpcio client ----

RAW = {"request_serializer": None, "response_deserializer": None}
BIG = 5 * 1000 * 1000
OPTS = [("grpc.max_receive_message_length", 64 << 20),
        ("grpc.max_send_message_length", 64 << 20)]


def channel(port, options=()):
    return grpc.insecure_channel("127.0.0.1:%d" % port, options=OPTS + list(options))


def stub(ch, kind, method):
    return getattr(ch, kind)("/demo.Echo/" + method, **RAW)


def server_stats(g):
    with grpc.insecure_channel("127.0.0.1:%d" % g.port) as ch:
        return json.loads(stub(ch, "unary_unary", "Stats")(b"", timeout=5))


@pytest.mark.parametrize("tls", [False, True], ids=["h2c", "tls-alpn"])
def test_every_kind_of_call_with_5mb_messages(sluice, redis, grpc_server, pki, tmp_path, tls):
    g = grpc_server(tls=(os.path.join(pki, "server.pem"), os.path.join(pki, "server.key"))
                    if tls else None)
    s = proxy(sluice, g.port, tmp_path, pki if tls else None)
    with channel(s.port) as ch:
        # unary: metadata there and back, custom trailing metadata
        r, call = stub(ch, "unary_unary", "Unary").with_call(
            b"hello", metadata=[("x-tenant", "t1"), ("x-bin-bin", b"\x00\xff")], timeout=10)
        assert r == b"hello"
        initial = dict(call.initial_metadata())
        assert initial["x-tenant"] == "t1" and initial["x-bin-bin"] == b"\x00\xff"
        trailing = dict(call.trailing_metadata())
        assert trailing["x-trail"] == "done" and trailing["x-trail-bin"] == b"\x00\x01\xff"
        # a status of the server's, its details and trailing metadata intact
        with pytest.raises(grpc.RpcError) as e:
            stub(ch, "unary_unary", "Fail")(b"x", timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.details() == "bad thing"
        assert dict(e.value.trailing_metadata())["x-why"] == "because"
        # server-streaming: 5 MB in five messages
        got = list(stub(ch, "unary_stream", "Split")(b"5:1000000", timeout=30))
        assert [len(m) for m in got] == [1000000] * 5
        assert got[4] == b"\x04" * 1000000
        # client-streaming: one 5 MB message and a small one
        big = os.urandom(BIG)
        r = stub(ch, "stream_unary", "Join")(iter([big, b"end"]), timeout=30)
        assert r == ("%d:%s" % (BIG + 3, hashlib.sha1(big + b"end").hexdigest())).encode()
        # bidirectional: 5 MB messages both ways, the server answering each
        # as it comes while the client still sends
        out = list(stub(ch, "stream_stream", "Chat")(iter([big, b"y" * 3, big]), timeout=30))
        assert [len(m) for m in out] == [BIG, 3, BIG] and out[0] == big and out[2] == big
    entries = read_log(s.log_path, 5)
    assert [e["grpc_status"] for e in entries] == [0, 3, 0, 0, 0]
    assert all(e["protocol"] == "HTTP/2.0" for e in entries)


@pytest.mark.parametrize("tls", [False, True], ids=["h2c", "tls-alpn"])
def test_concurrent_bidirectional_calls_on_one_connection(sluice, redis, grpc_server, pki,
                                                          tmp_path, tls):
    """Four bidirectional 5 MB calls at once, three times each, share the
    client's connection and sluice's upstream session: every stream's
    upload must keep moving while the others fill the windows (a stream
    whose input passed its read mark once waited for good)."""
    g = grpc_server(tls=(os.path.join(pki, "server.pem"), os.path.join(pki, "server.key"))
                    if tls else None)
    s = proxy(sluice, g.port, tmp_path, pki if tls else None)
    big = os.urandom(BIG)
    results = []

    def calls(ch):
        for _ in range(3):
            try:
                out = list(stub(ch, "stream_stream", "Chat")(iter([big, b"z", big]), timeout=30))
                results.append([len(m) for m in out] == [BIG, 1, BIG] and out[2] == big)
            except grpc.RpcError as e:
                results.append(e.code())

    with channel(s.port) as ch:
        threads = [threading.Thread(target=calls, args=(ch,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert results == [True] * 12, results


def test_deadline_and_cancellation_reach_the_server(sluice, redis, grpc_server, tmp_path):
    g = grpc_server()
    s = proxy(sluice, g.port, tmp_path)
    with channel(s.port) as ch:
        sleep = stub(ch, "unary_unary", "Sleep")
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as e:
            sleep(b"20000", timeout=0.5)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - t0 < 5
        # the server was told (grpc-timeout went up), and gave up too
        assert wait_until(lambda: server_stats(g)["cancelled"], 5,
                          until=lambda n: n >= 1)[0] == 1
        # a client that cancels: RST_STREAM to sluice, RST_STREAM to the server
        fut = sleep.future(b"20000", timeout=30)
        assert wait_until(lambda: server_stats(g)["calls"], 5, until=lambda n: n >= 2)[0] >= 2
        t0 = time.monotonic()
        fut.cancel()
        assert wait_until(lambda: server_stats(g)["cancelled"], 5,
                          until=lambda n: n >= 2)[0] == 2
        assert time.monotonic() - t0 < 2        # within a second or so
        # the connection and the session go on
        assert stub(ch, "unary_unary", "Unary")(b"again", timeout=10) == b"again"


LIMITED = """\
  - name: calls
    match: { path: /demo.Echo, grpc: true }
    upstream: grpc
    limits:
      - { name: per-tenant, algorithm: token_bucket, rate: 1/s, burst: 1,
          key: ["header:x-tenant"] }
"""

RETRY = json.dumps({"methodConfig": [{
    "name": [{"service": "demo.Echo"}],
    "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.01s",
                    "backoffMultiplier": 1, "retryableStatusCodes": ["RESOURCE_EXHAUSTED"]},
}]})


def test_limit_is_resource_exhausted_and_a_retry_policy_waits_it_out(sluice, redis, grpc_server,
                                                                      tmp_path):
    g = grpc_server()
    s = proxy(sluice, g.port, tmp_path, routes=LIMITED)
    md = [("x-tenant", "t-%f" % time.time())]
    with channel(s.port) as ch:
        unary = stub(ch, "unary_unary", "Unary")
        assert unary(b"1", metadata=md, timeout=10) == b"1"
        with pytest.raises(grpc.RpcError) as e:
            unary(b"2", metadata=md, timeout=10)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert e.value.details() == "rate_limited"
        trailing = dict(e.value.trailing_metadata())
        pushback = int(trailing["grpc-retry-pushback-ms"])
        assert 0 < pushback <= 1000 and trailing["retry-after"] == "1"
        assert trailing["ratelimit"].startswith('"per-tenant";r=0')
    calls = server_stats(g)["calls"]
    assert calls == 1
    # with a retry policy, the client waits as long as the pushback says
    # (its own backoff is 10 ms), and its retry passes
    opts = [("grpc.enable_retries", 1), ("grpc.service_config", RETRY)]
    with channel(s.port, opts) as ch:
        unary = stub(ch, "unary_unary", "Unary")
        time.sleep(1.5)
        assert unary(b"3", metadata=md, timeout=10) == b"3"      # the bucket's token
        t0 = time.monotonic()
        assert unary(b"4", metadata=md, timeout=10) == b"4"      # refused, then retried
        waited = time.monotonic() - t0
    assert 0.5 <= waited < 5, waited
    # refused, then passed: the retry came at the pushback's end (or, a
    # millisecond early by the bucket's clock, once more); the log's line
    # for the retry that passed may come a moment after the call's end
    entries = wait_until(lambda: read_log(s.log_path, 5, timeout_s=0), 5,
                         until=lambda es: len(es) >= 5 and es[-1].get("grpc_status") == 0)[0]
    codes = [e.get("grpc_status") for e in entries]
    assert codes[:4] == [0, 8, 0, 8] and codes[-1] == 0 and set(codes[4:-1]) <= {8}, codes
    assert len(codes) <= 6, codes


def test_limiter_down_is_unavailable_and_unknown_method_unimplemented(sluice, grpc_server,
                                                                      tmp_path):
    g = grpc_server()
    s = proxy(sluice, g.port, tmp_path, routes=LIMITED, on_error="deny")
    with channel(s.port) as ch:
        with pytest.raises(grpc.RpcError) as e:
            stub(ch, "unary_unary", "Unary")(b"x", metadata=[("x-tenant", "a")], timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert e.value.details() == "limiter_unavailable"
        # no route takes another service: UNIMPLEMENTED, from sluice itself
        with pytest.raises(grpc.RpcError) as e:
            ch.unary_unary("/demo.Other/Nope", **RAW)(b"x", timeout=10)
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert server_stats(g)["calls"] == 0


NODE_DIR = os.path.join(HERE, "..", "node")


def node(*args, timeout_s=60):
    """tests/node/grpc_client.js ARGS: its JSON lines."""
    assert os.path.isdir(os.path.join(NODE_DIR, "node_modules", "@grpc", "grpc-js")), \
        "@grpc/grpc-js is missing: run make deps (npm ci in tests/node)"
    p = subprocess.run([shutil.which("node") or "/usr/bin/node", "grpc_client.js", *args],
                       cwd=NODE_DIR, capture_output=True, timeout=timeout_s)
    assert p.returncode == 0, p.stderr.decode()
    return [json.loads(ln) for ln in p.stdout.decode().splitlines() if ln.strip()]


def test_node_grpc_js_client(sluice, redis, grpc_server, tmp_path):
    g = grpc_server()
    s = proxy(sluice, g.port, tmp_path, routes=LIMITED.replace('["header:x-tenant"]',
                                                               '["header:x-node"]'))
    # calls n0, n1, n2: each its own key (x-node), each passes once; the
    # metadata and trailing metadata come back
    out = node("127.0.0.1:%d" % s.port, "unary", "3")
    assert [o["code"] for o in out] == [0, 0, 0], out
    assert [o["initial"] for o in out] == [["n0"], ["n1"], ["n2"]]
    assert all(o["trailing"] == "done" for o in out), out
    # the same keys again at once: RESOURCE_EXHAUSTED with the pushback
    out = node("127.0.0.1:%d" % s.port, "unary", "1")
    assert out[0]["code"] == 8 and out[0]["details"] == "rate_limited", out
    assert 0 < int(out[0]["pushback"]) <= 1000
    # bidirectional with 5 MB messages
    out = node("127.0.0.1:%d" % s.port, "chat", "0", str(BIG))
    assert out == [{"code": 0, "messages": 3, "bytes": 3 * BIG}], out


SHAPED = """\
  - name: calls
    match: { path: /demo.Echo, grpc: true }
    upstream: grpc
    limits:
      - { name: one-at-a-time, algorithm: concurrency, limit: 1, key: ["header:x-tenant"],
          on_missing_key: pass }
      - { name: paced, algorithm: gcra, rate: 2/s, burst: 1, key: ["header:x-pace"], delay: 3s,
          on_missing_key: pass }
"""


LEASED = """\
  - name: calls
    match: { path: /demo.Echo, grpc: true }
    upstream: grpc
    limits:
      - { name: one-stream, algorithm: concurrency, limit: 1, lease: 1s, key: ["header:x-tenant"] }
"""


def test_a_long_stream_renews_its_lease(sluice, redis, grpc_server, tmp_path):
    """A bidirectional call that outlives its 1 s lease three times over
    keeps its slot (sluice renews it every third of the lease): a second
    call of the tenant is refused to the end, and served once it ends."""
    g = grpc_server()
    s = proxy(sluice, g.port, tmp_path, routes=LEASED)
    t = [("x-tenant", "lease-%f" % time.time())]
    sent = threading.Event()

    def slowly():
        for i in range(7):                  # 7 messages 0.5 s apart: about 3.5 s
            yield b"m%d" % i
            if i == 0:
                sent.set()
            time.sleep(0.5)

    with channel(s.port) as ch:
        chat = stub(ch, "stream_stream", "Chat")
        unary = stub(ch, "unary_unary", "Unary")
        got = []
        th = threading.Thread(target=lambda: got.extend(chat(slowly(), metadata=t, timeout=20)))
        th.start()
        assert sent.wait(5)
        refused, t0 = [], time.monotonic()
        while time.monotonic() - t0 < 2.8:  # well past the lease, before the call's end
            with pytest.raises(grpc.RpcError) as e:
                unary(b"x", metadata=t, timeout=5)
            refused.append(e.value.code())
            time.sleep(0.4)
        th.join(20)
        assert got == [b"m%d" % i for i in range(7)]
        assert refused and set(refused) == {grpc.StatusCode.RESOURCE_EXHAUSTED}, refused
        assert unary(b"after", metadata=t, timeout=5) == b"after"


def test_concurrency_counts_a_call_until_it_ends_and_delay_holds_one(sluice, redis, grpc_server,
                                                                    tmp_path):
    g = grpc_server()
    s = proxy(sluice, g.port, tmp_path, routes=SHAPED)
    t = [("x-tenant", "c-%f" % time.time())]
    with channel(s.port) as ch:
        sleep = stub(ch, "unary_unary", "Sleep")
        unary = stub(ch, "unary_unary", "Unary")
        fut = sleep.future(b"1500", metadata=t, timeout=10)
        assert wait_until(lambda: server_stats(g)["calls"], 5, until=lambda n: n >= 1)[0] == 1
        with pytest.raises(grpc.RpcError) as e:     # the slot is taken while it runs
            unary(b"x", metadata=t, timeout=10)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert fut.result() == b"slept"
        assert unary(b"y", metadata=t, timeout=10) == b"y"     # given back at its end
        # delay: the second call of a pair is held about 500 ms, then served
        p = [("x-pace", "p-%f" % time.time())]
        assert unary(b"1", metadata=p, timeout=10) == b"1"
        t0 = time.monotonic()
        assert unary(b"2", metadata=p, timeout=10) == b"2"
        assert 0.3 <= time.monotonic() - t0 < 3
