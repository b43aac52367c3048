# sluice - tests/integration/test_grafana_prometheus.py: the Grafana dashboard
# and the Prometheus alert rules in docs/ against a real sluice.
#
# A real sluice (admin on, a real redis-server that is stopped half-way) gets
# allowed, limited, regex-limited and Redis-error traffic; its /metrics must
# name every sluice_* metric and label any expression in docs/grafana/sluice.json
# or docs/prometheus/alerts.yml uses, with rate()/increase() only on counters
# and histograms. promtool (Debian's prometheus package) checks the rules,
# the dashboard's queries (as recording rules), the scrape, and runs unit
# tests of the alerts on synthetic series. The checker is also run on
# misspelt copies, which it must reject.

import json
import os
import re
import shutil
import subprocess
import uuid

import pytest
import yaml

from conftest import ROOT
from proxylib import metrics_text, mval, parse_metrics, start_proxy, statuses

DASHBOARD = os.path.join(ROOT, "docs", "grafana", "sluice.json")
ALERTS = os.path.join(ROOT, "docs", "prometheus", "alerts.yml")
PROMTOOL_TIMEOUT_S = 30

ROUTES = """\
  - name: lim
    match: { path: /lim }
    upstream: api
    limits:
      - { name: two, algorithm: fixed_window, limit: 2, window: 1m, key: ["header:X-K"] }
  - name: re
    match: { path_regex: "^/x/(.*|a){1,120}(b|c)" }
    upstream: api
"""

PANEL_TITLES = {
    "Request rate", "Limited share", "Workers connected to Redis", "Failed reloads",
    "Requests by decision", "Requests by route", "429 ratio by route", "Responses by code",
    "Decision errors by route", "Regex limit hits", "Redis decision latency",
    "Redis errors by reason", "Redis calls and deny-cache hits", "Redis Cluster redirects",
    "Connections", "Upstream latency", "Requests by worker", "Access log drops",
    "Config reloads",
}
DASHBOARD_FAMILIES = {
    "sluice_requests_total", "sluice_responses_total", "sluice_regex_limit_total",
    "sluice_worker_requests_total", "sluice_redis_requests_total", "sluice_redis_errors_total",
    "sluice_deny_cache_hits_total", "sluice_redis_duration_seconds",
    "sluice_upstream_duration_seconds", "sluice_connections", "sluice_redis_connected",
    "sluice_access_log_dropped_total", "sluice_redis_redirects_total",
    "sluice_config_reloads_total",
}
ALERT_NAMES = {
    "SluiceRedisDown", "SluiceDecisionErrors", "SluiceRedisOutOfMemory", "SluiceRedisSlow",
    "SluiceHigh429Ratio", "SluiceReloadFailed", "SluiceAccessLogDropping",
}
# Labels Prometheus adds to every scraped series.
TARGET_LABELS = {"job", "instance"}
# Grafana's variables, as a query would see them.
GRAFANA_VARS = [("$__rate_interval", "5m"), ("$__range", "1h"), ("$instance", ".*"),
                ("$route", ".*")]

_NAME = re.compile(r"\bsluice_[a-zA-Z0-9_]+\b")
_SELECTOR = re.compile(r"\b(sluice_[a-zA-Z0-9_]+)\s*\{([^}]*)\}")
_MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
_RATE = re.compile(r"\b(?:rate|irate|increase)\(\s*(sluice_[a-zA-Z0-9_]+)")
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+\S+')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def promtool():
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: install Debian's prometheus package (make deps)")
    return path


def run_promtool(*args, stdin=None):
    return subprocess.run([promtool()] + list(args), input=stdin, capture_output=True,
                          text=True, timeout=PROMTOOL_TIMEOUT_S)


# ------------------------------------------------------- the two files ----

def panels_of(dash):
    """Every panel, rows' nested panels included."""
    out = []
    for p in dash.get("panels", []):
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def dashboard_exprs(dash):
    """[(where, PromQL)] of every target and query variable."""
    out = []
    for p in panels_of(dash):
        for t in p.get("targets", []):
            out.append(("panel %r %s" % (p.get("title"), t.get("refId")), t["expr"]))
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v["query"]
            out.append(("variable %r" % v["name"], q["query"] if isinstance(q, dict) else q))
    return out


def alert_rules(path):
    with open(path) as f:
        doc = yaml.safe_load(f)
    return [r for g in doc["groups"] for r in g["rules"]]


def alert_exprs(path):
    return [("alert %r" % r.get("alert", r.get("record")), r["expr"]) for r in alert_rules(path)]


# ---------------------------------------------------------- the scrape ----

def parse_scrape(text):
    """-> ({family: type}, {sample name: {label: set(values)}})"""
    types, samples = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(None, 3)
            types[name] = kind.strip()
            continue
        if not line.strip() or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        assert m, "bad metrics line %r" % line
        labels = samples.setdefault(m.group(1), {})
        for k, v in _LABEL.findall(m.group(2) or ""):
            labels.setdefault(k, set()).add(v)
    return types, samples


def family(name, types):
    """The metric family a series name belongs to, or None."""
    if name in types:
        return name
    for suffix in ("_bucket", "_sum", "_count"):
        base = name[:-len(suffix)]
        if name.endswith(suffix) and types.get(base) in ("histogram", "summary"):
            return base
    return None


def check_exprs(exprs, scrape):
    """Problems of expressions against a scrape: unknown metric names, labels
    or label values that no series has, rate() of a gauge. [] when all is well."""
    types, samples = parse_scrape(scrape)
    problems = []
    for where, expr in exprs:
        names = _NAME.findall(expr)
        if not names:
            problems.append("%s: no sluice_* metric in %r" % (where, expr))
        for name in names:
            fam = family(name, types)
            if fam is None or name not in samples:
                problems.append("%s: %s is not in the scrape" % (where, name))
        for name, body in _SELECTOR.findall(expr):
            have = samples.get(name, {})
            for label, op, value in _MATCHER.findall(body):
                if label in TARGET_LABELS:
                    continue
                if label not in have and not (op in ("=", "=~") and value in ("", ".*")):
                    problems.append("%s: %s has no label %r" % (where, name, label))
                elif op == "=" and value and "$" not in value and \
                        value not in have.get(label, set()):
                    problems.append("%s: no %s{%s=%r} in the scrape" % (where, name, label, value))
        for name in _RATE.findall(expr):
            fam = family(name, types)
            if fam is not None and types[fam] == "gauge":
                problems.append("%s: rate/increase of the gauge %s" % (where, name))
    return problems


@pytest.fixture
def scrape(sluice, own_redis, tmp_path):
    """/metrics of a sluice that saw allowed, limited (Redis, then the deny
    cache), regex-limited, unrouted and Redis-down traffic."""
    s = start_proxy(sluice, ROUTES, redis_port=own_redis.port,
                  top="access_log: %s\n" % (tmp_path / "access.log"))
    key = uuid.uuid4().hex
    assert statuses(s.port, "/lim", 5, [("X-K", key)]) == [200, 200, 429, 429, 429]
    assert statuses(s.port, "/x/" + "a" * 3000, 1) == [400]
    assert statuses(s.port, "/nowhere", 1) == [404]
    own_redis.stop()
    # on_error allow: forwarded, counted as decision="error"
    assert statuses(s.port, "/lim", 2, [("X-K", uuid.uuid4().hex)]) == [200, 200]
    return metrics_text(s.admin_port)


# --------------------------------------------------------------- tests ----

def test_every_metric_used_is_exported(scrape):
    types, samples = parse_scrape(scrape)
    # the traffic reached the series the files are about
    ms = parse_metrics(scrape)
    assert mval(ms, "sluice_requests_total", route="lim", decision="limited") == 3
    assert mval(ms, "sluice_requests_total", route="lim", decision="error") == 2
    assert mval(ms, "sluice_redis_errors_total") >= 2
    assert mval(ms, "sluice_regex_limit_total", route="re") == 1
    with open(DASHBOARD) as f:
        dash = json.load(f)
    exprs = dashboard_exprs(dash) + alert_exprs(ALERTS)
    assert len(exprs) > 20, exprs
    assert check_exprs(exprs, scrape) == []
    # every family sluice exported when the dashboard was made is on it
    used = {family(n, types) for _, e in dashboard_exprs(dash) for n in _NAME.findall(e)}
    assert DASHBOARD_FAMILIES - used == set(), "not on the dashboard"
    assert DASHBOARD_FAMILIES <= set(types)


def test_promtool_accepts_the_scrape(scrape):
    r = run_promtool("check", "metrics", stdin=scrape)
    assert r.returncode == 0 and r.stdout.strip() == "" and r.stderr.strip() == "", r


def test_checker_rejects_misspelt_copies(scrape, tmp_path):
    with open(DASHBOARD) as f:
        text = f.read()
    bad = json.loads(text.replace("sluice_deny_cache_hits_total", "sluice_deny_cache_hit_total"))
    got = check_exprs(dashboard_exprs(bad), scrape)
    assert any("sluice_deny_cache_hit_total is not in the scrape" in p for p in got), got
    bad = json.loads(text.replace('code=\\"429\\"', 'status=\\"429\\"', 1))
    got = check_exprs(dashboard_exprs(bad), scrape)
    assert any("sluice_responses_total has no label 'status'" in p for p in got), got
    bad = json.loads(text.replace('decision=\\"limited\\"', 'decision=\\"denied\\"', 1))
    got = check_exprs(dashboard_exprs(bad), scrape)
    assert any("decision='denied'" in p for p in got), got
    got = check_exprs([("x", "rate(sluice_connections[5m])")], scrape)
    assert any("gauge sluice_connections" in p for p in got), got

    with open(ALERTS) as f:
        rules = f.read()
    copy = tmp_path / "alerts.yml"
    copy.write_text(rules.replace("sluice_redis_connected", "sluice_redis_conected"))
    got = check_exprs(alert_exprs(str(copy)), scrape)
    assert any("sluice_redis_conected is not in the scrape" in p for p in got), got
    copy.write_text(rules.replace("[5m]))", "[5m])", 1))
    r = run_promtool("check", "rules", str(copy))
    assert r.returncode != 0, r


def test_promtool_checks_the_rules():
    r = run_promtool("check", "rules", ALERTS)
    assert r.returncode == 0, r
    assert "SUCCESS: %d rules found" % len(ALERT_NAMES) in r.stdout, r
    assert {r["alert"] for r in alert_rules(ALERTS)} == ALERT_NAMES
    for rule in alert_rules(ALERTS):
        assert rule["annotations"]["summary"] and rule["labels"]["severity"], rule


def test_dashboard_is_importable_and_its_queries_parse(tmp_path):
    with open(DASHBOARD) as f:
        dash = json.load(f)
    assert dash["schemaVersion"] >= 30 and dash["title"] == "sluice" and dash["uid"]
    inputs = {i["name"]: i for i in dash["__inputs"]}
    assert inputs["DS_PROMETHEUS"]["type"] == "datasource"
    assert inputs["DS_PROMETHEUS"]["pluginId"] == "prometheus"
    ds = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
    panels = panels_of(dash)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), ids
    shown = [p for p in panels if p["type"] != "row"]
    assert {p["title"] for p in shown} == PANEL_TITLES
    for p in shown:
        assert p["datasource"] == ds and p["targets"], p["title"]
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"] == ds, p["title"]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["route"]["datasource"] == ds
    assert re.search(r"label_values\(sluice_requests_total\b.*,\s*route\)",
                     variables["route"]["query"]["query"]), variables["route"]
    # every panel filters on the route variable where its metric has routes
    for where, expr in dashboard_exprs(dash):
        for name in _NAME.findall(expr):
            if name in ("sluice_requests_total", "sluice_responses_total",
                        "sluice_regex_limit_total") and where.startswith("panel"):
                assert 'route=~"$route"' in expr, (where, expr)

    # the queries, with Grafana's variables filled in, as recording rules:
    # promtool parses each one as PromQL
    rules = []
    for i, (where, expr) in enumerate(dashboard_exprs(dash)):
        # a variable's label_values(SELECTOR, LABEL) is Grafana's: its selector
        expr = re.sub(r"^label_values\((.*),\s*[a-zA-Z_]+\)$", r"\1", expr)
        for var, value in GRAFANA_VARS:
            expr = expr.replace(var, value)
        rules.append({"record": "dashboard:query_%d" % i, "expr": expr})
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    r = run_promtool("check", "rules", str(path))
    assert r.returncode == 0, (r, path.read_text())


ALERT_TESTS = """\
rule_files: [%(alerts)s]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      # a: lost Redis; b: memory backend (never sent a decision to Redis)
      - series: 'sluice_redis_connected{job="sluice",instance="a"}'
        values: '1 1 0x10'
      - series: 'sluice_redis_requests_total{job="sluice",instance="a"}'
        values: '0+10x12'
      - series: 'sluice_redis_connected{job="sluice",instance="b"}'
        values: '0x12'
      - series: 'sluice_redis_requests_total{job="sluice",instance="b"}'
        values: '0x12'
      # route hot: half its responses 429; route calm: none
      - series: 'sluice_responses_total{job="sluice",instance="a",route="hot",code="200"}'
        values: '0+600x30'
      - series: 'sluice_responses_total{job="sluice",instance="a",route="hot",code="429"}'
        values: '0+600x30'
      - series: 'sluice_responses_total{job="sluice",instance="a",route="calm",code="200"}'
        values: '0+600x30'
      # 5%% of a's decisions are errors
      - series: 'sluice_requests_total{job="sluice",instance="a",route="hot",decision="allowed"}'
        values: '0+570x30'
      - series: 'sluice_requests_total{job="sluice",instance="a",route="hot",decision="error"}'
        values: '0+30x30'
      # a reload fails at 2m, a good one follows at 20m
      - series: 'sluice_config_last_reload_success{job="sluice",instance="a"}'
        values: '1 1 0x17 1x10'
      - series: 'sluice_access_log_dropped_total{job="sluice",instance="a"}'
        values: '0 0 0 50 50 50 50 50 50 50 50 50 50'
    alert_rule_test:
      - eval_time: 6m
        alertname: SluiceRedisDown
        exp_alerts:
          - exp_labels: { severity: critical, job: sluice, instance: a }
      - eval_time: 20m
        alertname: SluiceHigh429Ratio
        exp_alerts:
          - exp_labels: { severity: warning, job: sluice, route: hot }
      - eval_time: 20m
        alertname: SluiceDecisionErrors
        exp_alerts:
          - exp_labels: { severity: warning, job: sluice, instance: a }
      - eval_time: 5m
        alertname: SluiceReloadFailed
        exp_alerts:
          - exp_labels: { severity: warning, job: sluice, instance: a }
      - eval_time: 24m
        alertname: SluiceReloadFailed
        exp_alerts: []
      - eval_time: 5m
        alertname: SluiceAccessLogDropping
        exp_alerts:
          - exp_labels: { severity: warning, job: sluice, instance: a }
      - eval_time: 12m
        alertname: SluiceAccessLogDropping
        exp_alerts: []
"""


def test_alerts_fire_on_synthetic_series(tmp_path):
    """promtool test rules: each alert fires on the series it is about, and
    not on a memory-backend proxy, a calm route or after the window."""
    # The rules as they are, without their annotations: promtool would
    # compare the rendered texts, which check rules has already parsed.
    with open(ALERTS) as f:
        doc = yaml.safe_load(f)
    for g in doc["groups"]:
        for rule in g["rules"]:
            rule.pop("annotations", None)
    rules = tmp_path / "alerts_bare.yml"
    rules.write_text(yaml.safe_dump(doc))
    path = tmp_path / "alerts_test.yml"
    path.write_text(ALERT_TESTS % {"alerts": json.dumps(str(rules))})
    r = run_promtool("test", "rules", str(path))
    assert r.returncode == 0, r
    assert "SUCCESS" in r.stdout, r
