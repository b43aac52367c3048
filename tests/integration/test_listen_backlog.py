# sluice - tests/integration/test_listen_backlog.py: the listening sockets
# keep the backlog sluice chose. worker.c listens with 4096 (capped by the
# kernel's somaxconn) and admin.c with 128; libevent's evconnlistener, given
# backlog -1, called listen() again with 128, so a burst of more than 128
# connects at once waited for SYN retransmits (1 s each).
import selectors
import socket
import subprocess
import time

from proxylib import start_proxy

ROUTES = """\
  - name: r
    match: { path: /r }
    upstream: api
"""


def backlog(port):
    """Send-Q of the listening socket on 127.0.0.1:port (its backlog)."""
    out = subprocess.run(["ss", "-Hltn", "sport = :%d" % port], capture_output=True,
                         text=True, timeout=10).stdout
    rows = [line.split() for line in out.splitlines() if line.strip()]
    assert len(rows) == 1, out
    return int(rows[0][2])


def test_listeners_keep_their_backlog(sluice, redis):
    with open("/proc/sys/net/core/somaxconn") as f:
        somaxconn = int(f.read())
    s = start_proxy(sluice, ROUTES, workers=1)
    assert backlog(s.port) == min(4096, somaxconn)
    assert backlog(s.admin_port) == min(128, somaxconn)


def test_burst_of_connects_beyond_128_is_accepted_at_once(sluice, redis):
    s = start_proxy(sluice, ROUTES, workers=1)
    socks = []
    t0 = time.monotonic()
    try:
        for _ in range(400):
            so = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            so.setblocking(False)
            so.connect_ex(("127.0.0.1", s.port))
            socks.append(so)
        sel = selectors.DefaultSelector()
        for so in socks:
            sel.register(so, selectors.EVENT_WRITE)
        done = 0
        deadline = t0 + 10.0
        while sel.get_map() and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=0.5):
                sel.unregister(key.fileobj)
                done += 1
        sel.close()
        took = time.monotonic() - t0
    finally:
        for so in socks:
            so.close()
    assert done == 400
    # a SYN dropped by a full backlog is retried after 1 s
    assert took < 0.9, took
