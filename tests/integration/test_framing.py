# sluice - tests/integration/test_framing.py: framing and rewriting (issue 9,
# items 1, 2, 10 and 11).
#
# Request smuggling through `Connection: Content-Length` (and Transfer-Encoding,
# Host) in both directions, hostile upstream response heads that used to abort
# the process (a stray CRLF before the status line), interim responses without
# end, and the fields sluice rewrites on the way up (underscores, Forwarded and
# friends from untrusted peers, Upgrade: h2c) and down (101, 204, 304). Each
# hostile upstream is a raw-socket server in this process (proxylib.LoopbackServer)
# that records every request head it read and answers with scripted bytes.

import time

import pytest

from conftest import Conn, make_conf
from loadlib import client_conf, proc_cpu_s
from proxylib import LoopbackServer

ROUTES = """\
  - name: all
    match: { path: / }
    upstream: api
"""

UPGRADE_ROUTES = """\
  - name: ws
    match: { path: /ws }
    upstream: api
    upgrade: true
  - name: multi
    match: { path: /multi }
    upstream: api
    upgrade: [websocket, foo]
  - name: all
    match: { path: / }
    upstream: api
"""


class ScriptedUpstream(LoopbackServer):
    """Reads each request head (and a Content-Length body), records the head
    bytes and the body (self.heads, self.bodies), then sends what
    self.script(head) returns: bytes, or a list of bytes and float pauses (s).
    A script may return None to close the connection."""

    def __init__(self, script):
        self.script = script
        self.heads = []
        self.bodies = []
        super().__init__()

    def _serve(self, s):
        buf = b""
        try:
            for _ in range(100):
                while b"\r\n\r\n" not in buf:
                    data = s.recv(65536)
                    if not data:
                        return
                    buf += data
                    if len(buf) > 1 << 20:
                        return
                head, buf = buf.split(b"\r\n\r\n", 1)
                n = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        n = int(value.strip())
                while len(buf) < n:
                    data = s.recv(65536)
                    if not data:
                        return
                    buf += data
                body, buf = buf[:n], buf[n:]
                with self.lock:
                    self.heads.append(head + b"\r\n\r\n")
                    self.bodies.append(body)
                plan = self.script(head)
                if plan is None:
                    return
                for step in (plan if isinstance(plan, list) else [plan]):
                    if isinstance(step, float):
                        time.sleep(step)
                    else:
                        s.sendall(step)
        except OSError:
            return
        finally:
            s.close()

    def seen(self):
        with self.lock:
            return list(self.heads)


def fields(head):
    """[(lower-case name, value)] of a raw head."""
    out = []
    for line in head.split(b"\r\n")[1:]:
        if not line:
            continue
        n, _, v = line.decode("latin-1").partition(":")
        out.append((n.strip().lower(), v.strip()))
    return out


def read_raw_head(c):
    """The next raw response head on Conn c, interim ones included."""
    return c._until(b"\r\n\r\n") + b"\r\n\r\n"


def alive_and_serving(proxy):
    assert proxy.proc.poll() is None, "sluice exited %r" % proxy.proc.returncode


@pytest.fixture(scope="module")
def hostile():
    """One scripted upstream for the module; each test sets its script."""
    up = ScriptedUpstream(None)
    yield up
    up.stop()


@pytest.fixture
def scripted(sluice, redis, hostile):
    """Factory: scripted(script, routes=, conf=, **make_conf kw) -> (upstream,
    sluice): the module's upstream, its script set and its records cleared."""

    def make(script, routes=ROUTES, conf=None, **kw):
        with hostile.lock:
            hostile.script = script
            hostile.heads, hostile.bodies = [], []
        proxy = sluice(conf or make_conf(routes, **kw), upstream_port=hostile.port)
        return hostile, proxy

    return make


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def ok(head):
    return OK


# ------------------------------------------- item 1: request direction ----

SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"


def test_connection_content_length_does_not_smuggle(sluice, redis, upstream):
    """The body is a whole GET; dropping Content-Length because Connection
    names it made the upstream read that body as a second request."""
    proxy = sluice(make_conf(ROUTES))
    before = upstream.stats()
    req = (b"POST /front HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Content-Length\r\n"
           b"Content-Length: %d\r\n\r\n" % len(SMUGGLED)) + SMUGGLED
    with Conn(proxy.port) as c:
        c.send(req)
        r = c.read_response()
        closed = c.is_closed()
    time.sleep(0.1)
    after = upstream.stats()
    assert "/smuggled" not in after["targets"], "the body ran as a request upstream"
    assert after["heads"] == before["heads"]
    assert r.status == 400, r
    assert closed


@pytest.mark.parametrize("conn", [b"Transfer-Encoding", b"close, transfer-encoding",
                                  b"Host", b"keep-alive,HOST", b"content-length"])
def test_connection_naming_framing_or_host_is_400(scripted, conn):
    up, proxy = scripted(ok)
    body = b"0\r\n\r\n"
    req = (b"POST /x HTTP/1.1\r\nHost: x\r\nConnection: " + conn +
           b"\r\nTransfer-Encoding: chunked\r\n\r\n" + body)
    with Conn(proxy.port) as c:
        c.send(req)
        r = c.read_response()
        assert r.status == 400, (conn, r)
        assert c.is_closed()
    assert up.seen() == []


def test_request_framing_written_from_the_parse(scripted):
    """Content-Length goes up as the number sluice read, not as sent."""
    up, proxy = scripted(ok)
    with Conn(proxy.port) as c:
        c.send(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 005\r\n"
               b"Connection: X-Drop\r\nX-Drop: 1\r\nX-Keep: 2\r\n\r\nhello")
        assert c.read_response().status == 200
        c.send(b"POST /y HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        assert c.read_response().status == 200
    h1, h2 = [dict(fields(h)) for h in up.seen()]
    assert h1["content-length"] == "5"
    assert "x-drop" not in h1 and h1["x-keep"] == "2"
    assert h2["content-length"] == "0"
    assert up.bodies == [b"hello", b""]


def test_connection_with_thousands_of_tokens_is_linear(scripted):
    """90 fields and a Connection of 6000 tokens: the rewrite reads the
    tokens once, not once per field."""
    up, proxy = scripted(ok, max_header_bytes=65536)
    tokens = ",".join("t%d" % i for i in range(6000))
    extra = "".join("X-F%d: v\r\n" % i for i in range(90))
    req = ("GET /x HTTP/1.1\r\nHost: x\r\nConnection: %s\r\n%s\r\n" % (tokens, extra)).encode()
    n = 100
    cpu0 = proc_cpu_s(proxy.proc.pid)
    t0 = time.monotonic()
    with Conn(proxy.port, timeout_s=20) as c:
        for _ in range(n):
            c.send(req)
            assert c.read_response().status == 200
    cpu = proc_cpu_s(proxy.proc.pid) - cpu0
    print("connection tokens: %d requests, sluice CPU %.3f s, wall %.3f s"
          % (n, cpu, time.monotonic() - t0))
    assert len(up.seen()) == n
    assert cpu < 0.5, "sluice spent %.2f s of CPU on %d requests" % (cpu, n)


# ------------------------- sluice's own parser: stricter than http_parser ----

@pytest.mark.parametrize("line", [b"GET  /x HTTP/1.1", b"GET /x  HTTP/1.1",
                                  b"GET /x HXYZ/1.1", b"GET /x Http/1.1"],
                         ids=["two-sp-before-target", "two-sp-before-version",
                              "other-name", "lower-case-name"])
def test_request_line_is_strict(scripted, line):
    """RFC 9112 3: one SP between the parts and HTTP-name "HTTP"; http_parser
    skipped runs of SP and checked only the name's first letter, so two
    readers could split such a line differently."""
    up, proxy = scripted(ok)
    with Conn(proxy.port) as c:
        c.send(line + b"\r\nHost: x\r\n\r\n")
        r = c.read_response()
        assert r.status == 400, (line, r)
        assert c.is_closed()
    assert up.seen() == []


@pytest.mark.parametrize("trailer", [b"Content-Length: 5", b"Transfer-Encoding: chunked",
                                     b"X-A: 1\r\n folded", b"X A: 1"],
                         ids=["content-length", "transfer-encoding", "obs-fold", "space-in-name"])
def test_request_trailer_is_a_field_line_without_framing(scripted, trailer):
    """RFC 9112 7.1.2 and RFC 9110 6.5.1: a trailer line is a field line and
    names no framing field; http_parser took all four."""
    up, proxy = scripted(ok)
    req = (b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"5\r\nhello\r\n0\r\n" + trailer + b"\r\n\r\n")
    with Conn(proxy.port) as c:
        c.send(req)
        r = c.read_response()
        assert r.status == 400, (trailer, r)
        assert c.is_closed()
    assert up.seen() == []


# ------------------------------------------ item 1: response direction ----

@pytest.mark.parametrize("resp", [
    b"HTTP/1.1 200 OK\r\nConnection: Content-Length\r\nContent-Length: 5\r\n\r\nhello",
    b"HTTP/1.1 200 OK\r\nConnection: keep-alive, transfer-encoding\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
], ids=["content-length", "transfer-encoding"])
def test_upstream_connection_naming_framing_is_502(scripted, resp):
    up, proxy = scripted(lambda head: resp)
    with Conn(proxy.port, timeout_s=3) as c:
        c.send(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
        r = c.read_response()
        assert r.status == 502, r
    alive_and_serving(proxy)


def test_response_framing_written_from_the_parse(scripted):
    up, proxy = scripted(lambda head: b"HTTP/1.1 200 OK\r\nContent-Length: 005\r\n"
                                      b"Connection: X-Up\r\nX-Up: 1\r\n\r\nhello")
    with Conn(proxy.port, timeout_s=3) as c:
        c.send(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
        r = c.read_response()
    assert r.status == 200 and r.body == b"hello"
    assert r.header_all("Content-Length") == ["5"]
    assert r.header("X-Up") is None


@pytest.mark.parametrize("status", [204, 304])
def test_no_body_status_carries_no_framing(scripted, status):
    resp = (b"HTTP/1.1 %d X\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n" % status)
    up, proxy = scripted(lambda head: resp.replace(b"Transfer-Encoding: chunked\r\n", b"")
                         if status == 204 else resp.replace(b"Content-Length: 0\r\n", b""))
    with Conn(proxy.port, timeout_s=3) as c:
        for _ in range(2):      # the connection stays usable: nothing left over
            c.send(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
            head = read_raw_head(c)
            assert head.startswith(b"HTTP/1.1 %d" % status), head
            names = [n for n, _ in fields(head)]
            assert "content-length" not in names and "transfer-encoding" not in names, head


def test_head_response_keeps_its_length(scripted):
    up, proxy = scripted(lambda head: b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n")
    with Conn(proxy.port, timeout_s=3) as c:
        c.send(b"HEAD /x HTTP/1.1\r\nHost: x\r\n\r\n")
        r = c.read_response(head_request=True)
    assert r.status == 200 and r.header_all("Content-Length") == ["1234"]


# ----------------------------------- item 2: hostile response heads ----

@pytest.mark.parametrize("resp", [
    b"\r\n" + OK,
    b"\r\n\r\n\r\n" + OK,
    b"HTTP/1.1 100 Continue\r\n\r\n\r\n" + OK,
    b"HTTP/1.1 100 Continue\r\n\r\n" + OK,
], ids=["crlf", "three-crlf", "100-crlf", "100"])
def test_stray_crlf_before_status_line_does_not_abort(scripted, resp):
    """These aborted the process (exit 134); a leading empty line is
    tolerated now, as RFC 9112 2.2 lets a server skip one before a request."""
    up, proxy = scripted(lambda head: resp)
    for _ in range(2):
        with Conn(proxy.port, timeout_s=3) as c:
            c.send(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
            try:
                r = c.read_response()
            except (EOFError, ConnectionResetError):
                time.sleep(0.2)
                pytest.fail("no answer; sluice exit status %r" % proxy.proc.poll())
        assert r.status == 200 and r.body == b"ok", r
        alive_and_serving(proxy)


@pytest.mark.parametrize("resp", [
    b"\r\nXTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nConnection: content-length\r\nContent-Length: 2\r\n\r\nok",
    b"ICY 200 OK\r\n\r\n",
    b"HTTP/1.1 20 OK\r\nContent-Length: 2\r\n\r\nok",
], ids=["bad-after-crlf", "conn-cl", "icy", "short-code"])
def test_malformed_status_line_is_502_and_process_lives(scripted, resp):
    up, proxy = scripted(lambda head: resp)
    with Conn(proxy.port, timeout_s=3) as c:
        c.send(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
        r = c.read_response()
    assert r.status == 502, r
    alive_and_serving(proxy)


def test_status_line_without_reason_is_relayed(scripted):
    up, proxy = scripted(lambda head: b"HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok")
    with Conn(proxy.port, timeout_s=3) as c:
        c.send(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
        head = read_raw_head(c)
    assert head.startswith(b"HTTP/1.1 200\r\n"), head


def test_thousand_interim_responses_end_at_the_upstream_timeout(scripted):
    """1000 x 102 Processing, one every 5 ms (5 s): each resets a per-read
    timeout, so the whole exchange used to take as long as the upstream
    liked. The timeout (500 ms) now counts across interim responses."""
    steps = []
    for _ in range(1000):
        steps += [b"HTTP/1.1 102 Processing\r\n\r\n", 0.005]
    up, proxy = scripted(lambda head: steps + [OK], upstream_timeout="500ms")
    t0 = time.monotonic()
    with Conn(proxy.port, timeout_s=10) as c:
        c.send(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
        r = c.read_response()
    took = time.monotonic() - t0
    print("1000 x 102: status %d after %.3f s" % (r.status, took))
    assert r.status in (502, 504), r
    assert 0.4 < took < 2.0, took
    alive_and_serving(proxy)


def test_interim_responses_relayed_at_most_ten(scripted):
    # A body streamed to the upstream (buffering off): the upstream's own
    # 100s are what the client sees. (A body read whole first gets sluice's
    # own 100 Continue, and the upstream's are not relayed at all.)
    conf = make_conf(ROUTES).replace("client:\n", "client:\n  buffer_body_bytes: 0\n", 1)
    up, proxy = scripted(lambda head: [b"HTTP/1.1 100 Continue\r\n\r\n"] * 20 + [OK], conf=conf)
    with Conn(proxy.port, timeout_s=3) as c:
        c.send(b"POST /x HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
               b"Content-Length: 2\r\n\r\nhi")
        relayed = 0
        for _ in range(30):
            head = read_raw_head(c)
            if head.startswith(b"HTTP/1.1 100"):
                relayed += 1
                continue
            break
    assert head.startswith(b"HTTP/1.1 200"), head
    assert relayed == 10, relayed


# --------------------------------------- item 11: 101 and Upgrade ----

WS_REQ = (b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
          b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
SWITCH = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"


def test_switching_protocols_carries_request_id(scripted):
    up, proxy = scripted(lambda head: SWITCH + b"hello", routes=UPGRADE_ROUTES)
    with Conn(proxy.port, timeout_s=3) as c:
        c.send(WS_REQ)
        head = read_raw_head(c)
        assert head.startswith(b"HTTP/1.1 101"), head
        f = dict(fields(head))
        assert len(f.get("x-request-id", "")) == 32, head
        assert f["upgrade"] == "websocket" and f["connection"] == "upgrade"
        while len(c.buf) < 5:
            c._fill()
        assert c.buf == b"hello"
    sent = dict(fields(up.seen()[0]))
    assert sent["x-request-id"] == f["x-request-id"]


def test_h2c_upgrade_goes_up_as_a_plain_request(scripted):
    up, proxy = scripted(ok, routes=UPGRADE_ROUTES)
    with Conn(proxy.port, timeout_s=3) as c:
        c.send(b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
               b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n")
        r = c.read_response()
        assert r.status == 200
        # the connection is still HTTP: a second request is answered
        c.send(b"GET /ws/2 HTTP/1.1\r\nHost: x\r\n\r\n")
        assert c.read_response().status == 200
    names = [n for n, _ in fields(up.seen()[0])]
    assert "upgrade" not in names and "http2-settings" not in names
    assert "connection" not in names


def test_unasked_h2c_switch_is_502(scripted):
    h2c = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n"
    up, proxy = scripted(lambda head: h2c, routes=UPGRADE_ROUTES)
    with Conn(proxy.port, timeout_s=3) as c:
        c.send(WS_REQ)
        assert c.read_response().status == 502


def test_upgrade_list_tunnels_named_protocols_only(scripted):
    def script(head):
        if b"Upgrade: foo" in head:
            return b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: foo\r\nConnection: Upgrade\r\n\r\nhi"
        return ok(head)
    up, proxy = scripted(script, routes=UPGRADE_ROUTES)
    with Conn(proxy.port, timeout_s=3) as c:
        c.send(b"GET /multi HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: foo\r\n\r\n")
        head = read_raw_head(c)
        assert head.startswith(b"HTTP/1.1 101"), head
    with Conn(proxy.port, timeout_s=3) as c:   # not on the list: plain request
        c.send(b"GET /multi HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: bar\r\n\r\n")
        assert c.read_response().status == 200
    assert dict(fields(up.seen()[0])).get("upgrade") == "foo"
    assert "upgrade" not in dict(fields(up.seen()[1]))


# ----------------------------------- item 10: fields on the way up ----

def test_underscore_fields_dropped_by_default(scripted):
    up, proxy = scripted(ok)
    with Conn(proxy.port, timeout_s=3) as c:
        c.send(b"GET /x HTTP/1.1\r\nHost: x\r\nX_Api_Key: evil\r\nX-Api-Key: good\r\n"
               b"X_Forwarded_For: 1.2.3.4\r\n\r\n")
        assert c.read_response().status == 200
    f = fields(up.seen()[0])
    names = [n for n, _ in f]
    assert "x_api_key" not in names and "x_forwarded_for" not in names
    assert dict(f)["x-api-key"] == "good"


@pytest.mark.parametrize("mode,status,forwarded", [("pass", 200, True), ("reject", 400, False),
                                                   ("drop", 200, False)])
def test_underscore_headers_modes(scripted, mode, status, forwarded):
    up, proxy = scripted(ok, conf=client_conf(ROUTES, client={"underscore_headers": mode}))
    with Conn(proxy.port, timeout_s=3) as c:
        c.send(b"GET /x HTTP/1.1\r\nHost: x\r\nX_Api_Key: k\r\n\r\n")
        assert c.read_response().status == status
    heads = up.seen()
    if status == 400:
        assert heads == []
    else:
        assert ("x_api_key" in [n for n, _ in fields(heads[0])]) == forwarded


PROXY_FIELDS = (b"Forwarded: for=6.6.6.6;host=evil\r\nX-Real-IP: 6.6.6.6\r\n"
                b"X-Forwarded-Host: evil.example\r\nX-Forwarded-Port: 1\r\n")


@pytest.mark.parametrize("trusted", [False, True])
def test_proxy_fields_only_from_trusted_peers(scripted, trusted):
    up, proxy = scripted(ok, trusted=["127.0.0.1/32"] if trusted else None)
    with Conn(proxy.port, timeout_s=3) as c:
        c.send(b"GET /x HTTP/1.1\r\nHost: x\r\n" + PROXY_FIELDS + b"\r\n")
        assert c.read_response().status == 200
    names = set(n for n, _ in fields(up.seen()[0]))
    want = {"forwarded", "x-real-ip", "x-forwarded-host", "x-forwarded-port"}
    if trusted:
        assert want <= names
    else:
        assert not (want & names), names
