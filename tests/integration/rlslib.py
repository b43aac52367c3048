# sluice - tests/integration/rlslib.py: Envoy's RLS v3 call for the tests,
# with a protobuf encoder and decoder of its own (field numbers as published
# in envoyproxy/data-plane-api, written here independently of sluice's
# .proto), over HTTP/1.1 to the decision listener (a chunked body with a
# grpc-status trailer, or a bodyless 200 with grpc-status) and over HTTP/2
# with Debian's python3-grpcio.

import struct

from conftest import Conn, build_request, free_port

RLS_PATH = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
OK, OVER_LIMIT = 1, 2
SECOND, MINUTE, HOUR, DAY, MONTH, YEAR, WEEK = 1, 2, 3, 4, 5, 6, 7


# ------------------------------------------------------------- protobuf ----

def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def field_varint(num, v):
    return varint(num << 3) + varint(v)


def field_bytes(num, data):
    if isinstance(data, str):
        data = data.encode()
    return varint(num << 3 | 2) + varint(len(data)) + data


def descriptor(entries, limit=None, hits=None):
    """RateLimitDescriptor{entries=1{key=1,value=2}, limit=2{rpu=1,unit=2},
    hits_addend=3 (UInt64Value{value=1})}."""
    out = b""
    for k, v in entries:
        out += field_bytes(1, field_bytes(1, k) + (field_bytes(2, v) if v else b""))
    if limit is not None:
        out += field_bytes(2, field_varint(1, limit[0]) + field_varint(2, limit[1]))
    if hits is not None:
        out += field_bytes(3, field_varint(1, hits) if hits else b"")
    return out


def request(domain, descriptors, hits_addend=0):
    """RateLimitRequest{domain=1, descriptors=2, hits_addend=3}; descriptors
    are descriptor() bytes or lists of (key, value)."""
    out = field_bytes(1, domain)
    for d in descriptors:
        out += field_bytes(2, d if isinstance(d, bytes) else descriptor(d))
    if hits_addend:
        out += field_varint(3, hits_addend)
    return out


def frame(msg):
    return b"\0" + struct.pack(">I", len(msg)) + msg


def parse(data):
    """Protobuf bytes -> {field number: [values]} (varints as ints,
    length-delimited as bytes)."""
    out, i = {}, 0
    while i < len(data):
        key, i = _read_varint(data, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _read_varint(data, i)
        elif wt == 2:
            n, i = _read_varint(data, i)
            v, i = data[i:i + n], i + n
            assert len(v) == n, "truncated field"
        elif wt == 1:
            v, i = data[i:i + 8], i + 8
        elif wt == 5:
            v, i = data[i:i + 4], i + 4
        else:
            raise AssertionError("wire type %d" % wt)
        out.setdefault(num, []).append(v)
    return out


def _read_varint(data, i):
    n = shift = 0
    while True:
        b = data[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def response(msg):
    """RateLimitResponse -> dict: overall, statuses [{code, limit: {rpu,
    unit, name} or None, remaining, reset_s or None}], headers {name: value}
    (response_headers_to_add), request_headers (request_headers_to_add)."""
    f = parse(msg)
    statuses = []
    for s in f.get(2, []):
        sf = parse(s)
        st = {"code": sf.get(1, [0])[0], "remaining": sf.get(3, [0])[0],
              "limit": None, "reset_s": None}
        if 2 in sf:
            lf = parse(sf[2][0])
            st["limit"] = {"rpu": lf.get(1, [0])[0], "unit": lf.get(2, [0])[0],
                           "name": lf.get(3, [b""])[0].decode()}
        if 4 in sf:
            df = parse(sf[4][0])
            st["reset_s"] = df.get(1, [0])[0] + df.get(2, [0])[0] / 1e9
        statuses.append(st)
    headers, request_headers = {}, {}
    for num, into in ((3, headers), (4, request_headers)):
        for h in f.get(num, []):
            hf = parse(h)
            into[hf.get(1, [b""])[0].decode()] = hf.get(2, [b""])[0].decode()
    return {"overall": f.get(1, [0])[0], "statuses": statuses, "headers": headers,
            "request_headers": request_headers}


# ------------------------------------------------------- HTTP/1.1 call ----

class Answer:
    def __init__(self, status, headers, body, trailers):
        self.status = status
        self.headers = headers
        self.body = body
        self.trailers = trailers

    @property
    def grpc_status(self):
        v = self.trailers.get("grpc-status", self.headers.get("grpc-status"))
        return int(v) if v is not None else None

    def message(self):
        assert self.grpc_status == 0, (self.headers, self.trailers)
        assert self.body[:1] == b"\0" and struct.unpack(">I", self.body[1:5])[0] == len(self.body) - 5
        return response(self.body[5:])


def read_answer(conn):
    head = conn._until(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0].startswith(b"HTTP/1.1 "), lines[0]     # no stray bytes before it
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        n, _, v = line.decode("latin-1").partition(":")
        headers[n.strip().lower()] = v.strip()
    body, trailers = b"", {}
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size = int(conn._until(b"\r\n").split(b";")[0], 16)
            if size == 0:
                break
            body += conn._exact(size)
            assert conn._exact(2) == b"\r\n"
        while True:
            line = conn._until(b"\r\n")
            if not line:
                break
            n, _, v = line.decode("latin-1").partition(":")
            trailers[n.strip().lower()] = v.strip()
    elif "content-length" in headers:
        body = conn._exact(int(headers["content-length"]))
    return Answer(status, headers, body, trailers)


def call_h1(port, body, conn=None, content_type="application/grpc", path=RLS_PATH):
    """One call over HTTP/1.1: body is the framed message (frame())."""
    own = conn is None
    conn = conn or Conn(port, timeout_s=10.0)
    try:
        conn.send(build_request("POST", path, [("Content-Type", content_type),
                                               ("TE", "trailers")], body))
        return read_answer(conn)
    finally:
        if own:
            conn.close()


def should(port, domain, descriptors, hits_addend=0, conn=None):
    """ShouldRateLimit over HTTP/1.1 -> response() dict."""
    return call_h1(port, frame(request(domain, descriptors, hits_addend)), conn).message()


# ------------------------------------------------------------ the config ----

ROUTES = """\
  - name: unused
    match: { path: /unused }
    upstream: api
"""


def rls_top(config_path, listen_port, extra=""):
    """The decision section of a config serving RLS from config_path."""
    return ("decision:\n  listen: 127.0.0.1:%d\n  ratelimit_config: %s\n%s"
            % (listen_port, config_path, extra))


def start_rls(sluice, tmp_path, rls_yaml, extra="", on_error="allow", redis_port=None,
              top_extra="", token=None):
    """sluice with a decision listener reading rls_yaml (tmp_path/rls.yaml),
    more top-level YAML in top_extra, admin.token when token (apilib's
    api() then writes); returns (sluice, port)."""
    from proxylib import start_proxy
    path = tmp_path / "rls.yaml"
    path.write_text(rls_yaml)
    port = free_port()
    if token:
        from apilib import start_api
        s = start_api(sluice, ROUTES, token=token, top=top_extra + rls_top(path, port, extra),
                      redis_port=redis_port)
    else:
        s = start_proxy(sluice, ROUTES, top=top_extra + rls_top(path, port, extra),
                        on_error=on_error, redis_port=redis_port, admin=True,
                        wait_redis=redis_port is None)
    from conftest import wait_port
    assert wait_port(port, s.proc), s.stderr
    return s, port
