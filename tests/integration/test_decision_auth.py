# sluice - tests/integration/test_decision_auth.py: the decision listener's
# forward-auth endpoint (docs/decision.md).
#
# A gateway asks sluice's decision listener whether the request it holds may
# go on, described by headers (Traefik and Caddy: X-Forwarded-Method/Uri/
# Host/For; nginx: X-Original-URI/Method) or, for Envoy ext_authz, as the
# original request under decision.path_prefix. curl plays Traefik and Caddy;
# a real nginx (Debian's, started here on 127.0.0.1 with its own prefix and
# config) plays itself with auth_request in front of the test upstream,
# through the snippet docs/decision.md documents. Redis and the upstream are
# real; the upstream's own count shows that the decision listener never
# contacts it. Every process is stopped by PID.

import os
import subprocess
import time

import pytest

from conftest import free_port, read_log, stop_process, wait_port, wait_until
from nginxlib import NGINX, nginx_conf
from proxylib import metrics, mval, start_proxy
from tlslib import CA


# /api: a route of the decision listener alone (no upstream); /shop proxied
# and decided alike; /orders/<id>: a capture key; /w: POST only.
ROUTES = """\
  - name: writes
    match: { path: /w, methods: [POST] }
    limits:
      - { name: one_post, algorithm: fixed_window, limit: 1, window: 1m, key: [ip] }
  - name: orders
    match: { path_regex: "^/orders/([0-9]+)$" }
    limits:
      - { name: per_order, algorithm: fixed_window, limit: 1, window: 1m, key: ["capture:1"] }
  - name: search
    match: { path: /search }
    limits:
      - { name: per_q, algorithm: fixed_window, limit: 1, window: 1m, key: ["query:q"] }
  - name: tenant
    match: { path: /t, host: tenant.test }
    limits:
      - { name: per_host, algorithm: fixed_window, limit: 1, window: 1m, key: [ip] }
  - name: byip
    match: { path: /ip }
    limits:
      - { name: per_ip, algorithm: fixed_window, limit: 1, window: 1m, key: [ip] }
  - name: api
    match: { path: /api }
    limits:
      - { name: per_user, algorithm: fixed_window, limit: 2, window: 1m, key: ["header:X-User"] }
  - name: shop
    match: { path: /shop }
    upstream: api
    limits:
      - { name: per_cookie, algorithm: fixed_window, limit: 1, window: 1m, key: ["cookie:sid"] }
"""


def start_decision(sluice, tmp_path, decision="", routes=ROUTES, **kw):
    """sluice with a decision listener (its port as .dport) and an access
    log (.log_path); kw as start_proxy's."""
    dport = free_port()
    log = tmp_path / "access.log"
    top = "access_log: %s\ndecision:\n  listen: 127.0.0.1:%d\n%s" % (log, dport, decision)
    s = start_proxy(sluice, routes, top=top, **kw)
    assert wait_port(dport, s.proc), s.stderr
    s.dport, s.log_path = dport, str(log)
    return s


def curl(port, target, headers=(), method="GET", cacert=None):
    """One request with curl: (status, {lower-case name: value}, body);
    with cacert, over TLS to api.test (resolved to 127.0.0.1)."""
    args = ["curl", "-sS", "--max-time", "5", "-i", "-X", method]
    for name, value in headers:
        args += ["-H", "%s: %s" % (name, value)]
    url = "http://127.0.0.1:%d%s" % (port, target)
    if cacert:
        args += ["--cacert", cacert, "--resolve", "api.test:%d:127.0.0.1" % port]
        url = "https://api.test:%d%s" % (port, target)
    out = subprocess.run(args + [url], capture_output=True, timeout=10, check=True).stdout
    head, _, body = out.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = {}
    for ln in lines[1:]:
        name, _, value = ln.partition(":")
        fields[name.strip().lower()] = value.strip()
    return int(lines[0].split()[1]), fields, body


def traefik(uri, method="GET", host="app.test", more=()):
    """What Traefik's ForwardAuth (and Caddy's forward_auth) send."""
    return [("X-Forwarded-Method", method), ("X-Forwarded-Proto", "http"),
            ("X-Forwarded-Host", host), ("X-Forwarded-Uri", uri)] + list(more)


def nginx_style(uri, method="GET", more=()):
    """What the documented nginx auth_request snippet sends."""
    return [("X-Original-URI", uri), ("X-Original-Method", method)] + list(more)


def test_traefik_style_limit_then_429_with_retry_after(sluice, redis, upstream, tmp_path):
    s = start_decision(sluice, tmp_path)
    before = upstream.stats()["heads"]
    got = [curl(s.dport, "/decide", traefik("/api/items?x=1", more=[("X-User", "ann")]))
           for _ in range(3)]
    assert [g[0] for g in got] == [200, 200, 429]
    status, h, body = got[0]
    assert body == b"" and h["content-length"] == "0"
    assert h["x-ratelimit-limit"] == "2" and h["x-ratelimit-remaining"] == "1"
    assert h["ratelimit-policy"] == '"per_user";q=2;w=60'
    assert h["ratelimit"].startswith('"per_user";r=1;t=')
    status, h, body = got[2]
    assert 1 <= int(h["retry-after"]) <= 60
    assert h["x-ratelimit-remaining"] == "0" and h["ratelimit"].startswith('"per_user";r=0;')
    # the key is the described request's header: another user is not limited
    assert curl(s.dport, "/decide", traefik("/api/items", more=[("X-User", "bob")]))[0] == 200
    # a decision listener never contacts an upstream
    assert upstream.stats()["heads"] == before


def test_nginx_style_headers_method_and_route(sluice, redis, tmp_path):
    s = start_decision(sluice, tmp_path)
    # the described method picks the route: POST /w is limited to one
    assert curl(s.dport, "/decide", nginx_style("/w", "POST"))[0] == 200
    assert curl(s.dport, "/decide", nginx_style("/w", "POST"))[0] == 429
    # GET /w meets no route (the request to sluice itself is a GET either way)
    assert curl(s.dport, "/decide", nginx_style("/w", "GET"))[0] == 404
    assert curl(s.dport, "/decide", traefik("/w", "POST"))[0] == 429


def test_keys_from_the_described_request(sluice, redis, tmp_path):
    s = start_decision(sluice, tmp_path)
    # path capture and query parameter of the described URI
    assert curl(s.dport, "/decide", traefik("/orders/7"))[0] == 200
    assert curl(s.dport, "/decide", traefik("/orders/007"))[0] == 429
    assert curl(s.dport, "/decide", traefik("/orders/8"))[0] == 200
    assert curl(s.dport, "/decide", nginx_style("/search?q=a"))[0] == 200
    assert curl(s.dport, "/decide", nginx_style("/search?q=a&z=1"))[0] == 429
    assert curl(s.dport, "/decide", nginx_style("/search?q=b"))[0] == 200
    # a cookie of the described request (the gateway passes its fields on)
    assert curl(s.dport, "/decide", traefik("/shop", more=[("Cookie", "sid=s1")]))[0] == 200
    assert curl(s.dport, "/decide", traefik("/shop", more=[("Cookie", "sid=s1")]))[0] == 429
    # the described host: X-Forwarded-Host, not the Host of the question
    assert curl(s.dport, "/decide", traefik("/t", host="other.test"))[0] == 404
    assert curl(s.dport, "/decide", traefik("/t", host="tenant.test"))[0] == 200
    assert curl(s.dport, "/decide", traefik("/t", host="Tenant.Test:8443"))[0] == 429


def test_xff_believed_only_from_trusted_proxies(sluice, redis, tmp_path):
    s = start_decision(sluice, tmp_path, trusted=["127.0.0.1/32"])
    for client in ("192.0.2.1", "192.0.2.2"):
        assert curl(s.dport, "/decide", traefik("/ip", more=[("X-Forwarded-For", client)]))[0] == 200
    assert curl(s.dport, "/decide",
                traefik("/ip", more=[("X-Forwarded-For", "192.0.2.1")]))[0] == 429
    assert read_log(s.log_path, 3)[0]["client"] == "192.0.2.1"


def test_xff_ignored_from_untrusted_peers(sluice, redis, tmp_path):
    s = start_decision(sluice, tmp_path)
    assert curl(s.dport, "/decide", traefik("/ip", more=[("X-Forwarded-For", "192.0.2.1")]))[0] == 200
    # another claimed client, the same peer: the same key
    assert curl(s.dport, "/decide", traefik("/ip", more=[("X-Forwarded-For", "192.0.2.2")]))[0] == 429
    assert read_log(s.log_path, 2)[0]["client"] == "127.0.0.1"


def test_envoy_path_prefix_is_the_original_request(sluice, redis, tmp_path):
    s = start_decision(sluice, tmp_path, decision="  path_prefix: /check\n")
    # ext_authz HTTP sends the original request with the prefix before its path
    assert curl(s.dport, "/check/w", method="POST")[0] == 200
    assert curl(s.dport, "/check/w", method="POST")[0] == 429
    assert curl(s.dport, "/check/orders/9?a=b")[0] == 200
    assert curl(s.dport, "/check/orders/9")[0] == 429
    # Host is its own; a client's X-Forwarded-* fields are not believed here
    assert curl(s.dport, "/check/t", [("Host", "tenant.test")])[0] == 200
    assert curl(s.dport, "/check/t", [("Host", "other.test"),
                                      ("X-Forwarded-Host", "tenant.test")])[0] == 404
    # the prefix alone is the described-by-headers endpoint; /decide is not one now
    assert curl(s.dport, "/check", traefik("/orders/10"))[0] == 200
    assert curl(s.dport, "/decide", traefik("/orders/11"))[0] == 404


def test_deny_status_and_bad_descriptions(sluice, redis, tmp_path):
    s = start_decision(sluice, tmp_path, decision="  deny_status: 403\n")
    assert curl(s.dport, "/decide", traefik("/orders/1"))[0] == 200
    status, h, body = curl(s.dport, "/decide", traefik("/orders/1"))
    assert status == 403 and int(h["retry-after"]) >= 1
    assert h["x-ratelimit-remaining"] == "0" and b'"rate_limited"' in body
    status, _, body = curl(s.dport, "/decide", [("X-Forwarded-Method", "GET")])
    assert status == 400 and b"missing_uri" in body
    # both families at once: a client may have added one; neither is believed
    status, _, body = curl(s.dport, "/decide", traefik("/api") + nginx_style("/orders/2"))
    assert status == 400 and b"ambiguous_description" in body
    status, _, body = curl(s.dport, "/decide", traefik("/api", method="GE T"))
    assert status == 400 and b"bad_method" in body
    assert curl(s.dport, "/elsewhere", traefik("/api"))[0] == 404


OPTION_ROUTES = ROUTES.replace("  - name: api\n", """\
  - name: quiet
    match: { path: /quiet }
    limits:
      - { name: watch, algorithm: fixed_window, limit: 1, window: 1m, key: [ip], shadow: true }
  - name: vip
    match: { path: /vip }
    limits:
      - name: per_user
        algorithm: fixed_window
        limit: 1
        window: 1m
        key: ["header:X-User"]
        overrides: [ { key: [gold], limit: 3 } ]
  - name: smooth
    match: { path: /smooth }
    limits:
      - { name: paced, algorithm: gcra, rate: 1/2s, burst: 1, key: [ip], delay: 3s }
  - name: api
""", 1)


def test_shadow_and_overrides_as_for_the_proxy(sluice, redis, tmp_path):
    s = start_decision(sluice, tmp_path, routes=OPTION_ROUTES)
    # a shadow limit counts and reports, never rejects
    assert [curl(s.dport, "/decide", traefik("/quiet"))[0] for _ in range(3)] == [200] * 3
    assert read_log(s.log_path, 3)[2]["decision"] == "shadow_limited"
    # a config override's quota for one key
    gold = [curl(s.dport, "/decide", traefik("/vip", more=[("X-User", "gold")]))[0]
            for _ in range(4)]
    assert gold == [200, 200, 200, 429]
    assert [curl(s.dport, "/decide", traefik("/vip", more=[("X-User", "tin")]))[0]
            for _ in range(2)] == [200, 429]


def test_delay_holds_the_answer(sluice, redis, tmp_path):
    s = start_decision(sluice, tmp_path, routes=OPTION_ROUTES)
    assert curl(s.dport, "/decide", traefik("/smooth"))[0] == 200
    t0 = time.monotonic()
    assert curl(s.dport, "/decide", traefik("/smooth"))[0] == 200
    assert time.monotonic() - t0 >= 0.3       # held up to 2 s, then allowed
    assert read_log(s.log_path, 2)[1]["decision"] == "delayed"


@pytest.mark.parametrize("on_error,want", [("deny", 503), ("allow", 200)])
def test_redis_down_on_error(sluice, redis, tmp_path, on_error, want):
    s = start_decision(sluice, tmp_path, on_error=on_error, redis_port=free_port(),
                       wait_redis=False, redis_timeout="200ms")
    status, h, _ = curl(s.dport, "/decide", traefik("/orders/4"))
    assert status == want
    if want == 503:
        assert int(h["retry-after"]) >= 1


def test_decision_service_alone(sluice, redis, upstream):
    # no listen, no upstreams: the decision listener is the only socket
    s = sluice("decision: { listen: 127.0.0.1:@LISTEN_PORT@ }\n"
               "redis: { url: redis://127.0.0.1:@REDIS_PORT@/0, prefix: \"alone:\" }\n"
               "routes:\n" + ROUTES[:ROUTES.index("  - name: shop")])
    assert [curl(s.port, "/decide", traefik("/api", more=[("X-User", "u")]))[0]
            for _ in range(3)] == [200, 200, 429]
    assert "listening on 127.0.0.1:%d (decision)" % s.port in s.stderr


def test_tls_decision_listener(sluice, redis, tmp_path):
    ca = CA(tmp_path / "pki")
    cert, key = ca.leaf("dec", "ec", ["api.test"])
    dport = free_port()
    top = ("decision:\n  listen:\n    - address: 127.0.0.1:%d\n      tls:\n"
           "        certificates: [ { cert_file: %s, key_file: %s } ]\n" % (dport, cert, key))
    s = start_proxy(sluice, ROUTES, top=top)
    assert wait_port(dport, s.proc), s.stderr
    got = [curl(dport, "/decide", traefik("/orders/5"), cacert=ca.root)[0] for _ in range(2)]
    assert got == [200, 429]


def test_proxy_listener_passes_decision_only_routes_over(sluice, redis, upstream, tmp_path):
    s = start_decision(sluice, tmp_path)
    # /api has no upstream: the proxy listener has no route for it
    assert curl(s.port, "/api/items", [("X-User", "ann")])[0] == 404
    # /shop is both: proxied here (counted in the same key space)
    assert curl(s.port, "/shop", [("Cookie", "sid=p")])[0] == 200
    assert curl(s.dport, "/decide", traefik("/shop", more=[("Cookie", "sid=p")]))[0] == 429


def test_access_log_and_metrics_say_decision_mode(sluice, redis, tmp_path):
    s = start_decision(sluice, tmp_path)
    curl(s.dport, "/decide", traefik("/orders/3", method="PUT"))
    curl(s.dport, "/decide", traefik("/orders/3"))
    curl(s.port, "/shop", [("Cookie", "sid=m")])
    lines = read_log(s.log_path, 3)
    by_path = {(e["method"], e["path"]): e for e in lines}
    e = by_path[("PUT", "/orders/3")]
    assert e["mode"] == "decision" and e["status"] == 200 and e["decision"] == "allowed"
    assert e["route"] == "orders" and e["upstream_time"] is None
    assert by_path[("GET", "/orders/3")]["status"] == 429
    assert "mode" not in by_path[("GET", "/shop")]
    ms = metrics(s.admin_port)
    assert mval(ms, "sluice_decision_requests_total", decision="allowed") == 1
    assert mval(ms, "sluice_decision_requests_total", decision="limited") == 1


# ------------------------------------------------------------ nginx ----

NGINX_SERVER = """
    access_log off;
    server {
        listen 127.0.0.1:%(port)d;
%(snippet)s
    }
"""


def nginx_snippet(dport, upstream_port):
    """The server block's body of docs/decision.md's nginx example, with the
    decision listener's and the upstream's ports."""
    path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "decision.md")
    with open(path) as f:
        text = f.read()
    start = text.index("# nginx: begin")
    end = text.index("# nginx: end")
    return (text[text.index("\n", start) + 1:end]
            .replace("127.0.0.1:8081", "127.0.0.1:%d" % dport)
            .replace("127.0.0.1:8000", "127.0.0.1:%d" % upstream_port))


@pytest.fixture
def nginx_front(tmp_path, upstream):
    started = []

    def start(dport):
        d = tmp_path / "nginx"
        d.mkdir()
        port = free_port()
        conf = d / "nginx.conf"
        conf.write_text(nginx_conf(d, NGINX_SERVER % {
            "port": port, "snippet": nginx_snippet(dport, upstream.port)}))
        errf = open(d / "nginx.stderr", "wb")
        proc = subprocess.Popen([NGINX, "-p", str(d), "-c", str(conf)],
                                stdout=subprocess.DEVNULL, stderr=errf)
        started.append((proc, errf))
        if not wait_port(port, proc):
            raise AssertionError("nginx did not start: %s" % (d / "error.log").read_text()[-2000:])
        return port

    yield start
    for proc, errf in started:
        stop_process(proc)
        errf.close()


@pytest.mark.skipif(not os.path.exists(NGINX), reason="nginx not installed")
def test_nginx_auth_request_answers_429_with_retry_after(sluice, redis, upstream, tmp_path,
                                                         nginx_front):
    s = start_decision(sluice, tmp_path, decision="  deny_status: 403\n")
    port = nginx_front(s.dport)
    before = upstream.stats()["heads"]
    got = [curl(port, "/api/v1", [("X-User", "zoe")]) for _ in range(3)]
    assert [g[0] for g in got] == [200, 200, 429]
    # allowed: the upstream answered, with sluice's fields copied on
    assert got[0][1]["ratelimit"].startswith('"per_user";r=1;')
    assert got[0][1]["ratelimit-policy"] == '"per_user";q=2;w=60'
    # rejected: nginx's own 429, Retry-After from the subrequest's answer
    status, h, body = got[2]
    assert 1 <= int(h["retry-after"]) <= 60
    assert h["ratelimit"].startswith('"per_user";r=0;')
    assert b"rate_limited" in body
    assert wait_until(lambda: upstream.stats()["heads"] - before, 3, until=lambda n: n == 2)[0] == 2
    # sluice decided the URI nginx was asked for, with nginx's method
    lines = read_log(s.log_path, 3)
    assert {(e["method"], e["path"], e["mode"]) for e in lines} == {("GET", "/api/v1", "decision")}
    # a client's own X-Forwarded-Uri cannot pick another route through nginx:
    # the snippet clears it
    assert curl(port, "/api/v1", [("X-User", "zoe"), ("X-Forwarded-Uri", "/orders/1")])[0] == 429
