# sluice - tests/integration/test_calendar.py: calendar windows on Redis time.
#
# A fixed_window with calendar: true turns over at local midnight of the
# first of the month (day, Monday, January 1st) in its time zone. The 429's
# Retry-After and RateLimit reset must be the seconds from Redis TIME to the
# first of next month in that zone, computed here with Python's zoneinfo;
# the memory backend does the same on the proxy's clock. Config errors
# (unknown zone, a window that is not a calendar unit, another algorithm)
# are FILE:LINE:COL.

import datetime
import re
import subprocess
import time
from zoneinfo import ZoneInfo

from conftest import (http_get, make_conf, redis_cmd, redis_keys, redis_time_s, rl_headers,
                      sluice_bin)
from proxylib import start_proxy

ZONE = "America/St_Johns"       # -03:30 / -02:30: neither whole hours nor UTC


def routes(zone=ZONE, window="1mo", algorithm="fixed_window"):
    return """\
  - name: quota
    match: { path: /q }
    upstream: api
    limits:
      - { name: monthly, algorithm: %s, limit: 1, window: %s, calendar: true,
          timezone: %s, key: [ip] }
""" % (algorithm, window, zone)


def seconds_to_next_month(now_s, zone):
    z = ZoneInfo(zone)
    local = datetime.datetime.fromtimestamp(now_s, z)
    y, m = (local.year + 1, 1) if local.month == 12 else (local.year, local.month + 1)
    return datetime.datetime(y, m, 1, tzinfo=z).timestamp() - now_s


def reset_of(r):
    h = rl_headers(r)
    t = re.search(r';t=(\d+)', h["RateLimit"])
    return int(h["Retry-After"]), int(t.group(1)), int(h["X-RateLimit-Reset"])


def test_month_window_resets_at_the_first_of_next_month_on_redis_time(sluice, redis):
    s = sluice(make_conf(routes()))
    assert http_get(s.port, "/q").status == 200
    r = http_get(s.port, "/q")
    now = redis_time_s(redis.port)
    assert r.status == 429, r
    want = seconds_to_next_month(now, ZONE)
    for got in reset_of(r):
        assert abs(got - want) <= 2, (got, want, rl_headers(r))
    # the key lives until the period ends, not for an epoch-aligned 30 days
    keys = [k for k in redis_keys(redis.port) if b"monthly" in k]
    assert len(keys) == 1, keys
    assert abs(redis_cmd(redis.port, "PTTL", keys[0]) / 1000 - want) <= 2


def test_month_window_on_the_memory_backend(sluice):
    s = start_proxy(sluice, routes(), top="backend: memory\n", wait_redis=False, admin=False)
    assert http_get(s.port, "/q").status == 200
    r = http_get(s.port, "/q")
    now = time.time()
    assert r.status == 429, r
    want = seconds_to_next_month(now, ZONE)
    for got in reset_of(r):
        assert abs(got - want) <= 2, (got, want, rl_headers(r))


def check(tmp_path, text):
    p = tmp_path / "s.yaml"
    p.write_text(re.sub(r"@[A-Z]+_PORT@", "9", text))
    r = subprocess.run([sluice_bin(), "-t", "-c", str(p)], capture_output=True, timeout=30)
    return r.returncode, r.stderr.decode(), str(p)


def test_config_errors_have_file_line_col(tmp_path):
    rc, err, path = check(tmp_path, make_conf(routes(zone="Mars/Olympus_Mons")))
    assert rc == 1 and re.search(re.escape(path) + r":\d+:\d+: .*timezone: unknown time zone "
                                 r"'Mars/Olympus_Mons'", err), err
    rc, err, path = check(tmp_path, make_conf(routes(window="30d")))
    assert rc == 1 and re.search(re.escape(path) + r":\d+:\d+: .*bad calendar window '30d' "
                                 r"\(use 1d, 1w, 1mo or 1y\)", err), err
    rc, err, path = check(tmp_path, make_conf(routes(algorithm="sliding_window")))
    assert rc == 1 and re.search(re.escape(path) + r":\d+:\d+: .*'calendar' does not apply "
                                 r"to sliding_window", err), err
    rc, err, _ = check(tmp_path, make_conf(routes(zone="Asia/Tokyo", window="1w")))
    assert rc == 0, err
