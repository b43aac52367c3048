# sluice - tests/integration/test_io_layer.py: the connection I/O layer
# (src/io.c), plain and TLS, at both ends (issue 12).
#
# What the rest of the suite does not look at: how bytes reach sluice's
# buffers. A TLS client sending its request one byte per record; many
# pipelined requests in records that arrive in one TCP segment (all taken
# by one socket read: OpenSSL holds the rest, and no readiness event will
# come for it); 5 MB up and down through TLS at both ends past a reader
# that stalls (backpressure both ways, with records left in OpenSSL while
# reading is stopped); an upstream ending mid-response with close_notify or
# with a bare TCP close; a client's close_notify right after its request; a
# TLS upstream connection reused from the pool, and one whose server sent
# bytes after the response (never reused). The TLS upstream is a small
# Python ssl server run by the test, with a certificate from
# tls_listen_lib's CA.

import hashlib
import re
import socket
import ssl
import threading
import time

import pytest

from conftest import build_request
from conftest import free_port, wait_port
from tls_listen_lib import tls_listen_conf
from tlslib import CA

ROUTES = """\
  - name: secure
    match: { path: /sec }
    upstream: secure
  - name: api
    match: { path: / }
    upstream: api
    limits:
      - { name: per-ip, algorithm: token_bucket, rate: 100000/s, burst: 100000, key: [ip] }
"""

BIG = 5 * 1024 * 1024


def pattern(n):
    """n bytes that differ by position (a lost or doubled piece shows)."""
    block = b"".join(b"%07d\n" % i for i in range(8192))     # 64 KiB
    out = block * (n // len(block) + 1)
    return out[:n]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    ca = CA(tmp_path_factory.mktemp("iopki"))
    ca.ec = ca.leaf("ec", "ec", ["api.test", "localhost"])
    return ca


class TLSUpstream:
    """An HTTP/1.1 server over TLS on a thread per connection. Each
    response says which connection served it (X-Conn). Paths:
    /sec/ka          200 "ok"
    /sec/big?n=N     N bytes of pattern(); self.sent counts what went out
    /sec/up          reads the body (after a 0.5 s pause), answers its
                     length and sha256
    /sec/cut?m=M     Content-Length 100000, 1000 bytes, then ends: M=notify
                     with close_notify, M=dirty with a bare TCP close
    /sec/junk        a response and, in the same record, bytes after it"""

    def __init__(self, cert, key):
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(cert, key)
        self.ctx.set_alpn_protocols(["http/1.1"])
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(64)
        self.port = self.lsock.getsockname()[1]
        self.nconn = 0
        self.sent = 0
        self.done = threading.Event()
        self.conns = []
        self.stopping = False
        self.thread = threading.Thread(target=self.accept_loop, daemon=True)
        self.thread.start()

    def accept_loop(self):
        while not self.stopping:
            try:
                s, _ = self.lsock.accept()
            except OSError:
                return
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
            self.nconn += 1
            self.conns.append(s)
            threading.Thread(target=self.serve, args=(s, self.nconn), daemon=True).start()

    def stop(self):
        self.stopping = True
        self.lsock.close()
        for s in self.conns:
            try:
                s.close()
            except OSError:
                pass

    def serve(self, raw, cid):
        raw.settimeout(10)
        try:
            t = self.ctx.wrap_socket(raw, server_side=True)
        except (OSError, ssl.SSLError):
            return
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    d = t.recv(65536)
                    if not d:
                        return
                    buf += d
                head, buf = buf.split(b"\r\n\r\n", 1)
                line = head.split(b"\r\n", 1)[0].decode()
                path = line.split(" ")[1]
                m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
                clen = int(m.group(1)) if m else 0
                if not self.respond(t, raw, cid, path, clen, buf):
                    return
                buf = b"" if clen else buf
        except (OSError, ssl.SSLError):
            return

    def respond(self, t, raw, cid, path, clen, buf):
        def head(n, extra=""):
            return ("HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-Conn: %d\r\n%s\r\n"
                    % (n, cid, extra)).encode()
        if path.startswith("/sec/big"):
            n = int(path.split("n=")[1])
            self.sent = 0
            t.sendall(head(n))
            body = pattern(n)
            for i in range(0, n, 16384):
                t.sendall(body[i:i + 16384])
                self.sent += len(body[i:i + 16384])
            self.done.set()
            return True
        if path.startswith("/sec/up"):
            time.sleep(0.5)             # sluice must hold the client back
            h = hashlib.sha256()
            got = len(buf)
            h.update(buf)
            while got < clen:
                d = t.recv(min(65536, clen - got))
                if not d:
                    return False
                h.update(d)
                got += len(d)
            body = ("%d %s" % (got, h.hexdigest())).encode()
            t.sendall(head(len(body)) + body)
            return True
        if path.startswith("/sec/cut"):
            t.sendall(head(100000)[:-2] + b"\r\n" + b"x" * 1000)
            time.sleep(0.1)
            if "m=notify" in path:
                t.unwrap()
                raw.close()
            else:
                raw.shutdown(socket.SHUT_RDWR)
                raw.close()
            return False
        if path.startswith("/sec/junk"):
            t.sendall(head(2) + b"okHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\njunk!")
            return True
        t.sendall(head(2) + b"ok")
        return True


@pytest.fixture
def tls_up(pki):
    u = TLSUpstream(*pki.ec)
    yield u
    u.stop()


def start_both(sluice, pki, tls_up):
    """A plain and a TLS listener; /sec goes to tls_up over TLS, verified
    against the test CA by its IP address."""
    tls_port = free_port()
    text = tls_listen_conf(ROUTES, [pki.ec], tls_port)
    text = text.replace("upstreams:\n", "upstreams:\n  secure:\n    servers: [127.0.0.1:%d]\n"
                        "    keepalive: 8\n    connect_timeout: 2s\n    timeout: 5s\n"
                        "    tls: { ca_file: %s }\n" % (tls_up.port, pki.root), 1)
    s = sluice(text)
    s.tls_port = tls_port
    assert wait_port(tls_port, s.proc), s.stderr
    return s


def client_ctx(pki):
    ctx = ssl.create_default_context(cafile=pki.root)
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def tls_connect(pki, port, rcvbuf=None, timeout_s=10):
    raw = socket.socket()
    if rcvbuf:
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    raw.settimeout(timeout_s)
    raw.connect(("127.0.0.1", port))
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return client_ctx(pki).wrap_socket(raw, server_hostname="api.test")


def read_response(sock, buf=b"", limit_s=10):
    """(status, headers dict, body, rest) of one Content-Length response."""
    end = time.time() + limit_s
    while b"\r\n\r\n" not in buf:
        assert time.time() < end, "no response head"
        d = sock.recv(65536)
        assert d, "closed before a head: %r" % buf
        buf += d
    head, buf = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    hdrs = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    n = int(hdrs.get("content-length", "0"))
    while len(buf) < n:
        assert time.time() < end, "body not whole"
        d = sock.recv(65536)
        assert d, "closed inside a body"
        buf += d
    return status, hdrs, buf[:n], buf[n:]


class MemTLS:
    """A TLS client over MemoryBIO: every record it makes is ours to send
    when we choose, so several records can go out in one TCP segment."""

    def __init__(self, pki, port):
        self.raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.inc, self.out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.obj = client_ctx(pki).wrap_bio(self.inc, self.out, server_hostname="api.test")
        end = time.time() + 10
        while True:
            try:
                self.obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                self.push()
                assert time.time() < end
                d = self.raw.recv(65536)
                assert d, "closed in the handshake"
                self.inc.write(d)
        self.push()

    def push(self):
        d = self.out.read()
        if d:
            self.raw.sendall(d)

    def records(self, pieces):
        """Each piece in a record of its own, all sent with one send()."""
        for p in pieces:
            self.obj.write(p)
        self.push()

    def recv(self, n=65536):
        while True:
            try:
                return self.obj.read(n)
            except ssl.SSLWantReadError:
                d = self.raw.recv(65536)
                if not d:
                    return b""
                self.inc.write(d)
            except ssl.SSLZeroReturnError:
                return b""

    def close_notify(self):
        try:
            self.obj.unwrap()
        except ssl.SSLWantReadError:
            pass
        self.push()


# ---------------------------------------------------------------- reads ----

def test_request_in_one_byte_records(sluice, pki, tls_up):
    s = start_both(sluice, pki, tls_up)
    t = tls_connect(pki, s.tls_port)
    req = build_request("GET", "/x", host="api.test")
    for i in range(len(req)):
        t.send(req[i:i + 1])        # one TLS record per byte
    status, _, _, _ = read_response(t)
    assert status == 200
    # and again on the same connection, to the TLS upstream
    req = build_request("GET", "/sec/ka", host="api.test")
    for i in range(len(req)):
        t.send(req[i:i + 1])
    status, hdrs, body, _ = read_response(t)
    assert (status, body) == (200, b"ok"), s.stderr
    t.close()


def test_pipelined_records_in_one_segment(sluice, pki, tls_up):
    # 40 requests, one record each, sent with one send(): one socket read
    # takes them all, and the rest waits in OpenSSL, not in the socket.
    s = start_both(sluice, pki, tls_up)
    c = MemTLS(pki, s.tls_port)
    n = 40
    c.records([build_request("GET", "/x%d" % i, host="api.test") for i in range(n)])
    buf, got = b"", 0
    end = time.time() + 10
    while got < n:
        assert time.time() < end, "only %d of %d answered" % (got, n)
        if b"\r\n\r\n" in buf:
            status, _, _, buf = read_response(_Feed(c), buf)
            assert status == 200
            got += 1
            continue
        d = c.recv()
        assert d, "closed after %d answers" % got
        buf += d
    # and many small requests in one record, to the TLS upstream
    c.records([b"".join(build_request("GET", "/sec/ka", host="api.test") for _ in range(10))])
    for _ in range(10):
        status, _, body, buf = read_response(_Feed(c), buf)
        assert (status, body) == (200, b"ok")


class _Feed:
    """read_response's recv over a MemTLS."""

    def __init__(self, c):
        self.c = c

    def recv(self, n):
        return self.c.recv(n)


# ------------------------------------------------------ big bodies, slow ----

def test_download_through_tls_both_ends_slow_reader(sluice, pki, tls_up):
    # 16 MB from the TLS upstream to a TLS client that reads nothing for
    # 1.5 s: sluice stops reading the upstream (the upstream cannot finish
    # sending), then everything arrives, in order.
    s = start_both(sluice, pki, tls_up)
    n = 16 * 1024 * 1024
    t = tls_connect(pki, s.tls_port, rcvbuf=65536, timeout_s=20)
    t.sendall(build_request("GET", "/sec/big?n=%d" % n, host="api.test"))
    time.sleep(1.5)
    assert not tls_up.done.is_set() and tls_up.sent < n - 2 * 1024 * 1024, tls_up.sent
    h = hashlib.sha256()
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += t.recv(65536)
    head, body = buf.split(b"\r\n\r\n", 1)
    assert b" 200 " in head.split(b"\r\n")[0]
    got = len(body)
    h.update(body)
    slow_until = time.time() + 0.5
    while got < n:
        d = t.recv(4096 if time.time() < slow_until else 262144)
        assert d, "cut after %d bytes" % got
        h.update(d)
        got += len(d)
    assert got == n
    assert h.hexdigest() == hashlib.sha256(pattern(n)).hexdigest()
    # the connection is still good
    t.sendall(build_request("GET", "/sec/ka", host="api.test"))
    assert read_response(t)[2] == b"ok"


def test_upload_through_tls_both_ends(sluice, pki, tls_up):
    s = start_both(sluice, pki, tls_up)
    body = pattern(BIG)
    t = tls_connect(pki, s.tls_port, timeout_s=20)
    t.sendall(build_request("POST", "/sec/up", host="api.test", body=body))
    status, _, resp, _ = read_response(t, limit_s=20)
    assert status == 200, s.stderr
    assert resp.decode() == "%d %s" % (BIG, hashlib.sha256(body).hexdigest())


# ------------------------------------------------------------- closing ----

@pytest.mark.parametrize("mode", ["notify", "dirty"])
def test_upstream_ends_mid_response(sluice, pki, tls_up, mode):
    # The upstream stops 1000 bytes into a 100000-byte body, with or
    # without close_notify: the client gets what came and a close at once
    # (not after the 5 s upstream timeout), and sluice goes on serving.
    s = start_both(sluice, pki, tls_up)
    t = tls_connect(pki, s.tls_port)
    t0 = time.time()
    t.sendall(build_request("GET", "/sec/cut?m=" + mode, host="api.test"))
    buf = b""
    while True:
        d = t.recv(65536)
        if not d:
            break
        buf += d
    assert time.time() - t0 < 3, "the cut took the upstream timeout"
    head, body = buf.split(b"\r\n\r\n", 1)
    assert b" 200 " in head.split(b"\r\n")[0]
    assert len(body) == 1000
    t = tls_connect(pki, s.tls_port)
    t.sendall(build_request("GET", "/sec/ka", host="api.test"))
    assert read_response(t)[2] == b"ok", s.stderr


def test_client_close_notify_after_request(sluice, pki, tls_up):
    # A request and the client's close_notify in one segment: the request
    # is still answered (as a plain client's half-close is), then closed.
    s = start_both(sluice, pki, tls_up)
    for path in ("/x", "/sec/ka"):
        c = MemTLS(pki, s.tls_port)
        c.obj.write(build_request("GET", path, host="api.test"))
        c.close_notify()
        buf = b""
        end = time.time() + 5
        while time.time() < end:
            d = c.recv()
            if not d:
                break
            buf += d
        assert buf.startswith(b"HTTP/1.1 200 "), (path, buf[:200], s.stderr)


def test_client_cut_mid_download(sluice, pki, tls_up):
    # A TLS client that vanishes (bare TCP close) in a big response: the
    # upstream connection is dropped, other clients go on.
    s = start_both(sluice, pki, tls_up)
    t = tls_connect(pki, s.tls_port, rcvbuf=65536)
    t.sendall(build_request("GET", "/sec/big?n=%d" % BIG, host="api.test"))
    t.recv(65536)
    t.close()                       # Python sends no close_notify here
    time.sleep(0.2)
    t = tls_connect(pki, s.tls_port)
    t.sendall(build_request("GET", "/sec/ka", host="api.test"))
    assert read_response(t)[2] == b"ok", s.stderr


# ---------------------------------------------------------------- pool ----

def test_tls_upstream_connection_reused(sluice, pki, tls_up):
    s = start_both(sluice, pki, tls_up)
    conns = set()
    for _ in range(3):              # three client connections, two requests each
        t = tls_connect(pki, s.tls_port)
        for _ in range(2):
            t.sendall(build_request("GET", "/sec/ka", host="api.test"))
            status, hdrs, body, _ = read_response(t)
            assert (status, body) == (200, b"ok")
            conns.add(hdrs["x-conn"])
        t.close()
    assert len(conns) == 1, conns


def test_tls_upstream_bytes_after_response_not_reused(sluice, pki, tls_up):
    # The server sent more than the response, in the same record: that
    # connection must not carry the next request (whose answer would be
    # the stray bytes).
    s = start_both(sluice, pki, tls_up)
    t = tls_connect(pki, s.tls_port)
    t.sendall(build_request("GET", "/sec/junk", host="api.test"))
    status, hdrs, body, _ = read_response(t)
    assert (status, body) == (200, b"ok")
    first = hdrs["x-conn"]
    time.sleep(0.1)
    for _ in range(3):
        t.sendall(build_request("GET", "/sec/ka", host="api.test"))
        status, hdrs, body, _ = read_response(t)
        assert (status, body) == (200, b"ok"), (body, s.stderr)
        assert hdrs["x-conn"] != first


# ---------------------------------------------------------- read marks ----

@pytest.mark.parametrize("tls", [False, True])
def test_pipelined_past_the_read_mark(sluice, pki, tls_up, tls):
    # 400 pipelined requests (about 150 KB) in one go: more than a client's
    # input may hold (max_header_bytes + 64 KiB), so reading stops at the
    # mark and must resume as the requests are answered.
    s = start_both(sluice, pki, tls_up)
    n = 400
    pad = "a" * 300
    reqs = b"".join(build_request("GET", "/x%d?%s" % (i, pad), host="api.test")
                    for i in range(n))
    # Read while sending, as a client must (sluice holds what it cannot
    # answer yet, and no more): records are made first, then one thread
    # sends their bytes while this one reads.
    if tls:
        c = MemTLS(pki, s.tls_port)
        c.obj.write(reqs)
        data, sock, rd = c.out.read(), c.raw, _Feed(c)
    else:
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
        data, rd = reqs, sock
    sender = threading.Thread(target=sock.sendall, args=(data,), daemon=True)
    sender.start()
    buf, got = b"", 0
    while got < n:
        status, _, _, buf = read_response(rd, buf)
        assert status == 200, (got, s.stderr)
        got += 1
    sender.join(5)
    sock.close()
