# sluice - tests/integration/test_idle_memory.py: what an idle keep-alive
# client connection costs in RSS.
#
# IDLE_CONNS connections (the fd limit raised in this process, which sluice
# inherits), one request each (a decision in Redis and a 200 from the
# upstream), then left idle: sluice's VmRSS growth per connection must stay
# under IDLE_BYTES_MAX. make bench's memory row (10,000 connections, <= 64
# MiB) is the figure this guards; this is the same measurement, smaller.
# About 5 s (2,000 decisions through Redis and the Python upstream): slow.

import os
import re
import resource
import selectors
import socket
import time

import pytest

from conftest import make_conf
from loadlib import proc_rss_kb

pytestmark = pytest.mark.slow

IDLE_CONNS = int(os.environ.get("IDLE_MEMORY_CONNS", "2000"))
# Measured at 2,000 connections: 7,436-7,496 bytes per connection with the
# request state held by every idle connection (1ebd10e), 4,968-5,067 with it
# given back. 6 KiB is about the bench row's budget (64 MiB, less the 3 MiB
# sluice starts with, over 10,000 connections: 6.2 KiB) and fails the ~2.4
# KiB of request state (struct request 2,176 bytes, its path and key
# buffers) an idle connection used to keep.
IDLE_BYTES_MAX = 6 * 1024

ROUTES = """\
  - name: all
    match: { path: / }
    upstream: api
    limits:
      - { name: per-ip, algorithm: fixed_window, limit: 1000000000, window: 1h, key: [ip] }
"""


@pytest.fixture
def many_fds():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, IDLE_CONNS * 2 + 256)
    if want < IDLE_CONNS + 128:
        pytest.fail("RLIMIT_NOFILE hard limit %d is below %d" % (hard, IDLE_CONNS + 128))
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def connect_all(port, n, batch=100, timeout_s=30.0):
    """n connected sockets, batch at a time without blocking (a batch stays
    well below the accept backlog)."""
    socks = []
    deadline = time.monotonic() + timeout_s
    while len(socks) < n and time.monotonic() < deadline:
        sel = selectors.DefaultSelector()
        for _ in range(min(batch, n - len(socks))):
            so = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            so.setblocking(False)
            so.connect_ex(("127.0.0.1", port))
            sel.register(so, selectors.EVENT_WRITE)
        while sel.get_map() and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=1.0):
                so = key.fileobj
                sel.unregister(so)
                err = so.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                assert err == 0, "connect: %s" % os.strerror(err)
                socks.append(so)
        sel.close()
    assert len(socks) == n, "%d of %d connected" % (len(socks), n)
    return socks


def request_all(socks, timeout_s=60.0, batch=200):
    """One GET on each socket, the whole response read; {status: count}."""
    req = b"GET / HTTP/1.1\r\nHost: idle\r\n\r\n"
    statuses = {}
    deadline = time.monotonic() + timeout_s
    for i in range(0, len(socks), batch):
        sel = selectors.DefaultSelector()
        bufs = {}
        for s in socks[i:i + batch]:
            s.setblocking(True)
            s.sendall(req)
            s.setblocking(False)
            bufs[s] = b""
            sel.register(s, selectors.EVENT_READ)
        while bufs and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=1.0):
                s = key.fileobj
                try:
                    data = s.recv(65536)
                except BlockingIOError:
                    continue
                bufs[s] += data
                head, sep, body = bufs[s].partition(b"\r\n\r\n")
                m = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", head)
                if not data or (sep and m and len(body) >= int(m.group(1))):
                    st = head[9:12].decode("ascii", "replace") if data else "closed"
                    statuses[st] = statuses.get(st, 0) + 1
                    sel.unregister(s)
                    del bufs[s]
        if bufs:
            statuses["no answer"] = statuses.get("no answer", 0) + len(bufs)
        sel.close()
    return statuses


def sanitized(pid):
    """An ASan build (make SANITIZE=1): its redzones and quarantine are not
    the RSS this measures."""
    with open("/proc/%d/maps" % pid) as f:
        return "libasan" in f.read()


def test_idle_keepalive_connections_rss(sluice, many_fds):
    conf = make_conf(ROUTES).replace(
        "client:\n", "max_connections: 0\nclient:\n  header_timeout: 5m\n  idle_timeout: 5m\n")
    s = sluice(conf)
    pid = s.proc.pid
    socks = []
    warm = []
    try:
        # Warm up: the first requests allocate the worker's pools and scratch.
        warm = connect_all(s.port, 20)
        assert request_all(warm) == {"200": 20}
        for w in warm:
            w.close()
        time.sleep(0.3)
        rss0 = proc_rss_kb(pid)
        socks = connect_all(s.port, IDLE_CONNS)
        statuses = request_all(socks)
        assert statuses == {"200": IDLE_CONNS}, statuses
        time.sleep(0.5)
        rss1 = proc_rss_kb(pid)
        assert s.proc.poll() is None
    finally:
        for so in socks:
            so.close()
    per_conn = (rss1 - rss0) * 1024 / IDLE_CONNS
    print("idle memory: %d connections, RSS %d -> %d KiB, %.0f bytes per connection"
          % (IDLE_CONNS, rss0, rss1, per_conn))
    if sanitized(pid):
        pytest.skip("ASan build: %.0f bytes per connection, not comparable" % per_conn)
    assert per_conn <= IDLE_BYTES_MAX, \
        "%.0f bytes of RSS per idle keep-alive connection (at most %d)" % (per_conn, IDLE_BYTES_MAX)
