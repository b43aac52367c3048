# sluice - tests/integration/test_dashboard.py: the admin console's page
# (GET / on the admin address, issue 14) in a real browser.
#
# Debian's chromium (the Makefile's DEBS install it) loads the page from a
# running sluice after real traffic, headless; its DOM must show the
# routes, their counts, the Redis state and a hostile key as text (never
# as markup). A screenshot is taken at laptop and phone sizes; with
# SLUICE_DASHBOARD_PNG=PATH the laptop one is copied there (docs/dashboard.png
# is made so). chromium missing or failing is a failure, not a skip.

import json
import os
import shutil
import signal
import struct
import subprocess
import uuid
from html.parser import HTMLParser

import pytest

from conftest import http_get
from proxylib import start_proxy, statuses

CHROMIUM_TIMEOUT_S = 40
ROUTES = """\
  - name: api
    match: { path: /api }
    upstream: api
    limits:
      - { name: per_key, algorithm: fixed_window, limit: 3, window: 1m, key: ["header:X-K"] }
  - name: login
    match: { path: /login }
    upstream: api
    limits:
      - { name: per_ip, algorithm: gcra, rate: 1/s, burst: 2, key: [ip] }
  - name: static
    match: { path: /static }
    upstream: api
"""
HOSTILE = "<img src=x onerror=alert(1)>"


def chromium():
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("chromium not found: install Debian's chromium (make deps)")


def run_chromium(tmp_path, url, *args):
    """chromium headless on url, bounded in time (killed by PID, with its
    process group, past CHROMIUM_TIMEOUT_S). Returns its stdout and stderr
    (where --enable-logging puts the page's console messages)."""
    profile = tmp_path / ("profile-%s" % uuid.uuid4().hex[:8])
    cmd = [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu",
           "--disable-dev-shm-usage", "--no-first-run", "--disable-extensions",
           "--disable-background-networking", "--user-data-dir=%s" % profile,
           "--virtual-time-budget=5000"] + list(args) + [url]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=CHROMIUM_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail("chromium did not finish within %d s" % CHROMIUM_TIMEOUT_S)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    err = err.decode("utf-8", "replace")
    assert p.returncode == 0, (p.returncode, err[-3000:])
    return out.decode("utf-8", "replace"), err


class Dom(HTMLParser):
    """The text of elements by id, of each route card's counters, and of the
    cells of each table body with an id ("top-body" as top); and every tag
    seen."""

    def __init__(self):
        super().__init__()
        self.stack, self.by_id, self.routes, self.tags = [], {}, {}, []
        self.rows = {"top-body": []}
        self.top = self.rows["top-body"]
        self.route = None

    def _body(self):
        return next((t[1] for t in self.stack if t[0] == "tbody" and t[1]), None)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        if tag in ("meta", "link", "br", "img", "input"):
            return
        if "data-route" in a:
            self.route = a["data-route"]
            self.routes[self.route] = {}
        self.stack.append((tag, a.get("id"), a.get("class", ""), []))
        if tag == "tr" and self._body():
            self.rows.setdefault(self._body(), []).append([])

    def handle_endtag(self, tag):
        if not self.stack or tag in ("meta", "link", "br", "img", "input"):
            return
        t, ident, cls, text = self.stack.pop()
        s = "".join(text)
        for outer in self.stack:
            outer[3].append(s)
        if ident:
            self.by_id[ident] = s
        if t == "b" and cls.startswith("n-") and self.route:
            self.routes[self.route][cls[2:]] = s
        if t == "td" and self.rows.get(self._body()):
            self.rows[self._body()][-1].append((cls, s))

    def handle_data(self, data):
        if self.stack:
            self.stack[-1][3].append(data)


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", head[16:24])


@pytest.fixture
def console(sluice):
    # a prefix of its own: the hostile key is the same in every test
    s = start_proxy(sluice, ROUTES, workers=2, prefix="dash-%s:" % uuid.uuid4().hex[:8])
    key = uuid.uuid4().hex[:8]
    # api: 3 allowed, then the hostile key limited 12 times
    assert statuses(s.port, "/api/x", 15, [("X-K", HOSTILE)]) == [200] * 3 + [429] * 12
    assert statuses(s.port, "/api/y", 2, [("X-K", key)]) == [200] * 2
    assert statuses(s.port, "/login", 4)[:2] == [200, 200]
    assert statuses(s.port, "/static/a.css", 7) == [200] * 7
    return s


def test_page_headers_and_assets(console):
    s = console
    r = http_get(s.admin_port, "/")
    assert r.status == 200 and r.header("Content-Type").startswith("text/html")
    csp = r.header("Content-Security-Policy")
    assert "default-src 'none'" in csp and "script-src 'self'" in csp
    assert "connect-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe" not in csp
    assert r.header("X-Content-Type-Options") == "nosniff"
    body = r.body.decode()
    # nothing from elsewhere: every asset is the admin address's own
    assert "http://" not in body.replace('"http://www.w3.org', "") and "https://" not in body
    assert 'src="/dashboard.js"' in body and 'href="/dashboard.css"' in body
    assert "<script>" not in body and " on" not in body.split("<body>")[1].split("<footer")[0] \
        .replace(" one", "")
    js = http_get(s.admin_port, "/dashboard.js")
    assert js.status == 200 and js.header("Content-Type").startswith("text/javascript")
    assert b"innerHTML" not in js.body and b"textContent" in js.body
    css = http_get(s.admin_port, "/dashboard.css")
    assert css.status == 200 and css.header("Content-Type").startswith("text/css")
    assert b"@media" in css.body


def test_browser_navigation_headers_are_accepted(console):
    """Every browser sends Upgrade-Insecure-Requests on a navigation: it is
    an ordinary field (http1.c refused any name starting with "Upgrade"),
    on the admin address and the public one; a name that only starts with
    Upgrade upgrades nothing."""
    s = console
    nav = [("Upgrade-Insecure-Requests", "1"), ("Sec-Fetch-Mode", "navigate")]
    assert http_get(s.admin_port, "/", headers=nav).status == 200
    assert statuses(s.port, "/static/x", 1, nav) == [200]
    r = http_get(s.port, "/static/y", headers=[("Connection", "upgrade"), ("Upgradex", "h2c")])
    assert r.status == 200


def test_dashboard_in_headless_chromium(console, tmp_path):
    s = console
    url = "http://127.0.0.1:%d/" % s.admin_port
    html, log = run_chromium(tmp_path, url, "--dump-dom", "--enable-logging=stderr", "--v=0")
    # the page's console: no CSP violation, no script error
    console_lines = [l for l in log.splitlines() if ":CONSOLE" in l]
    assert not [l for l in console_lines if "Content Security Policy" in l or "Uncaught" in l
                or "Error" in l], console_lines
    dom = Dom()
    dom.feed(html)
    stats = json.loads(http_get(s.admin_port, "/api/stats").body)

    # the script ran and rendered /api/stats
    assert dom.by_id.get("status", "").startswith("updated"), dom.by_id.get("status")
    assert set(dom.routes) == {"api", "login", "static"}, dom.routes
    assert dom.routes["api"]["allowed"] == "5" and dom.routes["api"]["limited"] == "12"
    assert dom.routes["static"]["allowed"] == "7" and dom.routes["static"]["limited"] == "0"
    login = {r["route"]: r for r in stats["routes"]}["login"]["window"]
    assert dom.routes["login"]["limited"] == str(login["limited"])
    assert dom.routes["api"]["delayed"] == "0"
    assert dom.by_id["redis-state"] == "up"
    assert dom.by_id["workers"] == "2"
    assert dom.by_id["lat-p50"].endswith(" ms") and dom.by_id["lat-p99"].endswith(" ms")
    assert dom.by_id["reload-result"] == "loaded"
    assert int(dom.by_id["deny-window"]) >= 1
    assert dom.by_id["conn-client"].isdigit()
    # the hostile key, first in the table, as text: no <img> element exists
    first = dict(dom.top[0])
    assert first["key"] == HOSTILE and first["route"] == "api" and first["num count"] == "12"
    assert "img" not in dom.tags
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    # one bar per non-empty bucket and kind, drawn by the script
    assert "<rect" in html and 'class="bar allowed"' in html and 'class="bar limited"' in html


@pytest.mark.parametrize("size", [(1280, 900), pytest.param((390, 844), marks=pytest.mark.slow)],
                         ids=["laptop", "phone"])
def test_dashboard_screenshot(console, tmp_path, size):
    s = console
    png = tmp_path / "dashboard.png"
    run_chromium(tmp_path, "http://127.0.0.1:%d/" % s.admin_port,
                 "--hide-scrollbars", "--screenshot=%s" % png, "--window-size=%d,%d" % size)
    assert png.stat().st_size > 10000
    assert png_size(png) == size
    target = os.environ.get("SLUICE_DASHBOARD_PNG")
    if target and size == (1280, 900):
        shutil.copyfile(png, target)


def test_dashboard_with_the_token_in_its_fragment(sluice, tmp_path):
    """Issue 18 item 8: with admin.token set the page reads it from its URL
    fragment (/#token=..., never sent to a server) and sends it as a Bearer
    token; without it the page says how to give it."""
    from apilib import TOKEN, start_api
    s = start_api(sluice, ROUTES)
    assert statuses(s.port, "/api/x", 4, [("X-K", "k1")]) == [200] * 3 + [429]
    url = "http://127.0.0.1:%d/" % s.admin_port
    html, _ = run_chromium(tmp_path, url + "#token=" + TOKEN, "--dump-dom")
    dom = Dom()
    dom.feed(html)
    assert dom.by_id.get("status", "").startswith("updated"), dom.by_id.get("status")
    assert dom.routes["api"]["limited"] == "1", dom.routes
    html, _ = run_chromium(tmp_path, url, "--dump-dom")
    dom = Dom()
    dom.feed(html)
    assert "#token=" in dom.by_id.get("status", ""), dom.by_id.get("status")


def test_plan_view_in_headless_chromium(sluice, tmp_path):
    """Issue 23: the console shows a client's plan and its usage of each of
    the plan's limits (/api/plans), opened from the fragment #plan=KEY."""
    from apilib import TOKEN, start_api
    plans = ("plans:\n  default: free\n  assign: { k-gold: pro }\n"
             "  free:\n    limits:\n      - { name: per-hour, algorithm: fixed_window, "
             "limit: 2, window: 1h, key: [\"header:X-K\"] }\n"
             "  pro:\n    limits:\n      - { name: per-hour, algorithm: fixed_window, "
             "limit: 5, window: 1h, key: [\"header:X-K\"] }\n")
    routes = ROUTES.replace("    upstream: api\n", "    upstream: api\n    plan_key: \"header:X-K\"\n", 1)
    s = start_api(sluice, routes, top=plans)
    assert statuses(s.port, "/api/x", 3, [("X-K", "k-gold")]) == [200] * 3
    url = "http://127.0.0.1:%d/#token=%s&plan=k-gold" % (s.admin_port, TOKEN)
    html, _ = run_chromium(tmp_path, url, "--dump-dom")
    dom = Dom()
    dom.feed(html)
    assert "plan pro (config)" in dom.by_id.get("plan-status", ""), dom.by_id.get("plan-status")
    rows = [dict(r) for r in dom.rows.get("plan-body", [])]
    assert len(rows) == 1, rows
    assert rows[0]["limit"] == "per-hour" and rows[0]["num used"] == "3", rows
    assert rows[0]["num of"] == "5" and rows[0]["num remaining"] == "2", rows
