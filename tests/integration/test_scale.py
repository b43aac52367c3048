# sluice - tests/integration/test_scale.py: many connections and a soak.
#
# 10,000 idle client connections held open at once (the fd limit raised in
# this process, which sluice inherits), with sluice's RSS measured and a
# sample of them served afterwards; and a soak under wrk for SLUICE_SOAK_S
# seconds (default 180) with Redis restarted every 30 s, recording RSS
# growth and error counts. Slow: run by make test-slow.

import json
import os
import re
import resource
import select
import socket
import subprocess
import time

import pytest

from conftest import build_request, make_conf, wait_until
from loadlib import client_conf, proc_fds, proc_rss_kb, report

pytestmark = pytest.mark.slow

IDLE_CONNS = 10000
SOAK_S = int(os.environ.get("SLUICE_SOAK_S", "180"))
RESTART_EVERY_S = 30

ROUTES = """\
  - name: soak
    match: { path: / }
    upstream: api
    limits:
      - { name: per-key, algorithm: sliding_window, limit: 5, window: 10s, key: ["header:X-K"] }
      - { name: bucket, algorithm: token_bucket, rate: 100/s, burst: 50, key: ["header:X-K"] }
"""


@pytest.fixture
def many_fds():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 65536
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(hard, want)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    yield resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_ten_thousand_idle_connections(sluice, redis, many_fds):
    assert many_fds >= IDLE_CONNS + 1000, "cannot raise RLIMIT_NOFILE (got %d)" % many_fds
    s = sluice(client_conf(ROUTES, workers=2, top={"max_connections": 20000},
                         client={"idle_timeout": "300s", "header_timeout": "300s"}))
    rss0 = proc_rss_kb(s.proc.pid)
    socks = []
    t0 = time.monotonic()
    try:
        for i in range(IDLE_CONNS):
            socks.append(socket.create_connection(("127.0.0.1", s.port), timeout=5))
            if time.monotonic() - t0 > 60:
                break
        t_open = time.monotonic() - t0
        wait_until(lambda: proc_fds(s.proc.pid) >= IDLE_CONNS, 20, step_s=0.1)
        fds = proc_fds(s.proc.pid)
        time.sleep(1.0)
        rss1 = proc_rss_kb(s.proc.pid)
        # none was closed by sluice: an EOF would make it readable
        poller = select.poll()
        for sk in socks:
            poller.register(sk, select.POLLIN | select.POLLHUP | select.POLLERR)
        closed = len(poller.poll(0))
        # a sample, spread over all of them, is served
        sample = socks[::IDLE_CONNS // 200][:200]
        ok = 0
        for i, sk in enumerate(sample):
            sk.sendall(build_request("GET", "/sample", [("X-K", "s%d" % i)]))
        for sk in sample:
            sk.settimeout(10)
            data = b""
            while b"\r\n\r\n" not in data and len(data) < 65536:
                chunk = sk.recv(65536)
                if not chunk:
                    break
                data += chunk
            ok += data.startswith(b"HTTP/1.1 200")
        report("idle_10k", connections=len(socks), open_s="%.2f" % t_open, sluice_fds=fds,
               rss_before_kb=rss0, rss_after_kb=rss1,
               per_conn_bytes=int((rss1 - rss0) * 1024 / max(1, len(socks))),
               closed_by_sluice=closed, sample=len(sample), sample_ok=ok)
        assert len(socks) == IDLE_CONNS
        assert fds >= IDLE_CONNS, "sluice holds %d fds, expected >= %d" % (fds, IDLE_CONNS)
        assert closed == 0, "%d idle connections were closed" % closed
        assert ok == len(sample), "%d of %d sampled connections served" % (ok, len(sample))
        assert s.proc.poll() is None
    finally:
        for sk in socks:
            sk.close()


WRK_LUA = r"""
-- globals, not locals: done() reads each thread's `counts` with thread:get
n = 0
counts = {}
threads = {}
function setup(thread)
  table.insert(threads, thread)
end
function init(args)
  counts = {}
  math.randomseed(os.time() + tonumber(tostring({}):sub(8), 16) % 100000)
end
function request()
  n = n + 1
  return wrk.format("GET", "/soak/" .. n, { ["X-K"] = tostring(math.random(1, 20000)) })
end
function response(status, headers, body)
  counts[status] = (counts[status] or 0) + 1
end
function done(summary, latency, requests)
  local total = {}
  for _, t in ipairs(threads) do
    local c = t:get("counts") or {}
    for k, v in pairs(c) do total[k] = (total[k] or 0) + v end
  end
  local parts = {}
  for k, v in pairs(total) do table.insert(parts, string.format('"%d": %d', k, v)) end
  io.write("STATUS-JSON {" .. table.concat(parts, ", ") .. "}\n")
  io.write(string.format("ERRORS-JSON {\"connect\": %d, \"read\": %d, \"write\": %d, " ..
    "\"status\": %d, \"timeout\": %d}\n", summary.errors.connect, summary.errors.read,
    summary.errors.write, summary.errors.status, summary.errors.timeout))
end
"""


def test_soak_with_redis_restarts(sluice, own_redis, tmp_path):
    s = sluice(make_conf(ROUTES, on_error="allow", redis_timeout="100ms"),
               redis_port=own_redis.port)
    script = tmp_path / "soak.lua"
    script.write_text(WRK_LUA)
    out_path = tmp_path / "wrk.out"
    with open(out_path, "wb") as out:
        wrk = subprocess.Popen(["wrk", "-t2", "-c32", "-d%ds" % SOAK_S, "--timeout", "5s",
                                "-s", str(script), "http://127.0.0.1:%d/" % s.port],
                               stdout=out, stderr=subprocess.STDOUT)
    rss, restarts = [], 0
    t0 = time.monotonic()
    next_restart = t0 + RESTART_EVERY_S
    try:
        while wrk.poll() is None and time.monotonic() - t0 < SOAK_S + 30:
            rss.append((time.monotonic() - t0, proc_rss_kb(s.proc.pid)))
            assert s.proc.poll() is None, "sluice died during the soak"
            if time.monotonic() >= next_restart and time.monotonic() - t0 < SOAK_S - 5:
                own_redis.stop()
                time.sleep(1.0)
                own_redis.start()
                restarts += 1
                next_restart += RESTART_EVERY_S
            time.sleep(1.0)
        wrk.wait(timeout=30)
    finally:
        if wrk.poll() is None:
            wrk.kill()
            wrk.wait(timeout=5)
    text = out_path.read_text()
    m = re.search(r"STATUS-JSON (\{.*\})", text)
    statuses = {int(k): v for k, v in json.loads(m.group(1)).items()} if m else {}
    m = re.search(r"ERRORS-JSON (\{.*\})", text)
    errors = json.loads(m.group(1)) if m else None
    m = re.search(r"Requests/sec:\s+([\d.]+)", text)
    rps = float(m.group(1)) if m else 0.0
    warm = [kb for t, kb in rss if t >= RESTART_EVERY_S]
    rss_warm, rss_end, rss_max = warm[0], rss[-1][1], max(kb for _, kb in rss)
    growth = (rss_end - rss_warm) / rss_warm
    report("soak", seconds=SOAK_S, redis_restarts=restarts, requests=sum(statuses.values()),
           rps="%.0f" % rps, statuses=statuses, socket_errors=errors,
           rss_start_kb=rss[0][1], rss_warm_kb=rss_warm, rss_end_kb=rss_end,
           rss_max_kb=rss_max, growth_pct="%.1f" % (growth * 100))
    assert wrk.returncode == 0, text[-2000:]
    assert s.proc.poll() is None
    assert restarts >= SOAK_S // RESTART_EVERY_S - 1
    assert statuses and set(statuses) <= {200, 429}, statuses
    assert errors is not None and errors["connect"] == 0 and errors["timeout"] == 0, errors
    assert growth < 0.20, "RSS grew %.1f%% after warm-up" % (growth * 100)
