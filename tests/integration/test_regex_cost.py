# sluice - tests/integration/test_regex_cost.py: path_regex costs bounded CPU
# per request (issue 9, item 7).
#
# Routes with backtracking-prone patterns (an unanchored "/re/(.*)/login", the
# "(.*|a){1,120}b" family) get hostile paths up to the largest head the
# config allows. Each request must be answered (the right route, or a 400
# regex_limit when a match hits its limit) with sluice's CPU per request, read
# from /proc/PID/stat (utime + stime, all threads), under a bound; the limit
# is counted in sluice_regex_limit_total; captures still key the limits as
# before. Every loop is bounded in count and time.

import time

from conftest import Conn, build_request, redis_keys
from loadlib import proc_cpu_s, report
from proxylib import metrics, mval, start_proxy

MAX_HEAD = 65536
CPU_PER_REQUEST_S = 0.020
REQUESTS = 10           # per hostile kind: 10 ticks of 10 ms resolve 1 ms each
WALL_BUDGET_S = 8.0     # per kind: the unfixed code takes seconds a request

ROUTES = """\
  - name: login
    match: { path_regex: "/re/(.*)/login" }
    upstream: api
    limits:
      - { name: per-user, algorithm: fixed_window, limit: 2, window: 1h, key: ["capture:1"] }
  - name: alt
    match: { path_regex: "(.*|a){1,120}b", host: alt.test }
    upstream: api
    limits:
      - { name: alt-limit, algorithm: fixed_window, limit: 1000, window: 1h, key: [ip] }
  - name: alt2
    match: { path_regex: "^/x/(.*|a){1,120}(b|c)" }
    upstream: api
    limits:
      - { name: alt2-limit, algorithm: fixed_window, limit: 1000, window: 1h, key: [ip] }
  - name: rest
    match: { path: / }
    upstream: api
    limits:
      - { name: rest-limit, algorithm: fixed_window, limit: 1000, window: 1h, key: [ip] }
"""


def _target(prefix, unit, tail, head_room=300):
    """prefix + unit repeated + tail, as long as a head of MAX_HEAD allows."""
    n = (MAX_HEAD - head_room - len(prefix) - len(tail)) // len(unit)
    return prefix + unit * n + tail


def _get(port, target, host="localhost", timeout_s=10.0):
    with Conn(port, timeout_s) as c:
        c.send(build_request("GET", target, host=host))
        return c.read_response()


def _policy(resp):
    return resp.header("RateLimit-Policy") or ""


def _hostile(s, name, target, host="localhost"):
    """REQUESTS requests of one kind; returns (responses, CPU s per request)."""
    cpu0, t0 = proc_cpu_s(s.proc.pid), time.monotonic()
    out = []
    for _ in range(REQUESTS):
        out.append(_get(s.port, target, host=host))
        if time.monotonic() - t0 > WALL_BUDGET_S:
            break
    per = (proc_cpu_s(s.proc.pid) - cpu0) / len(out)
    report("sec_regex_" + name, path_bytes=len(target), requests=len(out),
           cpu_ms_per_request="%.1f" % (per * 1e3),
           statuses=",".join(sorted({str(r.status) for r in out})))
    return out, per


def _start(sluice):
    return start_proxy(sluice, ROUTES, max_header_bytes=MAX_HEAD)


def test_unanchored_dotstar_on_long_path(sluice, redis):
    """/re/(.*)/login against "/re/re/re/.../n": quadratic in the path for a
    backtracking matcher (146 ms at 15 KB with glibc's regexec)."""
    s = _start(sluice)
    for size, target in (("15k", "/re" * 5000 + "/n"), ("max", _target("", "/re", "/n"))):
        out, per = _hostile(s, "dotstar_" + size, target)
        assert len(out) == REQUESTS, "%d requests in %.0f s" % (len(out), WALL_BUDGET_S)
        for r in out:
            # Either the match gave up (400 regex_limit) or it decided (no
            # "/login" in the path: the catch-all route).
            assert r.status in (400, 200), r
            if r.status == 400:
                assert r.json() == {"error": "regex_limit"}, r
            else:
                assert "rest-limit" in _policy(r), r
        assert per < CPU_PER_REQUEST_S, "%.1f ms of CPU per request" % (per * 1e3)
    assert s.proc.poll() is None


def test_nested_alternation_on_long_path(sluice, redis):
    """(.*|a){1,120}b and (.*|a){1,120}(b|c) against "/aaaa...": 1.2 s a
    request with glibc at 15 KB. The first has no 'b' to find and falls
    through to the catch-all; the second must give up at its limit."""
    s = _start(sluice)
    ms0 = metrics(s.admin_port)
    out, per = _hostile(s, "alt_b", _target("/", "a", ""), host="alt.test")
    assert len(out) == REQUESTS, "%d requests in %.0f s" % (len(out), WALL_BUDGET_S)
    for r in out:
        assert r.status == 200 and "rest-limit" in _policy(r), r
    assert per < CPU_PER_REQUEST_S, "%.1f ms of CPU per request" % (per * 1e3)

    out, per = _hostile(s, "alt_bc", _target("/x/", "a", ""))
    assert len(out) == REQUESTS, "%d requests in %.0f s" % (len(out), WALL_BUDGET_S)
    for r in out:
        assert r.status == 400 and r.json() == {"error": "regex_limit"}, r
    assert per < CPU_PER_REQUEST_S, "%.1f ms of CPU per request" % (per * 1e3)
    ms1 = metrics(s.admin_port)
    assert (mval(ms1, "sluice_regex_limit_total", route="alt2") -
            mval(ms0, "sluice_regex_limit_total", route="alt2")) == REQUESTS
    assert (mval(ms1, "sluice_responses_total", route="", code="400") -
            mval(ms0, "sluice_responses_total", route="", code="400")) == REQUESTS

    # The same routes still match what they are for.
    r = _get(s.port, "/x/aaab")
    assert r.status == 200 and "alt2-limit" in _policy(r), r
    r = _get(s.port, "/aab", host="alt.test")
    assert r.status == 200 and "alt-limit" in _policy(r), r
    # This pattern takes 121 * 121 steps on any path that meets it; the step
    # budget (10,000,000 / path bytes, at most 100,000) allows them up to
    # ~680 bytes.
    r = _get(s.port, "/x/" + "a" * 300 + "c")
    assert r.status == 200 and "alt2-limit" in _policy(r), r


def test_limit_answer_keeps_the_connection(sluice, redis):
    """A 400 regex_limit is an answer to a well-formed request: the
    connection stays usable, and the next request on it is routed."""
    s = _start(sluice)
    with Conn(s.port, 10.0) as c:
        c.send(build_request("GET", _target("/x/", "a", "")))
        r = c.read_response()
        assert r.status == 400 and r.json() == {"error": "regex_limit"}, r
        assert r.header("Connection") is None
        c.send(build_request("GET", "/x/ab"))
        r = c.read_response()
        assert r.status == 200 and "alt2-limit" in _policy(r), r


def test_captures_still_key(sluice, redis):
    """capture:1 of the unanchored /re/(.*)/login keys per user as before:
    leftmost match, greedy group, normalised path, long captures hashed."""
    s = _start(sluice)
    seq = [_get(s.port, "/re/alice/login").status for _ in range(3)]
    assert seq == [200, 200, 429]
    assert _get(s.port, "/re//alice/./login").status == 429       # same user
    assert _get(s.port, "/a/re/alice/login?x=1").status == 429     # unanchored
    assert _get(s.port, "/re/bob/login").status == 200
    # Greedy: "/re/a/b/login" captures "a/b", a user of its own.
    assert [_get(s.port, "/re/a/b/login").status for _ in range(3)] == [200, 200, 429]
    # A long but harmless path matches quickly and keys by its capture.
    long_user = "u" * 20000
    cpu0 = proc_cpu_s(s.proc.pid)
    seq = [_get(s.port, "/re/%s/login" % long_user).status for _ in range(3)]
    cpu = proc_cpu_s(s.proc.pid) - cpu0
    assert seq == [200, 200, 429]
    assert cpu / 3 < CPU_PER_REQUEST_S, "%.1f ms of CPU per request" % (cpu / 3 * 1e3)
    keys = [k for k in redis_keys(redis.port) if b"per-user" in k]
    assert any(b"5:alice" in k for k in keys), keys
    assert any(b"3:bob" in k for k in keys), keys
    assert any(b"3:a/b" in k for k in keys), keys
    assert len(keys) == 4, keys         # alice, bob, a/b, the long one (hashed)
