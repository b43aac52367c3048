# sluice - tests/integration/test_conf_layers.py: conf is a parser below
# everything that uses it, and every loader still runs the whole check.
#
# The include graph of src/ has no cycle (tests/tools/include_cycles.py; conf
# included route, tls_server and tls_upstream, which include conf). What
# those modules must check or build for a config (upstream TLS files,
# listeners' TLS contexts, override keys) moved above conf (confcheck.c);
# here each loader is seen to run it: the start, a SIGHUP reload (all or
# nothing: a bad file changes nothing, a good one brings its overrides), and
# sluice -t (also in test_tls_listen and test_tls_upstream).

import os
import signal
import subprocess
import sys

from conftest import free_port, http_get, sluice_bin, wait_until
from proxylib import mval, metrics, start_proxy

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "tests", "tools", "include_cycles.py")
DATA = os.path.join(ROOT, "tests", "unit", "data", "conf")
CERT = os.path.join(DATA, "tls_client.pem")
KEY = os.path.join(DATA, "tls_client.key")
OTHER_KEY = os.path.join(DATA, "tls_other.key")


def cycles(src):
    return subprocess.run([sys.executable, SCRIPT, src], capture_output=True, text=True,
                          timeout=30)


def test_src_include_graph_has_no_cycle():
    p = cycles(os.path.join(ROOT, "src"))
    assert p.returncode == 0 and p.stdout == "no cycles\n", p.stdout + p.stderr


def test_cycle_script_reports_a_cycle(tmp_path):
    # a.c -> b.h, b.h -> c.h, c.c -> a.h: a -> b -> c -> a; d only includes.
    (tmp_path / "a.h").write_text("#include <stdio.h>\n")
    (tmp_path / "a.c").write_text('#include "a.h"\n#include "b.h"\n')
    (tmp_path / "b.h").write_text('  #  include "c.h"\n')
    (tmp_path / "c.c").write_text('#include "a.h"\n')
    (tmp_path / "d.c").write_text('#include "a.h"\n#include "c.h"\n')
    p = cycles(str(tmp_path))
    assert p.returncode == 1, p.stdout
    assert "cycle: a -> b -> c -> a\n" in p.stdout, p.stdout
    assert " d " not in p.stdout and "-> d" not in p.stdout, p.stdout


ROUTES = """\
  - name: r
    match: { path: /r }
    upstream: api
    limits:
      - name: fw
        algorithm: fixed_window
        limit: 1
        window: 1h
        key: ["header:X-K"]
"""

OVERRIDE = """\
        overrides:
          - { key: [vip], limit: 3 }
"""

# A second route on an upstream whose client certificate does not match its
# key: the upstreams section is the file's 6th line on, so its key_file is at
# a fixed place (checked below).
BAD_UPSTREAM = """\
  tlsup:
    servers: [127.0.0.1:9443]
    tls:
      cert_file: %s
      key_file: %s
""" % (CERT, OTHER_KEY)

NEW_ROUTE = """\
  - name: n
    match: { path: /new }
    upstream: api
"""


def statuses(s, path, key, n):
    return [http_get(s.port, path, headers=[("X-K", key)]).status for _ in range(n)]


def wait_reload(s, before, result, timeout_s=5.0):
    m, _ = wait_until(lambda: metrics(s.admin_port), timeout_s, step_s=0.05,
                      until=lambda m: mval(m, "sluice_config_reloads_total", result=result) > before)
    assert mval(m, "sluice_config_reloads_total", result=result) > before, \
        "no reload with result %s; stderr:\n%s" % (result, s.stderr)
    return m


def place(text, needle):
    """1-based line and column of the first needle in text."""
    i = text.index(needle)
    return text.count("\n", 0, i) + 1, i - text.rfind("\n", 0, i)


def test_reload_runs_the_whole_check_all_or_nothing(sluice, redis):
    s = start_proxy(sluice, ROUTES, prefix="layers1:")
    good = s.conf_path.read_text()
    assert statuses(s, "/r", "vip", 2) == [200, 429]
    assert http_get(s.port, "/new").status == 404

    # A new route and an override, with an upstream whose key does not match
    # its certificate: refused whole, reported at the key_file's place.
    bad = good.replace("upstreams:\n", "upstreams:\n" + BAD_UPSTREAM, 1)
    bad = bad.replace(ROUTES, ROUTES + OVERRIDE + NEW_ROUTE, 1)
    line, col = place(bad, OTHER_KEY)
    before = mval(metrics(s.admin_port), "sluice_config_reloads_total", result="error")
    s.conf_path.write_text(bad)
    os.kill(s.proc.pid, signal.SIGHUP)
    wait_reload(s, before, "error")
    want = ("%s:%d:%d: upstreams.tlsup.tls.key_file: cannot use '%s': the key does not "
            "match the certificate '%s'" % (s.conf_path, line, col, OTHER_KEY, CERT))
    assert want in s.stderr, s.stderr
    assert http_get(s.port, "/new").status == 404
    assert statuses(s, "/r", "gold", 2) == [200, 429]

    # The same without the bad upstream: the route and the override's key
    # (made above conf) arrive.
    before = mval(metrics(s.admin_port), "sluice_config_reloads_total", result="ok")
    s.conf_path.write_text(good.replace(ROUTES, ROUTES + OVERRIDE + NEW_ROUTE, 1))
    os.kill(s.proc.pid, signal.SIGHUP)
    wait_reload(s, before, "ok")
    assert http_get(s.port, "/new").status == 200
    assert statuses(s, "/r", "vipx", 2) == [200, 429]
    # vip used 1 of its 3 before the reload
    assert statuses(s, "/r", "vip", 3) == [200, 200, 429]


def test_start_runs_the_whole_check(tmp_path):
    port = free_port()
    text = ("listen:\n  - 127.0.0.1:%d\n  - address: 127.0.0.1:%d\n    tls:\n"
            "      certificates:\n        - { cert_file: %s, key_file: %s }\n"
            "backend: memory\nupstreams:\n  api: { servers: [127.0.0.1:9] }\n"
            "routes:\n  - { name: r, match: { path: / }, upstream: api }\n"
            % (port, free_port(), CERT, OTHER_KEY))
    conf = tmp_path / "start.yaml"
    conf.write_text(text)
    want = ("%s:6:11: listen[1].tls.certificates[0]: key_file '%s' does not match "
            "cert_file '%s'" % (conf, OTHER_KEY, CERT))
    for args in (["-c", str(conf)], ["-t", "-c", str(conf)]):
        p = subprocess.run([sluice_bin(), *args], capture_output=True, text=True, timeout=10)
        assert p.returncode == 1 and want in p.stderr, (args, p.stderr)
    conf.write_text(text.replace(OTHER_KEY, KEY))
    p = subprocess.run([sluice_bin(), "-t", "-c", str(conf)], capture_output=True, text=True,
                       timeout=10)
    assert p.returncode == 0, p.stderr
