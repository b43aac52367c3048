#!/usr/bin/python3
# sluice - make_corpus.py: writes the seed corpora under tests/fuzz/corpus/.
#
# The seeds are checked in; this script is how they were made, so a seed can
# be read (and a new one added) as text rather than as a binary file. Run it
# from anywhere: /usr/bin/python3 tests/fuzz/make_corpus.py
import pathlib

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent

def write(target, name, data):
    d = HERE / "corpus" / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)

# http1 targets: 5 header bytes (flags, small max, three split points).
def hdr(flags=0, small=0, cuts=(0x20, 0x80, 0xe0)):
    return bytes([flags, small]) + bytes(cuts)

H = b"Host: a.example\r\n"
REQUESTS = {
    "get": b"GET /api/users?id=1 HTTP/1.1\r\n" + H + b"Accept: */*\r\n\r\n",
    "get10": b"GET / HTTP/1.0\r\n\r\n",
    "keepalive10": b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
    "post_cl": b"POST /api/login HTTP/1.1\r\n" + H + b"Content-Length: 11\r\n\r\nuser=bob&x=",
    "post_cl_pipelined": b"POST /a HTTP/1.1\r\n" + H + b"Content-Length: 3\r\n\r\nabcGET /b HTTP/1.1\r\n" + H + b"\r\n",
    "chunked": b"POST /up HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n",
    "chunked_trailer": b"POST /up HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-Sum: 1\r\n\r\n",
    "chunked_upper_hex": b"PUT /x HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\n\r\nA\r\n0123456789\r\n0\r\n\r\n",
    "chunked_partial": b"POST /x HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\n\r\n10\r\nabc",
    "cl_te": b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "te_cl": b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n1\r\nA\r\n0\r\n\r\n",
    "te_xchunked": b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
    "te_space": b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding:  chunked \r\n\r\n0\r\n\r\n",
    "te_identity": b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
    "te_dup": b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "cl_dup": b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 1\r\nContent-Length: 2\r\n\r\nab",
    "cl_plus": b"POST / HTTP/1.1\r\n" + H + b"Content-Length: +5\r\n\r\nhello",
    "cl_huge": b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 18446744073709551616\r\n\r\n",
    "chunk_overflow": b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFFF\r\n",
    "chunk_nonhex": b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\n\r\n5g\r\nhello\r\n0\r\n\r\n",
    "chunk_highbyte": b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\n\r\n\xff\r\n\r\n",
    "chunk_bare_lf": b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\n\r\n3\nabc\n0\n\n",
    "bare_lf": b"GET / HTTP/1.1\nHost: a\n\n",
    "nul_in_value": b"GET / HTTP/1.1\r\nHost: a\x00b\r\n\r\n",
    "cr_in_name": b"GET / HTTP/1.1\r\nHo\rst: a\r\n\r\n",
    "obs_fold": b"GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\r\n  continued\r\n\r\n",
    "no_host": b"GET / HTTP/1.1\r\n\r\n",
    "two_hosts": b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    "absolute_form": b"GET http://a.example/x HTTP/1.1\r\n" + H + b"\r\n",
    "asterisk": b"OPTIONS * HTTP/1.1\r\n" + H + b"\r\n",
    "connect": b"CONNECT a.example:443 HTTP/1.1\r\n" + H + b"\r\n",
    "bad_method": b"G@T / HTTP/1.1\r\n" + H + b"\r\n",
    "http2_preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "http09": b"GET /\r\n\r\n",
    "upgrade": b"GET /ws HTTP/1.1\r\n" + H + b"Connection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
    "expect": b"PUT /f HTTP/1.1\r\n" + H + b"Expect: 100-continue\r\nContent-Length: 2\r\n\r\nok",
    "leading_crlf": b"\r\n\r\nGET / HTTP/1.1\r\n" + H + b"\r\n",
    "long_line": b"GET /" + b"a" * 3000 + b" HTTP/1.1\r\n" + H + b"\r\n",
}
for name, msg in REQUESTS.items():
    write("http1_request", name, hdr() + msg)
write("http1_request", "small_max_414", hdr(1, 4) + REQUESTS["long_line"])
write("http1_request", "small_max_431", hdr(1, 12) + b"GET / HTTP/1.1\r\n" + H + b"X-Pad: " + b"p" * 120 + b"\r\n\r\n")
write("http1_request", "split_early", hdr(0, 0, (0, 1, 2)) + REQUESTS["chunked"])

RESPONSES = {
    "ok_cl": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
    "ok_chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nWiki\r\n5\r\npedia\r\n0\r\n\r\n",
    "ok_eof": b"HTTP/1.1 200 OK\r\n\r\nall of this until close",
    "ok_eof_10": b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nbody",
    "te_gzip_eof": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nraw",
    "te_chunked_gzip": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\nraw",
    "no_content": b"HTTP/1.1 204 No Content\r\nContent-Length: 10\r\n\r\n",
    "not_modified": b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n",
    "continue_then_ok": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    "early_hints": b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
    "switching": b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n\x81\x05hello",
    "cl_te": b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "cl_dup": b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
    "bad_chunk": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    "chunk_highbyte": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\x80\r\n" + b"x" * 32 + b"\r\n0\r\n\r\n",
    "short_body": b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly a little",
    "garbage": b"SSH-2.0-OpenSSH_9.2\r\n",
    "status_999": b"HTTP/1.1 999 Odd\r\nContent-Length: 0\r\n\r\n",
    "status_099": b"HTTP/1.1 099 Low\r\n\r\n",
    "http2": b"HTTP/2 200\r\n\r\n",
    "bare_lf": b"HTTP/1.1 200 OK\nContent-Length: 1\n\nx",
    "obs_fold": b"HTTP/1.1 200 OK\r\nX-A: 1\r\n 2\r\nContent-Length: 0\r\n\r\n",
    "keepalive_close": b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\nx",
}
for name, msg in RESPONSES.items():
    write("http1_response", name, hdr() + msg)
write("http1_response", "head_with_cl", hdr(2) + RESPONSES["ok_cl"])
write("http1_response", "small_max_431", hdr(1, 8) + b"HTTP/1.1 200 OK\r\nX-Pad: " + b"p" * 100 + b"\r\n\r\n")

# http1_differential: the seeds of both http1 targets, byte 0's bit 2 saying
# which kind (set: a response), plus the known differences' examples.
for name, msg in REQUESTS.items():
    write("http1_differential", "req_" + name, hdr() + msg)
for name, msg in RESPONSES.items():
    write("http1_differential", "res_" + name, hdr(4) + msg)
write("http1_differential", "req_double_space", hdr() + b"GET  / HTTP/1.1\r\n" + H + b"\r\n")
write("http1_differential", "req_trailer_fold", hdr() + REQUESTS["chunked_trailer"][:-2] + b" folded\r\n\r\n")

# conf: the repository's configs as they are.
for f in sorted((ROOT / "tests/unit/data/conf").glob("*.yaml")) + sorted((ROOT / "conf").glob("*.yaml")):
    write("conf", f.parent.name + "_" + f.name, f.read_bytes())
write("conf", "fuzz_env.yaml", b"""listen: ${SLUICE_FUZZ_LISTEN}
workers: auto
redis: { url: "${SLUICE_FUZZ_REDIS_URL}", prefix: "p${SLUICE_FUZZ_EMPTY:-x}:", on_error: deny, timeout: 5ms }
upstreams:
  api: { servers: ["${SLUICE_FUZZ_UPSTREAM}", "[::1]:9001"], keepalive: 0 }
trusted_proxies: [10.0.0.0/8, "fd00::/8", 127.0.0.1]
routes:
  - name: users
    match: { path_regex: "^/users/([0-9]+)/", methods: [GET, POST] }
    upstream: api
    limits:
      - { name: u, algorithm: gcra, rate: 100/10s, burst: 3, key: ["capture:1", "header:X-Api-Key"] }
  - name: all
    match: { path: /, host: "${SLUICE_FUZZ_NEST}" }
    upstream: api
    limits:
      - { name: a, algorithm: sliding_window, limit: "${SLUICE_FUZZ_LIMIT}", window: 1w, key: [ip, method, path, "query:q", "cookie:c"] }
""")

# route_normalize: request targets.
TARGETS = [b"/", b"/api/login", b"/api/%6Cogin", b"/api%2Flogin", b"/api/./login", b"/api/x/../login",
           b"//api///login//", b"/a/b/c/./../../d", b"/..", b"/a/../..", b"/%2e%2e/x", b"/%00",
           b"/a%", b"/a%4", b"/a%zz", b"/%25", b"/%252e%252e", b"/a?b=/../..", b"/a#frag",
           b"http://h/x", b"*", b"/a/.", b"/a/..", b"/.%2e/", b"/\xc3\xa9t\xc3\xa9", b"/%2F%2F",
           b"/a\tb", b"/" + b"x/" * 200, b"/%3F?q", b"/a/b/",
           b"/API/Login;jsessionid=x", b"/api/x/..;/login%3Bx%2Fy", b"/;a;b/%3B/..;"]
for i, t in enumerate(TARGETS):
    write("route_normalize", "t%02d" % i, t)

# route_key: method byte, peer byte (bit 3: HTTP/1.1 with Host; bit 2: IPv6;
# bit 0/1: which address), then the target line and header lines.
KEYS = [
    (0, 8, b"/users/42/posts?user=bob\nX-Api-Key: k1\nCookie: sid=abc; c=2"),
    (1, 8, b"/login?user=a%20b&user=c\nX-Api-Key: a\nX-Api-Key: b\nA: 1\nA: 2"),
    (2, 9, b"/x?q=1&q=2\nX-Forwarded-For: 203.0.113.9, 10.0.0.2"),
    (3, 8, b"/x\nX-Forwarded-For: 10.0.0.1, 10.0.0.2"),
    (4, 12, b"/x\nX-Forwarded-For: [2001:db8::9]:443, 2001:db9::1"),
    (5, 14, b"/x\nX-Forwarded-For: 10.1.1.1\nX-Forwarded-For: garbage, 10.2.2.2"),
    (6, 8, b"/%75sers/7/?user=%\nCookie: sid = spaced ; sid=second"),
    (0, 8, b"/users/" + b"9" * 300 + b"/\nX-Api-Key: " + b"k" * 300),
    (0, 8, b"/p?user=#" + b"a" * 40 + b"\nX-Api-Key: #" + b"0" * 40),
    (0, 0, b"/old-client?user=x\nCookie: sid=1"),
    (1, 8, b"/a/../b/./c?user=+plus+\nCookie: a=1;sid=;b=2"),
    (0, 8, b"/{brace}?user={x}\nX-Api-Key: }{"),
    (0, 8, b"/q?user\nX-Api-Key:"),
    (0, 8, b"/users//\nA: 1"),
    (0, 8, b"/x?%75ser=enc&q=%41"),
    (0, 13, b"/x\nX-Forwarded-For: ::ffff:192.0.2.1"),
    (0, 8, b"/x?user=1:2\nX-Api-Key: 3:4"),
    (2, 8, b"/x?user=a&&&user=b&=&"),
    (0, 8, b"/x\nCookie: sid\nCookie: sid=late"),
    (0, 8, b"/users/%2F/x"),
    (0, 8, b"/x\nX-Forwarded-For: 10.0.0.3:8080, 1.2.3.4:1"),
    (0, 8, b"/x\nX_Api_Key: u1\nx-api_key: u2\na: 1\nCookie: sid=\"%61b\""),
    (0, 8, b"/x?user=1&u%73er=2\nX_API-KEY: k\nCookie: sid=1\nCookie: sid=2"),
]
for i, (m, peer, text) in enumerate(KEYS):
    write("route_key", "k%02d" % i, bytes([m, peer]) + text)

# fwdauth: the prefix byte (0 /decide, 1 /a/b, 2 /x), then a request head.
DESCRIBED = [
    (0, b"GET /decide HTTP/1.1\nHost: s\nX-Forwarded-Method: POST\nX-Forwarded-Uri: /api/a?b=1\n"
        b"X-Forwarded-Host: app.test\nX-Forwarded-Proto: https\nX-Forwarded-For: 192.0.2.1\n\n"),
    (0, b"GET /decide?x HTTP/1.1\nHost: s\nX-Original-URI: /w\nX-Original-Method: DELETE\n\n"),
    (1, b"HEAD /a/b/api/x?y=1 HTTP/1.1\nHost: app\nX-Forwarded-Uri: /other\n\n"),
    (0, b"GET /decide HTTP/1.1\nHost: s\nX-Forwarded-Uri: /a\nX-Original-URI: /b\n\n"),
    (0, b"GET /decide HTTP/1.1\nHost: s\nX-Forwarded-Uri: /a\nX-Forwarded-Method: G T\n\n"),
    (2, b"POST /envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit HTTP/1.1\nHost: s\n\n"),
    (0, b"GET /decider HTTP/1.1\nHost: s\nX-Forwarded-Uri:\n\n"),
]
for i, (prefix, text) in enumerate(DESCRIBED):
    write("fwdauth", "d%02d" % i, bytes([prefix]) + text)

# h1write targets: one option byte (see fuzz_h1write_request.c and
# fuzz_h1write_response.c), then the message.
H1W_REQUESTS = {
    "get": (0, b"GET /a?b=1 HTTP/1.1\r\n" + H + b"X-Forwarded-For: 1.1.1.1\r\nX-Request-Id: r1\r\n\r\n"),
    "get10": (0, b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"),
    "post_cl": (0, b"POST /x HTTP/1.1\r\n" + H + b"Content-Length: 007\r\n\r\nabcdefg"),
    "chunked": (0, b"POST /x HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
    "conn_cl": (0, b"POST /x HTTP/1.1\r\n" + H + b"Connection: keep-alive, Content-Length\r\nContent-Length: 3\r\n\r\nabc"),
    "conn_host": (0, b"GET /x HTTP/1.1\r\n" + H + b"Connection: Host\r\n\r\n"),
    "conn_named": (0, b"GET /x HTTP/1.1\r\n" + H + b"Connection: X-A, x-b\r\nX-A: 1\r\nX-B: 2\r\nX-C: 3\r\n\r\n"),
    "proxy_fields": (1, b"GET /x HTTP/1.1\r\n" + H + b"Forwarded: for=1.2.3.4\r\nX-Real-IP: 1.2.3.4\r\nX-Forwarded-Host: e\r\n\r\n"),
    "underscore_pass": (4, b"GET /x HTTP/1.1\r\n" + H + b"X_Api_Key: a\r\n\r\n"),
    "underscore_reject": (8, b"GET /x HTTP/1.1\r\n" + H + b"X_Api_Key: a\r\n\r\n"),
    "websocket": (2, b"GET /ws HTTP/1.1\r\n" + H + b"Connection: Upgrade\r\nUpgrade: websocket\r\n\r\n"),
    "h2c": (0, b"GET / HTTP/1.1\r\n" + H + b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAA\r\n\r\n"),
}
for name, (flags, msg) in H1W_REQUESTS.items():
    write("h1write_request", name, bytes([flags]) + msg)

H1W_RESPONSES = {
    "ok_cl": (0, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
    "ok_cl_zeros": (0, b"HTTP/1.1 200 OK\r\nContent-Length: 002\r\n\r\nok"),
    "chunked": (0, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
    "chunked_client10": (2, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
    "eof": (0, b"HTTP/1.0 200 OK\r\n\r\nbody"),
    "stray_crlf": (0, b"\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
    "continue_crlf": (0, b"HTTP/1.1 100 Continue\r\n\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
    "processing": (0, b"HTTP/1.1 102 Processing\r\n\r\n" * 3 + b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"),
    "not_modified": (0, b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\nETag: \"x\"\r\n\r\n"),
    "head_cl": (1, b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n"),
    "conn_cl": (0, b"HTTP/1.1 200 OK\r\nConnection: content-length\r\nContent-Length: 5\r\n\r\nhello"),
    "conn_named": (4, b"HTTP/1.1 200 OK\r\nConnection: X-A\r\nX-A: 1\r\nX-Request-Id: up\r\nContent-Length: 0\r\n\r\n"),
    "limits": (0, b"HTTP/1.1 200 OK\r\nX-RateLimit-Limit: 5\r\nRateLimit: x\r\nContent-Length: 0\r\n\r\n"),
    "switch": (0, b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"),
    "no_reason": (0, b"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n"),
}
for name, (flags, msg) in H1W_RESPONSES.items():
    write("h1write_response", name, bytes([flags]) + msg)

# redis_reply: 4 header bytes (piece size, which of 8 commands expect
# integers, their capacity, SUBSCRIBE after them), then the server's bytes.
def resp_bulk(s):
    return b"$%d\r\n%s\r\n" % (len(s), s)

def resp_arr(*items):
    return b"*%d\r\n" % len(items) + b"".join(items)

def ints(*v):
    return resp_arr(*[b":%d\r\n" % x for x in v])

SWITCH = resp_arr(resp_bulk(b"message"), resp_bulk(b"+switch-master"),
                  resp_bulk(b"mymaster 10.0.0.1 6379 10.0.0.2 6380"))
REDIS_REPLIES = {
    "ok": (0, 0, 0, 0, b"+OK\r\n" * 8),
    "ok_bytewise": (1, 0, 0, 0, b"+OK\r\n" * 8),
    "ints": (0, 0xff, 4, 0, ints(1, 0, 3) * 8),
    "ints_pieces": (3, 0x55, 4, 0, (ints(1, -2, 9223372036854775807, -9223372036854775808)
                                   + b":7\r\n") * 4),
    "ints_over_cap": (0, 0xff, 2, 0, ints(1, 2, 3) + ints() + resp_arr() * 6),
    "ints_not_ints": (0, 0xff, 8, 0, resp_arr(b":1\r\n", resp_bulk(b"x")) + resp_arr(ints(1))
                      + resp_arr(b"$-1\r\n") + b"-ERR x\r\n" + b"*-1\r\n" + b":5\r\n"
                      + b"+OK\r\n" + ints(1)),
    "mixed": (0, 0x0f, 3, 0, ints(1, 2) + b"-NOSCRIPT No matching script\r\n" + b"$-1\r\n"
              + b"*-1\r\n" + resp_bulk(b"hello") + b"$0\r\n\r\n" + b":42\r\n"
              + resp_arr(resp_arr(resp_arr(b":1\r\n")), resp_bulk(b"y"))),
    "too_deep": (0, 0, 0, 0, b"+OK\r\n" + b"*1\r\n" * 5 + b":1\r\n"),
    "too_wide": (0, 0, 0, 0, b"*65537\r\n" + b":1\r\n" * 4),
    "too_many": (0, 0, 0, 0, b"*4\r\n" + b"*65536\r\n" * 4),
    "string_huge": (0, 0, 0, 0, b"$16777217\r\nabc"),
    "protocol_error": (0, 0, 0, 0, b"+OK\r\n!garbage\r\n"),
    "unasked": (0, 0, 0, 0, b"+OK\r\n" * 9),
    "subscribe": (0, 0x01, 2, 1, ints(1) + b"+OK\r\n" * 7
                  + resp_arr(resp_bulk(b"subscribe"), resp_bulk(b"chan"), b":1\r\n") + SWITCH
                  + resp_arr(resp_bulk(b"message"), resp_bulk(b"+switch-master"),
                             resp_bulk(b"mymaster 10.0.0.1 6379 10.0.0.2 99999999999"))),
    "switch_pieces": (5, 0, 0, 1, b"+OK\r\n" * 8 + SWITCH * 3),
}
for name, (piece, mask, cap, sub, stream) in REDIS_REPLIES.items():
    write("redis_reply", name, bytes([piece, mask, cap, sub]) + stream)

# admin_api: 2 header bytes (method: 0 GET, 1 HEAD, 2 PUT, 3 DELETE, 4 POST,
# 5 another; bit 0 of the second: the right token), the target, header
# lines, an empty line and the body. Routes and limits are the harness's.
def api(method, auth, target, body=b"", headers=b""):
    return bytes([method, auth]) + target + b"\n" + headers + b"\n" + body

ADMIN_API = {
    "get_state": api(0, 0, b"/api/limits/r/fw?key=k"),
    "head_state": api(1, 0, b"/api/limits/g/tb?key=10.0.0.1"),
    "get_two_parts": api(0, 0, b"/api/limits/r/two?key=10.0.0.1&key=a%2Bb+c"),
    "get_vip": api(0, 0, b"/api/limits/r/fw?key=vip"),
    "put_limit": api(2, 1, b"/api/limits/r/fw/override?key=k", b'{"limit": 50, "ttl": "10m"}'),
    "put_rate": api(2, 1, b"/api/limits/g/gc/override?key=s1", b'{"rate": "100/s", "burst": 5}'),
    "put_bad_json": api(2, 1, b"/api/limits/r/fw/override?key=k", b'{"limit": "x\\"y",}'),
    "put_no_token": api(2, 0, b"/api/limits/r/fw/override?key=k", b'{"limit": 50}'),
    "put_wrong_token": api(2, 0, b"/api/limits/r/fw/override?key=k", b'{"limit": 50}',
                           b"Authorization: Bearer nope\n"),
    "delete": api(3, 1, b"/api/limits/r/fw/override?key=k"),
    "reset": api(4, 1, b"/api/limits/r/two/reset?key=10.0.0.1&key=q"),
    "bad_escape": api(0, 0, b"/api/limits/r/fw?key=%zz"),
    "unknown_route": api(0, 0, b"/api/limits/nope/fw?key=k"),
    "unknown_param": api(0, 0, b"/api/limits/r/fw?k=1"),
    "too_many_parts": api(0, 0, b"/api/limits/r/fw?key=a&key=b&key=c"),
    "long_part": api(0, 0, b"/api/limits/r/fw?key=" + b"x" * 600),
    "prefix_only": api(0, 0, b"/api/limits"),
    "deep_path": api(0, 0, b"/api/limits/r/fw/override/x/y?key=k"),
    "method_other": api(5, 1, b"/api/limits/r/fw/override?key=k"),
    "absolute_target": api(0, 0, b"http://a/api/limits/r/fw?key=k"),
}
for name, data in ADMIN_API.items():
    write("admin_api", name, data)

# h2srv: byte 0 is the HTTP/1.1 response's length in 8-byte units (0: the
# harness's fixed 103 + chunked 200 with trailers), then that response, then
# what a client sends after the preface (python3-h2's frames).
def h2_client(steps):
    import h2.config
    import h2.connection
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    c.initiate_connection()
    out = c.data_to_send()[24:]         # the harness sends the preface itself
    for step in steps:
        step(c)
        out += c.data_to_send()
    return out

def get(path, end=True):
    return lambda c: c.send_headers(c.get_next_available_stream_id(),
                                    [(":method", "GET"), (":scheme", "http"),
                                     (":authority", "a.example"), (":path", path),
                                     ("cookie", "a=1"), ("cookie", "b=2")], end_stream=end)

def post(path, body, length=True):
    def run(c):
        sid = c.get_next_available_stream_id()
        hdrs = [(":method", "POST"), (":scheme", "http"), (":authority", "a"), (":path", path)]
        if length:
            hdrs.append(("content-length", str(len(body))))
        c.send_headers(sid, hdrs)
        c.send_data(sid, body, end_stream=True)
    return run

def resp(text):
    pad = text + b" " * (-len(text) % 8)     # whole 8-byte units; trailing spaces end it
    return bytes([len(pad) // 8]) + pad

R200 = resp(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc")
H2SRV = {
    "get": b"\0" + h2_client([get("/a")]),
    "get_cl": R200 + h2_client([get("/a"), get("/b")]),
    "post_cl": b"\0" + h2_client([post("/up", b"hello world")]),
    "post_chunked": R200 + h2_client([post("/up", b"x" * 300, length=False)]),
    "reset": b"\0" + h2_client([get("/a", end=False), lambda c: c.reset_stream(1)]),
    "ping_settings": b"\0" + h2_client([lambda c: c.ping(b"12345678"),
                                        lambda c: c.update_settings({0x4: 0})]),
    "no_body_204": resp(b"HTTP/1.1 204 No Content\r\n\r\n") + h2_client([get("/n")]),
    "bad_response": resp(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n") +
                    h2_client([get("/x")]),
}
for name, data in H2SRV.items():
    write("h2srv", name, data)
