# sluice - tests/integration/test_redis_tls.py: TLS to Redis (rediss://, redis.tls).
#
# A TLS-only redis-server (--port 0 --tls-port P) with certificates made here
# by the openssl CLI: a CA, a server certificate for 127.0.0.1 and localhost,
# a client certificate, and a second CA nobody trusts. sluice decides through
# it with the CA configured, with and without client certificates
# (--tls-auth-clients yes), and refuses it, logged and on_error, when the
# certificate does not verify; never a plain connection.

import socket
import ssl
import subprocess
import time

import pytest

from conftest import (RedisError, _resp_encode, _RespReader, free_port, http_get, make_conf,
                      rl_headers, stop_process, sluice_bin, wait_until)
from tlslib import make_ca, make_cert

ROUTES = """\
  - name: r
    match: { path: / }
    upstream: api
    limits:
      - { name: two, algorithm: fixed_window, limit: 2, window: 1h, key: ["header:X-K"] }
"""


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    make_ca(d, "ca", "ca", suffix=".crt")
    make_ca(d, "other-ca", "other-ca", suffix=".crt")
    make_cert(d, "server", "ca", "localhost",
              "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth",
              suffix=".crt")
    make_cert(d, "client", "ca", "sluice", "extendedKeyUsage=clientAuth", suffix=".crt")
    return {k: str(d / k) for k in ("ca.crt", "other-ca.crt", "server.crt", "server.key",
                                     "client.crt", "client.key")}


class TlsRedis:
    """A redis-server that speaks TLS only."""

    def __init__(self, workdir, certs, auth_clients, port=None, extra=()):
        self.port = port or free_port()
        self.certs = certs
        self.proc = subprocess.Popen(
            ["redis-server", "--port", "0", "--tls-port", str(self.port),
             "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(workdir), "--daemonize", "no", "--loglevel", "warning",
             "--tls-cert-file", certs["server.crt"], "--tls-key-file", certs["server.key"],
             "--tls-ca-cert-file", certs["ca.crt"],
             "--tls-auth-clients", "yes" if auth_clients else "no"] + list(extra),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        def pong():
            try:
                return self.cmd("PING") == "PONG"
            except (OSError, ConnectionError):
                return False
        if wait_until(pong, 5, step_s=0.05)[0]:
            return
        self.stop()
        raise RuntimeError("TLS redis-server did not start")

    def cmd(self, *args):
        ctx = ssl.create_default_context(cafile=self.certs["ca.crt"])
        ctx.load_cert_chain(self.certs["client.crt"], self.certs["client.key"])
        with socket.create_connection(("127.0.0.1", self.port), timeout=2) as raw:
            with ctx.wrap_socket(raw, server_hostname="localhost") as s:
                s.sendall(_resp_encode(args))
                r = _RespReader(s).reply()
                if isinstance(r, RedisError):
                    raise r
                return r

    def stop(self):
        stop_process(self.proc)


@pytest.fixture
def tls_redis(tmp_path, certs):
    made = []

    def start(auth_clients=False, port=None, extra=()):
        made.append(TlsRedis(tmp_path, certs, auth_clients, port, extra))
        return made[-1]
    yield start
    for r in made:
        r.stop()


def tls_conf(certs, port, tls_yaml, on_error="deny", scheme="rediss"):
    conf = make_conf(ROUTES, on_error=on_error).replace(
        "url: redis://127.0.0.1:@REDIS_PORT@/0", "url: %s://127.0.0.1:%d/0" % (scheme, port))
    return conf.replace("upstreams:\n", "  tls:\n" + tls_yaml + "upstreams:\n", 1) \
        if tls_yaml else conf


def wait_decided(port, timeout_s=5.0):
    """Poll (bounded) until a request is decided by Redis; returns it or the last."""
    return wait_until(lambda: http_get(port, "/x", headers=[("X-K", "probe-%f" % time.monotonic())]),
                      timeout_s, until=lambda r: "X-RateLimit-Limit" in rl_headers(r),
                      step_s=0.05)[0]


def assert_limiting(port, key):
    for _ in range(2):
        r = http_get(port, "/x", headers=[("X-K", key)])
        assert r.status == 200 and "X-RateLimit-Limit" in rl_headers(r), r
    r = http_get(port, "/x", headers=[("X-K", key)])
    assert r.status == 429, r


def test_tls_redis_with_ca(sluice, tls_redis, certs):
    red = tls_redis()
    s = sluice(tls_conf(certs, red.port, "    ca_file: %s\n" % certs["ca.crt"]),
               wait_redis=False)
    assert "X-RateLimit-Limit" in rl_headers(wait_decided(s.port)), s.stderr
    assert_limiting(s.port, "tls")
    assert any(b"tls" in k for k in red.cmd("KEYS", "itest:*")), "no key written over TLS"


def test_tls_server_name_checked(sluice, tls_redis, certs):
    """server_name replaces the URL's host in the check: the certificate
    names localhost, so localhost passes and another name does not."""
    red = tls_redis()
    good = sluice(tls_conf(certs, red.port, "    ca_file: %s\n    server_name: localhost\n"
                           % certs["ca.crt"]), wait_redis=False)
    assert "X-RateLimit-Limit" in rl_headers(wait_decided(good.port)), good.stderr
    bad = sluice(tls_conf(certs, red.port, "    ca_file: %s\n    server_name: other.example\n"
                          % certs["ca.crt"]), wait_redis=False)
    time.sleep(0.5)
    r = http_get(bad.port, "/x", headers=[("X-K", "badname")])
    assert r.status == 503, r
    assert "certificate verify failed" in bad.stderr, bad.stderr


def test_tls_client_certificate(sluice, tls_redis, certs):
    red = tls_redis(auth_clients=True)
    s = sluice(tls_conf(certs, red.port, "    ca_file: %s\n    cert_file: %s\n    key_file: %s\n"
                        % (certs["ca.crt"], certs["client.crt"], certs["client.key"])),
               wait_redis=False)
    assert "X-RateLimit-Limit" in rl_headers(wait_decided(s.port)), s.stderr
    assert_limiting(s.port, "client-cert")


def test_tls_client_certificate_missing(sluice, tls_redis, certs):
    """The server wants a client certificate sluice does not have: on_error,
    and the log says the TLS connection failed."""
    red = tls_redis(auth_clients=True)
    s = sluice(tls_conf(certs, red.port, "    ca_file: %s\n" % certs["ca.crt"]),
               wait_redis=False)
    time.sleep(0.6)
    for _ in range(3):
        r = http_get(s.port, "/x", headers=[("X-K", "nocert")])
        assert r.status == 503, r
    # with TLS 1.3 the server refuses after the handshake: a reset, or its alert
    assert "store: redis '127.0.0.1:%d' down: TLS" % red.port in s.stderr, s.stderr


def test_tls_untrusted_certificate(sluice, tls_redis, certs):
    """The server's CA is not the one configured: logged with the reason, and
    on_error; no plain fallback (Redis never saw a command)."""
    red = tls_redis()
    s = sluice(tls_conf(certs, red.port, "    ca_file: %s\n" % certs["other-ca.crt"]),
               wait_redis=False)
    time.sleep(0.6)
    for _ in range(3):
        r = http_get(s.port, "/x", headers=[("X-K", "untrusted")])
        assert r.status == 503, r
    assert ("error store: redis '127.0.0.1:%d' down: TLS certificate verify failed: "
            % red.port) in s.stderr, s.stderr
    assert red.cmd("KEYS", "itest:*") == []
    stats = red.cmd("INFO", "commandstats").decode()
    assert "cmdstat_evalsha" not in stats and "cmdstat_script" not in stats, stats


def test_tls_system_store_does_not_trust_test_ca(sluice, tls_redis, certs):
    """Without ca_file the system trust store is used: it does not know the
    test CA, so the connection is refused, not made unverified."""
    red = tls_redis()
    s = sluice(tls_conf(certs, red.port, None), wait_redis=False)
    time.sleep(0.6)
    r = http_get(s.port, "/x", headers=[("X-K", "system")])
    assert r.status == 503, r
    assert "TLS certificate verify failed" in s.stderr, s.stderr


def test_tls_verify_false(sluice, tls_redis, certs):
    red = tls_redis()
    s = sluice(tls_conf(certs, red.port, "    ca_file: %s\n    verify: false\n"
                        % certs["other-ca.crt"]), wait_redis=False)
    assert "X-RateLimit-Limit" in rl_headers(wait_decided(s.port)), s.stderr
    assert_limiting(s.port, "noverify")


def test_plain_url_to_tls_redis_fails(sluice, tls_redis, certs):
    """redis:// to a TLS port is a failed handshake and on_error (the
    scheme, or a redis.tls section, is what turns TLS on)."""
    red = tls_redis()
    s = sluice(tls_conf(certs, red.port, None, scheme="redis"), wait_redis=False)
    time.sleep(0.5)
    r = http_get(s.port, "/x", headers=[("X-K", "plain")])
    assert r.status == 503, r


def test_tls_cluster(sluice, tls_redis, certs, tmp_path):
    """The same redis.tls serves cluster nodes: a one-node cluster that speaks
    TLS only (bus included) owns every slot; sluice reads CLUSTER SLOTS over
    TLS and decides there."""
    from clusterlib import cluster_port
    port = cluster_port()
    red = tls_redis(port=port, extra=["--cluster-enabled", "yes", "--tls-cluster", "yes",
                                      "--cluster-config-file", str(tmp_path / "nodes.conf")])
    assert red.cmd("CLUSTER", "ADDSLOTSRANGE", "0", "16383") == "OK"
    wait_until(lambda: b"cluster_state:ok" in red.cmd("CLUSTER", "INFO"), 10, step_s=0.05,
               what="the one-node cluster to become ok")
    conf = make_conf(ROUTES, on_error="deny").replace(
        "  url: redis://127.0.0.1:@REDIS_PORT@/0\n",
        "  cluster: [127.0.0.1:%d]\n  tls:\n    ca_file: %s\n" % (port, certs["ca.crt"]))
    s = sluice(conf, wait_redis=False)
    assert "X-RateLimit-Limit" in rl_headers(wait_decided(s.port)), s.stderr
    assert_limiting(s.port, "cluster")
    assert "(cluster topology)" in s.stderr, s.stderr


def test_tls_sentinel(sluice, tls_redis, certs, tmp_path):
    """The same redis.tls serves the sentinels and the master they name: a
    TLS-only master and a TLS-only sentinel (quorum 1) watching it."""
    red = tls_redis()
    sport = free_port()
    conf_path = tmp_path / "sentinel.conf"
    conf_path.write_text(
        "port 0\ntls-port %d\nbind 127.0.0.1\ndir %s\n"
        "tls-cert-file %s\ntls-key-file %s\ntls-ca-cert-file %s\n"
        "tls-auth-clients no\ntls-replication yes\n"
        "sentinel monitor tlsmaster 127.0.0.1 %d 1\n"
        % (sport, tmp_path, certs["server.crt"], certs["server.key"], certs["ca.crt"], red.port))
    sent = subprocess.Popen(["redis-server", str(conf_path), "--sentinel"], cwd=str(tmp_path),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        probe = TlsRedis.__new__(TlsRedis)
        probe.port, probe.certs = sport, certs
        def master_known():
            try:
                return probe.cmd("SENTINEL", "get-master-addr-by-name", "tlsmaster")
            except (OSError, ConnectionError, RedisError):
                return None
        wait_until(master_known, 10, step_s=0.05, what="the TLS sentinel to answer")
        conf = make_conf(ROUTES, on_error="deny").replace(
            "  url: redis://127.0.0.1:@REDIS_PORT@/0\n",
            "  sentinel:\n    master: tlsmaster\n    nodes: [127.0.0.1:%d]\n"
            "  tls:\n    ca_file: %s\n" % (sport, certs["ca.crt"]))
        s = sluice(conf, wait_redis=False)
        assert "X-RateLimit-Limit" in rl_headers(wait_decided(s.port)), s.stderr
        assert_limiting(s.port, "sentinel")
        assert "(sentinel)" in s.stderr, s.stderr
    finally:
        stop_process(sent)


@pytest.mark.parametrize("tls_yaml,want", [
    ("    ca_file: /nonexistent/ca.pem\n", "redis.tls.ca_file: cannot read '/nonexistent/ca.pem'"),
    ("    key_file: @KEY@\n", "redis.tls: key_file needs cert_file"),
    ("    verify: yes\n", "redis.tls.verify: expected true or false"),
    ("    server_name: 'bad name'\n", "redis.tls.server_name: bad server name"),
    ("    ciphers: x\n", "unknown key 'ciphers'"),
])
def test_tls_config_errors(tmp_path, certs, tls_yaml, want):
    conf = tls_conf(certs, 6379, tls_yaml.replace("@KEY@", certs["client.key"]))
    conf = conf.replace("@LISTEN_PORT@", "1").replace("@UPSTREAM_PORT@", "2").replace(
        "@DEAD_PORT@", "3")
    path = tmp_path / "bad.yaml"
    path.write_text(conf)
    out = subprocess.run([sluice_bin(), "-t", "-c", str(path)], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 1, out
    assert want in out.stderr, out.stderr
    assert out.stderr.startswith("%s:" % path), out.stderr   # FILE:LINE:COL
