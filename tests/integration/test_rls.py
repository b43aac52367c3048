# sluice - test_rls.py: Envoy's RLS v3 ShouldRateLimit on the decision
# listener, over HTTP/1.1 (the request and answer the HTTP/2 layer turns
# into gRPC frames), against a real redis-server, with descriptors in
# envoyproxy/ratelimit's own format (decision.ratelimit_config).

import pytest

from conftest import Conn, redis_cmd
from proxylib import metrics, mval
from rlslib import (DAY, HOUR, MINUTE, OK, OVER_LIMIT, RLS_PATH, SECOND, call_h1, frame, request,
                    descriptor, should, start_rls)

BASIC = """\
domain: envoy
descriptors:
  - key: generic_key
    value: slow
    rate_limit:
      unit: minute
      requests_per_unit: 3
  - key: remote_address
    rate_limit:
      unit: hour
      requests_per_unit: 2
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit:
          name: nested
          unit: day
          requests_per_unit: 1
  - key: path
    value: /api/*
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: tenant
    value: shared*
    share_threshold: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: shadow
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
  - key: free
    rate_limit:
      unlimited: true
"""


def codes(r):
    return [s["code"] for s in r["statuses"]]


def test_ok_then_over_limit_after_requests_per_unit(sluice, redis, tmp_path):
    s, port = start_rls(sluice, tmp_path, BASIC)
    with Conn(port, timeout_s=10.0) as conn:       # one kept-alive connection
        seen = [should(port, "envoy", [[("generic_key", "slow")]], conn=conn) for _ in range(4)]
    assert [r["overall"] for r in seen] == [OK, OK, OK, OVER_LIMIT]
    assert [r["statuses"][0]["remaining"] for r in seen] == [2, 1, 0, 0]
    first = seen[0]["statuses"][0]
    assert first["limit"] == {"rpu": 3, "unit": MINUTE, "name": ""}
    assert 0 < first["reset_s"] <= 60
    # the proxy's fields, Retry-After with the denial
    assert seen[0]["headers"]["X-RateLimit-Limit"] == "3"
    assert seen[0]["headers"]["X-RateLimit-Remaining"] == "2"
    assert "RateLimit-Policy" in seen[0]["headers"] and "RateLimit" in seen[0]["headers"]
    assert "Retry-After" not in seen[0]["headers"]
    assert int(seen[3]["headers"]["Retry-After"]) >= 1
    # counted per domain
    ms = metrics(s.admin_port)
    assert mval(ms, "sluice_requests_total", route="rls:envoy", decision="allowed") == 3
    assert mval(ms, "sluice_requests_total", route="rls:envoy", decision="limited") == 1


def test_statuses_per_descriptor_in_request_order(sluice, redis, tmp_path):
    s, port = start_rls(sluice, tmp_path, BASIC)
    descs = [[("unknown", "x")], [("remote_address", "10.0.0.1")], [("free", "x")],
             [("generic_key", "slow")]]
    r = should(port, "envoy", descs)
    assert r["overall"] == OK
    st = r["statuses"]
    assert len(st) == 4
    assert st[0] == {"code": OK, "remaining": 0, "limit": None, "reset_s": None}
    assert st[1]["limit"]["rpu"] == 2 and st[1]["limit"]["unit"] == HOUR and st[1]["remaining"] == 1
    assert st[2]["code"] == OK and st[2]["remaining"] == 2**32 - 1 and st[2]["limit"] is None
    assert st[3]["limit"]["rpu"] == 3 and st[3]["remaining"] == 2
    # a second address has a counter of its own
    r = should(port, "envoy", [[("remote_address", "10.0.0.2")]])
    assert r["statuses"][0]["remaining"] == 1


def test_unknown_domain_answers_ok_without_limit(sluice, redis, tmp_path):
    s, port = start_rls(sluice, tmp_path, BASIC)
    r = should(port, "nope", [[("generic_key", "slow")], [("a", "b")]])
    assert r["overall"] == OK
    assert r["statuses"] == [{"code": OK, "remaining": 0, "limit": None, "reset_s": None}] * 2
    assert r["headers"] == {}


def test_hits_addend_request_and_descriptor(sluice, redis, tmp_path):
    s, port = start_rls(sluice, tmp_path, BASIC)
    r = should(port, "envoy", [[("generic_key", "slow")]], hits_addend=2)
    assert r["statuses"][0]["remaining"] == 1
    # 0 on the descriptor peeks: nothing consumed
    r = should(port, "envoy", [descriptor([("generic_key", "slow")], hits=0)])
    assert r["overall"] == OK and r["statuses"][0]["remaining"] == 1
    # the descriptor's own beats the request's
    r = should(port, "envoy", [descriptor([("generic_key", "slow")], hits=1)], hits_addend=5)
    assert r["overall"] == OK and r["statuses"][0]["remaining"] == 0
    r = should(port, "envoy", [[("generic_key", "slow")]], hits_addend=1)
    assert r["overall"] == OVER_LIMIT


def test_nested_and_wildcard_descriptors(sluice, redis, tmp_path):
    s, port = start_rls(sluice, tmp_path, BASIC)
    nested = [("key1", "value1"), ("subkey1", "anything")]
    r = should(port, "envoy", [nested])
    assert r["statuses"][0]["limit"] == {"rpu": 1, "unit": DAY, "name": "nested"}
    assert should(port, "envoy", [nested])["overall"] == OVER_LIMIT
    # the parent alone has no limit; a deeper request than the tree neither
    r = should(port, "envoy", [[("key1", "value1")], nested + [("more", "x")]])
    assert [s["limit"] for s in r["statuses"]] == [None, None]
    # a prefix wildcard: each value its own counter
    for path in ("/api/a", "/api/b"):
        assert [should(port, "envoy", [[("path", path)]])["overall"] for _ in range(3)] == \
               [OK, OK, OVER_LIMIT]
    assert should(port, "envoy", [[("path", "/other")]])["statuses"][0]["limit"] is None
    # share_threshold: every matching value shares one counter
    got = [should(port, "envoy", [[("tenant", "shared-%d" % i)]])["overall"] for i in range(3)]
    assert got == [OK, OK, OVER_LIMIT]


def test_shadow_mode_counts_but_answers_ok(sluice, redis, tmp_path):
    s, port = start_rls(sluice, tmp_path, BASIC)
    got = [should(port, "envoy", [[("shadow", "x")]]) for _ in range(3)]
    assert [r["overall"] for r in got] == [OK, OK, OK]
    assert [r["statuses"][0]["remaining"] for r in got] == [0, 0, 0]
    ms = metrics(s.admin_port)
    assert mval(ms, "sluice_requests_total", route="rls:envoy", decision="shadow_limited") == 2


def test_all_or_nothing_by_default(sluice, redis, tmp_path):
    s, port = start_rls(sluice, tmp_path, BASIC)
    addr = [("remote_address", "10.9.9.9")]
    assert should(port, "envoy", [[("generic_key", "slow")]], hits_addend=3)["overall"] == OK
    # generic_key is over: the call consumes nothing, remote_address included
    r = should(port, "envoy", [addr, [("generic_key", "slow")]])
    assert r["overall"] == OVER_LIMIT and codes(r) == [OK, OVER_LIMIT]
    r = should(port, "envoy", [addr])
    assert r["overall"] == OK and r["statuses"][0]["remaining"] == 1


def test_every_descriptor_counts_as_the_reference(sluice, redis, tmp_path):
    s, port = start_rls(sluice, tmp_path, BASIC, extra="  rls_consume: every_descriptor\n")
    addr = [("remote_address", "10.9.9.8")]
    assert should(port, "envoy", [[("generic_key", "slow")]], hits_addend=3)["overall"] == OK
    r = should(port, "envoy", [addr, [("generic_key", "slow")]])
    assert r["overall"] == OVER_LIMIT and codes(r) == [OK, OVER_LIMIT]
    # the rejected call consumed remote_address's unit
    assert should(port, "envoy", [addr])["statuses"][0]["remaining"] == 0


def test_request_limit_override(sluice, redis, tmp_path):
    s, port = start_rls(sluice, tmp_path, BASIC)
    d = descriptor([("remote_address", "10.1.1.1")], limit=(1, SECOND))
    r = should(port, "envoy", [d])
    assert r["statuses"][0]["limit"] == {"rpu": 1, "unit": SECOND, "name": ""}
    assert r["statuses"][0]["remaining"] == 0


def test_malformed_messages_get_status_3(sluice, redis, tmp_path):
    s, port = start_rls(sluice, tmp_path, BASIC)
    with Conn(port, timeout_s=10.0) as conn:
        for body in (b"", b"\0\0\0", frame(b"\xff\xff\xff"), frame(b"\x0a\x05ab"),
                     frame(request("", [[("a", "b")]])), frame(request("envoy", [])),
                     b"\0\0\0\0\x09" + request("envoy", [])[:3]):
            a = call_h1(port, body, conn)
            assert a.status == 200 and a.grpc_status == 3, (body, a.headers)
            assert a.headers["content-type"] == "application/grpc"
            assert a.body == b"" and a.headers.get("grpc-message")
        # the connection still serves
        assert should(port, "envoy", [[("generic_key", "slow")]], conn=conn)["overall"] == OK
    assert s.proc.poll() is None


@pytest.mark.parametrize("setting,overall,grpc", [
    ("", OK, 0), ("  rls_on_error: deny\n", OVER_LIMIT, 0),
    ("  rls_on_error: unavailable\n", None, 14)])
def test_redis_down(sluice, own_redis, tmp_path, setting, overall, grpc):
    s, port = start_rls(sluice, tmp_path, BASIC, extra=setting, redis_port=own_redis.port)
    assert should(port, "envoy", [[("generic_key", "slow")]])["overall"] == OK
    own_redis.stop()
    a = call_h1(port, frame(request("envoy", [[("generic_key", "slow")], [("x", "y")]])))
    assert a.status == 200 and a.grpc_status == grpc
    if grpc == 0:
        r = a.message()
        assert r["overall"] == overall
        assert codes(r) == [overall, OK]
    else:
        assert a.body == b"" and a.headers["grpc-message"]


def test_redis_down_follows_redis_on_error_deny(sluice, own_redis, tmp_path):
    s, port = start_rls(sluice, tmp_path, BASIC, on_error="deny", redis_port=own_redis.port)
    own_redis.stop()
    r = should(port, "envoy", [[("generic_key", "slow")]])
    assert r["overall"] == OVER_LIMIT


def test_keys_in_redis_carry_the_domain(sluice, redis, tmp_path):
    s, port = start_rls(sluice, tmp_path, BASIC)
    should(port, "envoy", [[("generic_key", "slow")]])
    keys = redis_cmd(redis.port, "KEYS", "*")
    assert any(k.startswith(b"itest:{rls|5:envoy") for k in keys), keys


def test_sighup_rereads_the_descriptors(sluice, redis, tmp_path):
    import os
    import signal
    from proxylib import wait_metric
    s, port = start_rls(sluice, tmp_path, BASIC)
    desc = [[("generic_key", "slow")]]
    assert should(port, "envoy", desc)["statuses"][0]["limit"]["rpu"] == 3
    # a bad file: the reload fails at its place, the old descriptors stay
    (tmp_path / "rls.yaml").write_text(BASIC + "  - key: generic_key\n    value: slow\n")
    before = mval(metrics(s.admin_port), "sluice_config_reloads_total", result="error")
    os.kill(s.proc.pid, signal.SIGHUP)
    assert wait_metric(s.admin_port, "sluice_config_reloads_total", before + 1, result="error")
    assert "rls.yaml:39:5: descriptors[7]: duplicate descriptor composite key " \
           "'generic_key_slow'" in s.stderr
    assert should(port, "envoy", desc)["statuses"][0]["limit"]["rpu"] == 3
    # a good one applies to the next call
    (tmp_path / "rls.yaml").write_text(BASIC.replace("requests_per_unit: 3", "requests_per_unit: 9"))
    before = mval(metrics(s.admin_port), "sluice_config_reloads_total", result="ok")
    os.kill(s.proc.pid, signal.SIGHUP)
    assert wait_metric(s.admin_port, "sluice_config_reloads_total", before + 1, result="ok")
    assert should(port, "envoy", desc)["statuses"][0]["limit"]["rpu"] == 9


def test_not_a_grpc_call(sluice, redis, tmp_path):
    s, port = start_rls(sluice, tmp_path, BASIC)
    body = frame(request("envoy", [[("generic_key", "slow")]]))
    assert call_h1(port, body, content_type="application/json").status == 415
    with Conn(port, timeout_s=10.0) as conn:
        conn.send(b"GET " + RLS_PATH.encode() + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert conn.read_response().status == 405


REPLACES = """\
domain: envoy
descriptors:
  - key: user
    rate_limit: { name: per-user, unit: minute, requests_per_unit: 1 }
  - key: vip
    rate_limit:
      name: vip
      unit: minute
      requests_per_unit: 5
      replaces: [ { name: per-user } ]
"""


def test_replaces_drops_the_replaced_limit(sluice, redis, tmp_path):
    s, port = start_rls(sluice, tmp_path, REPLACES)
    both = [[("user", "u1")], [("vip", "yes")]]
    got = [should(port, "envoy", both) for _ in range(3)]
    # per-user (1/min) is replaced: OK without a limit; vip counts
    assert [r["overall"] for r in got] == [OK, OK, OK]
    assert [r["statuses"][0]["limit"] for r in got] == [None] * 3
    assert [r["statuses"][1]["remaining"] for r in got] == [4, 3, 2]
    # alone, per-user applies
    assert [should(port, "envoy", [both[0]])["overall"] for _ in range(2)] == [OK, OVER_LIMIT]


def test_memory_backend_decides_the_same(sluice, redis, tmp_path):
    s, port = start_rls(sluice, tmp_path, BASIC, top_extra="backend: memory\n")
    got = [should(port, "envoy", [[("generic_key", "slow")]])["overall"] for _ in range(4)]
    assert got == [OK, OK, OK, OVER_LIMIT]
