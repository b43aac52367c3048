# sluice - test_http2_abuse.py: HTTP/2's attacks, sent frame by frame.
#
# Rapid reset (CVE-2023-44487: 10,000 HEADERS+RST_STREAM pairs end in
# GOAWAY, the upstream sees at most the stream cap), CONTINUATION floods,
# an HPACK bomb (431 on its stream), PING floods from a client that does not
# read, a window never opened, the requests-per-connection bound (graceful
# GOAWAY) and the preface timeout. Each connection first gets one ordinary
# answer, so each test also shows that HTTP/2 was served at all.

import os
import socket
import subprocess
import threading
import time

from conftest import wait_until
from h2lib import RawH2, continuation_frame, headers_frame, rst_frame
from proxylib import proxy_conf
from test_idle_memory import sanitized

ROUTES = """\
  - name: decided
    match: { path: / }
    upstream: api
    limits:
      - { name: many, algorithm: fixed_window, limit: 100000000, window: 1h, key: [ip] }
"""


def start(sluice, client=""):
    """sluice on ROUTES with more client: lines (each indented by 2)."""
    text = proxy_conf(ROUTES)
    assert "\nclient:\n" in text
    return sluice(text.replace("\nclient:\n", "\nclient:\n" + client, 1))


def served(c, path="/first"):
    sid = c.request(path)
    return c.response(sid)[0]


def cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def prior_knowledge_ok(port):
    p = subprocess.run(["/usr/bin/curl", "-s", "-o", "/dev/null", "-w", "%{http_version} %{http_code}",
                        "--http2-prior-knowledge", "http://127.0.0.1:%d/after" % port],
                       capture_output=True, timeout=30)
    return p.stdout == b"2 200"


def test_rapid_reset(sluice, upstream):
    s = start(sluice)
    c = RawH2(s.port)
    assert served(c) == 200
    heads = upstream.stats()["heads"]
    cpu = cpu_s(s.proc.pid)
    sent = 0
    for _ in range(100):
        batch = b""
        for _ in range(100):
            sid = c.next_sid
            c.next_sid += 2
            batch += headers_frame(sid, c.block("/rr")) + rst_frame(sid)
        if not c.send(batch):
            break
        sent += 100
        c.pump(0)
    c.wait(lambda c: c.goaway is not None, 10)
    assert c.goaway is not None, "no GOAWAY after %d resets" % sent
    c.close()
    time.sleep(0.5)
    seen = upstream.stats()["heads"] - heads
    used = cpu_s(s.proc.pid) - cpu
    print("rapid reset: %d pairs sent, GOAWAY %r, upstream saw %d, sluice CPU %.2f s"
          % (sent, c.goaway, seen, used))
    assert seen <= 128
    assert used < 20
    assert prior_knowledge_ok(s.port)


def test_continuation_flood(sluice):
    s = start(sluice)
    c = RawH2(s.port)
    assert served(c) == 200
    sid = c.next_sid
    c.send(headers_frame(sid, c.block("/flood"), end_headers=False))
    for i in range(200):
        if not c.send(continuation_frame(sid, c.enc.encode([("x-c%d" % i, "v")]))):
            break
    c.wait(lambda c: c.closed, 10)
    assert c.closed
    assert c.stream(sid)["headers"] == []
    c.close()
    assert prior_knowledge_ok(s.port)


def test_hpack_bomb_is_431(sluice, upstream):
    s = start(sluice)
    c = RawH2(s.port)
    assert served(c) == 200
    heads = upstream.stats()["heads"]
    # one 4000-byte field into the table, then 3000 one-byte references to
    # it: 12 MB decoded from a 7 KB frame
    sid = c.next_sid
    c.next_sid += 2
    block = c.block("/bomb", extra=[("x-bomb", "a" * 4000)]) + b"\xbe" * 3000
    c.send(headers_frame(sid, block))
    assert c.response(sid)[0] == 431
    assert served(c, "/after-bomb") == 200
    assert upstream.stats()["heads"] - heads == 1
    assert c.goaway is None and not c.closed
    c.close()


def test_ping_flood_unread(sluice):
    s = start(sluice, client="  idle_timeout: 2s\n")
    c = RawH2(s.port)
    assert served(c) == 200
    rss = rss_kb(s.proc.pid)
    from hyperframe.frame import PingFrame
    ping = PingFrame(0)
    ping.opaque_data = b"12345678"
    burst = ping.serialize() * 1000
    c.sock.settimeout(10)
    # 17 KB a burst, never reading an ACK: past its frame budget sluice says
    # GOAWAY (ENHANCE_YOUR_CALM), drops what still comes for a second, and
    # closes; answers it cannot send are not kept beyond its output bound
    t0 = time.monotonic()
    for _ in range(2000):
        try:
            c.sock.sendall(burst)
        except OSError:
            break
    c.wait(lambda c: c.closed, 15)
    took = time.monotonic() - t0
    assert c.closed, "still open after %.1f s" % took
    grown = rss_kb(s.proc.pid) - rss
    print("PING flood: closed after %.1f s, RSS grew %d KiB" % (took, grown))
    if not sanitized(s.proc.pid):      # ASan's quarantine is not what this bounds
        assert grown < 16 * 1024
    c.close()
    assert prior_knowledge_ok(s.port)


def flood_frames(c, frame, n=30000, batch=1000):
    """n copies of frame, in batches, reading between them (no write
    stalls: this is about frames sluice must process, not unread ACKs)."""
    for _ in range(n // batch):
        if not c.send(frame * batch):
            break
        c.pump(0.001)


def test_empty_data_and_window_update_floods(sluice):
    from hyperframe.frame import DataFrame, WindowUpdateFrame
    s = start(sluice)
    for make in ("empty DATA", "WINDOW_UPDATE"):
        c = RawH2(s.port)
        assert served(c) == 200
        sid = c.request("/upload", method="POST", end=False)
        if make == "empty DATA":
            frame = DataFrame(sid).serialize()          # no payload, no END_STREAM
        else:
            w = WindowUpdateFrame(0)
            w.window_increment = 1
            frame = w.serialize()
        flood_frames(c, frame)
        c.wait(lambda c: c.goaway is not None, 10)
        assert c.goaway is not None and c.goaway[0] == 11, (make, c.goaway)  # ENHANCE_YOUR_CALM
        c.close()
    # a connection that works for its frames is not cut: 300 requests, each
    # with a PING and a WINDOW_UPDATE beside it
    c = RawH2(s.port)
    from hyperframe.frame import PingFrame
    for i in range(300):
        p = PingFrame(0)
        p.opaque_data = b"%08d" % i
        c.send(p.serialize())
        assert served(c, "/ok%d" % i) == 200
    assert c.goaway is None
    c.close()


def test_window_never_opened(sluice):
    s = start(sluice, client="  idle_timeout: 2s\n")
    c = RawH2(s.port, settings={0x4: 0})     # SETTINGS_INITIAL_WINDOW_SIZE 0
    rss = rss_kb(s.proc.pid)
    sid = c.request("/big/20000000")
    t0 = time.monotonic()
    c.wait(lambda c: c.stream(sid)["reset"] is not None or c.goaway is not None, 20)
    took = time.monotonic() - t0
    assert c.stream(sid)["headers"][0][":status"] == "200"
    assert c.stream(sid)["data"] == b""
    assert c.stream(sid)["reset"] is not None or c.goaway is not None
    grown = rss_kb(s.proc.pid) - rss
    print("zero window: reset after %.1f s, RSS grew %d KiB" % (took, grown))
    if not sanitized(s.proc.pid):
        assert grown < 8 * 1024  # not the 20 MB body
    c.close()


def test_max_requests_graceful_goaway(sluice):
    s = start(sluice, client="  http2_max_requests: 5\n")
    c = RawH2(s.port)
    for i in range(5):
        sid = c.request("/r%d" % i)
        assert c.response(sid)[0] == 200
    c.wait(lambda c: c.goaway is not None, 5)
    assert c.goaway == (0, 9)
    c.wait(lambda c: c.closed, 5)
    assert c.closed
    c.close()


def test_preface_without_settings_times_out(sluice):
    s = start(sluice, client="  header_timeout: 1s\n")
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
    sock.sendall(RawH2.PREFACE)
    t0 = time.monotonic()
    got = b""
    while True:
        d = sock.recv(4096)
        if not d:
            break
        got += d
    took = time.monotonic() - t0
    sock.close()
    assert got[3:4] == b"\x04"      # our SETTINGS first, not an HTTP/1.1 400
    assert 0.5 < took < 8
    assert wait_until(lambda: prior_knowledge_ok(s.port), 5)


def test_reset_streams_hold_their_slots_until_cancelled(sluice, upstream):
    s = start(sluice, client="  http2_max_streams: 2\n")
    c = RawH2(s.port)
    heads = upstream.stats()["heads"]
    a, b = c.request("/slow/3000"), c.request("/slow/3000")
    assert wait_until(lambda: upstream.stats()["heads"] - heads >= 2, 10)
    # Both reset, a third stream in the same write: nghttp2 counts two
    # closed streams, but their exchanges are not cancelled yet: refused.
    sid = c.next_sid
    c.next_sid += 2
    c.send(rst_frame(a) + rst_frame(b) + headers_frame(sid, c.block("/third")))
    c.wait(lambda c: c.stream(sid)["reset"] is not None or c.stream(sid)["ended"], 10)
    assert c.stream(sid)["reset"] == 7         # REFUSED_STREAM: safe to retry
    # once cancelled (within a loop turn), the slots are free again
    assert served(c, "/fourth") == 200
    assert c.goaway is None
    c.close()
