# sluice - test_rls_grpc.py: Envoy's RLS v3 ShouldRateLimit over HTTP/2 with
# a real gRPC client (Debian's python3-grpcio, a generic unary call with the
# protobuf bytes rlslib encodes), against a real redis-server: the wire
# Envoy's envoy_grpc clusters use (prior knowledge on a plain listener).

import json
import os
import shutil
import subprocess

import grpc
import pytest

from apilib import TOKEN, api, deny_hits
from conftest import wait_until
from rlslib import (HOUR, MINUTE, OK, OVER_LIMIT, RLS_PATH, descriptor, request, response,
                    start_rls)

CONF = """\
domain: envoy
descriptors:
  - key: generic_key
    value: slow
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: remote_address
    rate_limit: { unit: hour, requests_per_unit: 2 }
  - key: path
    value: /api/*
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: { name: nested, unit: day, requests_per_unit: 1 }
  - key: shadow
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
"""


class Rls:
    """A gRPC channel to the decision listener; call() -> response() dict."""

    def __init__(self, port):
        self.channel = grpc.insecure_channel("127.0.0.1:%d" % port)
        self.method = self.channel.unary_unary(RLS_PATH)

    def raw(self, body):
        return self.method(body, timeout=10)

    def call(self, domain, descriptors, hits_addend=0):
        return response(self.raw(request(domain, descriptors, hits_addend)))

    def close(self):
        self.channel.close()


@pytest.fixture
def rls(sluice, redis, tmp_path):
    s, port = start_rls(sluice, tmp_path, CONF)
    client = Rls(port)
    yield s, client
    client.close()


def codes(r):
    return [st["code"] for st in r["statuses"]]


def test_ok_then_over_limit_over_grpc(rls):
    s, c = rls
    got = [c.call("envoy", [[("generic_key", "slow")]]) for _ in range(4)]
    assert [r["overall"] for r in got] == [OK, OK, OK, OVER_LIMIT]
    assert [r["statuses"][0]["remaining"] for r in got] == [2, 1, 0, 0]
    assert got[0]["statuses"][0]["limit"] == {"rpu": 3, "unit": MINUTE, "name": ""}
    assert int(got[3]["headers"]["Retry-After"]) >= 1


def test_statuses_hits_nested_wildcard_shadow_over_grpc(rls):
    s, c = rls
    r = c.call("envoy", [[("x", "y")], [("remote_address", "1.2.3.4")],
                         [("key1", "value1"), ("subkey1", "a")], [("path", "/api/z")]])
    assert r["overall"] == OK and codes(r) == [OK] * 4
    assert r["statuses"][0]["limit"] is None
    assert [st["remaining"] for st in r["statuses"][1:]] == [1, 0, 0]
    assert r["statuses"][2]["limit"]["name"] == "nested"
    # hits_addend: the request's, and a descriptor's own 0 (a peek)
    r = c.call("envoy", [descriptor([("remote_address", "1.2.3.4")], hits=0)])
    assert r["statuses"][0]["remaining"] == 1
    r = c.call("envoy", [[("remote_address", "1.2.3.4")]], hits_addend=2)
    assert r["overall"] == OVER_LIMIT
    assert c.call("envoy", [[("path", "/api/z")]])["overall"] == OVER_LIMIT
    assert c.call("envoy", [[("path", "/api/other")]])["overall"] == OK
    # shadow: over, answered OK
    assert [c.call("envoy", [[("shadow", "1")]])["overall"] for _ in range(2)] == [OK, OK]


NODE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "node")


def node_rls(port, domain, n, descriptors):
    """tests/node/rls_client.js: @grpc/grpc-js with the messages loaded from
    the project's .proto; one dict per call."""
    assert os.path.isdir(os.path.join(NODE_DIR, "node_modules", "@grpc", "proto-loader")), \
        "@grpc/proto-loader is missing: run make deps (npm ci in tests/node)"
    p = subprocess.run([shutil.which("node") or "/usr/bin/node", "rls_client.js",
                        "127.0.0.1:%d" % port, domain, str(n), json.dumps(descriptors)],
                       cwd=NODE_DIR, capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    return [json.loads(ln) for ln in p.stdout.decode().splitlines() if ln.strip()]


def test_node_client_from_the_projects_proto(sluice, redis, tmp_path):
    """Node's @grpc/grpc-js, with stubs loaded from src/rls/proto: OK then
    OVER_LIMIT after requests_per_unit calls, and per-descriptor statuses
    (no limit, nested) in request order."""
    s, port = start_rls(sluice, tmp_path, CONF)
    got = node_rls(port, "envoy", 4, [[["generic_key", "slow"]]])
    assert [r.get("overall") for r in got] == ["OK", "OK", "OK", "OVER_LIMIT"], got
    assert [r["statuses"][0]["remaining"] for r in got] == [2, 1, 0, 0]
    assert got[0]["statuses"][0]["rpu"] == 3 and got[0]["statuses"][0]["unit"] == "MINUTE"
    assert int(got[3]["headers"]["Retry-After"]) >= 1
    r = node_rls(port, "envoy", 1, [[["x", "y"]], [["remote_address", "5.6.7.8"]],
                                    [["key1", "value1"], ["subkey1", "b"]]])[0]
    assert r["overall"] == "OK" and [st["code"] for st in r["statuses"]] == ["OK"] * 3, r
    assert r["statuses"][0]["rpu"] is None
    assert [(st["rpu"], st["unit"]) for st in r["statuses"][1:]] == [(2, "HOUR"), (1, "DAY")]


def test_unknown_domain_and_all_or_nothing_over_grpc(rls):
    s, c = rls
    r = c.call("other", [[("generic_key", "slow")]])
    assert r["overall"] == OK and r["statuses"][0]["limit"] is None
    c.call("envoy", [[("generic_key", "slow")]], hits_addend=3)
    r = c.call("envoy", [[("remote_address", "9.9.9.9")], [("generic_key", "slow")]])
    assert r["overall"] == OVER_LIMIT and codes(r) == [OK, OVER_LIMIT]
    assert c.call("envoy", [[("remote_address", "9.9.9.9")]])["statuses"][0]["remaining"] == 1


def test_malformed_is_invalid_argument_over_grpc(rls):
    s, c = rls
    for body in (b"\xff\xff", request("", [[("a", "b")]]), request("envoy", [])):
        with pytest.raises(grpc.RpcError) as e:
            c.raw(body)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert c.call("envoy", [[("generic_key", "slow")]])["overall"] == OK
    assert s.proc.poll() is None


def test_redis_down_unavailable_over_grpc(sluice, own_redis, tmp_path):
    s, port = start_rls(sluice, tmp_path, CONF, extra="  rls_on_error: unavailable\n",
                        redis_port=own_redis.port)
    c = Rls(port)
    try:
        assert c.call("envoy", [[("generic_key", "slow")]])["overall"] == OK
        own_redis.stop()
        with pytest.raises(grpc.RpcError) as e:
            c.call("envoy", [[("generic_key", "slow")]])
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        c.close()


def test_redis_down_deny_over_grpc(sluice, own_redis, tmp_path):
    s, port = start_rls(sluice, tmp_path, CONF, extra="  rls_on_error: deny\n",
                        redis_port=own_redis.port)
    c = Rls(port)
    try:
        own_redis.stop()
        r = c.call("envoy", [[("generic_key", "slow")], [("x", "y")]])
        assert r["overall"] == OVER_LIMIT and codes(r) == [OVER_LIMIT, OK]
    finally:
        c.close()


# ---- run-time overrides from the admin API (docs/rls.md "Overrides") ----

OVR_CONF = """\
domain: envoy
descriptors:
  - key: tenant
    value: free
    descriptors:
      - key: user
        rate_limit: { name: free-user, unit: hour, requests_per_unit: 2 }
  - key: api_key
    rate_limit: { unit: hour, requests_per_unit: 2 }
"""


def user(name):
    return [[("tenant", "free"), ("user", name)]]


def test_admin_override_of_a_descriptor_limit(sluice, redis, tmp_path):
    s, port = start_rls(sluice, tmp_path, OVR_CONF, token=TOKEN)
    c = Rls(port)
    base = "/api/limits/rls:envoy/free-user"
    try:
        # raised: the next call meets 4 instead of 2, in its current_limit too
        code, doc, _ = api(s, "PUT", base + "/override?key=free&key=alice", {"limit": 4})
        assert code == 200 and doc["params"]["limit"] == 4, doc
        assert doc["route"] == "rls:envoy" and doc["key"] == ["free", "alice"], doc
        got = [c.call("envoy", user("alice")) for _ in range(5)]
        assert [r["overall"] for r in got] == [OK] * 4 + [OVER_LIMIT]
        assert got[0]["statuses"][0]["limit"] == {"rpu": 4, "unit": HOUR, "name": "free-user"}
        assert got[0]["statuses"][0]["remaining"] == 3
        # another key keeps the config's 2
        assert [c.call("envoy", user("bob"))["overall"] for _ in range(3)] == \
            [OK, OK, OVER_LIMIT]
        code, doc, _ = api(s, "GET", base + "?key=free&key=alice")
        assert code == 200 and doc["source"] == "runtime", doc
        assert doc["params"]["limit"] == 4 and doc["config_params"]["limit"] == 2, doc
        assert doc["allowed"] is False and doc["remaining"] == 0, doc
        # lowered: 1
        assert api(s, "PUT", base + "/override?key=free&key=carol", {"limit": 1})[0] == 200
        assert [c.call("envoy", user("carol"))["overall"] for _ in range(2)] == [OK, OVER_LIMIT]
        # DELETE: the config's 2 again (carol used 1 of them)
        code, doc, _ = api(s, "DELETE", base + "/override?key=free&key=carol")
        assert code == 200 and doc["existed"] is True, doc
        assert [c.call("envoy", user("carol"))["overall"] for _ in range(2)] == [OK, OVER_LIMIT]
        assert api(s, "GET", base + "?key=free&key=carol")[1]["source"] == "limit"
        # reset: bob passes again
        assert api(s, "POST", base + "/reset?key=free&key=bob")[0] == 200
        assert c.call("envoy", user("bob"))["overall"] == OK
        # a limit without a name is named by its path
        code, doc, _ = api(s, "PUT", "/api/limits/rls:envoy/api_key/override?key=k1",
                           {"limit": 3})
        assert code == 200, doc
        assert [c.call("envoy", [[("api_key", "k1")]])["overall"] for _ in range(4)] == \
            [OK] * 3 + [OVER_LIMIT]
    finally:
        c.close()


def test_denied_descriptors_on_the_console(sluice, redis, tmp_path):
    """The console's heavy hitters show an RLS descriptor that denied calls
    as they show the proxy's keys: route rls:DOMAIN, the limit, its entries."""
    s, port = start_rls(sluice, tmp_path, OVR_CONF, token=TOKEN)
    c = Rls(port)
    name = "dave-%d" % os.getpid()
    try:
        assert [c.call("envoy", user(name))["overall"] for _ in range(5)] == \
            [OK, OK] + [OVER_LIMIT] * 3
    finally:
        c.close()
    code, top, _ = api(s, "GET", "/api/top")
    assert code == 200, top
    mine = [g for g in top["limits"] if (g["route"], g["limit"]) == ("rls:envoy", "free-user")]
    assert mine, top["limits"]
    assert {"key": ["tenant=free", "user=" + name], "count": 3, "error": 0,
            "truncated": False} in mine[0]["keys"], mine
    code, st, _ = api(s, "GET", "/api/stats")
    assert code == 200 and "rls:envoy" in [r["route"] for r in st["routes"]], st["routes"]


def test_admin_override_of_a_descriptor_limit_refused(sluice, redis, tmp_path):
    s, port = start_rls(sluice, tmp_path, OVR_CONF, token=TOKEN)
    c = Rls(port)
    base = "/api/limits/rls:envoy/free-user"
    try:
        # the token rules of the proxy's limits: writes and reads need it
        for method, path in (("PUT", base + "/override?key=free&key=dan"),
                             ("DELETE", base + "/override?key=free&key=dan"),
                             ("POST", base + "/reset?key=free&key=dan"),
                             ("GET", base + "?key=free&key=dan")):
            for token in (None, "wrong"):
                code, doc, r = api(s, method, path, {"limit": 9} if method == "PUT" else None,
                                   token=token)
                assert code == 401 and r.header("WWW-Authenticate"), (method, token, doc)
        assert [c.call("envoy", user("dan"))["overall"] for _ in range(3)] == \
            [OK, OK, OVER_LIMIT]
        # what names nothing, or values the limit does not meet
        for path, words in (("/api/limits/rls:other/free-user?key=a", "no such RLS domain"),
                            ("/api/limits/rls:envoy/nope?key=a", "unknown limit"),
                            (base + "?key=paid&key=dan", "meets no limit"),
                            (base + "?key=free", "has a key of 2 parts")):
            code, doc, _ = api(s, "GET", path)
            assert code == 400 and words in doc["error"], (path, doc)
    finally:
        c.close()


# ---- concurrency descriptors: a slot per call, released by a second call ----

CONC_CONF = """\
domain: jobs
descriptors:
  - key: tenant
    algorithm: concurrency
    limit: 2
    lease: 3s
    rate_limit: { name: running }
"""


def test_concurrency_descriptor_release_and_lease(sluice, redis, tmp_path):
    s, port = start_rls(sluice, tmp_path, CONC_CONF)
    c = Rls(port)
    try:
        got = [c.call("jobs", [[("tenant", "a")]]) for _ in range(3)]
        assert [r["overall"] for r in got] == [OK, OK, OVER_LIMIT]
        assert got[0]["statuses"][0]["limit"] == {"rpu": 2, "unit": 0, "name": "running"}
        leases = [r["request_headers"].get("X-Sluice-Lease") for r in got]
        assert leases[0] and leases[1] and leases[0] != leases[1] and leases[2] is None, leases
        # another tenant has its own slots
        assert c.call("jobs", [[("tenant", "b")]])["overall"] == OK
        # the release: the same descriptor ending in sluice_lease: ID
        r = c.call("jobs", [[("tenant", "a"), ("sluice_lease", leases[0])]])
        assert r["overall"] == OK and r["request_headers"] == {}, r
        # at once (within the 3 s lease): the give-back went before this decision
        assert c.call("jobs", [[("tenant", "a")]])["overall"] == OK
        assert c.call("jobs", [[("tenant", "a")]])["overall"] == OVER_LIMIT
        # nothing released: the lease (3 s) ends the slots
        assert wait_until(lambda: c.call("jobs", [[("tenant", "a")]])["overall"] == OK, 8)[0]
        # a release that names no slot id
        with pytest.raises(grpc.RpcError) as e:
            c.raw(request("jobs", [[("tenant", "a"), ("sluice_lease", "x")]]))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        c.close()


# ---- the deny cache: a denied key answered without Redis until its retry ----

def test_deny_cache_answers_denied_descriptors(sluice, redis, tmp_path):
    s, port = start_rls(sluice, tmp_path, OVR_CONF, token=TOKEN)
    c = Rls(port)
    base = "/api/limits/rls:envoy/free-user"
    try:
        hits = deny_hits(s)
        got = [c.call("envoy", user("erin")) for _ in range(4)]
        assert [r["overall"] for r in got] == [OK, OK, OVER_LIMIT, OVER_LIMIT]
        # the 3rd was Redis's denial, the 4th the cache's, with the same answer
        assert deny_hits(s) == hits + 1
        assert got[3]["statuses"][0]["limit"] == got[2]["statuses"][0]["limit"]
        assert 0 < got[3]["statuses"][0]["reset_s"] <= 3600
        assert int(got[3]["headers"]["Retry-After"]) >= 1
        # another descriptor in the call is not consumed (all or nothing)
        r = c.call("envoy", [[("api_key", "z")]] + user("erin"))
        assert r["overall"] == OVER_LIMIT and deny_hits(s) == hits + 2
        assert c.call("envoy", [[("api_key", "z")]])["statuses"][0]["remaining"] == 1
        # a reset from the admin API: every worker's cache forgets at once
        assert api(s, "POST", base + "/reset?key=free&key=erin")[0] == 200
        assert c.call("envoy", user("erin"))["overall"] == OK
    finally:
        c.close()


def test_deny_cache_not_with_every_descriptor(sluice, redis, tmp_path):
    s, port = start_rls(sluice, tmp_path, OVR_CONF, token=TOKEN,
                        extra="  rls_consume: every_descriptor\n")
    c = Rls(port)
    try:
        hits = deny_hits(s)
        got = [c.call("envoy", user("fay")) for _ in range(4)]
        assert [r["overall"] for r in got] == [OK, OK, OVER_LIMIT, OVER_LIMIT]
        assert deny_hits(s) == hits
    finally:
        c.close()
