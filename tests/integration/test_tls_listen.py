# sluice - tests/integration/test_tls_listen.py: TLS for clients (issue 12).
#
# A plain and a TLS listener in front of the tests' plain upstream, with
# certificates made by the openssl CLI (tls_listen_lib.py): SNI among RSA and
# ECDSA certificates with their chains, curl, openssl s_client and Python's
# ssl as clients, keep-alive, X-Forwarded-Proto, the access log's "tls",
# the handshake metrics, what closes one connection only (plaintext, a
# silent client, a refused version), resumption by session ticket, reload
# of certificates under load, and `sluice -t` on a key that does not match.

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time

import pytest

from conftest import Conn, build_request, free_port, read_log, sluice_bin, wait_until
from proxylib import metrics, mval, wait_metric
from tls_listen_lib import start_tls, tls_listen_conf
from tlslib import CA

ROUTES = """\
  - name: api
    match: { path: / }
    upstream: api
    limits:
      - { name: per-ip, algorithm: token_bucket, rate: 100000/s, burst: 100000, key: [ip] }
"""


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA and three leaves: ECDSA api.test (the default), RSA rsa.test,
    ECDSA *.wild.test."""
    ca = CA(tmp_path_factory.mktemp("pki"))
    ca.ec = ca.leaf("ec", "ec", ["api.test", "localhost"])
    ca.rsa = ca.leaf("rsa", "rsa", ["rsa.test"])
    ca.wild = ca.leaf("wild", "ec", ["*.wild.test"])
    return ca


class TLSConn(Conn):
    """conftest.Conn over Python's ssl: the same exact-bytes reader."""

    def __init__(self, port, cafile, server_hostname="api.test", timeout_s=5.0, ctx=None,
                 session=None):
        if ctx is None:
            ctx = ssl.create_default_context(cafile=cafile)
        raw = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self.sock = ctx.wrap_socket(raw, server_hostname=server_hostname, session=session)
        self.buf = b""
        self.timeout_s = timeout_s


def curl(args, timeout_s=10):
    return subprocess.run(["curl", "-sS", "--max-time", "5"] + args, capture_output=True,
                          timeout=timeout_s)


def s_client(port, *args, stdin=b"Q\n"):
    p = subprocess.run(["openssl", "s_client", "-connect", "127.0.0.1:%d" % port] + list(args),
                       input=stdin, capture_output=True, timeout=10)
    return p.returncode, p.stdout.decode("latin-1") + p.stderr.decode("latin-1")


def subject_cn(port, *args):
    rc, out = s_client(port, *args)
    for line in out.splitlines():
        if line.startswith("subject="):
            return line.split("CN = ", 1)[-1].strip()
    return None


def echoed(resp):
    return {n.lower(): v for n, v in json.loads(resp.body)["headers"]}


def start(sluice, pki, **kw):
    return start_tls(sluice, ROUTES, [pki.ec, pki.rsa, pki.wild], **kw)


# ------------------------------------------------------------------ SNI ----

def test_sni_picks_rsa_ecdsa_and_wildcard_with_their_chains(sluice, redis, pki):
    s = start(sluice, pki)
    for name in ("api.test", "rsa.test", "x.wild.test"):
        p = curl(["--cacert", pki.root, "--resolve", "%s:%d:127.0.0.1" % (name, s.tls_port),
                  "https://%s:%d/sni" % (name, s.tls_port)])
        assert p.returncode == 0, (name, p.stderr)
        assert json.loads(p.stdout)["target"] == "/sni"
    assert subject_cn(s.tls_port, "-servername", "rsa.test") == "rsa.test"
    assert subject_cn(s.tls_port, "-servername", "a.wild.test") == "*.wild.test"
    # A name no certificate has, and no SNI at all: the first (default).
    assert subject_cn(s.tls_port, "-servername", "other.example") == "api.test"
    assert subject_cn(s.tls_port, "-noservername") == "api.test"
    # Two labels under a wildcard are not its names.
    assert subject_cn(s.tls_port, "-servername", "a.b.wild.test") == "api.test"
    # The RSA certificate with an RSA suite on TLS 1.2, ECDSA with ECDSA.
    rc, out = s_client(s.tls_port, "-servername", "rsa.test", "-tls1_2")
    assert "ECDHE-RSA-" in out and "Verification" in out, out
    rc, out = s_client(s.tls_port, "-servername", "api.test", "-tls1_2")
    assert "ECDHE-ECDSA-" in out, out


def test_start_up_log_names_every_listener(sluice, redis, pki):
    # issue 18 item 10b: the start-up line named only the first listener
    s = start(sluice, pki)
    line = [ln for ln in s.stderr.splitlines() if "listening on" in ln]
    assert len(line) == 1, s.stderr
    assert ("listening on 127.0.0.1:%d, 127.0.0.1:%d (tls) with 1 worker"
            % (s.port, s.tls_port)) in line[0], line


# --------------------------------------------- keep-alive, XFP, the log ----

def test_keep_alive_forwarded_proto_and_access_log(sluice, redis, pki, tmp_path):
    log = tmp_path / "access.log"
    s = start(sluice, pki, top="access_log: %s\n" % log)
    with TLSConn(s.tls_port, pki.root) as c:
        assert c.sock.version() == "TLSv1.3"
        assert c.sock.selected_alpn_protocol() is None      # none offered
        conns = set()
        for i in range(3):
            # A client's own X-Forwarded-Proto never goes up.
            c.send(build_request("GET", "/ka/%d" % i, [("X-Forwarded-Proto", "http")],
                                 host="api.test"))
            r = c.read_response()
            assert r.status == 200, r
            h = echoed(r)
            assert h["x-forwarded-proto"] == "https", h
            conns.add(json.loads(r.body)["conn"])
    with Conn(s.port) as c:
        c.send(build_request("GET", "/plain", [("X-Forwarded-Proto", "https")]))
        r = c.read_response()
        assert r.status == 200 and echoed(r)["x-forwarded-proto"] == "http", r
    # TLS 1.2 over curl, keep-alive: one connection, two requests.
    p = curl(["-v", "--http1.1", "--tlsv1.2", "--tls-max", "1.2", "--cacert", pki.root, "--resolve",
              "api.test:%d:127.0.0.1" % s.tls_port,
              "https://api.test:%d/c1" % s.tls_port, "https://api.test:%d/c2" % s.tls_port])
    assert p.returncode == 0, p.stderr
    err = p.stderr.decode()
    assert "Re-using existing connection" in err and "ALPN: server accepted http/1.1" in err, err
    lines = read_log(log, 6)
    by_path = {x["path"]: x["tls"] for x in lines}
    assert by_path["/ka/0"] == "TLSv1.3" and by_path["/ka/2"] == "TLSv1.3", lines
    assert by_path["/plain"] == "", lines
    assert by_path["/c1"] == "TLSv1.2" and by_path["/c2"] == "TLSv1.2", lines
    ms = metrics(s.admin_port)
    assert mval(ms, "sluice_tls_handshakes_total") >= 2


# ------------------------------------------------- what is refused ------

def test_old_versions_weak_suites_and_h2_only(sluice, redis, pki):
    s = start(sluice, pki)
    rc, out = s_client(s.tls_port, "-servername", "api.test", "-tls1_1")
    assert rc != 0 and "Cipher is (NONE)" in out, out
    rc, out = s_client(s.tls_port, "-servername", "api.test", "-tls1")
    assert rc != 0 and "Cipher is (NONE)" in out, out
    # A suite without forward secrecy or AEAD, offered alone: refused.
    for weak in ("AES128-GCM-SHA256", "ECDHE-RSA-AES128-SHA", "ECDHE-ECDSA-AES256-SHA384"):
        rc, out = s_client(s.tls_port, "-servername", "rsa.test", "-tls1_2", "-cipher", weak)
        assert rc != 0 and "Cipher is (NONE)" in out, (weak, out)
    # ALPN: h2 first, then http/1.1 (docs/http2.md); anything else gets none.
    rc, out = s_client(s.tls_port, "-servername", "api.test", "-alpn", "h2")
    assert "ALPN protocol: h2" in out, out
    rc, out = s_client(s.tls_port, "-servername", "api.test", "-alpn", "http/1.1,h2")
    assert "ALPN protocol: h2" in out, out
    rc, out = s_client(s.tls_port, "-servername", "api.test", "-alpn", "http/1.1")
    assert "ALPN protocol: http/1.1" in out, out
    rc, out = s_client(s.tls_port, "-servername", "api.test", "-alpn", "spdy/3")
    assert "No ALPN negotiated" in out and "New, TLSv1.3" in out, out
    ms = metrics(s.admin_port)
    assert mval(ms, "sluice_tls_handshake_failures_total", reason="version") >= 2, ms
    assert mval(ms, "sluice_tls_handshake_failures_total", reason="cipher") >= 3, ms
    assert subprocess.run(["curl", "-sS", "--max-time", "5", "--cacert", pki.root,
                           "--resolve", "api.test:%d:127.0.0.1" % s.tls_port,
                           "https://api.test:%d/still" % s.tls_port],
                          capture_output=True, timeout=10).returncode == 0


def test_min_version_13_refuses_tls12(sluice, redis, pki):
    s = start_tls(sluice, ROUTES, [pki.ec], min_version="1.3")
    rc, out = s_client(s.tls_port, "-servername", "api.test", "-tls1_2")
    assert rc != 0 and "Cipher is (NONE)" in out, out
    rc, out = s_client(s.tls_port, "-servername", "api.test", "-tls1_3")
    assert "New, TLSv1.3" in out, out


def test_plaintext_and_silent_clients_close_that_connection_only(sluice, redis, pki):
    s = start(sluice, pki, client="  header_timeout: 500ms\n")
    with TLSConn(s.tls_port, pki.root) as busy:
        # Plain HTTP to the TLS port: closed at once, no HTTP answer.
        with socket.create_connection(("127.0.0.1", s.tls_port), timeout=3) as p:
            p.sendall(b"GET / HTTP/1.1\r\nHost: api.test\r\n\r\n")
            t0 = time.monotonic()
            try:
                data = p.recv(4096)
            except ConnectionResetError:
                data = b""
            assert not data.startswith(b"HTTP/"), data
            assert data == b"" or data[0] == 0x15, data     # EOF, or a TLS alert
            assert time.monotonic() - t0 < 1.0
        # A TCP client that sends nothing, and one that sends half a
        # ClientHello and then nothing: both closed after header_timeout.
        silent = socket.create_connection(("127.0.0.1", s.tls_port), timeout=5)
        half = socket.create_connection(("127.0.0.1", s.tls_port), timeout=5)
        half.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
        t0 = time.monotonic()
        for q in (silent, half):
            try:
                data = q.recv(4096)
            except ConnectionResetError:
                data = b""
            waited = time.monotonic() - t0
            q.close()
            assert data == b"" and 0.35 <= waited < 3.0, (data, waited)
        # The connection that was open all along still works.
        busy.send(build_request("GET", "/after", host="api.test"))
        assert busy.read_response().status == 200
    ms = metrics(s.admin_port)
    assert mval(ms, "sluice_tls_handshake_failures_total", reason="not_tls") >= 1, ms
    assert mval(ms, "sluice_tls_handshake_failures_total", reason="timeout") >= 2, ms


def test_body_delimited_by_the_close_ends_with_close_notify(sluice, redis, pki):
    """An HTTP/1.0 client reading to the end: sluice's close must be a TLS
    close (close_notify), or a strict client sees a truncation."""
    s = start(sluice, pki)
    ctx = ssl.create_default_context(cafile=pki.root)
    with socket.create_connection(("127.0.0.1", s.tls_port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname="api.test",
                             suppress_ragged_eofs=False) as t:
            t.sendall(b"GET /no-length HTTP/1.0\r\nHost: api.test\r\n\r\n")
            data = b""
            for _ in range(1000):
                d = t.recv(65536)       # SSLEOFError without close_notify
                if not d:
                    break
                data += d
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == b"200", head
    assert len(body) == 3000, len(body)         # tests/upstream.py's /no-length
    p = curl(["--http1.0", "--cacert", pki.root, "--resolve",
              "api.test:%d:127.0.0.1" % s.tls_port, "https://api.test:%d/no-length" % s.tls_port])
    assert p.returncode == 0, p.stderr


def test_session_ticket_resumption(sluice, redis, pki):
    s = start(sluice, pki)
    for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
        ctx = ssl.create_default_context(cafile=pki.root)
        ctx.maximum_version = version
        with TLSConn(s.tls_port, pki.root, ctx=ctx) as c:
            c.send(build_request("GET", "/t1", host="api.test"))
            assert c.read_response().status == 200
            session = c.sock.session
            assert not c.sock.session_reused
        with TLSConn(s.tls_port, pki.root, ctx=ctx, session=session) as c:
            c.send(build_request("GET", "/t2", host="api.test"))
            assert c.read_response().status == 200
            assert c.sock.session_reused, version


# --------------------------------------------------------------- reload ----

def _swap(pem_key, dst):
    """Copy (cert, key) over dst's two files, atomically each."""
    for src, d in zip(pem_key, dst):
        shutil.copyfile(src, d + ".tmp")
        os.replace(d + ".tmp", d)


def test_sighup_reloads_certificates_under_load(sluice, redis, pki, tmp_path):
    live = (str(tmp_path / "live.pem"), str(tmp_path / "live.key"))
    first = pki.leaf("gen1", "ec", ["api.test"])
    second = pki.leaf("gen2", "rsa", ["api.test"])
    _swap(first, live)
    s = start_tls(sluice, ROUTES, [live])
    port = s.tls_port
    assert subject_cn(port, "-servername", "api.test") == "api.test"

    def serial():
        ctx = ssl.create_default_context(cafile=pki.root)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            with ctx.wrap_socket(raw, server_hostname="api.test") as t:
                return t.getpeercert()["serialNumber"]

    gen1 = serial()
    held = TLSConn(port, pki.root)          # opened before any reload
    held_cert = held.sock.getpeercert()["serialNumber"]
    results = {"ok": 0, "bad": []}
    stop = threading.Event()

    def load():
        ctx = ssl.create_default_context(cafile=pki.root)
        deadline = time.monotonic() + 20
        while not stop.is_set() and time.monotonic() < deadline and results["ok"] < 2000:
            try:
                with TLSConn(port, pki.root, ctx=ctx) as c:     # a new handshake each
                    c.send(build_request("GET", "/load", host="api.test"))
                    r = c.read_response()
                    if r.status == 200:
                        results["ok"] += 1
                    else:
                        results["bad"].append(r.status)
            except Exception as e:      # noqa: BLE001 - every failure counts
                results["bad"].append(repr(e))

    threads = [threading.Thread(target=load) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for gen in (second, first, second):
            time.sleep(0.15)
            _swap(gen, live)
            before = mval(metrics_or_none(s), "sluice_config_reloads_total", result="ok")
            os.kill(s.proc.pid, signal.SIGHUP)
            wait_reload(s, before + 1)
        # Enough handshakes around the reloads, also under a sanitizer.
        wait_until(lambda: results["ok"] >= 30, 10, step_s=0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert results["bad"] == [] and results["ok"] >= 30, results
    gen2 = serial()
    assert gen2 != gen1
    # The connection opened first still works, with the certificate it had.
    held.send(build_request("GET", "/held", host="api.test"))
    assert held.read_response().status == 200
    assert held.sock.getpeercert()["serialNumber"] == held_cert == gen1

    # A key that does not match its certificate: a FILE:LINE:COL error, the
    # running certificates stay.
    shutil.copyfile(first[1], live[1] + ".tmp")
    os.replace(live[1] + ".tmp", live[1])
    os.kill(s.proc.pid, signal.SIGHUP)
    wait_until(lambda: "reload failed" in s.stderr, 5, step_s=0.05)
    want = "%s:6:11: listen[1].tls.certificates[0]: key_file '%s' does not match" % (
        s.conf_path, live[1])
    assert want in s.stderr, s.stderr
    assert serial() == gen2
    held.close()


def metrics_or_none(s):
    return metrics(s.admin_port) if s.admin_port else {}


def wait_reload(s, want):
    got = wait_metric(s.admin_port, "sluice_config_reloads_total", want, result="ok")
    assert got >= want, s.stderr


# ------------------------------------------------------------ sluice -t ----

def check_conf(certs):
    text = tls_listen_conf(ROUTES, certs, free_port())
    for k in ("@LISTEN_PORT@", "@REDIS_PORT@", "@UPSTREAM_PORT@", "@DEAD_PORT@"):
        text = text.replace(k, str(free_port()))
    return text


def test_check_mode_names_the_entry_whose_key_does_not_match(pki, tmp_path):
    bad_pem = tmp_path / "garbage.pem"
    bad_pem.write_text("not a certificate\n")
    cases = [
        ([pki.ec, (pki.rsa[0], pki.ec[1])], 1,
         "key_file '%s' does not match cert_file '%s'" % (pki.ec[1], pki.rsa[0])),
        ([(str(bad_pem), pki.ec[1])], 0, "cannot load cert_file '%s'" % bad_pem),
        ([(pki.ec[0], str(bad_pem))], 0, "key_file '%s' does not match" % bad_pem),
    ]
    conf = tmp_path / "t.yaml"
    for certs, bad, msg in cases:
        conf.write_text(check_conf(certs))
        p = subprocess.run([sluice_bin(), "-t", "-c", str(conf)], capture_output=True,
                           timeout=10)
        err = p.stderr.decode()
        line = 6 + bad
        want = "%s:%d:11: listen[1].tls.certificates[%d]: %s" % (conf, line, bad, msg)
        assert p.returncode == 1 and want in err, (want, err)
    conf.write_text(check_conf([pki.ec, pki.rsa, pki.wild]))
    p = subprocess.run([sluice_bin(), "-t", "-c", str(conf)], capture_output=True, timeout=10)
    assert p.returncode == 0, p.stderr
