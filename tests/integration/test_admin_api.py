# sluice - tests/integration/test_admin_api.py: the admin API's limit endpoints (issue 14).
#
# The token rule (Bearer admin.token from ${VAR}: 401 missing or wrong, 403
# with no token configured; reads need it too when one is set), bad input answered 400 with a JSON
# error and nothing written, a key's state read without consuming, and the
# bounds on what the admin endpoint reads (body size, chunked bodies).

import json
import time

from apilib import TOKEN, api, get_k, start_api
from conftest import Conn, build_request, http_get, redis_cmd, redis_keys

ROUTES = """\
  - name: r
    match: { path: /r }
    upstream: api
    limits:
      - { name: fw, algorithm: fixed_window, limit: 2, window: 1h, key: ["header:X-K"] }
      - { name: two, algorithm: sliding_log, limit: 5, window: 1h, key: [ip, "header:X-K"] }
  - name: g
    match: { path: /g }
    upstream: api
    limits:
      - { name: gc, algorithm: gcra, rate: 10/m, burst: 3, key: ["header:X-K"] }
"""

WRITES = [("PUT", "/api/limits/r/fw/override?key=k", {"limit": 50}),
          ("DELETE", "/api/limits/r/fw/override?key=k", None),
          ("POST", "/api/limits/r/fw/reset?key=k", None)]


def ovr_keys(port):
    return [k for k in redis_keys(port) if k.endswith(b":ovr")]


def test_writes_need_the_token(sluice, redis):
    s = start_api(sluice, ROUTES)
    redis_cmd(redis.port, "SET", "itest:{r|fw|1:k}:ovr", "0 4 0")     # an override to keep
    assert [get_k(s, "/r", "k") for _ in range(5)] == [200] * 4 + [429]
    for method, path, body in WRITES:
        for token, hdrs in ((None, []), ("wrong", []), (TOKEN + "x", []),
                            (None, [("Authorization", "Basic " + TOKEN)]),
                            (None, [("Authorization", TOKEN)])):
            code, doc, r = api(s, method, path, body, token=token, headers=hdrs)
            assert code == 401, (method, token, hdrs, code, doc)
            assert "error" in doc and r.header("WWW-Authenticate", "").startswith("Bearer")
    # nothing changed: the override and the count stand
    assert redis_cmd(redis.port, "GET", "itest:{r|fw|1:k}:ovr") == b"0 4 0"
    assert get_k(s, "/r", "k") == 429
    # with admin.token set, reads show keys: they need it too (issue 18 item 8)
    code, doc, r = api(s, "GET", "/api/limits/r/fw?key=k", token=None)
    assert code == 401 and r.header("WWW-Authenticate", "").startswith("Bearer"), doc
    code, doc, _ = api(s, "GET", "/api/limits/r/fw?key=k")
    assert code == 200 and doc["source"] == "runtime" and doc["params"]["limit"] == 4, doc
    # the right token works
    code, doc, _ = api(s, "POST", "/api/limits/r/fw/reset?key=k")
    assert code == 200, doc


def test_no_token_configured_refuses_writes(sluice, redis):
    s = start_api(sluice, ROUTES, token=None)
    # no token, no API writes: decisions do not read override keys at all
    redis_cmd(redis.port, "SET", "itest:{r|fw|1:k}:ovr", "0 9 0")
    assert [get_k(s, "/r", "k") for _ in range(3)] == [200, 200, 429]
    redis_cmd(redis.port, "DEL", "itest:{r|fw|1:k}:ovr")
    for method, path, body in WRITES:
        for token in (None, TOKEN, ""):
            code, doc, _ = api(s, method, path, body, token=token)
            assert code == 403 and "admin.token" in doc["error"], (method, code, doc)
    assert ovr_keys(redis.port) == []
    assert get_k(s, "/r", "k") == 429
    code, doc, _ = api(s, "GET", "/api/limits/r/fw?key=k", token=None)
    assert code == 200 and doc["allowed"] is False, doc


BAD = [
    ("PUT", "/api/limits/nope/fw/override?key=k", {"limit": 3}, "unknown route"),
    ("PUT", "/api/limits/r/nope/override?key=k", {"limit": 3}, "unknown limit"),
    ("PUT", "/api/limits/r/fw/override", {"limit": 3}, "1 part; got 0"),
    ("PUT", "/api/limits/r/fw/override?key=a&key=b", {"limit": 3}, "1 part; got 2"),
    ("PUT", "/api/limits/r/two/override?key=a", {"limit": 3}, "2 parts; got 1"),
    ("PUT", "/api/limits/r/fw/override?key=k&x=1", {"limit": 3}, "unknown query parameter"),
    ("PUT", "/api/limits/r/fw/override?key=%zz", {"limit": 3}, "escape"),
    ("PUT", "/api/limits/g/gc/override?key=k", {"rate": "fast"}, "bad rate"),
    ("PUT", "/api/limits/g/gc/override?key=k", {"rate": "0/s"}, "bad rate"),
    ("PUT", "/api/limits/g/gc/override?key=k", {"limit": 3}, "not limit"),
    ("PUT", "/api/limits/r/fw/override?key=k", {"rate": "1/s"}, "takes limit"),
    ("PUT", "/api/limits/r/fw/override?key=k", {"limit": 0}, "1..1000000000"),
    ("PUT", "/api/limits/r/fw/override?key=k", {"limit": "3"}, "integer"),
    ("PUT", "/api/limits/r/fw/override?key=k", {"limit": 3, "color": "red"}, "unknown field"),
    ("PUT", "/api/limits/r/fw/override?key=k", {"limit": 3, "ttl": "soon"}, "bad ttl"),
    ("PUT", "/api/limits/r/fw/override?key=k", b'{"limit": 3', "expected"),
    ("PUT", "/api/limits/r/fw/override?key=k", b'', "JSON object"),
    ("PUT", "/api/limits/r/fw/override?key=k", {}, "give limit"),
    ("POST", "/api/limits/r/fw/reset?key=a&key=b", None, "got 2"),
    ("GET", "/api/limits/r/two?key=a", None, "2 parts; got 1"),
]


def test_bad_input_is_400_and_changes_nothing(sluice, redis):
    s = start_api(sluice, ROUTES)
    assert [get_k(s, "/r", "k") for _ in range(3)] == [200, 200, 429]
    before = sorted(redis_keys(redis.port))
    for method, path, body, msg in BAD:
        code, doc, r = api(s, method, path, body)
        assert code == 400, (method, path, code, r.body)
        assert r.header("Content-Type") == "application/json"
        assert msg in doc["error"], (path, body, doc)
        assert sorted(redis_keys(redis.port)) == before, (path, body)
        assert get_k(s, "/r", "k") == 429, (path, body)   # count and deny cache stand


def test_state_reads_without_consuming(sluice, redis):
    s = start_api(sluice, ROUTES)
    code, doc, _ = api(s, "GET", "/api/limits/g/gc?key=u1")
    assert code == 200, doc
    assert doc == {"route": "g", "limit": "gc", "key": ["u1"], "algorithm": "gcra",
                   "source": "limit", "params": {"burst": 3, "interval_us": 6000000},
                   "config_params": {"burst": 3, "interval_us": 6000000},
                   "allowed": True, "remaining": 3, "reset_ms": 0, "retry_ms": None}, doc
    for _ in range(5):          # reads consume nothing
        api(s, "GET", "/api/limits/g/gc?key=u1")
    assert [get_k(s, "/g", "u1") for _ in range(4)] == [200, 200, 200, 429]
    code, doc, _ = api(s, "GET", "/api/limits/g/gc?key=u1")
    assert doc["allowed"] is False and doc["remaining"] == 0, doc
    assert 0 < doc["retry_ms"] <= 6000 and 0 < doc["reset_ms"] <= 18000, doc
    # a two-part key, %-encoded in the query as the client sends it
    assert get_k(s, "/r", "a b") == 200
    code, doc, _ = api(s, "GET", "/api/limits/r/two?key=127.0.0.1&key=a%20b")
    assert code == 200 and doc["remaining"] == 4 and doc["key"] == ["127.0.0.1", "a b"], doc


def test_methods_and_bounds(sluice, redis):
    s = start_api(sluice, ROUTES)
    code, doc, r = api(s, "POST", "/api/limits/r/fw?key=k")
    assert code == 405 and r.header("Allow") == "GET", doc
    code, doc, r = api(s, "GET", "/api/limits/r/fw/override?key=k")
    assert code == 405 and r.header("Allow") == "PUT, DELETE", doc
    code, doc, r = api(s, "GET", "/api/limits/r")
    assert code == 404, doc
    # a body over 4 KB is refused unread; a chunked one too; then close
    big = json.dumps({"limit": 3, "ttl": "1d" + " " * 5000}).encode()
    code, doc, r = api(s, "PUT", "/api/limits/r/fw/override?key=k", big)
    assert code == 413
    data = build_request("PUT", "/api/limits/r/fw/override?key=k",
                         [("Authorization", "Bearer " + TOKEN),
                          ("Transfer-Encoding", "chunked")], b"5\r\n{}   \r\n0\r\n\r\n")
    with Conn(s.admin_port, 5.0) as c:
        c.send(data)
        assert c.read_response().status == 413
    assert ovr_keys(redis.port) == []
    # a body sent in pieces, on a keep-alive connection, then a second request
    body = b'{"limit": 4}'
    head = build_request("PUT", "/api/limits/r/fw/override?key=k",
                         [("Authorization", "Bearer " + TOKEN),
                          ("Content-Length", str(len(body)))])
    with Conn(s.admin_port, 5.0) as c:
        c.send(head + body[:5])

        time.sleep(0.1)
        c.send(body[5:])
        assert c.read_response().status == 200
        c.send(build_request("GET", "/api/limits/r/fw?key=k",
                             [("Authorization", "Bearer " + TOKEN)]))
        r = c.read_response()
        assert r.status == 200 and json.loads(r.body)["params"]["limit"] == 4


CONC_ROUTES = """\
  - name: c
    match: { path: /c }
    upstream: api
    limits:
      - { name: conc, algorithm: concurrency, limit: 2, lease: 20s, key: ["header:X-K"] }
"""


def test_concurrency_state_with_token_reads_and_survives(sluice, redis):
    # issue 18 item 1: a concurrency limit's slot plus the override key's
    # index overran op_state's argument arrays (UBSan: index 9 out of bounds;
    # a release build could die of it, taking every route down)
    s = start_api(sluice, CONC_ROUTES)
    for _ in range(2):
        code, doc, _ = api(s, "GET", "/api/limits/c/conc?key=k")
        assert code == 200, doc
        assert doc["allowed"] is True and doc["remaining"] == 2, doc
        assert doc["source"] == "limit" and doc["params"]["limit"] == 2, doc
    code, doc, _ = api(s, "PUT", "/api/limits/c/conc/override?key=k", {"limit": 5})
    assert code == 200, doc
    code, doc, _ = api(s, "GET", "/api/limits/c/conc?key=k")
    assert code == 200, doc
    assert doc["source"] == "runtime" and doc["params"] == {"limit": 5, "lease_ms": 20000}, doc
    assert doc["remaining"] == 5, doc
    assert get_k(s, "/c", "k") == 200          # every route still answers
    assert s.proc.poll() is None, s.stderr


def test_concurrency_params_name_the_lease(sluice, redis):
    # issue 18 item 10d: a concurrency limit's window_ms is its lease
    s = start_api(sluice, CONC_ROUTES + ROUTES, token=None)
    code, doc, _ = api(s, "GET", "/api/limits/c/conc?key=k", token=None)
    assert code == 200, doc
    assert doc["params"] == {"limit": 2, "lease_ms": 20000}, doc
    assert doc["config_params"] == {"limit": 2, "lease_ms": 20000}, doc
    code, doc, _ = api(s, "GET", "/api/limits/r/fw?key=k", token=None)
    assert code == 200 and doc["params"] == {"limit": 2, "window_ms": 3600000}, doc


def test_a_key_of_many_sources_is_addressable(sluice, redis):
    # issue 18 item 1, the same pattern: the key's parts went into arrays of
    # CONF_MAX_LIMITS (16, the limits per route), while a key may have more
    # sources than that: such a limit could not be read or overridden
    n = 17
    srcs = ", ".join('"header:X-P%d"' % i for i in range(n))
    routes = ("  - name: m\n    match: { path: /m }\n    upstream: api\n    limits:\n"
              "      - { name: many, algorithm: fixed_window, limit: 3, window: 1h, "
              "key: [%s] }\n" % srcs)
    s = start_api(sluice, routes)
    hdrs = [("X-P%d" % i, "v%d" % i) for i in range(n)]
    assert http_get(s.port, "/m", headers=hdrs).status == 200
    query = "&".join("key=v%d" % i for i in range(n))
    code, doc, _ = api(s, "GET", "/api/limits/m/many?" + query)
    assert code == 200 and doc["remaining"] == 2 and len(doc["key"]) == n, doc
    code, doc, _ = api(s, "PUT", "/api/limits/m/many/override?" + query, {"limit": 7})
    assert code == 200, doc
    code, doc, _ = api(s, "GET", "/api/limits/m/many?" + query + "&key=extra")
    assert code == 400 and "got 18 or more" in doc["error"], doc


def test_health_never_waits_on_a_silent_redis(sluice):
    """Issue 18 item 7: a Redis that accepts and reads but never answers.
    Twenty key reads at once: 16 wait on it (the most) and get 503 once
    redis.timeout (1 s at least) has passed, the others 503 at once;
    /healthz, /readyz and /metrics answer at once all the same."""
    import socket
    import threading
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(64)
    lsock.settimeout(0.2)
    stop = threading.Event()
    held = []

    def silent():           # accept, read, never write
        while not stop.is_set():
            try:
                c, _ = lsock.accept()
                c.setblocking(False)
                held.append(c)
            except OSError:
                pass
            for c in held:
                try:
                    c.recv(65536)
                except OSError:
                    pass

    t = threading.Thread(target=silent, daemon=True)
    t.start()
    try:
        s = start_api(sluice, ROUTES, redis_port=lsock.getsockname()[1])
        results = []

        def read(i):
            t0 = time.monotonic()
            code, doc, _ = api(s, "GET", "/api/limits/r/fw?key=k%d" % i)
            results.append((code, time.monotonic() - t0, (doc or {}).get("error", "")))

        readers = [threading.Thread(target=read, args=(i,)) for i in range(20)]
        for r in readers:
            r.start()
        time.sleep(0.3)     # the four reads are in flight
        for path in ("/healthz", "/readyz", "/metrics") * 3:
            t0 = time.monotonic()
            r = http_get(s.admin_port, path, timeout_s=5.0)
            took = time.monotonic() - t0
            assert r.status in (200, 503) and took < 0.5, (path, r.status, took)
        for r in readers:
            r.join(15.0)
        assert [c for c, _, _ in results] == [503] * 20, results
        assert max(took for _, took, _ in results) < 5.0, results
        refused = [took for _, took, err in results if "the most" in err]
        assert len(refused) >= 1 and max(refused) < 0.5, results
        assert len([1 for _, _, err in results if "timed out" in err]) <= 16, results
    finally:
        stop.set()
        t.join(2.0)
        for c in held:
            c.close()
        lsock.close()


def test_admin_reads_reuse_one_redis_connection(sluice, redis):
    """Issue 18 item 7: 500 key reads open a handful of Redis connections,
    not one each."""
    s = start_api(sluice, ROUTES)

    def received():
        info = redis_cmd(redis.port, "INFO", "stats").decode()
        return int(info.split("total_connections_received:")[1].split()[0])

    before = received()
    for i in range(500):
        code, doc, _ = api(s, "GET", "/api/limits/r/fw?key=k%d" % (i % 7))
        assert code == 200, doc
    opened = received() - before
    assert opened <= 5, opened


