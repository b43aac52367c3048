# sluice - test_http2.py: HTTP/2 from clients, with real clients.
#
# curl over TLS (ALPN h2) and with prior knowledge on a plain listener,
# nghttp with 100 streams on one connection against a limit of 20, h2load,
# httpx with http2=True, request and response bodies both ways (with a
# length and chunked), the access log's protocol, a listener with http2:
# false, and what a stream's head may not carry (:authority and another
# Host, CONNECT, a header list past client.max_header_bytes), answered on
# the stream with the connection kept.

import hashlib
import json
import os
import signal
import subprocess
import time

import pytest

from conftest import free_port, read_log, wait_port
from h2lib import H2Conn
from proxylib import metrics, mval, start_proxy, top_keys, wait_metric
from tls_listen_lib import start_tls, tls_listen_conf
from tlslib import CA

CURL = "/usr/bin/curl"
NGHTTP = "/usr/bin/nghttp"
H2LOAD = "/usr/bin/h2load"

ROUTES = """\
  - name: twenty
    match: { path: /twenty }
    upstream: api
    limits:
      - { name: twenty, algorithm: fixed_window, limit: 20, window: 1h, key: ["header:X-K"] }
  - name: one
    match: { path: /one }
    upstream: api
    limits:
      - { name: one, algorithm: fixed_window, limit: 1, window: 1h, key: ["header:X-K"] }
  - name: open
    match: { path: / }
    upstream: api
"""


def run(args, timeout_s=60):
    return subprocess.run(args, capture_output=True, timeout=timeout_s)


def curl(args, timeout_s=30):
    """curl -s with -w appending the version and status: (version, status, body)."""
    p = run([CURL, "-s", "-S", "-o", "-", "-w", "\n%{http_version} %{http_code}", *args],
            timeout_s)
    body, _, tail = p.stdout.rpartition(b"\n")
    version, status = tail.decode().split()
    return version, int(status), body


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    ca = CA(tmp_path_factory.mktemp("pki"))
    ca.ec = ca.leaf("ec", "ec", ["api.test", "localhost"])
    return ca


def test_prior_knowledge_curl_access_log_metrics(sluice, tmp_path):
    log = tmp_path / "access.log"
    s = start_proxy(sluice, ROUTES, top=top_keys(access_log=str(log)))
    version, status, body = curl(["--http2-prior-knowledge", "http://127.0.0.1:%d/a?b=1" % s.port])
    assert (version, status) == ("2", 200)
    echo = json.loads(body)
    assert echo["target"] == "/a?b=1" and echo["version"] == "HTTP/1.1"
    names = dict((n.lower(), v) for n, v in echo["headers"])
    assert names["host"] == "127.0.0.1:%d" % s.port
    assert names["x-forwarded-proto"] == "http"
    # HTTP/1.1 on the same port still works, and is logged without protocol
    version, status, _ = curl(["--http1.1", "http://127.0.0.1:%d/c" % s.port])
    assert (version, status) == ("1.1", 200)
    lines = read_log(log, 2)
    by_path = {e["path"]: e for e in lines}
    assert by_path["/a?b=1"]["protocol"] == "HTTP/2.0"
    assert by_path["/a?b=1"]["method"] == "GET" and by_path["/a?b=1"]["status"] == 200
    assert "protocol" not in by_path["/c"]
    ms = metrics(s.admin_port)
    assert mval(ms, "sluice_client_requests_total", protocol="HTTP/2") == 1
    assert mval(ms, "sluice_client_requests_total", protocol="HTTP/1") == 1


def test_tls_alpn_h2_curl(sluice, pki):
    s = start_tls(sluice, ROUTES, [pki.ec])
    url = "https://api.test:%d/tls" % s.tls_port
    resolve = "api.test:%d:127.0.0.1" % s.tls_port
    version, status, body = curl(["--http2", "--cacert", pki.root, "--resolve", resolve, url])
    assert (version, status) == ("2", 200)
    names = dict((n.lower(), v) for n, v in json.loads(body)["headers"])
    assert names["x-forwarded-proto"] == "https"
    assert names["host"] == "api.test:%d" % s.tls_port
    version, status, _ = curl(["--http1.1", "--cacert", pki.root, "--resolve", resolve, url])
    assert (version, status) == ("1.1", 200)
    # an h2-only client (nghttp speaks nothing else) is served
    p = run([NGHTTP, "-n", "-s", url.replace("api.test", "127.0.0.1")])
    assert p.returncode == 0, p.stderr
    assert b" 200 " in p.stdout


def test_http2_off_per_listener(sluice, pki):
    tls_port = free_port()
    text = tls_listen_conf(ROUTES, [pki.ec], tls_port)
    text = text.replace("  - 127.0.0.1:@LISTEN_PORT@\n",
                        "  - { address: 127.0.0.1:@LISTEN_PORT@, http2: false }\n")
    text = text.replace("  - address: 127.0.0.1:%d\n" % tls_port,
                        "  - address: 127.0.0.1:%d\n    http2: false\n" % tls_port)
    s = sluice(text)
    assert wait_port(tls_port, s.proc), s.stderr
    p = run([CURL, "-s", "-o", "/dev/null", "-w", "%{http_version} %{http_code}",
             "--http2-prior-knowledge", "http://127.0.0.1:%d/x" % s.port])
    assert p.stdout.decode() != "2 200"
    resolve = "api.test:%d:127.0.0.1" % tls_port
    version, status, _ = curl(["--http2", "--cacert", pki.root, "--resolve", resolve,
                               "https://api.test:%d/x" % tls_port])
    assert (version, status) == ("1.1", 200)


def test_nghttp_100_streams_against_20(sluice, upstream):
    s = start_proxy(sluice, ROUTES)
    before = upstream.stats()["requests"]
    p = run([NGHTTP, "-n", "-v", "-m", "100", "-H", "x-k: nghttp-%d" % os.getpid(),
             "http://127.0.0.1:%d/twenty" % s.port])
    assert p.returncode == 0, p.stderr
    out = p.stdout.decode()
    statuses = [ln.split(":status: ")[1].strip() for ln in out.splitlines()
                if ":status: " in ln and "recv" in ln]
    assert len(statuses) == 100
    assert statuses.count("200") == 20 and statuses.count("429") == 80
    assert "recv GOAWAY" not in out         # one connection, kept open throughout
    assert upstream.stats()["requests"] - before == 20


def test_h2load(sluice):
    s = start_proxy(sluice, ROUTES)
    p = run([H2LOAD, "-n", "400", "-c", "2", "-m", "10", "http://127.0.0.1:%d/load" % s.port],
            timeout_s=120)
    assert p.returncode == 0, p.stderr
    assert b"400 succeeded, 0 failed, 0 errored" in p.stdout, p.stdout
    assert b"status codes: 400 2xx" in p.stdout, p.stdout


def test_httpx_http2(sluice):
    import httpx
    s = start_proxy(sluice, ROUTES)
    with httpx.Client(http1=False, http2=True, timeout=10) as c:
        for i in range(5):
            r = c.get("http://127.0.0.1:%d/x%d" % (s.port, i))
            assert r.http_version == "HTTP/2" and r.status_code == 200
            assert r.json()["target"] == "/x%d" % i
        r = c.post("http://127.0.0.1:%d/post" % s.port, content=b"q" * 70000)
        assert r.status_code == 200
        assert r.json()["body_sha1"] == hashlib.sha1(b"q" * 70000).hexdigest()


def test_bodies_both_ways(sluice, tmp_path):
    s = start_proxy(sluice, ROUTES)
    blob = os.urandom(300000)
    f = tmp_path / "blob"
    f.write_bytes(blob)
    base = "http://127.0.0.1:%d" % s.port
    # with a length: passed as is
    v, st, body = curl(["--http2-prior-knowledge", "--data-binary", "@%s" % f, base + "/up"])
    echo = json.loads(body)
    assert (v, st) == ("2", 200)
    assert echo["body_len"] == len(blob) and not echo["chunked"]
    assert echo["body_sha1"] == hashlib.sha1(blob).hexdigest()
    # no length: chunked to the upstream
    v, st, body = curl(["--http2-prior-knowledge", "-H", "Transfer-Encoding: chunked",
                        "-T", str(f), base + "/up2"])
    echo = json.loads(body)
    assert echo["chunked"] and echo["body_len"] == len(blob)
    assert echo["body_sha1"] == hashlib.sha1(blob).hexdigest()
    # a large response, and a chunked one, as DATA
    p = run([CURL, "-s", "--http2-prior-knowledge", "-D", "-", base + "/big/2000000"])
    head, _, data = p.stdout.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/2 200")
    sha = [ln.split(b": ")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"x-body-sha1")]
    assert len(data) == 2000000 and hashlib.sha1(data).hexdigest().encode() == sha[0]
    v, st, body = curl(["--http2-prior-knowledge", base + "/chunked-response"])
    from upstream import CHUNKED_PARTS
    assert (v, st) == ("2", 200) and body == b"".join(CHUNKED_PARTS)
    # HEAD, and 204: no DATA
    c = H2Conn(s.port)
    sid = c.request("/status/204")
    st, _, data, rst = c.response(sid)
    assert (st, data, rst) == (204, b"", None)
    sid = c.request("/big/1000", method="HEAD")
    st, head, data, rst = c.response(sid)
    assert (st, data, rst) == (200, b"", None) and head.get("content-length") == "1000"
    c.close()


def test_stream_answers_keep_the_connection(sluice, tmp_path):
    log = str(tmp_path / "access.log")
    s = start_proxy(sluice, ROUTES, max_header_bytes=4096, top="access_log: %s\n" % log)
    c = H2Conn(s.port)
    # :authority and a different Host: 400 (nginx too); the same: fine
    sid = c.request("/a", authority="a.example", headers=[("host", "b.example")])
    assert c.response(sid)[0] == 400
    sid = c.request("/a", authority="a.example", headers=[("host", "a.example")])
    assert c.response(sid)[0] == 200
    # CONNECT: 501 on its stream
    sid = c.conn.get_next_available_stream_id()
    c.conn.send_headers(sid, [(":method", "CONNECT"), (":authority", "example.com:443")])
    c.flush()
    assert c.response(sid)[0] == 501
    # a header list past client.max_header_bytes: 431
    sid = c.request("/big-head", headers=[("x-big", "v" * 3000), ("x-big2", "w" * 3000)])
    assert c.response(sid)[0] == 431
    sid = c.request("/after")
    st, _, body, _ = c.response(sid)
    assert st == 200 and json.loads(body)["target"] == "/after"
    assert c.goaway is None and not c.closed
    # cookie crumbs are one Cookie field upstream
    sid = c.request("/cookies", headers=[("cookie", "a=1"), ("cookie", "b=2")])
    st, _, body, _ = c.response(sid)
    cookies = [v for n, v in json.loads(body)["headers"] if n.lower() == "cookie"]
    assert cookies == ["a=1; b=2"]
    c.close()
    # every stream is in the access log, sluice's own refusals of a header
    # list included (as HTTP/1.1's parse errors are)
    entries = read_log(log, 6)
    assert [e["status"] for e in entries] == [400, 200, 501, 431, 200, 200], entries
    assert all(e["protocol"] == "HTTP/2.0" for e in entries), entries


def test_a_large_header_list_arrives_whole(sluice):
    """Fields of 30 KB in all (under max_header_bytes) reach the upstream
    whole: the HTTP/1.1 head made of them spans many buffer chains."""
    s = start_proxy(sluice, ROUTES, max_header_bytes=32768)
    c = H2Conn(s.port)
    fields = [("x-f%02d" % i, chr(ord("a") + i % 26) * 1500) for i in range(20)]
    sid = c.request("/large-head", headers=fields)
    st, _, body, _ = c.response(sid)
    assert st == 200
    got = [(n.lower(), v) for n, v in json.loads(body)["headers"]
           if n.lower()[:3] == "x-f" and n[3:].isdigit()]
    assert got == fields
    c.close()


def test_answer_before_body_end_resets_no_error(sluice):
    s = start_proxy(sluice, ROUTES)
    c = H2Conn(s.port)
    key = [("x-k", "early-%d" % os.getpid())]
    sid = c.request("/one", headers=key)
    assert c.response(sid)[0] == 200
    # limited while its body is still coming: 429, then RST_STREAM(NO_ERROR)
    sid = c.request("/one", method="POST", headers=key, body=b"part", end=False)
    st, head, _, _ = c.response(sid)
    assert st == 429 and "retry-after" in head
    c.wait(lambda c: c.stream(sid)["reset"] is not None, 5)
    assert c.stream(sid)["reset"] == 0
    sid = c.request("/open-after")
    assert c.response(sid)[0] == 200
    c.close()


def test_sigterm_goaway_then_streams_finish(sluice):
    from h2lib import RawH2
    s = start_proxy(sluice, ROUTES)
    c = RawH2(s.port)
    sid = c.request("/first")
    assert c.response(sid)[0] == 200
    slow = c.request("/slow/1500")
    time.sleep(0.3)
    s.proc.send_signal(signal.SIGTERM)
    # the notice (the largest stream id), then the last stream taken
    c.wait(lambda c: c.goaway is not None, 5)
    assert c.goaway == (0, 2 ** 31 - 1)
    status, _, body, rst = c.response(slow, 10)
    assert (status, rst) == (200, None) and json.loads(body)["target"] == "/slow/1500"
    c.wait(lambda c: c.goaway != (0, 2 ** 31 - 1), 5)
    assert c.goaway == (0, slow)
    c.wait(lambda c: c.closed, 10)
    assert c.closed
    assert s.proc.wait(10) == 0


def test_sighup_new_streams_take_the_new_config(sluice, upstream):
    s = start_proxy(sluice, ROUTES, admin=True)
    c = H2Conn(s.port)
    sid = c.request("/moved")
    assert c.response(sid)[0] == 200
    # the new config sends /moved to the dead upstream: 502 on the same connection
    text = s.conf_path.read_text().replace(
        "  - name: open\n", "  - name: moved\n    match: { path: /moved }\n    upstream: dead\n"
        "  - name: open\n", 1)
    b = metrics(s.admin_port)
    want = mval(b, "sluice_config_reloads_total", result="ok") + 1
    s.conf_path.write_text(text)
    os.kill(s.proc.pid, signal.SIGHUP)
    assert wait_metric(s.admin_port, "sluice_config_reloads_total", want, result="ok") == want
    sid = c.request("/moved")
    assert c.response(sid)[0] == 502
    assert c.goaway is None and not c.closed
    c.close()


def test_headless_chromium_over_tls(sluice, pki, tmp_path):
    from test_dashboard import run_chromium
    log = tmp_path / "access.log"
    s = start_tls(sluice, ROUTES, [pki.ec], top="access_log: %s\n" % log)
    out, _ = run_chromium(tmp_path, "https://127.0.0.1:%d/chromium?x=1" % s.tls_port,
                          "--ignore-certificate-errors", "--dump-dom")
    assert "/chromium?x=1" in out, out[-2000:]
    lines = read_log(log, 1, keep=lambda e: e["path"] == "/chromium?x=1")
    assert lines and lines[0]["protocol"] == "HTTP/2.0" and lines[0]["tls"] == "TLSv1.3", lines
