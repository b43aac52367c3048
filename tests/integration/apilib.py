# sluice - tests/integration/apilib.py: helpers for the admin API tests (issue 14).
#
# Two proxies on one Redis with the admin API, JSON calls with or without
# the Bearer token, and a bounded poll. Used by test_overrides.py and
# test_admin_api.py.

import json

from conftest import free_port, http_get, wait_port
from proxylib import metrics, mval, proxy_conf

TOKEN = "s3cret-token"


def api(s, method, path, body=None, token=TOKEN, headers=None):
    """(status, parsed JSON body or None, Response) from s's admin port."""
    hdrs = list(headers or [])
    if token is not None:
        hdrs.append(("Authorization", "Bearer " + token))
    data = None
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        hdrs.append(("Content-Type", "application/json"))
    r = http_get(s.admin_port, path, method=method, headers=hdrs, body=data)
    try:
        doc = json.loads(r.body.decode()) if r.body else None
    except ValueError:
        doc = None
    return r.status, doc, r


def get_k(s, path, key):
    """One proxied request with X-K: key; returns the status."""
    return http_get(s.port, path, headers=[("X-K", key)]).status


def start_api(sluice, routes, token=TOKEN, workers=1, top="", redis_port=None, hosts=None):
    """sluice with an admin port; admin.token comes from the environment
    (${SLUICE_TEST_TOKEN}) unless token is None (no admin.token at all);
    redis_port: a Redis not to wait for (the test's own)."""
    admin_port = free_port()
    text = proxy_conf(routes, workers=workers, top=top)
    admin = "admin:\n  listen: 127.0.0.1:%d\n" % admin_port
    if token is not None:
        admin += "  token: ${SLUICE_TEST_TOKEN}\n"
    if hosts is not None:
        admin += "  hosts: [%s]\n" % ", ".join(hosts)
    text = text.replace("routes:\n", admin + "routes:\n", 1)
    s = sluice(text, env={"SLUICE_TEST_TOKEN": token or ""}, redis_port=redis_port,
               wait_redis="backend: memory" not in top and redis_port is None)
    s.admin_port = admin_port
    assert wait_port(admin_port, s.proc), s.stderr
    return s


def start_pair(sluice, routes, token=TOKEN, workers=1, top=""):
    """Two proxies on the session Redis, the same prefix."""
    return [start_api(sluice, routes, token, workers, top) for _ in range(2)]


def deny_hits(s):
    return mval(metrics(s.admin_port), "sluice_deny_cache_hits_total")
