# sluice - tests/integration/test_valgrind.py: one scenario under valgrind memcheck.
#
# sluice runs under `valgrind --leak-check=full` with two workers, an access
# log and an admin listener, and gets a few hundred varied requests (allowed,
# limited, 404, 400, 413, 431, chunked, pipelined, HEAD, 502, cut short);
# after SIGTERM it must exit 0 with zero memcheck errors and no definite or
# indirect leak. `make valgrind` runs it; it is also part of make test-slow.

import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

from conftest import (Conn, build_request, free_port, http_get, make_conf, redis_clients,
                      wait_port, wait_script_loaded)

pytestmark = pytest.mark.slow

ROUTES = """\
  - name: limited
    match: { path: /lim }
    upstream: api
    limits:
      - { name: three, algorithm: fixed_window, limit: 3, window: 1h, key: ["header:X-K"] }
      - { name: bucket, algorithm: token_bucket, rate: 10/s, burst: 5, key: [ip, "query:u"] }
      - { name: log, algorithm: sliding_log, limit: 50, window: 10s, key: ["cookie:s"] }
  - name: gone
    match: { path: /gone }
    upstream: dead
  - name: open
    match: { path: /open }
    upstream: api
    limits:
      - { name: gcra, algorithm: gcra, rate: 1000/s, burst: 100, key: [path] }
      - { name: sw, algorithm: sliding_window, limit: 1000, window: 1m, key: [method] }
"""


def traffic(port):
    """A few hundred requests of every kind; returns how many were sent."""
    n = 0
    for i in range(60):                                   # allowed, then limited
        r = http_get(port, "/lim/a?u=%d" % (i % 7), headers=[("X-K", "k%d" % (i % 12)),
                                                          ("Cookie", "s=%d" % i)])
        assert r.status in (200, 429), r
        n += 1
    with Conn(port, timeout_s=20) as c:                   # keep-alive mix
        for i in range(40):
            c.send(build_request("GET", "/open/%d" % i))
            assert c.read_response().status == 200
            c.send(build_request("GET", "/nowhere"))
            assert c.read_response().status == 404
            n += 2
    with Conn(port, timeout_s=20) as c:                   # pipelined
        c.send(b"".join(build_request("GET", "/open/p%d" % i) for i in range(20)))
        for _ in range(20):
            assert c.read_response().status == 200
        n += 20
    for i in range(20):                                   # chunked bodies
        with Conn(port, timeout_s=20) as c:
            c.send(b"POST /open/c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                   b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
            assert c.read_response().status == 200
            n += 1
    bad = [b"GARBAGE\r\n\r\n", b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n", b"GET /%00 HTTP/1.1\r\nHost: x\r\n\r\n",
           build_request("GET", "/open", [("X-Big", "b" * 20000)]),
           b"POST /open HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n" + b"x" * 5000]
    for i in range(40):                                   # 400, 431, 413
        with Conn(port, timeout_s=20) as c:
            c.send(bad[i % len(bad)])
            try:
                assert c.read_response().status in (400, 413, 431)
            except (EOFError, ConnectionResetError):
                pass
            n += 1
    for i in range(10):                                   # HEAD, 502
        assert http_get(port, "/open/h", method="HEAD", timeout_s=20).status == 200
        assert http_get(port, "/gone", timeout_s=20).status == 502
        n += 2
    for i in range(20):                                   # cut short
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"POST /open HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc"
                  if i % 2 else b"GET /open/slow HT")
        s.close()
        n += 1
    return n


def test_valgrind_memcheck_clean(redis_server, upstream, tmp_path):
    if shutil.which("valgrind") is None:
        if os.environ.get("SLUICE_REQUIRE_VALGRIND"):
            pytest.fail("valgrind is not installed")
        pytest.skip("valgrind is not installed")
    from conftest import redis_cmd, sluice_bin
    redis_cmd(redis_server.port, "FLUSHALL")
    port, admin = free_port(), free_port()
    conf = make_conf(ROUTES, redis_timeout="500ms", max_header_bytes=8192)
    conf = conf.replace("workers: 1\n", "workers: 2\nadmin: { listen: 127.0.0.1:%d }\n"
                        "access_log: %s\n" % (admin, tmp_path / "access.log"))
    conf = conf.replace("client:\n", "client:\n  max_body_bytes: 1000\n")
    conf = (conf.replace("@LISTEN_PORT@", str(port))
            .replace("@REDIS_PORT@", str(redis_server.port))
            .replace("@UPSTREAM_PORT@", str(upstream.port))
            .replace("@DEAD_PORT@", str(free_port())))
    conf_path = tmp_path / "valgrind.yaml"
    conf_path.write_text(conf)
    log_path = tmp_path / "valgrind.log"
    before = redis_clients(redis_server.port)
    proc = subprocess.Popen(
        ["valgrind", "--leak-check=full", "--errors-for-leak-kinds=definite,indirect",
         "--show-leak-kinds=definite,indirect", "--error-exitcode=99",
         "--log-file=%s" % log_path, sluice_bin(), "-c", str(conf_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_port(port, proc, timeout_s=60), "sluice under valgrind did not listen"
        wait_script_loaded(redis_server.port, before, timeout_s=30)
        sent = traffic(port)
        assert http_get(admin, "/metrics", timeout_s=20).status == 200
        os.kill(proc.pid, signal.SIGUSR1)                 # reopen the access log
        time.sleep(0.5)
        os.kill(proc.pid, signal.SIGTERM)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    log = log_path.read_text()
    summary = [line.split("==", 2)[-1].strip() for line in log.splitlines()
               if "ERROR SUMMARY" in line or "definitely lost" in line
               or "indirectly lost" in line or "All heap blocks" in line]
    print("HARD-FIGURES valgrind requests=%d rc=%s %s" % (sent, rc, " | ".join(summary)))
    assert rc == 0, "sluice under valgrind exited %r:\n%s" % (rc, log[-6000:])
    assert "ERROR SUMMARY: 0 errors" in log, log[-6000:]
