# sluice - tests/integration/test_redis_conn.py: Redis on connections sluice owns.
#
# A decision made while the connection is being made waits for it (within
# redis.timeout) instead of getting on_error; one made while sluice waits out
# the backoff after a refused attempt gets on_error at once. Names in
# redis.url resolve without blocking the loop: an LD_PRELOAD shim makes the
# libc resolver sleep, and every request is still answered in time.

import os
import signal
import subprocess
import threading
import time

import pytest

from conftest import (HERE, ROOT, Conn, build_request, free_port, make_conf,
                      parallel, rl_headers, timed_get, wait_port, wait_until)

ROUTES = """\
  - name: r
    match: { path: / }
    upstream: api
    limits:
      - { name: two, algorithm: fixed_window, limit: 2, window: 1h, key: ["header:X-K"] }
"""


def get(port, key, timeout_s=5):
    return timed_get(port, "/x", [("X-K", key)], timeout_s)


def test_frozen_redis_at_start_requests_wait(sluice, own_redis):
    """Redis is stopped (SIGSTOP: its kernel still accepts, nothing replies)
    when sluice starts, and thawed 400 ms after the first requests went out:
    those requests are decided by Redis (2 allowed, then 429 at the limit),
    not on_error (deny would be 503)."""
    os.kill(own_redis.proc.pid, signal.SIGSTOP)
    try:
        s = sluice(make_conf(ROUTES, on_error="deny", redis_timeout="2s"),
                   redis_port=own_redis.port, wait_redis=False)
        t0 = time.monotonic()
        results = []

        def thaw():
            time.sleep(0.4)
            os.kill(own_redis.proc.pid, signal.SIGCONT)
            return time.monotonic() - t0
        fns = [lambda: get(s.port, "frozen") for _ in range(4)] + [thaw]
        results = parallel(fns, join_timeout_s=15)
    finally:
        os.kill(own_redis.proc.pid, signal.SIGCONT)
    for r in results[:4]:
        assert not isinstance(r, Exception), r
    statuses = sorted(r.status for r, _ in results[:4])
    assert statuses == [200, 200, 429, 429], [r for r, _ in results[:4]]
    for r, elapsed in results[:4]:
        assert "X-RateLimit-Limit" in rl_headers(r), r
        # sent while Redis was frozen, answered after the thaw
        assert 0.3 <= elapsed < 2.0, elapsed
    assert "down" not in s.stderr, s.stderr


def test_frozen_redis_past_timeout_is_on_error(sluice, own_redis):
    """A connection that does not come within redis.timeout: the waiting
    decision gets on_error as a timeout, after redis.timeout and not much more."""
    os.kill(own_redis.proc.pid, signal.SIGSTOP)
    try:
        s = sluice(make_conf(ROUTES, on_error="deny", redis_timeout="300ms"),
                   redis_port=own_redis.port, wait_redis=False)
        r, elapsed = get(s.port, "frozen")
    finally:
        os.kill(own_redis.proc.pid, signal.SIGCONT)
    assert r.status == 503, r
    assert 0.25 <= elapsed < 0.8, elapsed


def test_redis_refused_on_error_at_once(sluice):
    """Nothing listens: every attempt is refused at once, and between attempts
    (the backoff) a decision gets on_error at once, well under redis.timeout."""
    s = sluice(make_conf(ROUTES, on_error="deny", redis_timeout="2s"),
               redis_port=free_port(), wait_redis=False)
    worst = 0.0
    with Conn(s.port) as c:
        for i in range(20):
            t0 = time.monotonic()
            c.send(build_request("GET", "/x", [("X-K", "refused")]))
            r = c.read_response()
            worst = max(worst, time.monotonic() - t0)
            assert r.status == 503, r
            time.sleep(0.02)
    assert worst < 0.2, "an on_error answer took %.3f s with Redis refusing" % worst


# ---- names resolve without blocking the loop --------------------------------

SHIM_SRC = os.path.join(ROOT, "tests", "shim", "slow_getaddrinfo.c")


@pytest.fixture
def slow_resolver(tmp_path):
    """The shim as a shared object: getaddrinfo() of a name sleeps 2 s."""
    so = tmp_path / "slow_getaddrinfo.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(so), SHIM_SRC, "-ldl"],
                   check=True, timeout=60)
    env = {"LD_PRELOAD": str(so), "SLOW_GETADDRINFO_MS": "2000"}
    # an ASan build insists on coming first in the library list
    env["ASAN_OPTIONS"] = ":".join(filter(None, [os.environ.get("ASAN_OPTIONS", ""),
                                                 "verify_asan_link_order=0"]))
    return env


def test_shim_slows_getaddrinfo(slow_resolver):
    """The shim works: a name takes 2 s through the libc resolver."""
    code = "import socket,time; t=time.monotonic(); socket.getaddrinfo('localhost', 1); " \
           "print(time.monotonic()-t)"
    env = dict(os.environ)
    env.update(slow_resolver)
    out = subprocess.run(["/usr/bin/python3", "-c", code], env=env, capture_output=True,
                         text=True, timeout=30, check=True)
    assert float(out.stdout) >= 1.9, out.stdout


def test_redis_name_resolves_without_blocking(sluice, own_redis, slow_resolver):
    """redis.url names localhost; the libc resolver takes 2 s a name. Redis is
    restarted under load (on_error: allow): sluice reconnects through evdns
    (/etc/hosts), so every request is answered within redis.timeout + 100 ms,
    and limiting resumes."""
    conf = make_conf(ROUTES, on_error="allow", redis_timeout="300ms").replace(
        "redis://127.0.0.1:", "redis://localhost:")
    s = sluice(conf, redis_port=own_redis.port, env=slow_resolver)
    r, _ = get(s.port, "warm")
    assert r.status == 200, r
    worst = [0.0]
    limited = [0]
    stop = threading.Event()

    def load():
        n = 0
        with Conn(s.port) as c:
            while not stop.is_set() and n < 2000:
                n += 1
                t0 = time.monotonic()
                c.send(build_request("GET", "/x", [("X-K", "load%d" % n)]))
                resp = c.read_response()
                worst[0] = max(worst[0], time.monotonic() - t0)
                assert resp.status == 200, resp
                if "X-RateLimit-Limit" in rl_headers(resp):
                    limited[0] += 1
                time.sleep(0.005)
    t = threading.Thread(target=load)
    t.start()
    try:
        time.sleep(0.3)
        own_redis.stop()
        time.sleep(0.3)
        own_redis.start()
        before = limited[0]
        wait_until(lambda: limited[0] != before, 3.0, step_s=0.05)
        time.sleep(0.3)
    finally:
        stop.set()
        t.join(10)
    assert not t.is_alive()
    assert worst[0] < 0.4, "a request took %.3f s (redis.timeout 300ms)" % worst[0]
    assert limited[0] > before, "limiting did not resume after the restart"


@pytest.mark.parametrize("redis_yaml,where", [
    ("  url: redis://no-such-host.invalid:6379/0\n", "redis.url"),
    ("  cluster: [127.0.0.1:7000, no-such-host.invalid:7001]\n", "redis.cluster"),
])
def test_check_names_at_t(tmp_path, redis_yaml, where):
    """sluice -t looks the Redis names up once: one that does not resolve is a
    config error naming its place (a running sluice resolves at each connect)."""
    from conftest import sluice_bin
    conf = ("listen: 127.0.0.1:8080\nupstreams:\n  api:\n    servers: [127.0.0.1:9000]\n"
            "routes:\n  - name: d\n    match: { path: / }\n    upstream: api\n"
            "redis:\n" + redis_yaml)
    path = tmp_path / "names.yaml"
    path.write_text(conf)
    out = subprocess.run([sluice_bin(), "-t", "-c", str(path)], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 1, out
    assert out.stderr.startswith("%s:10:" % path), out.stderr
    assert "%s" % where in out.stderr and "cannot resolve redis host 'no-such-host.invalid'" \
        in out.stderr, out.stderr
