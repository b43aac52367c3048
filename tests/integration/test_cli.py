# sluice - tests/integration/test_cli.py: the command line, config errors, signals.
#
# -V, -h, -t on good and bad files (each error kind must name FILE:LINE:COL),
# ${VAR} and ${VAR:-default} expansion, and a clean exit 0 on SIGTERM/SIGINT.

import os
import re
import signal
import subprocess

import pytest

from conftest import (ROOT, free_port, http_get, make_conf, rl_headers, sluice_bin,
                      stop_process)

GOOD = """\
listen: 127.0.0.1:18080
redis:
  url: redis://127.0.0.1:6379/0
  timeout: 50ms
  prefix: "sluice:"
  on_error: allow
upstreams:
  api:
    servers: [127.0.0.1:9000]
    keepalive: 4
    connect_timeout: 1s
    timeout: 5s
routes:
  - name: one
    match: { path: /api }
    upstream: api
    limits:
      - { name: per-ip, algorithm: fixed_window, limit: 5, window: 1s, key: [ip] }
"""


def run_cli(*args, env=None, timeout_s=10):
    full_env = dict(os.environ)
    full_env.pop("SLUICE_ITEST_UNSET_VAR", None)
    full_env.update(env or {})
    return subprocess.run([sluice_bin()] + list(args), cwd=ROOT, env=full_env,
                          capture_output=True, timeout=timeout_s)


def replace_line(text, lineno, new):
    lines = text.split("\n")
    lines[lineno - 1] = new
    return "\n".join(lines)


def cols_of(line, *needles):
    """1-based columns where the needles start in line."""
    out = set()
    for n in needles:
        i = line.find(n)
        assert i >= 0, (n, line)
        out.add(i + 1)
    return out


def test_version():
    r = run_cli("-V")
    assert r.returncode == 0, r
    out = (r.stdout + r.stderr).decode()
    assert re.search(r"\d+\.\d+", out), out


def test_help():
    r = run_cli("-h")
    assert r.returncode == 0, r
    out = (r.stdout + r.stderr).decode()
    assert "-c" in out and "-t" in out, out


def test_unknown_option_fails():
    r = run_cli("--no-such-option")
    assert r.returncode != 0


def test_reference_config_validates():
    path = os.path.join(ROOT, "conf", "sluice.yaml")
    assert os.path.exists(path), "conf/sluice.yaml is missing"
    r = run_cli("-t", "-c", path)
    assert r.returncode == 0, r.stderr.decode()


def test_good_config_validates(tmp_path):
    p = tmp_path / "good.yaml"
    p.write_text(GOOD)
    r = run_cli("-t", "-c", str(p))
    assert r.returncode == 0, r.stderr.decode()


def test_missing_file_fails(tmp_path):
    r = run_cli("-t", "-c", str(tmp_path / "nope.yaml"))
    assert r.returncode == 1
    assert r.stderr.strip()


# (case id, line number, replacement line, needle: the error's column is
# where it starts: the key for an unknown key, else the offending value)
BAD_CASES = [
    ("unknown_key", 10, "    keepalives: 4", ("keepalives",)),
    ("wrong_type", 10, "    keepalive: [4]", ("[4]",)),
    ("wrong_type_scalar", 10, "    keepalive: lots", ("lots",)),
    ("bad_duration", 12, "    timeout: 5parsecs", ("5parsecs",)),
    ("unknown_upstream", 16, "    upstream: nope", ("nope",)),
    ("unset_var", 3, "  url: redis://127.0.0.1:${SLUICE_ITEST_UNSET_VAR}/0",
     ("redis://",)),
    ("bad_on_error", 6, "  on_error: maybe", ("maybe",)),
    ("bad_algorithm", 18,
     "      - { name: per-ip, algorithm: leaky, limit: 5, window: 1s, key: [ip] }",
     ("leaky",)),
    ("bad_key_source", 18,
     "      - { name: per-ip, algorithm: fixed_window, limit: 5, window: 1s, key: [ipaddr] }",
     ("ipaddr",)),
    ("bad_rate", 18,
     "      - { name: per-ip, algorithm: token_bucket, rate: fast, burst: 3, key: [ip] }",
     ("fast",)),
]


@pytest.mark.parametrize("case", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_config_names_place(tmp_path, case):
    _, lineno, new, needles = case
    text = replace_line(GOOD, lineno, new)
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    r = run_cli("-t", "-c", str(p))
    err = r.stderr.decode()
    assert r.returncode == 1, err
    cols = cols_of(new, *needles)
    m = re.search(r"^%s:(\d+):(\d+): \S" % re.escape(str(p)), err, re.M)
    assert m, "no FILE:LINE:COL: prefix in %r" % err
    assert int(m.group(1)) == lineno, err
    assert int(m.group(2)) in cols, (err, cols)


def test_duplicate_route_name(tmp_path):
    text = GOOD + ("  - name: one\n"
                   "    match: { path: /b }\n"
                   "    upstream: api\n")
    p = tmp_path / "dup.yaml"
    p.write_text(text)
    r = run_cli("-t", "-c", str(p))
    err = r.stderr.decode()
    assert r.returncode == 1, err
    m = re.search(r"^%s:(\d+):(\d+): \S" % re.escape(str(p)), err, re.M)
    assert m, err
    # the second route's name value: line 19, col 11
    assert (int(m.group(1)), int(m.group(2))) == (19, 11), err


def test_missing_required_field(tmp_path):
    # route "one" without its upstream: the error points at the route's mapping
    lines = GOOD.split("\n")
    del lines[15]
    p = tmp_path / "missing.yaml"
    p.write_text("\n".join(lines))
    r = run_cli("-t", "-c", str(p))
    err = r.stderr.decode()
    assert r.returncode == 1, err
    m = re.search(r"^%s:(\d+):(\d+): \S" % re.escape(str(p)), err, re.M)
    assert m, err
    # the route's mapping starts at its first key, line 14 col 5
    assert (int(m.group(1)), int(m.group(2))) == (14, 5), err
    assert "upstream" in err


def test_yaml_syntax_error(tmp_path):
    p = tmp_path / "syntax.yaml"
    p.write_text(GOOD + "  - name: [unclosed\n")
    r = run_cli("-t", "-c", str(p))
    err = r.stderr.decode()
    assert r.returncode == 1, err
    assert re.search(r"^%s:\d+:\d+: \S" % re.escape(str(p)), err, re.M), err


def test_bad_config_does_not_start(tmp_path):
    port = free_port()
    p = tmp_path / "bad.yaml"
    p.write_text(replace_line(GOOD, 1, "listen: 127.0.0.1:%d" % port)
                 .replace("upstream: api", "upstream: nope"))
    proc = subprocess.Popen([sluice_bin(), "-c", str(p)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        rc = proc.wait(timeout=5)
    finally:
        stop_process(proc, signal.SIGKILL)
    assert rc == 1
    assert b"%s:16:" % str(p).encode() in proc.stderr.read()


ENV_ROUTES = """\
  - name: r
    match: { path: / }
    upstream: api
    limits:
      - { name: per-ip, algorithm: fixed_window, limit: 100, window: 10s, key: [ip] }
"""


def test_env_var_in_listen_and_redis_url(sluice, redis, tmp_path):
    port = free_port()
    conf = make_conf(ENV_ROUTES)
    conf = conf.replace("listen: 127.0.0.1:@LISTEN_PORT@",
                        'listen: "127.0.0.1:${SLUICE_ITEST_PORT}"')
    conf = conf.replace("url: redis://127.0.0.1:@REDIS_PORT@/0",
                        'url: "redis://${SLUICE_ITEST_RHOST}:${SLUICE_ITEST_RPORT}/0"')
    s = sluice(conf, listen_port=port,
               env={"SLUICE_ITEST_PORT": str(port), "SLUICE_ITEST_RHOST": "127.0.0.1",
                    "SLUICE_ITEST_RPORT": str(redis.port)})
    r = http_get(s.port, "/x")
    assert r.status == 200
    # the rate-limit headers prove that Redis was reached through the URL
    assert rl_headers(r).get("X-RateLimit-Limit") == "100", r


def test_env_var_defaults(sluice, redis):
    port = free_port()
    conf = make_conf(ENV_ROUTES)
    conf = conf.replace("listen: 127.0.0.1:@LISTEN_PORT@",
                        'listen: "${SLUICE_ITEST_UNSET_VAR:-127.0.0.1:%d}"' % port)
    conf = conf.replace("url: redis://127.0.0.1:@REDIS_PORT@/0",
                        'url: "redis://127.0.0.1:${SLUICE_ITEST_UNSET_VAR:-%d}/0"'
                        % redis.port)
    s = sluice(conf, listen_port=port)
    r = http_get(s.port, "/x")
    assert r.status == 200
    assert rl_headers(r).get("X-RateLimit-Limit") == "100", r


def test_env_var_set_overrides_default(sluice, redis):
    port = free_port()
    conf = make_conf(ENV_ROUTES)
    conf = conf.replace("listen: 127.0.0.1:@LISTEN_PORT@",
                        'listen: "${SLUICE_ITEST_LISTEN:-127.0.0.1:1}"')
    s = sluice(conf, listen_port=port,
               env={"SLUICE_ITEST_LISTEN": "127.0.0.1:%d" % port})
    assert http_get(s.port, "/x").status == 200


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_signal_exits_zero(sluice, redis, sig):
    s = sluice(make_conf(ENV_ROUTES))
    assert http_get(s.port, "/x").status == 200
    os.kill(s.proc.pid, sig)
    try:
        rc = s.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pytest.fail("sluice did not exit within 5 s of %s" % sig)
    assert rc == 0, s.stderr


def test_signal_with_open_idle_connection(sluice, redis):
    from conftest import Conn, build_request
    s = sluice(make_conf(ENV_ROUTES))
    with Conn(s.port) as c:
        c.send(build_request("GET", "/x"))
        assert c.read_response().status == 200
        os.kill(s.proc.pid, signal.SIGTERM)
        try:
            rc = s.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pytest.fail("sluice did not exit within 5 s with an idle keep-alive client")
        assert rc == 0, s.stderr
