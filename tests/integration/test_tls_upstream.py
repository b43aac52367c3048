# sluice - tests/integration/test_tls_upstream.py: TLS to upstreams.
#
# The TLS upstream is a real nginx with ssl (Debian's), started per test on
# 127.0.0.1 with a config and certificates made in tmp_path by the openssl
# CLI (a CA, a server certificate for upstream.test, localhost and
# 127.0.0.1, a self-signed one nobody trusts, a client certificate). nginx
# logs, per request, its connection number and $ssl_session_reused, so the
# tests count TLS handshakes on the upstream's side. Hostile TLS servers
# (garbage for a ServerHello, a close mid-handshake, a stall) are raw
# sockets here. Every process is stopped by PID.

import os
import re
import signal
import socket
import subprocess
import threading
import time

import pytest

from conftest import Conn, build_request, free_port, stop_process, wait_port, wait_until, http_get
from nginxlib import NGINX, nginx_conf
from proxylib import LoopbackServer
from tlslib import OPENSSL, make_ca, make_cert, make_key

BIG = bytes(range(256)) * (3 * 4096 + 7)     # about 3 MB, served by nginx as /big

pytestmark = pytest.mark.skipif(not os.path.exists(NGINX), reason="nginx not installed")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """Certificates: ca (trusted by the tests), server (signed by ca: DNS
    upstream.test and localhost, IP 127.0.0.1), rogue (self-signed, the same
    names), client (signed by ca, clientAuth), other.key (matches nothing)."""
    d = str(tmp_path_factory.mktemp("pki"))
    for ca in ("ca", "rogue"):
        make_ca(d, ca, "sluice test %s" % ca)
    names = "subjectAltName=DNS:upstream.test,DNS:localhost,IP:127.0.0.1"
    make_cert(d, "server", "ca", "upstream.test", names + "\nextendedKeyUsage=serverAuth")
    make_cert(d, "roguesrv", "rogue", "upstream.test", names + "\nextendedKeyUsage=serverAuth")
    make_cert(d, "client", "ca", "sluice client", "extendedKeyUsage=clientAuth")
    make_key(d, "other.key")
    return d


class Nginx:
    """nginx with ssl on a free port; access log: connection, requests on it,
    $ssl_session_reused, protocol, client verification, uri, SNI ("-": none)."""

    def __init__(self, tmp, pki, cert="server", verify_client=False, tickets=True,
                 protocols="TLSv1.2 TLSv1.3", keepalive_timeout="60s"):
        self.port = free_port()
        self.dir = tmp
        self.log = os.path.join(tmp, "access.log")
        conf = os.path.join(tmp, "nginx.conf")
        vc = ("ssl_client_certificate %s/ca.pem;\n        ssl_verify_client on;" % pki
              if verify_client else "")
        with open(conf, "w") as f:
            f.write(nginx_conf(tmp, """
    log_format tls '$connection $connection_requests $ssl_session_reused $ssl_protocol $ssl_client_verify $request_uri $ssl_server_name';
    access_log %(log)s tls;
    keepalive_requests 10000;
    keepalive_timeout %(kt)s;
    server {
        listen 127.0.0.1:%(port)d ssl;
        ssl_certificate %(pki)s/%(cert)s.pem;
        ssl_certificate_key %(pki)s/%(cert)s.key;
        ssl_protocols %(protocols)s;
        ssl_session_tickets %(tickets)s;
        ssl_session_cache shared:up:1m;
        %(vc)s
        client_max_body_size 8m;
        location /big {
            alias %(t)s/big.bin;
        }
        location / {
            return 200 "tls upstream $ssl_protocol $ssl_client_s_dn\\n";
        }
    }
""" % {"t": tmp, "log": self.log, "port": self.port, "pki": pki, "cert": cert, "vc": vc,
       "tickets": "on" if tickets else "off", "protocols": protocols,
       "kt": keepalive_timeout}))
        with open(os.path.join(tmp, "big.bin"), "wb") as f:
            f.write(BIG)
        self.errf = open(os.path.join(tmp, "nginx.stderr"), "wb")
        self.proc = subprocess.Popen([NGINX, "-p", tmp, "-c", conf], stdout=subprocess.DEVNULL,
                                     stderr=self.errf)
        if not wait_port(self.port, self.proc):
            self.stop()
            raise RuntimeError("nginx did not start: %s" % open(
                os.path.join(tmp, "error.log")).read()[-2000:])
        # wait_port's probe connection is in nginx's log only as a handshake
        # failure; requests are what the tests count

    def lines(self, prefix="/", count=1):
        """[(connection, requests_on_it, reused, protocol, client_verify,
        uri, sni)] of the requests whose uri starts with prefix, once there are
        count of them (nginx logs after it answered), or after 2 s."""
        def read():
            with open(self.log) as f:
                out = [ln.split() for ln in f.read().splitlines() if ln.strip()]
            return [ln for ln in out if len(ln) == 7 and ln[5].startswith(prefix)]
        return wait_until(read, 2, until=lambda out: len(out) >= count)[0]

    def stop(self):
        stop_process(self.proc)
        self.errf.close()


@pytest.fixture
def nginx(tmp_path, pki):
    started = []

    def start(**kw):
        d = tmp_path / ("nginx%d" % len(started))
        d.mkdir()
        n = Nginx(str(d), pki, **kw)
        started.append(n)
        return n

    yield start
    for n in started:
        n.stop()


CONF = """\
listen: 127.0.0.1:@LISTEN_PORT@
workers: 1
backend: memory
admin: { listen: 127.0.0.1:%(admin)d }
upstreams:
  secure:
    servers: [%(server)s]
    keepalive: 8
    connect_timeout: %(connect)s
    timeout: 2s
    tls: %(tls)s
  fresh:
    servers: [%(server)s]
    keepalive: 0
    connect_timeout: %(connect)s
    timeout: 2s
    tls: %(tls)s
  plain:
    servers: [127.0.0.1:@UPSTREAM_PORT@]
routes:
  - name: plain
    match: { path: /plain }
    upstream: plain
  - name: fresh
    match: { path: /fresh }
    upstream: fresh
  - name: secure
    match: { path: / }
    upstream: secure
"""


def start(sluice, tls, server, connect="1s"):
    admin = free_port()
    s = sluice(CONF % {"tls": tls, "server": server, "connect": connect, "admin": admin},
               wait_redis=False, redis_port=free_port())
    s.admin_port = admin
    assert wait_port(admin, s.proc)
    return s


def metrics(s):
    return http_get(s.admin_port, "/metrics").body.decode()


def tls_failures(s, reason):
    m = re.search(r'^sluice_upstream_tls_failures_total\{upstream="secure",reason="%s"\} (\d+)$'
                  % reason, metrics(s), re.M)
    return int(m.group(1)) if m else 0


def get(port, path="/x", timeout_s=5.0):
    return http_get(port, path, timeout_s=timeout_s)


# ---------------------------------------------------------------- trust ----

def test_verified_with_ca_file(sluice, nginx, pki):
    n = nginx()
    s = start(sluice, "{ ca_file: %s/ca.pem, server_name: upstream.test }" % pki,
              "127.0.0.1:%d" % n.port)
    r = get(s.port)
    assert r.status == 200, (r, s.stderr)
    assert r.body.startswith(b"tls upstream TLSv1.3")
    assert n.lines("/x")[-1][6] == "upstream.test"      # the SNI sent


def test_ip_server_verified_against_ip_san(sluice, nginx, pki):
    # no server_name: the name is the server's host, an IP address here
    # (checked against the IP SAN, and no SNI is sent for it)
    n = nginx()
    s = start(sluice, "{ ca_file: %s/ca.pem }" % pki, "127.0.0.1:%d" % n.port)
    assert get(s.port).status == 200, s.stderr
    assert n.lines("/x")[-1][6] == "-"


def test_ip_not_in_certificate_is_502(sluice, nginx, pki):
    n = nginx()
    s = start(sluice, "{ ca_file: %s/ca.pem, server_name: 127.0.0.2 }" % pki,
              "127.0.0.1:%d" % n.port)
    assert get(s.port).status == 502
    assert "certificate verify failed: IP address mismatch" in s.stderr, s.stderr


def test_host_name_of_server_is_default_name(sluice, nginx, pki):
    n = nginx()
    s = start(sluice, "{ ca_file: %s/ca.pem }" % pki, "localhost:%d" % n.port)
    assert get(s.port).status == 200, s.stderr
    assert n.lines("/x")[-1][6] == "localhost"


def test_untrusted_certificate_is_502_with_reason(sluice, nginx, pki):
    n = nginx(cert="roguesrv")
    s = start(sluice, "{ ca_file: %s/ca.pem, server_name: upstream.test }" % pki,
              "127.0.0.1:%d" % n.port)
    r = get(s.port)
    assert r.status == 502
    assert re.search(r"upstream: TLS handshake failed '127\.0\.0\.1:%d' \(upstream secure\): "
                     r"certificate verify failed: \S" % n.port, s.stderr), s.stderr
    assert tls_failures(s, "verify") == 1
    assert n.lines("/x", 0) == []


def test_system_trust_store_does_not_trust_test_ca(sluice, nginx, pki):
    # tls: {} is verification against the system store
    n = nginx()
    s = start(sluice, "{}", "127.0.0.1:%d" % n.port)
    assert get(s.port).status == 502
    assert "certificate verify failed" in s.stderr


def test_wrong_server_name_is_502(sluice, nginx, pki):
    n = nginx()
    s = start(sluice, "{ ca_file: %s/ca.pem, server_name: other.test }" % pki,
              "127.0.0.1:%d" % n.port)
    assert get(s.port).status == 502
    assert "certificate verify failed: hostname mismatch" in s.stderr, s.stderr
    assert tls_failures(s, "verify") == 1


def test_verify_false_accepts_untrusted(sluice, nginx, pki):
    n = nginx(cert="roguesrv")
    s = start(sluice, "{ verify: false, server_name: nobody.test }", "127.0.0.1:%d" % n.port)
    r = get(s.port)
    assert r.status == 200, s.stderr
    assert tls_failures(s, "verify") == 0


# ------------------------------------------------------ reuse, resumption ----

@pytest.mark.parametrize("protocols,tickets", [
    ("TLSv1.3", True), ("TLSv1.2", True), ("TLSv1.2", False),
])
def test_keepalive_reuse_and_resumption(sluice, nginx, pki, protocols, tickets):
    # TLS 1.3 tickets; TLS 1.2 tickets; TLS 1.2 session ids (nginx's cache)
    n = nginx(protocols=protocols, tickets=tickets)
    s = start(sluice, "{ ca_file: %s/ca.pem, server_name: upstream.test }" % pki,
              "127.0.0.1:%d" % n.port)
    # sequential requests on one client connection: one upstream connection
    with Conn(s.port) as c:
        for i in range(5):
            c.send(build_request("GET", "/seq%d" % i))
            assert c.read_response().status == 200
    lines = n.lines("/seq", 5)
    assert len(lines) == 5
    assert len({ln[0] for ln in lines}) == 1, lines      # one TLS connection
    assert lines[0][2] == "."                             # a full handshake first
    # keepalive: 0, a new connection per request: each resumes a session
    with Conn(s.port) as c:
        for i in range(4):
            c.send(build_request("GET", "/fresh/%d" % i))
            assert c.read_response().status == 200
    lines = n.lines("/fresh/", 4)
    assert len(lines) == 4 and len({ln[0] for ln in lines}) == 4, lines
    assert [ln[2] for ln in lines] == [".", "r", "r", "r"], lines
    m = metrics(s)
    full = int(re.search(r'sluice_upstream_tls_handshakes_total\{resumed="false"\} (\d+)', m).group(1))
    resumed = int(re.search(r'sluice_upstream_tls_handshakes_total\{resumed="true"\} (\d+)', m).group(1))
    assert (full, resumed) == (2, 3), m     # one full handshake per upstream's context


def test_idle_connection_closed_by_server_is_replaced(sluice, nginx, pki):
    # nginx closes an idle keep-alive connection after 300 ms (close_notify,
    # then FIN): the pool drops it, and the next request gets a new one
    n = nginx(keepalive_timeout="300ms")
    s = start(sluice, "{ ca_file: %s/ca.pem, server_name: upstream.test }" % pki,
              "127.0.0.1:%d" % n.port)
    with Conn(s.port) as c:
        c.send(build_request("GET", "/idle1"))
        assert c.read_response().status == 200
        time.sleep(0.6)
        c.send(build_request("GET", "/idle2"))
        assert c.read_response().status == 200
    lines = n.lines("/idle", 2)
    assert len(lines) == 2 and lines[0][0] != lines[1][0], lines
    assert lines[1][2] == "r"                               # and it resumed
    assert "exchange: upstream" not in s.stderr, s.stderr


def test_plain_upstream_still_works(sluice, nginx, pki):
    n = nginx()
    s = start(sluice, "{ ca_file: %s/ca.pem, server_name: upstream.test }" % pki,
              "127.0.0.1:%d" % n.port)
    with Conn(s.port) as c:
        for _ in range(3):
            c.send(build_request("GET", "/plain/a"))
            r = c.read_response()
            assert r.status == 200 and r.json()["target"] == "/plain/a"
            c.send(build_request("GET", "/b"))
            assert c.read_response().body.startswith(b"tls upstream")


def test_large_bodies_both_ways(sluice, nginx, pki):
    # megabytes each way through the TLS bufferevent and the watermarks
    import hashlib
    n = nginx()
    s = start(sluice, "{ ca_file: %s/ca.pem, server_name: upstream.test }" % pki,
              "127.0.0.1:%d" % n.port)
    with Conn(s.port, timeout_s=10) as c:
        for _ in range(2):
            c.send(build_request("GET", "/big"))
            r = c.read_response()
            assert r.status == 200 and hashlib.sha1(r.body).digest() == hashlib.sha1(BIG).digest()
        up = b"x" * (2 << 20)
        c.send(build_request("POST", "/upload", body=up))
        r = c.read_response()
        assert r.status == 200 and r.body.startswith(b"tls upstream")
    assert len({ln[0] for ln in n.lines("/", 3)}) == 1      # all on one TLS connection


# ------------------------------------------------------------ mutual TLS ----

def test_client_certificate(sluice, nginx, pki):
    n = nginx(verify_client=True)
    s = start(sluice, "{ ca_file: %s/ca.pem, server_name: upstream.test, cert_file: %s/client.pem,"
              " key_file: %s/client.key }" % (pki, pki, pki), "127.0.0.1:%d" % n.port)
    r = get(s.port)
    assert r.status == 200, s.stderr
    assert b"CN=sluice client" in r.body
    assert n.lines("/x")[-1][4] == "SUCCESS"


def test_no_client_certificate_nginx_answers_400(sluice, nginx, pki):
    # nginx finishes the handshake without a client certificate and answers
    # 400 itself ("No required SSL certificate was sent"): passed on as the
    # upstream's answer, never a 200
    n = nginx(verify_client=True)
    s = start(sluice, "{ ca_file: %s/ca.pem, server_name: upstream.test }" % pki,
              "127.0.0.1:%d" % n.port)
    r = get(s.port)
    assert r.status == 400 and b"No required SSL certificate" in r.body, r
    assert n.lines("/x")[-1][4] == "NONE"


class SServer:
    """openssl s_server -Verify 1: the handshake itself fails without a
    client certificate (an alert), as most TLS servers requiring one do."""

    def __init__(self, tmp, pki, version):
        self.port = free_port()
        self.errf = open(os.path.join(tmp, "s_server.%s.out" % version), "wb")
        self.proc = subprocess.Popen(
            [OPENSSL, "s_server", "-accept", "127.0.0.1:%d" % self.port, "-cert",
             pki + "/server.pem", "-key", pki + "/server.key", "-CAfile", pki + "/ca.pem",
             "-Verify", "1", "-www", "-" + version, "-quiet"],
            stdin=subprocess.DEVNULL, stdout=self.errf, stderr=self.errf)
        if not wait_port(self.port, self.proc):
            self.stop()
            raise RuntimeError("s_server did not start")

    def stop(self):
        stop_process(self.proc)
        self.errf.close()


@pytest.mark.parametrize("version,reason", [("tls1_3", "error"), ("tls1_2", "handshake")])
def test_client_certificate_required_by_handshake(sluice, tmp_path, pki, version, reason):
    srv = SServer(str(tmp_path), pki, version)
    try:
        tls = "{ ca_file: %s/ca.pem, server_name: upstream.test%s }"
        s = start(sluice, tls % (pki, ""), "127.0.0.1:%d" % srv.port)
        assert get(s.port).status == 502
        # TLS 1.3: the refusal is an alert after sluice's Finished;
        # TLS 1.2: it ends the handshake
        assert re.search(r"upstream: TLS (handshake )?failed '127\.0\.0\.1:%d' \(upstream "
                         r"secure\): .*alert" % srv.port, s.stderr), s.stderr
        assert tls_failures(s, reason) == 1, metrics(s)
        s2 = start(sluice, tls % (pki, ", cert_file: %s/client.pem, key_file: %s/client.key"
                                  % (pki, pki)), "127.0.0.1:%d" % srv.port)
        r = get(s2.port)
        assert r.status == 200 and b"s_server" in r.body, (r, s2.stderr)
    finally:
        srv.stop()


# ----------------------------------------------------------- hostile TLS ----

class Hostile(LoopbackServer):
    """A TCP server on 127.0.0.1 that does `mode` to each connection:
    garbage: reads the ClientHello, answers with plain HTTP bytes;
    close: reads the ClientHello, closes; stall: reads it, says nothing
    (held open until stop())."""

    def __init__(self, mode):
        self.mode = mode
        super().__init__()

    def _serve(self, c):
        c.settimeout(2)
        try:
            c.recv(4096)
            if self.mode == "garbage":
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi" * 20)
                time.sleep(0.1)
                c.close()
            elif self.mode == "close":
                c.close()
        except OSError:
            c.close()


@pytest.fixture
def hostile():
    made = []

    def make(mode):
        h = Hostile(mode)
        made.append(h)
        return h

    yield make
    for h in made:
        h.stop()


@pytest.mark.parametrize("mode,status,reason", [
    ("garbage", 502, "handshake"),
    ("close", 502, "closed"),
    ("stall", 504, "timeout"),
])
def test_hostile_tls_upstream(sluice, hostile, pki, mode, status, reason):
    h = hostile(mode)
    s = start(sluice, "{ ca_file: %s/ca.pem, server_name: upstream.test }" % pki,
              "127.0.0.1:%d" % h.port, connect="500ms")
    t0 = time.monotonic()
    r = get(s.port, timeout_s=5)
    took = time.monotonic() - t0
    assert r.status == status, (r, s.stderr)
    assert took < 2.5, took                 # bounded by connect_timeout (500 ms)
    assert tls_failures(s, reason) == 1, metrics(s)
    assert "upstream: TLS handshake failed '127.0.0.1:%d'" % h.port in s.stderr, s.stderr
    # sluice goes on serving
    assert get(s.port, "/plain/ok").status == 200


def test_refused_tls_upstream_is_plain_502(sluice, pki):
    port = free_port()
    s = start(sluice, "{ ca_file: %s/ca.pem }" % pki, "127.0.0.1:%d" % port)
    assert get(s.port).status == 502
    # not TLS's doing: a refused connect, logged and counted as before
    assert "TLS handshake failed" not in s.stderr
    assert "exchange: upstream '127.0.0.1:%d' failed" % port in s.stderr, s.stderr
    assert "sluice_upstream_tls_failures_total{" not in metrics(s)


# ------------------------------------------------------ -t and reload ----

def test_check_mode_reports_bad_tls_files(tmp_path, pki):
    from conftest import sluice_bin
    conf = tmp_path / "t.yaml"
    conf.write_text("listen: 127.0.0.1:%d\nbackend: memory\nupstreams:\n  api:\n"
                    "    servers: [127.0.0.1:9443]\n    tls:\n"
                    "      cert_file: %s/client.pem\n      key_file: %s/other.key\n"
                    "routes:\n  - { name: r, match: { path: / }, upstream: api }\n"
                    % (free_port(), pki, pki))
    p = subprocess.run([sluice_bin(), "-t", "-c", str(conf)], capture_output=True, timeout=10)
    assert p.returncode == 1
    assert ("%s:8:17: upstreams.api.tls.key_file: cannot use '%s/other.key': the key does "
            "not match the certificate '%s/client.pem'" % (conf, pki, pki)) in p.stderr.decode()
    conf.write_text(conf.read_text().replace("other.key", "client.key"))
    p = subprocess.run([sluice_bin(), "-t", "-c", str(conf)], capture_output=True, timeout=10)
    assert p.returncode == 0, p.stderr


class SlowTLS(LoopbackServer):
    """A Python ssl server: each request is answered after delay_s, with
    Content-Length, keep-alive."""

    def __init__(self, pki, delay_s):
        import ssl
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(pki + "/server.pem", pki + "/server.key")
        self.delay_s = delay_s
        self.threads = []
        self.conns = []
        super().__init__()

    def _serve(self, c):
        self.threads.append(threading.current_thread())
        c.settimeout(5)
        try:
            s = self.ctx.wrap_socket(c, server_side=True)
            self.conns.append(s)
            buf = b""
            for _ in range(20):
                while b"\r\n\r\n" not in buf:
                    data = s.recv(65536)
                    if not data:
                        return
                    buf += data
                _, buf = buf.split(b"\r\n\r\n", 1)
                time.sleep(self.delay_s)
                s.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nslow\n")
        except OSError:
            pass
        finally:
            c.close()

    def stop(self):
        """LoopbackServer.stop(), and the TLS sockets (wrap_socket took over
        the accepted ones' descriptors) shut down, their threads ended."""
        super().stop()
        for c in self.conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in self.threads:
            t.join(timeout=6)


def reloads_ok(s):
    m = re.search(r'sluice_config_reloads_total\{result="ok"\} (\d+)', metrics(s))
    return int(m.group(1))


def reload(s, text):
    before = reloads_ok(s)
    failed = metrics(s).count('result="error"} 1')
    s.conf_path.write_text(text)
    os.kill(s.proc.pid, signal.SIGHUP)
    wait_until(lambda: reloads_ok(s) > before or metrics(s).count('result="error"} 1') > failed,
               5, step_s=0.05, what="a reload")
    return reloads_ok(s) > before


def test_reload_builds_new_contexts_in_flight_keep_theirs(sluice, pki):
    srv = SlowTLS(pki, 0.3)
    try:
        tls = "{ ca_file: %s/ca.pem, server_name: upstream.test }" % pki
        s = start(sluice, tls, "127.0.0.1:%d" % srv.port)
        text = s.conf_path.read_text()
        assert get(s.port).status == 200
        # a request in flight across a reload to a CA that does not sign the
        # server: it finishes on its own connection and context ...
        c = Conn(s.port)
        c.send(build_request("GET", "/inflight"))
        time.sleep(0.3)
        assert reload(s, text.replace(pki + "/ca.pem", pki + "/rogue.pem"))
        assert c.read_response().status == 200
        c.close()
        # ... and new requests get the new context: refused
        assert get(s.port).status == 502
        assert tls_failures(s, "verify") == 1
        # a reload to a file that cannot be read is refused, the config stays
        assert not reload(s, text.replace(pki + "/ca.pem", pki + "/missing.pem"))
        assert "cannot read '%s/missing.pem'" % pki in s.stderr
        assert get(s.port).status == 502
        # back to the right CA
        assert reload(s, text)
        assert get(s.port).status == 200
    finally:
        srv.stop()


def test_reload_reads_a_changed_ca_file_again(sluice, nginx, pki, tmp_path):
    # trust stores are parsed once and shared while the file stays the same:
    # the same path with other contents is parsed again
    import shutil
    trust = str(tmp_path / "trust.pem")
    shutil.copy(pki + "/ca.pem", trust)
    n = nginx()
    s = start(sluice, "{ ca_file: %s, server_name: upstream.test }" % trust,
              "127.0.0.1:%d" % n.port)
    text = s.conf_path.read_text()
    assert get(s.port).status == 200
    assert reload(s, text)
    assert get(s.port, "/fresh/1").status == 200        # a new connection, same store
    shutil.copy(pki + "/rogue.pem", trust + ".new")
    os.replace(trust + ".new", trust)                   # another inode
    assert reload(s, text)
    assert get(s.port, "/fresh/2").status == 502
    assert "certificate verify failed" in s.stderr
