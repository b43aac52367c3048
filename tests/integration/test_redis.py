# sluice - tests/integration/test_redis.py: Redis down, back, slow, and flushed.
#
# Each test has a redis-server of its own so it can stop it. on_error allow
# forwards without rate-limit headers, deny answers 503 JSON; sluice
# reconnects by itself; a paused Redis costs no more than redis.timeout.

import time
import uuid

import pytest

from conftest import (Conn, build_request, http_get, make_conf, redis_cmd, rl_headers, timed_get,
                      wait_until)

ROUTES = """\
  - name: r
    match: { path: / }
    upstream: api
    limits:
      - { name: two, algorithm: fixed_window, limit: 2, window: 1h, key: ["header:X-K"] }
"""


def get(port, key):
    return timed_get(port, "/x", [("X-K", key)], 5)


def assert_limiting(port, key):
    for _ in range(2):
        r, _ = get(port, key)
        assert r.status == 200 and "X-RateLimit-Limit" in rl_headers(r), r
    r, _ = get(port, key)
    assert r.status == 429, r


def wait_limiting_resumes(port, timeout_s=8.0):
    """Poll (bounded) until a decision comes from Redis again; returns seconds."""
    return wait_until(lambda: "X-RateLimit-Limit" in rl_headers(get(port, uuid.uuid4().hex)[0]),
                      timeout_s, step_s=0.1,
                      what="limiting to resume after Redis came back")[1]


def test_redis_down_allow_then_back(sluice, own_redis):
    s = sluice(make_conf(ROUTES, on_error="allow"), redis_port=own_redis.port)
    assert_limiting(s.port, "before")
    own_redis.stop()
    for i in range(5):
        r, elapsed = get(s.port, "down")
        assert r.status == 200, r
        assert rl_headers(r) == {}, r
        assert r.json()["target"] == "/x"
        assert elapsed < 1.0, elapsed
    own_redis.start()
    wait_limiting_resumes(s.port)
    assert_limiting(s.port, "after")
    assert s.proc.poll() is None


def test_redis_down_deny_then_back(sluice, own_redis, upstream):
    s = sluice(make_conf(ROUTES, on_error="deny"), redis_port=own_redis.port)
    assert_limiting(s.port, "before")
    own_redis.stop()
    before = upstream.stats()["heads"]
    with Conn(s.port) as c:
        for i in range(3):
            t0 = time.monotonic()
            c.send(build_request("GET", "/x", [("X-K", "down")]))
            r = c.read_response()
            assert r.status == 503, r
            assert r.header("Content-Type", "").startswith("application/json"), r
            r.json()
            assert time.monotonic() - t0 < 1.0
    assert upstream.stats()["heads"] == before, "a denied request reached the upstream"
    own_redis.start()
    wait_limiting_resumes(s.port)
    assert_limiting(s.port, "after")


def test_redis_never_up_allow(sluice, tmp_path):
    from conftest import free_port
    s = sluice(make_conf(ROUTES, on_error="allow"), redis_port=free_port())
    r, elapsed = get(s.port, "k")
    assert r.status == 200 and rl_headers(r) == {}, r
    assert elapsed < 1.0


@pytest.mark.parametrize("on_error,status", [("allow", 200), ("deny", 503)])
def test_redis_paused_answers_within_timeout(sluice, own_redis, on_error, status):
    s = sluice(make_conf(ROUTES, on_error=on_error, redis_timeout="50ms"),
               redis_port=own_redis.port)
    r, _ = get(s.port, "warm")
    assert r.status == 200 and "X-RateLimit-Limit" in rl_headers(r), r
    redis_cmd(own_redis.port, "CLIENT", "PAUSE", "1000")
    r, elapsed = get(s.port, "paused")
    assert r.status == status, r
    assert "X-RateLimit-Limit" not in rl_headers(r), r
    assert elapsed < 0.5, "the decision waited %.3f s with redis.timeout 50ms" % elapsed
    time.sleep(1.1)
    wait_limiting_resumes(s.port)
    assert_limiting(s.port, "after-pause")


def test_scripts_flushed_noscript_reloads(sluice, redis):
    s = sluice(make_conf(ROUTES))
    assert_limiting(s.port, "k1")
    redis_cmd(redis.port, "SCRIPT", "FLUSH")
    # the next decision meets NOSCRIPT, reloads and retries: no failed request
    assert_limiting(s.port, "k2")


@pytest.mark.slow
def test_redis_restarts_repeatedly(sluice, own_redis):
    s = sluice(make_conf(ROUTES, on_error="allow"), redis_port=own_redis.port)
    for _ in range(3):
        own_redis.stop()
        for _ in range(5):
            r, elapsed = get(s.port, "x")
            assert r.status == 200 and elapsed < 1.0
        own_redis.start()
        wait_limiting_resumes(s.port)
    assert_limiting(s.port, "final")


# ------------------------------------------------- connection settings ----

def test_one_evalsha_per_request(sluice, redis):
    from conftest import redis_cmds
    s = sluice(make_conf("""\
  - name: five
    match: { path: / }
    upstream: api
    limits:
      - { name: a, algorithm: fixed_window, limit: 100, window: 1h, key: ["header:X-K"] }
      - { name: b, algorithm: sliding_window, limit: 100, window: 10s, key: ["header:X-K"] }
      - { name: c, algorithm: sliding_log, limit: 100, window: 10s, key: ["header:X-K"] }
      - { name: d, algorithm: token_bucket, rate: 100/s, burst: 100, key: ["header:X-K"] }
      - { name: e, algorithm: gcra, rate: 100/s, burst: 100, key: ["header:X-K"] }
"""))
    assert http_get(s.port, "/warm", headers=[("X-K", "w")]).status == 200
    redis_cmd(redis.port, "CONFIG", "RESETSTAT")
    with Conn(s.port) as c:
        for i in range(10):
            c.send(build_request("GET", "/x", [("X-K", "k")]))
            r = c.read_response()
            assert r.status == 200 and r.header("X-RateLimit-Limit") == "100", r
    stats = redis_cmds(redis.port, [("INFO", "commandstats")])[0].decode()
    calls = {}
    for line in stats.splitlines():
        if line.startswith("cmdstat_"):
            name, _, rest = line[len("cmdstat_"):].partition(":")
            calls[name] = int(rest.split("calls=")[1].split(",")[0])
    calls.pop("info", None)
    calls.pop("config|resetstat", None)
    assert calls.get("evalsha") == 10, calls
    # commands the script runs are counted too; the proxy itself sends EVALSHA only
    assert "eval" not in calls and "time" in calls, calls


def test_redis_unix_socket_url(sluice, tmp_path):
    from conftest import RedisServer
    sock_path = tmp_path / "redis.sock"
    srv = RedisServer(tmp_path, extra_args=["--unixsocket", str(sock_path),
                                            "--unixsocketperm", "700"]).start()
    try:
        conf = make_conf(ROUTES).replace("url: redis://127.0.0.1:@REDIS_PORT@/0",
                                         "url: unix://%s" % sock_path)
        s = sluice(conf, redis_port=srv.port)
        wait_limiting_resumes(s.port)
        assert_limiting(s.port, "unix")
        assert any(k.startswith(b"itest:") for k in redis_cmd(srv.port, "KEYS", "*"))
    finally:
        srv.stop()


def test_redis_url_db_and_password(sluice, tmp_path):
    from conftest import RedisServer, redis_cmds
    srv = RedisServer(tmp_path, password="s3cret").start()
    try:
        conf = make_conf(ROUTES).replace("url: redis://127.0.0.1:@REDIS_PORT@/0",
                                         "url: redis://:s3cret@127.0.0.1:@REDIS_PORT@/3")
        s = sluice(conf, redis_port=srv.port)
        wait_limiting_resumes(s.port)
        assert_limiting(s.port, "db3")
        db0, db3 = redis_cmds(srv.port, [("AUTH", "s3cret"), ("DBSIZE",), ("SELECT", "3"),
                                         ("DBSIZE",)])[1::2]
        assert db0 == 0 and db3 > 0, (db0, db3)
    finally:
        srv.stop()


def test_redis_url_user_and_password(sluice, tmp_path):
    from conftest import RedisServer
    srv = RedisServer(tmp_path, password="pw").start()
    try:
        conf = make_conf(ROUTES).replace("url: redis://127.0.0.1:@REDIS_PORT@/0",
                                         "url: redis://default:pw@127.0.0.1:@REDIS_PORT@/0")
        s = sluice(conf, redis_port=srv.port)
        wait_limiting_resumes(s.port)
        assert_limiting(s.port, "acl")
    finally:
        srv.stop()


def test_redis_wrong_password_follows_on_error(sluice, tmp_path):
    from conftest import RedisServer
    srv = RedisServer(tmp_path, password="right").start()
    try:
        conf = make_conf(ROUTES, on_error="deny").replace(
            "url: redis://127.0.0.1:@REDIS_PORT@/0",
            "url: redis://:wrong@127.0.0.1:@REDIS_PORT@/0")
        s = sluice(conf, redis_port=srv.port)
        r, elapsed = get(s.port, "k")
        assert r.status == 503, r
        assert elapsed < 1.0
    finally:
        srv.stop()
