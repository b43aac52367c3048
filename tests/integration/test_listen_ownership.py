# sluice - tests/integration/test_listen_ownership.py: a listen address
# belongs to one process.
#
# Every worker binds its own socket with SO_REUSEPORT, which on its own lets
# a second process of the same user join the group unnoticed: the kernel
# then split the connections between two configs (of 20 requests, 15 got
# one's limits and 5 the other's). A sluice now checks each address before
# any worker binds it and refuses to start when something listens there:
# exit 1, "address in use" naming the address, nothing bound. The first
# one keeps every connection; its own workers still share the address.

import socket
import subprocess
import uuid

from conftest import Conn, build_request, free_port, sluice_bin, stop_process
from proxylib import proxy_conf, start_proxy
from tls_listen_lib import start_tls, tls_listen_conf
from tlslib import CA


def routes(limit):
    return """\
  - name: r
    match: { path: /r }
    upstream: api
    limits:
      - { name: l, algorithm: fixed_window, limit: %d, window: 1h, key: ["header:X-K"] }
""" % limit


def fill(text, listen_port, redis_port):
    """The sluice fixture's substitutions, for a sluice started by hand."""
    return (text.replace("@LISTEN_PORT@", str(listen_port))
            .replace("@REDIS_PORT@", str(redis_port))
            .replace("@UPSTREAM_PORT@", str(free_port()))
            .replace("@DEAD_PORT@", str(free_port())))


def run_refused(tmp_path, text, timeout_s=10.0):
    """Start sluice on text; it must exit by itself within timeout_s.
    Returns (exit code, stderr). One that keeps running is stopped by PID."""
    conf = tmp_path / "second.yaml"
    conf.write_text(text)
    err = tmp_path / "second.stderr"
    with open(err, "wb") as f:
        proc = subprocess.Popen([sluice_bin(), "-c", str(conf)], stdout=subprocess.DEVNULL,
                                stderr=f)
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        stop_process(proc)
    return rc, err.read_text(errors="replace")


def limits_seen(port, n=20):
    """X-RateLimit-Limit of n requests (one fresh key), each on a fresh
    connection."""
    seen, k = [], [("X-K", uuid.uuid4().hex)]
    for _ in range(n):
        with Conn(port) as c:
            c.send(build_request("GET", "/r", k))
            r = c.read_response()
            assert r.status == 200, r
            seen.append(r.header("X-RateLimit-Limit"))
    return seen


def test_second_sluice_on_a_held_address_exits(sluice, redis, tmp_path):
    first = start_proxy(sluice, routes(1000), workers=2)
    text = proxy_conf(routes(7), workers=2, admin_port=free_port())
    rc, err = run_refused(tmp_path, fill(text, first.port, redis.port))
    assert rc == 1, (rc, err)
    assert "cannot listen on '127.0.0.1:%d': address in use" % first.port in err, err
    assert "listening on" not in err, err
    # every connection reaches the first one's config
    assert limits_seen(first.port) == ["1000"] * 20
    assert first.proc.poll() is None


def test_tls_listener_held_refuses_the_whole_start(sluice, redis, tmp_path):
    (tmp_path / "pki").mkdir()
    ca = CA(tmp_path / "pki")
    leaf = ca.leaf("ec", "ec", ["localhost"])
    first = start_tls(sluice, routes(1000), [leaf], workers=2)
    # a plain address that is free, and the first one's TLS address
    plain = free_port()
    text = tls_listen_conf(routes(7), [leaf], first.tls_port, workers=2,
                           admin_port=free_port())
    rc, err = run_refused(tmp_path, fill(text, plain, redis.port))
    assert rc == 1, (rc, err)
    assert "cannot listen on '127.0.0.1:%d': address in use" % first.tls_port in err, err
    # nothing was bound: the free address was not taken, even for a while
    s = socket.socket()
    try:
        assert s.connect_ex(("127.0.0.1", plain)) != 0
    finally:
        s.close()
    assert limits_seen(first.port) == ["1000"] * 20


def test_address_free_again_once_the_first_stops(sluice, redis):
    """The handover on one host: SIGTERM closes the first one's listeners at
    once (then it drains), and a new sluice takes the address, past the
    connections the first one left in TIME_WAIT."""
    first = start_proxy(sluice, routes(1000), workers=2)
    assert limits_seen(first.port, 4) == ["1000"] * 4
    assert stop_process(first.proc) == 0
    second = sluice(proxy_conf(routes(7), workers=2), listen_port=first.port)
    assert limits_seen(second.port, 4) == ["7"] * 4
