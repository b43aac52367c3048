# sluice - tests/integration/test_key_spellings.py: a key the upstream reads under
# another spelling, and a request without its key (issue 18, item 4).
#
# Every spelling some framework reads as the plain key must meet the plain
# key's counter: query names PHP folds (api.key, api+key, api%20key, api[key,
# +api_key), pairs split at ';' (Rack 2, old Go and Python), cookie names
# decoded (PHP < 8, Rack 2) and split at ',' (RFC 2109), a path key with a trailing
# '/' or whitespace, a numeric capture as Python's int() reads it. A request
# lacking a key source is counted under the client address by default
# (on_missing_key: ip), refused (deny) or not counted (pass). Against real
# redis-server and tests/upstream.py.

import json
import os
import subprocess
import time
import uuid

import pytest

from conftest import Conn, build_request, http_get, make_conf, rl_headers, sluice_bin
from proxylib import metrics, mval, start_proxy

ROUTES = """\
  - name: by-query
    match: { path: /kq }
    upstream: api
    limits:
      - { name: kq, algorithm: fixed_window, limit: 2, window: 1h, key: ["query:api_key"] }
  - name: by-query-mixed
    match: { path: /mixed }
    upstream: api
    limits:
      - { name: mixed, algorithm: fixed_window, limit: 7, window: 1h, key: ["query:api_key"] }
  - name: by-cookie
    match: { path: /kc }
    upstream: api
    limits:
      - { name: kc, algorithm: fixed_window, limit: 2, window: 1h, key: ["cookie:sid"] }
  - name: by-path
    match: { path: /kp }
    upstream: api
    limits:
      - { name: kp, algorithm: fixed_window, limit: 2, window: 1h, key: [path, "header:X-C"] }
  - name: by-capture
    match: { path_regex: "^/u/([^/]+)$" }
    upstream: api
    limits:
      - { name: ku, algorithm: fixed_window, limit: 2, window: 1h, key: ["capture:1", "header:X-C"] }
  - name: by-capture-override
    match: { path_regex: "^/o/([^/]+)$" }
    upstream: api
    limits:
      - { name: ko, algorithm: fixed_window, limit: 2, window: 1h, key: ["capture:1"],
          overrides: [ { key: ["007"], limit: 5 } ] }
  - name: miss-ip
    match: { path: /mi }
    upstream: api
    limits:
      - { name: mi, algorithm: fixed_window, limit: 2, window: 1h, key: ["header:X-Key"] }
  - name: rest
    match: { path: / }
    upstream: api
    limits:
      - { name: rest, algorithm: fixed_window, limit: 1000, window: 1h, key: [ip] }
"""


# Routes with on_missing_key, apart: base sluice refuses the key, and the
# spelling tests above run there too (and fail for the spellings).
MISSING_ROUTES = """\
  - name: by-query-pass
    match: { path: /kqp }
    upstream: api
    limits:
      - { name: kqp, algorithm: fixed_window, limit: 2, window: 1h, key: ["query:api_key"],
          on_missing_key: pass }
  - name: miss-deny
    match: { path: /md }
    upstream: api
    limits:
      - { name: md, algorithm: fixed_window, limit: 2, window: 1h, key: ["header:X-Key"],
          on_missing_key: deny }
  - name: miss-pass
    match: { path: /mp }
    upstream: api
    limits:
      - { name: mp, algorithm: fixed_window, limit: 2, window: 1h, key: ["header:X-Key"],
          on_missing_key: pass }
"""


@pytest.fixture
def proxy(sluice, redis):
    return sluice(make_conf(ROUTES))


@pytest.fixture
def missing(sluice, redis):
    return sluice(make_conf(MISSING_ROUTES + ROUTES))


def get(port, target, headers=None):
    return http_get(port, target, headers=headers)


def uid():
    return uuid.uuid4().hex[:12]


def spend(port, target, headers=None):
    """The plain form's quota of 2 is used up: two pass, the third is 429."""
    for _ in range(2):
        r = get(port, target, headers)
        assert r.status == 200, r
        assert r.header("X-RateLimit-Limit") == "2", ("not the 2-a-hour limit", r)
    r = get(port, target, headers)
    assert r.status == 429, r


# ------------------------------------------------------- query names ----

QUERY_SPELLINGS = ["api.key={k}", "api+key={k}", "api%20key={k}", "api[key={k}",
                   "+api_key={k}", "x=1;api_key={k}", "api%5Bkey={k}", "%20api.key={k}&x=1"]


@pytest.mark.parametrize("spelling", QUERY_SPELLINGS)
def test_query_name_spellings_meet_the_plain_key(proxy, spelling):
    key = uid()
    spend(proxy.port, "/kq?api_key=" + key)
    target = "/kq?" + spelling.format(k=key)
    r = get(proxy.port, target)
    assert r.status == 429, "%s got a fresh quota: %r" % (target, r)
    assert r.json()["limit"] == "kq", r


def test_mixed_query_spellings_share_one_quota(proxy):
    # limit 7: the first seven spellings each take one, the eighth is denied
    key = uid()
    spellings = ["api_key={k}"] + QUERY_SPELLINGS[:6]
    for i, sp in enumerate(spellings):
        r = get(proxy.port, "/mixed?" + sp.format(k=key))
        assert r.status == 200, (sp, r)
        assert r.header("X-RateLimit-Remaining") == str(6 - i), (sp, r)
    r = get(proxy.port, "/mixed?api.key=" + key)
    assert r.status == 429, r


def test_folded_spellings_twice_are_ambiguous(proxy, upstream):
    # PHP reads api.key as api_key: both in one query is a key given twice
    for q in ("api_key=1&api.key=2", "api_key=1;api_key=2", "api+key=1&api_key=2"):
        before = upstream.stats()["heads"]
        with Conn(proxy.port) as c:
            c.send(build_request("GET", "/kq?" + q))
            r = c.read_response()
            assert r.status == 400 and r.json() == {"error": "ambiguous_key"}, (q, r)
        assert upstream.stats()["heads"] == before, q


def test_other_query_names_stay_other_names(missing):
    # an array of another name (PHP, Rack) and names no framework folds:
    # without api_key, not counted (on_missing_key: pass)
    key = uid()
    spend(missing.port, "/kqp?api_key=" + key)
    for q in ("api[key]=%s", "apikey=%s", "api__key=%s", "API_KEY=%s", "api_key%%2Ex=%s"):
        r = get(missing.port, "/kqp?" + q % key)
        assert r.status == 200 and "X-RateLimit-Remaining" not in rl_headers(r), (q, r)


# ------------------------------------------------------------ cookies ----

@pytest.mark.parametrize("cookie", ["%73id={k}", "x=1, sid={k}", "%73%69%64={k}; a=1",
                                    "sid={k}, x=1"])
def test_cookie_name_spellings_meet_the_plain_key(proxy, cookie):
    key = uid()
    spend(proxy.port, "/kc", [("Cookie", "sid=" + key)])
    r = get(proxy.port, "/kc", [("Cookie", cookie.format(k=key))])
    assert r.status == 429, "%s got a fresh quota: %r" % (cookie, r)


def test_cookie_spellings_twice_are_ambiguous(proxy):
    r = get(proxy.port, "/kc", [("Cookie", "sid=1, %73id=2")])
    assert r.status == 400 and r.json() == {"error": "ambiguous_key"}, r


# --------------------------------------------------------- path keys ----

@pytest.mark.parametrize("variant", ["/kp/a/", "/kp/a%20", "/kp/a/%20", "/kp/a%09", "/kp/a%0A",
                                     "/kp//a//"])
def test_path_key_spellings_meet_the_plain_key(proxy, variant):
    client = [("X-C", uid())]
    spend(proxy.port, "/kp/a", client)
    r = get(proxy.port, variant, client)
    assert r.status == 429, "%s got a fresh quota: %r" % (variant, r)


def test_path_key_keeps_inner_spaces_apart(proxy):
    client = [("X-C", uid())]
    spend(proxy.port, "/kp/a", client)
    assert get(proxy.port, "/kp/a%20b", client).status == 200


# ----------------------------------------------------------- captures ----

@pytest.mark.parametrize("variant", ["7%0a", "%EF%BC%97", "%20%207", "007", "+7", "%D9%A7",
                                     "7%C2%A0"])
def test_numeric_capture_spellings_meet_the_plain_key(proxy, variant):
    # Python's int() reads each as 7 (Flask's and Django's int converters
    # read 007, werkzeug's \d+ also full-width digits)
    client = [("X-C", uid())]
    spend(proxy.port, "/u/7", client)
    r = get(proxy.port, "/u/" + variant, client)
    assert r.status == 429, "%s got a fresh quota: %r" % (variant, r)
    assert r.json()["route"] == "by-capture", r


def test_capture_with_control_byte_is_refused(proxy, upstream):
    before = upstream.stats()["heads"]
    for variant in ("7%0ax", "a%09b", "x%7F"):
        r = get(proxy.port, "/u/" + variant, [("X-C", uid())])
        assert r.status == 400 and r.json() == {"error": "bad_key"}, (variant, r)
    assert upstream.stats()["heads"] == before


def test_other_captures_keep_their_bytes(proxy):
    client = [("X-C", uid())]
    spend(proxy.port, "/u/7", client)
    for variant in ("7a", "70", "alice", "al%C3%AFce"):
        assert get(proxy.port, "/u/" + variant, client).status == 200, variant


def test_override_names_a_numeric_capture_in_any_spelling(proxy):
    # the override says 007; requests for 7 and a full-width 7 are that key
    for left, target in (("4", "/o/7"), ("3", "/o/%EF%BC%97"), ("2", "/o/007")):
        r = get(proxy.port, target)
        assert r.status == 200, r
        assert r.header("X-RateLimit-Limit") == "5", (target, r)
        assert r.header("X-RateLimit-Remaining") == left, (target, r)


# ------------------------------------------------------- missing keys ----

def read_log(path, want, timeout_s=5.0):
    """The parsed access log lines once there are `want` (bounded)."""
    deadline = time.monotonic() + timeout_s
    lines = []
    while time.monotonic() < deadline and len(lines) < want:
        time.sleep(0.03)
        if os.path.exists(path):
            with open(path, "rb") as f:
                lines = [json.loads(ln) for ln in f.read().split(b"\n") if ln]
    return lines


def test_missing_key_counts_under_the_client_address_by_default(sluice, redis, tmp_path):
    log = str(tmp_path / "access.log")
    s = start_proxy(sluice, ROUTES, top="access_log: %s\n" % log)
    for i in range(2):
        r = get(s.port, "/mi")
        assert r.status == 200, r
        assert r.header("X-RateLimit-Remaining") == str(1 - i), r
    r = get(s.port, "/mi")
    assert r.status == 429, "a request without its key was not counted: %r" % r
    assert mval(metrics(s.admin_port), "sluice_key_fallbacks_total") == 3
    # a key value that spells the address is a key of its own, not the fallback's
    r = get(s.port, "/mi", [("X-Key", "127.0.0.1")])
    assert r.status == 200 and r.header("X-RateLimit-Remaining") == "1", r
    r = get(s.port, "/mi", [("X-Key", uid())])
    assert r.status == 200 and r.header("X-RateLimit-Remaining") == "1", r
    assert mval(metrics(s.admin_port), "sluice_key_fallbacks_total") == 3
    lines = read_log(log, 5)
    assert [ln.get("key_fallback") for ln in lines] == [True, True, True, None, None], lines


def test_missing_key_address_is_the_forwarded_client(sluice, redis):
    s = sluice(make_conf(ROUTES, trusted=["127.0.0.0/8"]))
    one, two = [("X-Forwarded-For", "192.0.2.1")], [("X-Forwarded-For", "192.0.2.2")]
    spend(s.port, "/mi", one)
    r = get(s.port, "/mi", two)
    assert r.status == 200 and r.header("X-RateLimit-Remaining") == "1", r


def test_missing_key_deny_is_400_and_keeps_the_connection(missing, upstream):
    before = upstream.stats()["heads"]
    with Conn(missing.port) as c:
        c.send(build_request("GET", "/md"))
        r = c.read_response()
        assert r.status == 400 and r.json() == {"error": "missing_key"}, r
        assert r.header("X-Request-Id"), r
        c.send(build_request("GET", "/md", [("X-Key", uid())]))
        r = c.read_response()
        assert r.status == 200 and r.header("X-RateLimit-Remaining") == "1", r
    assert upstream.stats()["heads"] == before + 1


def test_missing_key_pass_is_not_counted(missing):
    for _ in range(5):
        r = get(missing.port, "/mp")
        assert r.status == 200, r
        h = rl_headers(r)
        assert "X-RateLimit-Remaining" not in h and "RateLimit" not in h, r
    spend(missing.port, "/mp", [("X-Key", uid())])


# ------------------------------------------------------ config errors ----

@pytest.mark.parametrize("value,message", [
    ("maybe", "bad value 'maybe' (use ip, deny or pass)"),
    ("IP", "bad value 'IP' (use ip, deny or pass)"),
    ("[ip]", "expected a scalar, got a sequence")])
def test_on_missing_key_bad_value_is_a_config_error(tmp_path, value, message):
    routes = ("  - name: r\n    match: { path: / }\n    upstream: api\n    limits:\n"
              "      - { name: l, algorithm: fixed_window, limit: 2, window: 1h, "
              "key: [\"header:X-Key\"], on_missing_key: %s }\n" % value)
    conf = tmp_path / "bad.yaml"
    text = make_conf(routes)
    for placeholder in ("@LISTEN_PORT@", "@REDIS_PORT@", "@UPSTREAM_PORT@", "@DEAD_PORT@"):
        text = text.replace(placeholder, "9")
    conf.write_text(text)
    at = text.index("on_missing_key: " + value) + len("on_missing_key: ")
    line = text.count("\n", 0, at) + 1
    col = at - text.rfind("\n", 0, at)
    p = subprocess.run([sluice_bin(), "-t", "-c", str(conf)], capture_output=True, timeout=10)
    assert p.returncode != 0
    want = "bad.yaml:%d:%d: routes[0].limits[0].on_missing_key: %s" % (line, col, message)
    assert want in p.stderr.decode(), p.stderr
