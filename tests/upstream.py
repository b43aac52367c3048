#!/usr/bin/python3
# sluice - tests/upstream.py: the echo upstream the integration tests run against.
#
# A real HTTP/1.1 server on raw sockets and threads (not http.server), so it
# reports exactly what it received (headers in order, raw target, body hash)
# and can misbehave on demand by target path. GET /__stats (answered, never
# counted) tells a test how many requests reached it. Logs nothing.
#
#   /usr/bin/python3 tests/upstream.py --port P    (--port 0: first stdout line
#   is the chosen port)

import argparse
import hashlib
import json
import os
import signal
import socket
import sys
import threading
import time

MAX_HEAD_BYTES = 256 * 1024
MAX_BODY_BYTES = 512 * 1024 * 1024
READ_TIMEOUT_S = 120

# The body of /chunked-response, one element per chunk; tests import it.
CHUNKED_PARTS = [b"first chunk\n", b"x" * 5000 + b"\n", b"\n", b"last chunk\n"]


def big_body(n):
    """The n-byte body of /big/N: a repeating byte pattern tests can rebuild."""
    pattern = bytes(range(256))
    reps = n // 256 + 1
    return (pattern * reps)[:n]


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.conns = 0          # connections accepted (numbering)
        self.heads = 0          # request heads parsed (stats requests excluded)
        self.requests = 0       # requests whose body was read in full
        self.bad = 0            # requests the upstream could not parse
        self.targets = []       # last targets seen, for debugging

    def next_conn(self):
        with self.lock:
            self.conns += 1
            return self.conns

    def snapshot(self):
        with self.lock:
            return {"conns": self.conns, "heads": self.heads,
                    "requests": self.requests, "bad": self.bad,
                    "targets": list(self.targets[-50:])}


STATS = Stats()
SERVER_PORT = [0]       # set once listening; reported so tests can tell servers apart


class BadRequest(Exception):
    pass


class Reader:
    """Buffered reads from a socket; b'' from recv means the peer closed."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""

    def fill(self):
        data = self.sock.recv(65536)
        if not data:
            raise EOFError()
        self.buf += data

    def read_until(self, delim, limit):
        while True:
            i = self.buf.find(delim)
            if i >= 0:
                out = self.buf[:i + len(delim)]
                self.buf = self.buf[i + len(delim):]
                return out
            if len(self.buf) > limit:
                raise BadRequest("line too long")
            self.fill()

    def read_exact(self, n, sink):
        while n > 0:
            if not self.buf:
                self.fill()
            take = self.buf[:n]
            self.buf = self.buf[len(take):]
            sink(take)
            n -= len(take)


def parse_head(raw):
    lines = raw[:-4].split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise BadRequest("request line")
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise BadRequest("header line")
        headers.append((name.decode("latin-1"),
                        value.strip(b" \t").decode("latin-1")))
    return (parts[0].decode("latin-1"), parts[1].decode("latin-1"),
            parts[2].decode("latin-1"), headers)


def header_values(headers, name):
    return [v for n, v in headers if n.lower() == name]


def read_body(reader, headers, hasher):
    """Read the request body; returns (length, chunked)."""
    te = ",".join(header_values(headers, "transfer-encoding")).lower()
    codings = [c.strip() for c in te.split(",") if c.strip()]
    if codings:
        if codings[-1] != "chunked":
            raise BadRequest("transfer-encoding")
        total = 0
        while True:
            line = reader.read_until(b"\r\n", 4096)
            size_txt = line[:-2].split(b";")[0].strip()
            try:
                size = int(size_txt, 16)
            except ValueError:
                raise BadRequest("chunk size")
            if size == 0:
                break
            total += size
            if total > MAX_BODY_BYTES:
                raise BadRequest("body too large")
            reader.read_exact(size, hasher.update)
            if reader.read_until(b"\r\n", 2) != b"\r\n":
                raise BadRequest("chunk end")
        while reader.read_until(b"\r\n", 8192) != b"\r\n":
            pass    # trailers
        return total, True
    cls = header_values(headers, "content-length")
    if not cls:
        return 0, False
    if len(set(cls)) != 1 or not cls[0].isdigit():
        raise BadRequest("content-length")
    n = int(cls[0])
    if n > MAX_BODY_BYTES:
        raise BadRequest("body too large")
    reader.read_exact(n, hasher.update)
    return n, False


def send_response(sock, status, headers, body, head_request):
    reason = {200: "OK", 404: "Not Found"}.get(status, "Status")
    out = ["HTTP/1.1 %d %s\r\n" % (status, reason)]
    for n, v in headers:
        out.append("%s: %s\r\n" % (n, v))
    out.append("\r\n")
    data = "".join(out).encode("latin-1")
    if not head_request and status not in (204, 304):
        data += body
    sock.sendall(data)


def path_of(target):
    return target.split("?", 1)[0]


def misbehave(sock, path):
    """The behaviours that end the connection. True when one ran."""
    if path == "/garbage":
        sock.sendall(b"THIS IS NOT HTTP AT ALL\r\n\x00\x01\x02\r\n\r\n")
    elif path == "/close-mid-body":
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n0123456789")
    elif path == "/bad-chunk":
        sock.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"zz\r\nhello\r\n0\r\n\r\n")
    elif path == "/no-length":
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                     b"Connection: close\r\n\r\n" + big_body(3000))
    else:
        return False
    return True


def answer(sock, conn_no, req, body_len, body_sha1, chunked):
    method, target, version, headers = req
    path = path_of(target)
    head_request = method == "HEAD"
    echo = {"method": method, "target": target, "version": version,
            "headers": [[n, v] for n, v in headers], "body_len": body_len,
            "body_sha1": body_sha1, "chunked": chunked, "conn": conn_no,
            "seq": req_seq(sock), "server_port": SERVER_PORT[0],
            "arrived": ARRIVED.t}    # wall time the head was read (smoothing tests)
    status = 200
    extra = []
    body = json.dumps(echo).encode()
    if path.startswith("/status/"):
        try:
            status = int(path[len("/status/"):])
        except ValueError:
            status = 400
        if not 200 <= status <= 599:
            status = 400
    elif path.startswith("/slow/"):
        try:
            ms = min(int(path[len("/slow/"):]), 60000)
        except ValueError:
            ms = 0
        time.sleep(ms / 1000.0)
    elif path.startswith("/big/"):
        try:
            n = min(int(path[len("/big/"):]), MAX_BODY_BYTES)
        except ValueError:
            n = 0
        body = big_body(n)
        extra.append(("X-Body-Sha1", hashlib.sha1(body).hexdigest()))
    elif path == "/chunked-response":
        head = ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
                "X-Upstream-Conn: %d\r\n\r\n" % conn_no).encode()
        sock.sendall(head)
        if head_request:
            return True
        for part in CHUNKED_PARTS:
            sock.sendall(b"%x\r\n%s\r\n" % (len(part), part))
            time.sleep(0.01)
        sock.sendall(b"0\r\n\r\n")
        return True
    elif path == "/headers":
        extra += [("X-Custom", "1"), ("Connection", "close")]
        send_response(sock, 200, [("Content-Type", "application/json"),
                                  ("Content-Length", str(len(body))),
                                  ("X-Upstream-Conn", str(conn_no))] + extra,
                      body, head_request)
        return False
    headers_out = [("Content-Type", "application/json" if not path.startswith("/big/")
                    else "application/octet-stream"),
                   ("Content-Length", str(len(body))),
                   ("X-Upstream-Conn", str(conn_no))] + extra
    send_response(sock, status, headers_out, body, head_request)
    return True


_seq = threading.local()
ARRIVED = threading.local()     # .t: when this thread read the current head


def req_seq(sock):
    return _seq.n


def wants_close(version, headers):
    conn = ",".join(header_values(headers, "connection")).lower()
    tokens = [t.strip() for t in conn.split(",")]
    if version == "HTTP/1.0":
        return "keep-alive" not in tokens
    return "close" in tokens


def serve_stats(sock):
    body = json.dumps(STATS.snapshot()).encode()
    send_response(sock, 200, [("Content-Type", "application/json"),
                              ("Content-Length", str(len(body)))], body, False)


def handle(sock, conn_no):
    reader = Reader(sock)
    _seq.n = 0
    try:
        while True:
            raw = reader.read_until(b"\r\n\r\n", MAX_HEAD_BYTES)
            req = parse_head(raw)
            method, target, version, headers = req
            if target == "/__stats":
                serve_stats(sock)
                continue
            _seq.n += 1
            ARRIVED.t = time.time()
            with STATS.lock:
                STATS.heads += 1
                STATS.targets.append(target)
            if any(v.lower() == "100-continue" for v in header_values(headers, "expect")):
                sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            hasher = hashlib.sha1()
            body_len, chunked = read_body(reader, headers, hasher)
            with STATS.lock:
                STATS.requests += 1
            if misbehave(sock, path_of(target)):
                return
            if not answer(sock, conn_no, req, body_len, hasher.hexdigest(), chunked):
                return
            if wants_close(version, headers):
                return
    except BadRequest:
        with STATS.lock:
            STATS.bad += 1
        try:
            sock.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n"
                         b"Connection: close\r\n\r\n")
        except OSError:
            pass
    except (EOFError, OSError):
        pass
    finally:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()


def main():
    ap = argparse.ArgumentParser(description="sluice test echo upstream")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    args = ap.parse_args()

    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    signal.signal(signal.SIGINT, lambda *_: os._exit(0))

    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((args.host, args.port))
    ls.listen(512)
    SERVER_PORT[0] = ls.getsockname()[1]
    print(SERVER_PORT[0], flush=True)

    while True:
        try:
            sock, _ = ls.accept()
        except OSError:
            continue
        sock.settimeout(READ_TIMEOUT_S)
        t = threading.Thread(target=handle, args=(sock, STATS.next_conn()), daemon=True)
        t.start()


if __name__ == "__main__":
    sys.exit(main())
