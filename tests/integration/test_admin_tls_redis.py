# sluice - tests/integration/test_admin_tls_redis.py: the admin API and the
# reset subscriber over TLS to Redis (rediss://, redis.tls).
#
# The admin API's commands and the reset subscriber run on connections of
# their own (rconn), with the store's TLS settings: against a TLS-only
# redis-server an override is written and read, applied by the proxy, and a
# reset reaches the deny cache through pub/sub over TLS.

import time

from apilib import TOKEN, api
from conftest import free_port, http_get, wait_port, wait_until
from test_redis_tls import certs, tls_conf, tls_redis, wait_decided  # noqa: F401 (fixtures)

PATH = "/api/limits/r/two"


def start(sluice, red, certs):
    admin_port = free_port()
    text = tls_conf(certs, red.port, "    ca_file: %s\n" % certs["ca.crt"])
    text = text.replace("routes:\n", "admin:\n  listen: 127.0.0.1:%d\n  token: %s\n"
                        "routes:\n" % (admin_port, TOKEN), 1)
    s = sluice(text, wait_redis=False)
    s.admin_port = admin_port
    assert wait_port(admin_port, s.proc), s.stderr
    assert "X-RateLimit-Limit" in dict(wait_decided(s.port).headers), s.stderr
    return s


def statuses(s, key, n):
    return [http_get(s.port, "/x", headers=[("X-K", key)]).status for _ in range(n)]


def test_override_written_and_applied_over_tls(sluice, tls_redis, certs):
    red = tls_redis()
    s = start(sluice, red, certs)
    st, doc, r = api(s, "PUT", PATH + "/override?key=vip", {"limit": 4})
    assert st == 200, (st, doc, s.stderr[-2000:])
    assert any(k.endswith(b":ovr") for k in red.cmd("KEYS", "itest:*")), red.cmd("KEYS", "*")
    st, doc, _ = api(s, "GET", PATH + "?key=vip")
    assert st == 200 and doc["source"] == "runtime", doc
    assert statuses(s, "vip", 5) == [200, 200, 200, 200, 429]     # 4, not the config's 2
    assert statuses(s, "plain", 3) == [200, 200, 429]


def test_reset_reaches_the_deny_cache_over_tls(sluice, tls_redis, certs):
    red = tls_redis()
    s = start(sluice, red, certs)
    assert statuses(s, "flood", 4) == [200, 200, 429, 429]       # the last from the deny cache
    st, doc, _ = api(s, "POST", PATH + "/reset?key=flood")
    assert st == 200, (st, doc, s.stderr[-2000:])
    ok, took = wait_until(lambda: http_get(s.port, "/x", headers=[("X-K", "flood")]).status == 200,
                    1.0)
    assert ok, "a reset key still denied after %.2f s:\n%s" % (took, s.stderr[-2000:])
    assert "reset subscriber lost" not in s.stderr
