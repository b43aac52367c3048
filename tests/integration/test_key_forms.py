# sluice - tests/integration/test_key_forms.py: keys that upstreams read differently (issue 9, item 10).
#
# Each case first spends the plain form's quota (two pass, the third gets a
# 429), then sends a variant that some upstream stack reads as the same key:
# the variant must not get a fresh quota (it is denied too, or refused with a
# 400). A doubled key source, a Host a host cannot be, and the `paths:` section
# (case, matrix parameters). Against real redis-server and tests/upstream.py.

import uuid

import pytest

from conftest import Conn, build_request, http_get, make_conf

ROUTES = """\
  - name: by-header
    match: { path: /kh }
    upstream: api
    limits:
      - { name: kh, algorithm: fixed_window, limit: 2, window: 1h, key: ["header:X-Api-Key"] }
  - name: by-query
    match: { path: /kq }
    upstream: api
    limits:
      - { name: kq, algorithm: fixed_window, limit: 2, window: 1h, key: ["query:api_key"] }
  - name: by-cookie
    match: { path: /kc }
    upstream: api
    limits:
      - { name: kc, algorithm: fixed_window, limit: 2, window: 1h, key: ["cookie:session"] }
  - name: by-ip
    match: { path: /kip }
    upstream: api
    limits:
      - { name: kip, algorithm: fixed_window, limit: 100, window: 1h, key: [ip] }
  - name: hosted
    match: { path: /host, host: api.example.com }
    upstream: api
    limits:
      - { name: host2, algorithm: fixed_window, limit: 2, window: 1h, key: ["header:X-Client"] }
  - name: login
    match: { path: /api/login }
    upstream: api
    limits:
      - { name: login2, algorithm: fixed_window, limit: 2, window: 1h, key: ["header:X-Client"] }
  - name: by-path
    match: { path: /kp }
    upstream: api
    limits:
      - { name: kp, algorithm: fixed_window, limit: 2, window: 1h, key: [path, "header:X-Client"] }
  - name: by-capture
    match: { path_regex: "^/u/([^/]+)/x$" }
    upstream: api
    limits:
      - { name: ku, algorithm: fixed_window, limit: 2, window: 1h, key: ["capture:1"] }
  - name: rest
    match: { path: / }
    upstream: api
    limits:
      - { name: rest, algorithm: fixed_window, limit: 1000, window: 1h, key: [ip] }
"""

PATHS_BOTH = "paths: { case: insensitive, matrix_params: strip }\n"


@pytest.fixture
def proxy(sluice, redis):
    return sluice(make_conf(ROUTES))


@pytest.fixture
def proxy_paths(sluice, redis):
    return sluice(PATHS_BOTH + make_conf(ROUTES))


def get(port, target, headers=None, host="localhost"):
    return http_get(port, target, headers=headers, host=host)


def spend(port, target, headers=None, host="localhost"):
    """Two pass and the third is denied: the plain form's quota is gone."""
    for _ in range(2):
        r = get(port, target, headers, host)
        assert r.status == 200, r
        assert r.header("X-RateLimit-Limit") == "2", ("not the 2-a-hour limit", r)
    r = get(port, target, headers, host)
    assert r.status == 429, r


def no_fresh_quota(r):
    """The variant is denied, or refused before any limit: never a new quota."""
    assert r.status in (429, 400), "the variant got a fresh quota: %r" % r
    return r


def assert_ambiguous(port, upstream, target, headers):
    before = upstream.stats()["heads"]
    with Conn(port) as c:
        c.send(build_request("GET", target, headers))
        r = c.read_response()
        assert r.status == 400, r
        assert r.json() == {"error": "ambiguous_key"}, r
        # like a bad cost_header: the connection stays usable
        c.send(build_request("GET", "/kip"))
        assert c.read_response().status == 200
    assert upstream.stats()["heads"] == before + 1, "the ambiguous request reached the upstream"


def uid():
    return uuid.uuid4().hex[:12]


# ------------------------------------------------- a key source twice ----

def test_header_key_twice_is_ambiguous(proxy, upstream):
    key = uid()
    spend(proxy.port, "/kh", [("X-Api-Key", key)])
    assert_ambiguous(proxy.port, upstream, "/kh", [("X-Api-Key", key), ("X-Api-Key", "r1")])
    assert_ambiguous(proxy.port, upstream, "/kh", [("X-Api-Key", "r2"), ("x-api-key", key)])


def test_query_key_twice_is_ambiguous(proxy, upstream):
    key = uid()
    spend(proxy.port, "/kq?api_key=" + key)
    # sluice read the first, PHP and Rails read the last
    assert_ambiguous(proxy.port, upstream, "/kq?api_key=r1&api_key=" + key, None)
    assert_ambiguous(proxy.port, upstream, "/kq?api_key=%s&x=1&api%%5Fkey=r1" % key, None)


def test_cookie_key_twice_is_ambiguous(proxy, upstream):
    key = uid()
    spend(proxy.port, "/kc", [("Cookie", "session=" + key)])
    assert_ambiguous(proxy.port, upstream, "/kc", [("Cookie", "session=r1; session=" + key)])
    assert_ambiguous(proxy.port, upstream, "/kc",
                     [("Cookie", "a=1; session=r2"), ("Cookie", "session=" + key)])


def test_doubled_source_only_matters_where_it_is_a_key(proxy):
    # the /kip route keys on the address: two X-Api-Key fields are its upstream's business
    r = get(proxy.port, "/kip?api_key=1&api_key=2",
            [("X-Api-Key", "a"), ("X-Api-Key", "b"), ("Cookie", "session=1; session=2")])
    assert r.status == 200, r


# ------------------------------------------------- '_' in a key header ----

def test_underscore_spelling_keys_as_the_header(proxy, upstream):
    key = uid()
    spend(proxy.port, "/kh", [("X-Api-Key", key)])
    # WSGI, Rack and CGI read X_Api_Key as X-Api-Key: it is that key here too
    no_fresh_quota(get(proxy.port, "/kh", [("X_Api_Key", key)]))
    no_fresh_quota(get(proxy.port, "/kh", [("x_api-KEY", key)]))
    assert_ambiguous(proxy.port, upstream, "/kh", [("X-Api-Key", "r1"), ("X_Api_Key", key)])


def test_underscore_spelling_alone_is_counted(proxy):
    key = uid()
    spend(proxy.port, "/kh", [("X_Api_Key", key)])
    no_fresh_quota(get(proxy.port, "/kh", [("X-Api-Key", key)]))


# ---------------------------------------------------------------- Host ----

def test_host_variants_meet_the_host_route(proxy):
    for variant in ("api.example.com.", "API.Example.COM.", "api.example.com.:8080",
                    "api.example.com:8080"):
        client = [("X-Client", uid())]
        spend(proxy.port, "/host", client, host="api.example.com")
        r = no_fresh_quota(get(proxy.port, "/host", client, host=variant))
        assert r.status == 429 and r.json()["route"] == "hosted", (variant, r)


def test_host_a_host_cannot_be_is_400(proxy, upstream):
    client = [("X-Client", uid())]
    spend(proxy.port, "/host", client, host="api.example.com")
    for variant in ("evil@api.example.com", "x:y@api.example.com", "api.example.com x",
                    "api.example.com/x", "api.example.com\\x", "api..example.com", ".",
                    "api.example.com,other", "api.example.com:80:80", "api.example.com:8o",
                    "[::1", "[::1]x", "api.example.com%2e", "::1"):
        before = upstream.stats()["heads"]
        r = no_fresh_quota(get(proxy.port, "/host", client, host=variant))
        assert r.status == 400 and r.json() == {"error": "bad_host"}, (variant, r)
        assert upstream.stats()["heads"] == before


def test_ordinary_hosts_pass(proxy):
    for host in ("localhost", "127.0.0.1:8080", "[::1]:8080", "my_host.internal", "",
                 "xn--bcher-kva.example", "example.com:"):
        r = get(proxy.port, "/kip", host=host)
        assert r.status == 200, (host, r)


# ------------------------------------------------------- cookie values ----

def test_cookie_value_keys_as_plain(proxy):
    for variant in ('"{k}"', "%{hex}", ' "{k}" ', '"%{hex}"'):
        key = uid()
        spend(proxy.port, "/kc", [("Cookie", "session=" + key)])
        hexed = "%".join("%02x" % ord(ch) for ch in key)
        value = variant.format(k=key, hex=hexed)
        no_fresh_quota(get(proxy.port, "/kc", [("Cookie", "a=1; session=" + value)]))


def test_cookie_quoted_and_encoded_forms_share(proxy):
    # a value that arrives quoted first keys as the same plain value
    spend(proxy.port, "/kc", [("Cookie", 'session="%73%31"')])
    no_fresh_quota(get(proxy.port, "/kc", [("Cookie", "session=s1")]))


# --------------------------------------------------------------- paths ----

def test_default_paths_are_case_sensitive_and_keep_matrix(proxy):
    # as nginx: /API/login and /api/login;x are not the route /api/login
    client = [("X-Client", uid())]
    r = get(proxy.port, "/API/login", client)
    assert r.status == 200 and r.header("X-RateLimit-Limit") == "1000", r
    r = get(proxy.port, "/api/login;jsessionid=x", client)
    assert r.status == 200 and r.header("X-RateLimit-Limit") == "1000", r


def test_paths_variants_meet_the_route(proxy_paths):
    client = [("X-Client", uid())]
    spend(proxy_paths.port, "/api/login", client)
    for variant in ("/API/login", "/Api/LOGIN", "/api/login;jsessionid=x", "/api;v=1/login",
                    "/API/Login;JSESSIONID=x?a=1", "/api/x/..;/login", "/api/login%3Bx",
                    "/%41PI/login", "/api/login;x%2Fy", "/api/login;"):
        r = no_fresh_quota(get(proxy_paths.port, variant, client))
        assert r.status == 429 and r.json()["route"] == "login", (variant, r)


def test_paths_target_goes_upstream_as_sent(proxy_paths):
    r = get(proxy_paths.port, "/API/login;jsessionid=x", [("X-Client", uid())])
    assert r.status == 200, r
    assert r.json()["target"] == "/API/login;jsessionid=x"


def test_paths_path_key(proxy_paths):
    for plain, variant in (("/kp/a", "/KP/A"), ("/kp/a", "/kp/a;x=1"), ("/kp/a/b", "/kp/A;x/B;y")):
        client = [("X-Client", uid())]
        spend(proxy_paths.port, plain, client)
        no_fresh_quota(get(proxy_paths.port, variant, client))


def test_paths_capture_key(proxy_paths):
    for variant in ("/u/{k}/X", "/U/{K}/x", "/u/{k};jsessionid=1/x", "/u/{K};v/x;w"):
        key = uid()
        spend(proxy_paths.port, "/u/%s/x" % key)
        target = variant.format(k=key, K=key.upper())
        r = no_fresh_quota(get(proxy_paths.port, target))
        assert r.json()["route"] == "by-capture", (target, r)


def test_paths_one_section_at_a_time(sluice, redis):
    # case alone: /api/login;x stays another path; matrix alone: /API/login does
    only_case = sluice("paths: { case: insensitive }\n" + make_conf(ROUTES))
    only_matrix = sluice("paths: { matrix_params: strip }\n" + make_conf(ROUTES))
    for s, same, other in ((only_case, "/API/login", "/api/login;x"),
                           (only_matrix, "/api/login;x", "/API/login")):
        client = [("X-Client", uid())]
        spend(s.port, "/api/login", client)
        no_fresh_quota(get(s.port, same, client))
        r = get(s.port, other, client)
        assert r.status == 200 and r.header("X-RateLimit-Limit") == "1000", r


def test_paths_bad_value_is_a_config_error(tmp_path):
    import subprocess
    from conftest import sluice_bin
    conf = tmp_path / "bad.yaml"
    conf.write_text("paths: { case: upper }\n" + make_conf(ROUTES))
    p = subprocess.run([sluice_bin(), "-t", "-c", str(conf)], capture_output=True, timeout=10)
    assert p.returncode != 0
    assert b"bad.yaml:1:16: paths.case: bad value 'upper' (use sensitive or insensitive)" in p.stderr, p.stderr
