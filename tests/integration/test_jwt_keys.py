# sluice - tests/integration/test_jwt_keys.py: verified JWT claims as key
# parts (issue 23, Keys).
#
# Keys made per run and tokens signed by Python's cryptography module
# (jwtlib.py): per-sub budgets, the token failures that key a request as
# anonymous or get a 401 under require_jwt, RS256/ES256/EdDSA from a JWKS
# file, HS256 from a secret in the environment, a JWKS rotated by SIGHUP
# (and a bad one kept out), the cookie source. Real redis-server, real
# upstream (tests/upstream.py), sluice as a process.

import os
import signal
import subprocess

from conftest import http_get, sluice_bin
from jwtlib import AUDIENCE, ISSUER, Key, claims, flip, jwks, secret_key, token
from proxylib import proxy_conf, start_proxy, wait_metric, mval, metrics

ROUTES = """\
  - name: per-sub
    match: { path: /sub }
    upstream: api
    limits:
      - { name: sub2, algorithm: fixed_window, limit: 2, window: 1h, key: ["jwt:sub"] }
  - name: per-org
    match: { path: /org }
    upstream: api
    limits:
      - { name: org2, algorithm: fixed_window, limit: 2, window: 1h, key: [method, "jwt:org_id"] }
  - name: private
    match: { path: /private }
    upstream: api
    require_jwt: true
    limits:
      - { name: p100, algorithm: fixed_window, limit: 100, window: 1h, key: ["jwt:sub"] }
"""


def jwt_top(jwks_path=None, secret=None, cookie=None):
    lines = ["jwt:"]
    if jwks_path:
        lines.append("  jwks_file: %s" % jwks_path)
    if secret:
        lines.append("  secret: %s" % secret)
    lines += ["  issuer: %s" % ISSUER, "  audience: %s" % AUDIENCE, "  leeway: 30s"]
    if cookie:
        lines.append("  cookie: %s" % cookie)
    return "\n".join(lines) + "\n"


def bearer(tok):
    return [("Authorization", "Bearer " + tok)]


def status(port, path, tok=None, headers=None):
    return http_get(port, path, headers=(bearer(tok) if tok else []) + (headers or [])).status


def start(sluice, tmp_path, *keys, cookie=None, **kw):
    path = tmp_path / "jwks.json"
    path.write_text(jwks(*keys))
    return start_proxy(sluice, ROUTES, top=jwt_top(jwks_path=path, cookie=cookie), **kw), path


def test_each_sub_has_its_own_budget(sluice, redis, tmp_path):
    k = Key("RS256", "rsa-1")
    s, _ = start(sluice, tmp_path, k)
    alice, bob = token(k, claims(sub="alice")), token(k, claims(sub="bob"))
    assert [status(s.port, "/sub", alice) for _ in range(3)] == [200, 200, 429]
    assert [status(s.port, "/sub", bob) for _ in range(3)] == [200, 200, 429]
    # a new token of the same sub (another iat) shares its budget
    assert status(s.port, "/sub", token(k, claims(sub="alice", jti="2"))) == 429
    # a composite key: method and an integer claim
    one, two = token(k, claims(org_id=7)), token(k, claims(org_id=8))
    assert [status(s.port, "/org", one) for _ in range(3)] == [200, 200, 429]
    assert status(s.port, "/org", two) == 200


def test_failed_tokens_are_anonymous_or_401(sluice, redis, tmp_path):
    """Each failure keys the request as anonymous (the anonymous budget,
    not its sub's) and gets 401 invalid_token where the route requires a
    token."""
    k = Key("ES256", "ec-1")
    s, _ = start(sluice, tmp_path, k)
    bad = {
        "expired": token(k, claims(sub="carol", ttl_s=-120)),
        "not yet valid": token(k, claims(sub="carol", nbf=int(__import__("time").time()) + 600)),
        "bad signature": flip(token(k, claims(sub="carol"))),
        "wrong audience": token(k, claims(sub="carol", aud="web")),
        "wrong issuer": token(k, claims(sub="carol", iss="https://evil.test")),
        "alg none": token(None, claims(sub="carol"), alg="none", kid="ec-1"),
        "alg not the key's": token(k, claims(sub="carol"), alg="HS256"),
        "unknown kid": token(k, claims(sub="carol"), kid="ec-gone"),
        "not a token": "abc.def",
    }
    assert [status(s.port, "/sub") for _ in range(3)] == [200, 200, 429]   # anonymous spent
    for name, tok in bad.items():
        assert status(s.port, "/sub", tok) == 429, name        # anonymous, not carol's
        r = http_get(s.port, "/private", headers=bearer(tok))
        assert r.status == 401, name
        assert r.header("WWW-Authenticate") == 'Bearer error="invalid_token"', name
        assert r.json() == {"error": "invalid_token"}, name
    assert status(s.port, "/sub", token(k, claims(sub="carol"))) == 200  # carol's budget is whole
    # no claim value reaches the anonymous budget, the marker's own text neither
    assert status(s.port, "/sub", token(k, claims(sub="!anon"))) == 200
    r = http_get(s.port, "/private")
    assert r.status == 401 and r.header("WWW-Authenticate") == "Bearer", r
    assert r.json() == {"error": "missing_token"}
    r = http_get(s.port, "/private", headers=[("Authorization", "Basic YTpi")])
    assert r.status == 401 and r.header("WWW-Authenticate") == "Bearer", r
    # two Authorization fields, one of them a good Bearer: no token is believed
    good = token(k, claims(sub="carol"))
    r = http_get(s.port, "/private", headers=[("Authorization", "Basic YTpi")] + bearer(good))
    assert r.status == 401 and r.json() == {"error": "invalid_token"}, r
    # a valid token without the claim: on_missing_key (ip) counts it, unrefused
    assert status(s.port, "/private", token(k, claims(sub=None))) == 200
    assert status(s.port, "/sub", token(k, claims(sub=None))) == 200


def test_rs256_es256_eddsa_from_jwks(sluice, redis, tmp_path):
    keys = [Key("RS256", "r"), Key("ES256", "e"), Key("EdDSA", "d"), Key("ES384", "e384"),
            Key("PS256", "p"), Key("RS512", "r512")]
    s, _ = start(sluice, tmp_path, *keys)
    for k in keys:
        tok = token(k, claims(sub="user-" + k.alg))
        assert status(s.port, "/private", tok) == 200, k.alg
        assert [status(s.port, "/sub", tok) for _ in range(3)] == [200, 200, 429], k.alg
    # without a kid: the key that fits the alg
    assert status(s.port, "/private", token(keys[2], claims(), kid=None)) == 200


def test_repeat_is_a_cache_hit(sluice, redis, tmp_path):
    """One signature check per token per worker: repeats are cache hits,
    failures are counted by reason (sluice_jwt_tokens_total)."""
    k = Key("EdDSA", "ed")
    s, _ = start(sluice, tmp_path, k)
    tok = token(k, claims(sub="frank"))
    assert [status(s.port, "/private", tok) for _ in range(5)] == [200] * 5
    assert status(s.port, "/private", token(k, claims(ttl_s=-300))) == 401
    assert status(s.port, "/private", flip(tok)) == 401
    assert status(s.port, "/private") == 401
    assert status(s.port, "/sub", headers=bearer(tok) + bearer(tok)) == 200   # twice: anonymous
    ms = metrics(s.admin_port)
    got = {r: mval(ms, "sluice_jwt_tokens_total", result=r)
           for r in ("verified", "cached", "expired", "bad_signature", "missing", "twice")}
    assert got == {"verified": 1, "cached": 4, "expired": 1, "bad_signature": 1, "missing": 1,
                   "twice": 1}, got


PLANS = """\
plans:
  default: free
  free:
    limits:
      - { name: plan-day, algorithm: fixed_window, limit: 2, window: 1d, key: ["jwt:sub"] }
  pro:
    limits:
      - { name: plan-day, algorithm: fixed_window, limit: 4, window: 1d, key: ["jwt:sub"] }
"""

PLAN_ROUTES = """\
  - name: by-claim
    match: { path: /plan }
    upstream: api
    plan_key: "jwt:sub"
    plan_from: "jwt:plan"
  - name: by-header
    match: { path: /hdr }
    upstream: api
    plan_key: "header:X-Api-Key"
"""


def test_plan_from_a_verified_claim(sluice, redis, tmp_path):
    """plan_from: jwt:plan picks the plan; a plan's limits keyed by jwt:sub
    read the token on every route applying plans, even one that reads no
    token itself; without a valid token, the default plan, anonymous."""
    k = Key("ES256", "p")
    path = tmp_path / "jwks.json"
    path.write_text(jwks(k))
    s = start_proxy(sluice, PLAN_ROUTES, top=jwt_top(jwks_path=path) + PLANS)
    pro, free = token(k, claims(sub="pat", plan="pro")), token(k, claims(sub="fay", plan="free"))
    assert [status(s.port, "/plan", pro) for _ in range(5)] == [200] * 4 + [429]
    assert [status(s.port, "/plan", free) for _ in range(3)] == [200, 200, 429]
    forged = token(Key("ES256", "p"), claims(sub="mal", plan="pro"))     # not our key
    assert [status(s.port, "/plan", forged) for _ in range(3)] == [200, 200, 429]   # free, anonymous
    assert status(s.port, "/plan") == 429                                # the same anonymous budget
    # by-header reads no token itself: its plans' limits make it read them
    gus, hal = token(k, claims(sub="gus")), token(k, claims(sub="hal"))
    assert [status(s.port, "/hdr", gus) for _ in range(3)] == [200, 200, 429]
    assert status(s.port, "/hdr", hal) == 200


def test_hs256_secret_from_env(sluice, redis, tmp_path):
    secret = os.urandom(24).hex()
    text = proxy_conf(ROUTES, top=jwt_top(secret="${JWT_TEST_SECRET}"))
    s = sluice(text, env={"JWT_TEST_SECRET": secret})
    good = token(secret_key(secret.encode()), claims(sub="h"))
    assert status(s.port, "/private", good) == 200
    assert status(s.port, "/private", token(secret_key(b"x" * 48), claims(sub="h"))) == 401
    assert [status(s.port, "/sub", good) for _ in range(3)] == [200, 200, 429]


def test_jwks_rotated_by_sighup(sluice, redis, tmp_path):
    old, new = Key("RS256", "2025"), Key("EdDSA", "2026")
    s, path = start(sluice, tmp_path, old)
    old_tok, new_tok = token(old, claims()), token(new, claims())
    assert status(s.port, "/private", old_tok) == 200          # verified, now cached
    assert status(s.port, "/private", old_tok) == 200
    assert status(s.port, "/private", new_tok) == 401
    before = mval(metrics(s.admin_port), "sluice_config_reloads_total", result="ok")
    path.write_text(jwks(new))
    os.kill(s.proc.pid, signal.SIGHUP)
    wait_metric(s.admin_port, "sluice_config_reloads_total", before + 1, result="ok")
    assert status(s.port, "/private", old_tok) == 401          # the cache kept nothing of it
    assert status(s.port, "/private", new_tok) == 200
    # a bad file at reload: refused, the keys before it stay
    before = mval(metrics(s.admin_port), "sluice_config_reloads_total", result="error")
    path.write_text('{"keys": [{"kty": "RSA", "n": "AQAB", "e": "AQAB"}]}')
    os.kill(s.proc.pid, signal.SIGHUP)
    wait_metric(s.admin_port, "sluice_config_reloads_total", before + 1, result="error")
    assert "RSA key shorter than 2048 bits" in s.stderr
    assert status(s.port, "/private", new_tok) == 200


def test_cookie_source(sluice, redis, tmp_path):
    k = Key("ES256", "c")
    path = tmp_path / "jwks.json"
    path.write_text(jwks(k))
    s = start_proxy(sluice, ROUTES, top=jwt_top(jwks_path=path, cookie="session"))
    dave = token(k, claims(sub="dave"))
    cookie = [("Cookie", "theme=dark; session=" + dave)]
    assert [status(s.port, "/sub", headers=cookie) for _ in range(3)] == [200, 200, 429]
    assert status(s.port, "/sub", token(k, claims(sub="erin"))) == 200
    assert status(s.port, "/private", headers=cookie) == 200
    # the cookie twice is no token
    twice = [("Cookie", "session=%s; session=%s" % (dave, dave))]
    assert status(s.port, "/private", headers=twice) == 401


def test_bad_jwks_file_is_a_config_error(tmp_path):
    conf = tmp_path / "s.yaml"
    path = tmp_path / "jwks.json"
    path.write_text('{"keys": [{"kty": "EC", "crv": "P-521", "x": "AA", "y": "AA"}]}')
    conf.write_text(proxy_conf(ROUTES, top=jwt_top(jwks_path=path))
                    .replace("@LISTEN_PORT@", "1").replace("@REDIS_PORT@", "1")
                    .replace("@UPSTREAM_PORT@", "1").replace("@DEAD_PORT@", "1"))
    r = subprocess.run([sluice_bin(), "-t", "-c", str(conf)], capture_output=True, text=True,
                       timeout=10)
    assert r.returncode != 0
    line = [i + 1 for i, t in enumerate(conf.read_text().splitlines()) if "jwks_file" in t][0]
    assert "%s:%d:14: jwt.jwks_file: JWKS: keys[0]: EC key on a curve other than P-256 or " \
           "P-384" % (conf, line) in r.stderr, r.stderr
