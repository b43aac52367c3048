# sluice - tests/integration/test_plans.py: plans, named sets of limits per client (issue 23).
#
# Real sluice processes on one real Redis: free and pro keys get their
# plan's budget, a per-key assignment in the config, a plan switched at run
# time through one proxy's admin API taking effect on a second proxy, a
# clear falling back, the usage read, the token rule, and config errors
# with FILE:LINE:COL.

import os
import re
import signal
import subprocess

from apilib import TOKEN, api, start_api, start_pair
from conftest import http_get, make_conf, sluice_bin, wait_until
from proxylib import wait_metric

PLANS = """\
plans:
  default: free
  assign:
    k-gold: pro
  free:
    limits:
      - { name: per-hour, algorithm: fixed_window, limit: 2, window: 1h, key: ["header:X-Api-Key"] }
  pro:
    limits:
      - { name: per-hour, algorithm: fixed_window, limit: 5, window: 1h, key: ["header:X-Api-Key"] }
      - { name: burst, algorithm: token_bucket, rate: 1/h, burst: 50, key: ["header:X-Api-Key"] }
"""

ROUTES = """\
  - name: api
    match: { path: /api }
    upstream: api
    plan_key: "header:X-Api-Key"
    limits:
      - { name: per-ip, algorithm: fixed_window, limit: 1000, window: 1h, key: [ip] }
"""


def start(sluice, routes=ROUTES, plans=PLANS, token=TOKEN):
    return start_api(sluice, routes, token=token, top=plans)


def call(s, key):
    return http_get(s.port, "/api", headers=[("X-Api-Key", key)]).status


def run(s, key, n):
    return [call(s, key) for _ in range(n)]


def test_free_and_pro_get_their_budgets(sluice, redis):
    s = start(sluice)
    assert run(s, "k-free", 4) == [200, 200, 429, 429]
    assert run(s, "k-gold", 7) == [200] * 5 + [429, 429]    # plans.assign: pro
    # the rate-limit fields show the plan's limits beside the route's
    r = http_get(s.port, "/api", headers=[("X-Api-Key", "k-other")])
    assert r.status == 200 and r.header("X-RateLimit-Limit") == "2", r.headers
    assert '"per-hour";q=2' in r.header("RateLimit-Policy"), r.headers
    # keys of the plan's own, apart per plan
    keys = [k.decode() for k in redis_keys_of(redis)]
    assert any(k.startswith("itest:{plan:free|per-hour|") for k in keys), keys
    assert any(k.startswith("itest:{plan:pro|per-hour|") for k in keys), keys


def redis_keys_of(redis):
    from conftest import redis_keys
    return redis_keys(redis.port)


def test_runtime_switch_reaches_the_second_proxy(sluice, redis):
    a, b = start_pair(sluice, ROUTES, top=PLANS)
    assert run(b, "k-bob", 3) == [200, 200, 429]
    code, doc, _ = api(a, "PUT", "/api/plans?key=k-bob", {"plan": "pro"})
    assert code == 200 and doc["plan"] == "pro" and doc["source"] == "runtime", doc
    # b applies it once its subscriber has the message; pro's counters are
    # its own, so bob starts from 0 of 5
    assert wait_until(lambda: call(b, "k-bob") == 200, timeout_s=5.0)
    assert run(b, "k-bob", 5)[-1] == 429
    code, doc, _ = api(b, "GET", "/api/plans?key=k-bob")
    assert code == 200 and doc["plan"] == "pro" and doc["source"] == "runtime", doc
    # clear: back to plans.assign, else the default, on both proxies
    code, doc, _ = api(a, "DELETE", "/api/plans?key=k-bob")
    assert code == 200 and doc["existed"] is True and doc["plan"] == "free", doc
    assert wait_until(lambda: api(b, "GET", "/api/plans?key=k-bob")[1]["plan"] == "free",
                      timeout_s=5.0)
    assert call(b, "k-bob") == 429                      # free's 2 were used
    code, doc, _ = api(a, "PUT", "/api/plans?key=k-gold", {"plan": "free"})
    assert code == 200 and doc["source"] == "runtime"
    code, doc, _ = api(a, "DELETE", "/api/plans?key=k-gold")
    assert doc["plan"] == "pro" and doc["source"] == "config", doc


def test_a_proxy_started_later_reads_the_assignments(sluice, redis):
    a = start(sluice)
    code, doc, _ = api(a, "PUT", "/api/plans?key=k-late", {"plan": "pro"})
    assert code == 200, doc
    b = start(sluice)
    assert wait_until(lambda: api(b, "GET", "/api/plans?key=k-late")[1]["source"] == "runtime",
                      timeout_s=5.0)
    assert run(b, "k-late", 6) == [200] * 5 + [429]


def test_usage_read_shows_the_counts(sluice, redis):
    s = start(sluice)
    assert run(s, "k-gold", 3) == [200] * 3
    code, doc, _ = api(s, "GET", "/api/plans?key=k-gold")
    assert code == 200, doc
    assert doc["plan"] == "pro" and doc["source"] == "config", doc
    lim = {l["limit"]: l for l in doc["limits"]}
    assert lim["per-hour"]["state"]["used"] == 3, repr(lim["per-hour"])
    assert lim["per-hour"]["state"]["remaining"] == 2, doc
    assert lim["per-hour"]["params"] == {"limit": 5, "window_ms": 3600000}, lim
    assert lim["burst"]["state"]["remaining"] == 47, lim
    # the read consumed nothing
    assert run(s, "k-gold", 3) == [200, 200, 429]
    # a plan's limits are a route of their own to the limits API: reset
    code, doc, _ = api(s, "POST", "/api/limits/plan:pro/per-hour/reset?key=k-gold")
    assert code == 200 and doc["existed"] is True, doc
    assert call(s, "k-gold") == 200
    code, doc, _ = api(s, "GET", "/api/plans?key=k-new")
    assert doc["plan"] == "free" and doc["source"] == "default", doc
    assert doc["limits"][0]["state"]["used"] == 0, doc


def test_admin_writes_and_reads_need_the_token(sluice, redis):
    s = start(sluice)
    for method, body in (("PUT", {"plan": "pro"}), ("DELETE", None), ("GET", None)):
        code, doc, r = api(s, method, "/api/plans?key=k-x", body, token=None)
        assert code == 401, (method, code, doc)
        code, doc, _ = api(s, method, "/api/plans?key=k-x", body, token="wrong")
        assert code == 401, (method, code, doc)
    assert run(s, "k-x", 3) == [200, 200, 429]          # still free
    code, doc, _ = api(s, "PUT", "/api/plans?key=k-x", {"plan": "platinum"})
    assert code == 400 and "unknown plan" in doc["error"], doc
    # no admin.token: refused
    t = start(sluice, token=None)
    code, doc, _ = api(t, "PUT", "/api/plans?key=k-x", {"plan": "pro"}, token=None)
    assert code == 403, doc


def test_memory_backend_plans(sluice):
    s = start_api(sluice, ROUTES, top=PLANS + "backend: memory\n")
    assert run(s, "k-m", 3) == [200, 200, 429]
    code, doc, _ = api(s, "PUT", "/api/plans?key=k-m", {"plan": "pro"})
    assert code == 200, doc
    assert run(s, "k-m", 6) == [200] * 5 + [429]
    code, doc, _ = api(s, "GET", "/api/plans?key=k-m")
    assert doc["limits"][0]["state"]["used"] == 5, doc


def check(tmp_path, text):
    p = tmp_path / "s.yaml"
    p.write_text(re.sub(r"@[A-Z]+_PORT@", "9", text))
    r = subprocess.run([sluice_bin(), "-t", "-c", str(p)], capture_output=True, timeout=30)
    return r.returncode, r.stderr.decode(), str(p)


def conf_with(plans, routes=ROUTES):
    return make_conf(routes).replace("routes:\n", plans + "routes:\n", 1)


def test_config_errors_have_file_line_col(tmp_path):
    text = conf_with(PLANS)
    rc, err, _ = check(tmp_path, text)
    assert rc == 0, err
    line = text.split("\n").index("    k-gold: pro") + 1
    rc, err, path = check(tmp_path, text.replace("k-gold: pro", "k-gold: platinum"))
    assert rc == 1 and re.search(re.escape(path) + r":%d:13: .*plans\.assign\.k-gold.*unknown "
                                 r"plan 'platinum'" % line, err), err
    rc, err, path = check(tmp_path, text.replace("default: free", "default: gold"))
    assert rc == 1 and re.search(re.escape(path) + r":\d+:\d+: .*unknown plan 'gold'", err), err
    rc, err, path = check(tmp_path, text.replace("  default: free\n", ""))
    assert rc == 1 and re.search(re.escape(path) + r":\d+:\d+: .*missing required key "
                                 r"'default' in plans", err), err
    rc, err, path = check(tmp_path, text.replace("  free:\n    limits:\n", "  free:\n    x:\n"))
    assert rc == 1 and re.search(re.escape(path) + r":\d+:\d+: .*(missing required key "
                                 r"'limits'|unknown key 'x')", err), err
    rc, err, path = check(tmp_path, conf_with("", ROUTES))
    assert rc == 1 and re.search(re.escape(path) + r":\d+:\d+: .*no plans: section", err), err


def test_plan_from_names_the_plan_after_the_assignments(sluice, redis):
    routes = ROUTES.replace('    plan_key: "header:X-Api-Key"\n',
                            '    plan_key: "header:X-Api-Key"\n    plan_from: "header:X-Plan"\n')
    s = start(sluice, routes=routes)

    def with_plan(key, plan, n):
        return [http_get(s.port, "/api", headers=[("X-Api-Key", key), ("X-Plan", plan)]).status
                for _ in range(n)]

    assert with_plan("k-p1", "pro", 6) == [200] * 5 + [429]
    assert with_plan("k-p2", "nosuch", 3) == [200, 200, 429]    # no such plan: default
    code, doc, _ = api(s, "PUT", "/api/plans?key=k-p3", {"plan": "free"})
    assert code == 200, doc
    assert with_plan("k-p3", "pro", 3) == [200, 200, 429]       # the assignment goes first


def test_reload_keeps_assignments_and_passes_over_a_removed_plan(sluice, redis):
    s = start(sluice)
    code, doc, _ = api(s, "PUT", "/api/plans?key=k-r", {"plan": "pro"})
    assert code == 200, doc
    assert run(s, "k-r", 2) == [200, 200]
    # the same file again: the run-time assignment stands (pro: 3 of 5 left)
    os.kill(s.proc.pid, signal.SIGHUP)
    assert wait_metric(s.admin_port, "sluice_config_reloads_total", 1, result="ok")
    assert run(s, "k-r", 4) == [200, 200, 200, 429]
    # pro renamed: the assignment names no plan of this config, the default applies
    s.conf_path.write_text(s.conf_path.read_text().replace("  pro:\n", "  gold:\n")
                           .replace("k-gold: pro", "k-gold: gold"))
    os.kill(s.proc.pid, signal.SIGHUP)
    assert wait_metric(s.admin_port, "sluice_config_reloads_total", 2, result="ok")
    assert run(s, "k-r", 3) == [200, 200, 429]
    code, doc, _ = api(s, "GET", "/api/plans?key=k-r")
    assert doc["plan"] == "free" and doc["source"] == "default", doc
