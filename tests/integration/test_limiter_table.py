# sluice - tests/integration/test_limiter_table.py: limit.lua against the shared table.
#
# tests/unit/data/limiter_cases.txt is the one table of cases that the pure C
# limiter (test_limiter.c) and the in-process backend (test_memstore.c) pass;
# here the real script runs it in a real redis-server, in its test-only mode
# "t" (the same as "d" but now_us comes from the last argument), so that the
# Lua and the C are proven to give the same answers on the same fake clock.
# A table line this file cannot read fails the run: nothing is skipped.

import datetime
import os
import re
import time
from zoneinfo import ZoneInfo

import pytest

from batchlib import decide_args, decide_reply
from conftest import RedisError, RedisServer, redis_cmd, redis_cmds, redis_keys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TABLE = os.path.join(ROOT, "tests", "unit", "data", "limiter_cases.txt")
SCRIPT = os.path.join(ROOT, "src", "store", "scripts", "limit.lua")
REFUND = os.path.join(ROOT, "src", "store", "scripts", "refund.lua")
DAY_MS = 86400000
# 400 Gregorian years: a calendar case's dates fall on the same weekdays,
# under the same DST rule, and in the future, where SET PXAT keeps its keys
CAL_BASE_US = 146097 * DAY_MS * 1000
CAL_UNITS = ["day", "week", "month", "year"]
ALGOS = ["fixed_window", "sliding_window", "sliding_log", "token_bucket", "gcra",
         "concurrency"]
CONCURRENCY = 5
STEP = re.compile(r"^at (-?\d+) cost (\d+)(?: slot ([1-9]\d*))? -> ([01])"
                  r"((?: \| [01] -?\d+ -?\d+ -?\d+)+)\s*$")
SLOT_STEP = re.compile(r"^(release|renew) (-?\d+) slot ([1-9]\d*)(?: -> ([01]))?\s*$")
SETTLE_STEP = re.compile(r"^settle (-?\d+) admitted (-?\d+) cost (-?[1-9]\d*)\s*$")


class Case:
    def __init__(self, name, line):
        self.name = name
        self.line = line
        self.limits = []    # dicts: algo, limit, window_ms, interval_us, flags, key
        self.steps = []     # (line, at_us, cost, allowed, [(a, rem, reset, retry)...], slot)
                            # or (line, "release"/"renew", at_us, slot, allowed)
                            # or (line, "settle", at_us, admitted_us, cost)


def parse_limit(case, rest, lineno):
    words = rest.split()
    if not words or words[0] not in ALGOS:
        raise ValueError("%s:%d: unknown algorithm" % (TABLE, lineno))
    lim = {"algo": ALGOS.index(words[0]), "limit": 0, "window_ms": 0, "interval_us": 0,
           "delay_ms": 0, "flags": 0, "key": str(len(case.limits)), "cal": None, "tz": None}
    for w in words[1:]:
        k, sep, v = w.partition("=")
        if not sep or k not in lim or k == "algo" or (k == "cal" and v not in CAL_UNITS):
            raise ValueError("%s:%d: bad field %r" % (TABLE, lineno, w))
        lim[k] = v if k in ("key", "cal", "tz") else int(v)
    if (lim["cal"] is None) != (lim["tz"] is None) or (lim["cal"] and lim["algo"] != 0):
        raise ValueError("%s:%d: cal= and tz= go together, on fixed_window" % (TABLE, lineno))
    if lim["cal"]:
        ZoneInfo(lim["tz"])
    elif lim["algo"] <= 2 and (lim["window_ms"] < 1 or DAY_MS % lim["window_ms"]):
        raise ValueError("%s:%d: a window must divide a day" % (TABLE, lineno))
    case.limits.append(lim)


def parse_step(case, rest, lineno):
    m = STEP.match("at " + rest)
    if not m or not case.limits:
        raise ValueError("%s:%d: cannot read step" % (TABLE, lineno))
    per = [tuple(int(x) for x in part.split()) for part in m.group(5).split("|")[1:]]
    if len(per) != len(case.limits):
        raise ValueError("%s:%d: %d results for %d limits" %
                         (TABLE, lineno, len(per), len(case.limits)))
    case.steps.append((lineno, int(m.group(1)), int(m.group(2)), int(m.group(4)), per,
                       int(m.group(3) or 0)))


def parse_slot_step(case, line, lineno):
    m = SLOT_STEP.match(line)
    if not m or not case.limits or (m.group(1) == "renew") != (m.group(4) is not None):
        raise ValueError("%s:%d: cannot read step" % (TABLE, lineno))
    case.steps.append((lineno, m.group(1), int(m.group(2)), int(m.group(3)),
                       int(m.group(4) or 0)))


def parse_settle_step(case, line, lineno):
    m = SETTLE_STEP.match(line)
    if not m or not case.limits:
        raise ValueError("%s:%d: cannot read step" % (TABLE, lineno))
    case.steps.append((lineno, "settle", int(m.group(1)), int(m.group(2)), int(m.group(3))))


def load_cases():
    cases = []
    with open(TABLE) as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            word, _, rest = line.partition(" ")
            if word == "case":
                cases.append(Case(rest, lineno))
            elif word == "limit" and cases:
                parse_limit(cases[-1], rest, lineno)
            elif word == "at" and cases:
                parse_step(cases[-1], rest, lineno)
            elif word in ("release", "renew") and cases:
                parse_slot_step(cases[-1], line, lineno)
            elif word == "settle" and cases:
                parse_settle_step(cases[-1], line, lineno)
            else:
                raise ValueError("%s:%d: cannot read %r" % (TABLE, lineno, line))
    for c in cases:
        if not c.steps:
            raise ValueError("%s:%d: case %s has no steps" % (TABLE, c.line, c.name))
    return cases


CASES = load_cases()      # a table error fails collection, loudly


@pytest.fixture(scope="module")
def lua_redis(tmp_path_factory):
    """A redis-server of this module's own, with limit.lua loaded; killed by PID."""
    srv = RedisServer(tmp_path_factory.mktemp("lua-table"))
    srv.start()
    try:
        with open(SCRIPT, "rb") as f:
            sha = redis_cmd(srv.port, "SCRIPT", "LOAD", f.read()).decode()
        with open(REFUND, "rb") as f:
            refund_sha = redis_cmd(srv.port, "SCRIPT", "LOAD", f.read()).decode()
        # Time is shifted by whole days, so every window stays aligned, and
        # into the future, so that SET PXAT (Redis' real clock) keeps the keys.
        base_ms = (int(time.time() * 1000) // DAY_MS + 2) * DAY_MS
        yield srv.port, (sha, refund_sha), base_ms * 1000
    finally:
        srv.stop()


def period_starts(unit, zone, t_ms):
    """The first instants (ms) of the periods before, holding, after and
    after that of t_ms, as sluice's tzcal.c computes them, here by zoneinfo."""
    z = ZoneInfo(zone)
    day = datetime.datetime.fromtimestamp(t_ms // 1000, z).date()
    out = []
    for k in (-1, 0, 1, 2):
        if unit == "day":
            d = day + datetime.timedelta(days=k)
        elif unit == "week":
            d = day + datetime.timedelta(days=7 * k - day.weekday())
        elif unit == "month":
            mm = day.year * 12 + day.month - 1 + k
            d = datetime.date(mm // 12, mm % 12 + 1, 1)
        else:
            d = datetime.date(day.year + k, 1, 1)
        local = datetime.datetime(d.year, d.month, d.day)
        guess = int(local.replace(tzinfo=z).timestamp())
        lo, hi = guess - 2 * 86400, guess + 2 * 86400
        while lo + 1 < hi:          # the first second of that day (DST may skip 00:00)
            mid = (lo + hi) // 2
            if datetime.datetime.fromtimestamp(mid, z).replace(tzinfo=None) >= local:
                hi = mid
            else:
                lo = mid
        out.append(hi * 1000)
    return out


def limit_args(lim, cost, slot, now_us=0):
    """One limit's six arguments (seven for a calendar window): a delay goes
    as flag 4 with the delay in the window's place; a concurrency limit's
    interval is the slot id; a calendar window has interval 1 and its period
    starts around now_us."""
    window, interval, flags = lim["window_ms"], lim["interval_us"], lim["flags"]
    if lim["delay_ms"]:
        window, flags = lim["delay_ms"], flags | 4
    if lim["algo"] == CONCURRENCY:
        interval = slot
    if lim["cal"]:
        return [lim["algo"], lim["limit"], window, 1, cost, flags,
                period_starts(lim["cal"], lim["tz"], now_us // 1000)]
    return [lim["algo"], lim["limit"], window, interval, cost, flags]


def evalsha_t(port, sha, keys, limits, cost, now_us, slot=0):
    """One request in the batch protocol; the reply in the per-limit shape
    [allowed, (allowed_i remaining_i reset_i retry_i)*n] (batchlib.py)."""
    lims = [limit_args(lim, cost, slot, now_us) for lim in limits]
    reply = redis_cmds(port, [decide_args(sha, keys, lims, "t", now_us)])[-1]
    return decide_reply(reply, keys, lims)


def slot_step(port, shas, keys, limits, kind, at_us, slot):
    """release: refund.lua (algo 5, mark = the slot) per concurrency key;
    renew: limit.lua with the concurrency limits alone, same slot id."""
    conc = [(k, lim) for k, lim in zip(keys, limits) if lim["algo"] == CONCURRENCY]
    if kind == "release":
        for k, lim in conc:
            redis_cmds(port, [["EVALSHA", shas[1], 1, k, 0, 0, 1, CONCURRENCY, lim["limit"],
                               lim["window_ms"], slot, 1, slot]])
        return None
    return evalsha_t(port, shas[0], [k for k, _ in conc], [l for _, l in conc], 1, at_us,
                     slot)[0]


def settle_step(port, refund_sha, keys, limits, at_us, admitted_us, cost):
    """A cost_from settlement: refund.lua per key with the signed cost, the
    admission's window as the mark, on the fake clock at_us."""
    for k, lim in zip(keys, limits):
        assert not lim["cal"], "settle steps take no calendar windows here"
        W = lim["window_ms"]
        mark = admitted_us // 1000 // W if lim["algo"] in (0, 1) else 0
        redis_cmds(port, [["EVALSHA", refund_sha, 1, k, 0, 0, 1, lim["algo"], lim["limit"],
                           W, lim["interval_us"], cost, mark, at_us]])


def test_table_is_big_enough():
    assert len(CASES) >= 40
    per_algo = [0] * len(ALGOS)
    for c in CASES:
        for lim in c.limits:
            per_algo[lim["algo"]] += 1
    assert min(per_algo) >= 5, per_algo


@pytest.mark.parametrize("idx", range(len(CASES)), ids=[c.name for c in CASES])
def test_case(lua_redis, idx):
    port, shas, base_us = lua_redis
    case = CASES[idx]
    if any(lim["cal"] for lim in case.limits):
        base_us = CAL_BASE_US
    keys = ["ltable:{%d}:%s" % (idx, lim["key"]) for lim in case.limits]
    bad = []
    for step in case.steps:
        if step[1] == "settle":
            lineno, _, at_us, admitted_us, cost = step
            settle_step(port, shas[1], keys, case.limits, base_us + at_us, base_us + admitted_us,
                        cost)
            continue
        if step[1] in ("release", "renew"):
            lineno, kind, at_us, slot, allowed = step
            got = slot_step(port, shas, keys, case.limits, kind, base_us + at_us, slot)
            if kind == "renew" and got != allowed:
                bad.append("%s:%d: renew got %d, want %d" % (TABLE, lineno, got, allowed))
            continue
        lineno, at_us, cost, allowed, want, slot = step
        reply = evalsha_t(port, shas[0], keys, case.limits, cost, base_us + at_us, slot)
        got = [tuple(reply[1 + 4 * i: 5 + 4 * i]) for i in range(len(case.limits))]
        if reply[0] != allowed or got != want:
            bad.append("%s:%d: got %d %s, want %d %s" % (TABLE, lineno, reply[0], got,
                                                       allowed, want))
        # the script's contract: no key it writes lives without a TTL
        for k in set(keys):
            assert redis_cmd(port, "PTTL", k) != -1, "%s has no TTL" % k
    assert not bad, "\n".join(bad)


def packable(case):
    """A case store.c could send as parts of one key (one key per route):
    its limits of the STRING algorithms, no delay, no flag but check only,
    each on its own key in the table, no settle, release or renew steps."""
    return (all(lim["algo"] in (0, 1, 3, 4) and not lim["delay_ms"] and lim["flags"] in (0, 2)
                for lim in case.limits)
            and len({lim["key"] for lim in case.limits}) == len(case.limits)
            and all(step[1] not in ("settle", "release", "renew") for step in case.steps))


PACKED = [i for i, c in enumerate(CASES) if packable(c)]


def test_enough_cases_as_parts():
    assert len(PACKED) >= 25, len(PACKED)
    per_algo = [0] * len(ALGOS)
    for i in PACKED:
        for lim in CASES[i].limits:
            per_algo[lim["algo"]] += 1
    assert min(per_algo[a] for a in (0, 1, 3, 4)) >= 3, per_algo
    assert any(len(CASES[i].limits) >= 2 for i in PACKED)


@pytest.mark.parametrize("idx", PACKED, ids=[CASES[i].name for i in PACKED])
def test_case_as_parts(lua_redis, idx):
    """The same case with its limits parts of one key (limit.lua's "One key
    per route", each parameter set's algorithm + 16 * its tag): the same
    answers on the same fake clock, and the key written has a TTL."""
    port, shas, base_us = lua_redis
    case = CASES[idx]
    if any(lim["cal"] for lim in case.limits):
        base_us = CAL_BASE_US
    key = "ltable:{%d}:parts" % idx
    limits = [dict(lim, algo=lim["algo"] + 16 * (4000000000 + i))
              for i, lim in enumerate(case.limits)]
    keys = [key] * len(limits)
    bad = []
    one_flag = len({lim["flags"] for lim in limits}) == 1
    for n, (lineno, at_us, cost, allowed, want, slot) in enumerate(case.steps):
        if cost == 1 and one_flag and len(limits) >= 2 and n % 2:
            # every other step in store.c's run form: -(16 + m), the first ref
            lims = [limit_args(lim, cost, slot, base_us + at_us) for lim in limits]
            args = ["EVALSHA", shas[0], 1, key, "t", len(lims)]
            for lim in lims:
                args += lim[:4]
            args += [1, -16 - len(lims), lims[0][5]]
            for lim in lims:
                args += list(lim[6]) if len(lim) > 6 else []
            args.append(base_us + at_us)
            reply = decide_reply(redis_cmds(port, [args])[-1], keys, lims)
        else:
            reply = evalsha_t(port, shas[0], keys, limits, cost, base_us + at_us, slot)
        got = [tuple(reply[1 + 4 * i: 5 + 4 * i]) for i in range(len(limits))]
        if reply[0] != allowed or got != want:
            bad.append("%s:%d: got %d %s, want %d %s" % (TABLE, lineno, reply[0], got,
                                                       allowed, want))
        assert redis_cmd(port, "PTTL", key) != -1, "%s has no TTL" % key
        val = redis_cmd(port, "GET", key)
        assert val is None or (len(val) % 30 == 0 and len(val) <= 30 * len(limits)
                               and all(val[i] == ord(";") for i in range(0, len(val), 30))), val
    assert not bad, "\n".join(bad)


def test_mode_t_refuses_a_bad_time(lua_redis):
    port, (sha, _), base_us = lua_redis
    # one parameter set (fixed_window 5 per 1 s), one request of one limit
    # (key 1, parameter set 1, no flags: ref 0), cost 1
    lim = [1, 0, 5, 1000, 0, 1, 1, 0, 1]
    for bad in ["soon", "1.5"]:
        with pytest.raises(RedisError):
            redis_cmds(port, [["EVALSHA", sha, 1, "ltable:bad", "t"] + lim + [bad]])
    with pytest.raises(RedisError):         # "t" without its time
        redis_cmds(port, [["EVALSHA", sha, 1, "ltable:bad", "t"] + lim])
    with pytest.raises(RedisError):         # "d" takes no time
        redis_cmds(port, [["EVALSHA", sha, 1, "ltable:bad", "d"] + lim + [base_us]])
    assert "ltable:bad" not in [k.decode() for k in redis_keys(port)]


def test_mode_d_still_uses_redis_time(lua_redis):
    """The fake clock is only in "t": "d" on the same key follows TIME."""
    port, (sha, _), _ = lua_redis
    lim = [0, 2, 86400000, 0, 1, 0]        # fixed_window 2 per day
    out = [decide_reply(redis_cmds(port, [decide_args(sha, ["ltable:d"], [lim])])[-1],
                        ["ltable:d"], [lim]) for _ in range(3)]
    assert [o[0] for o in out] == [1, 1, 0]
    sec, usec = redis_cmd(port, "TIME")
    now_ms = int(sec) * 1000 + int(usec) // 1000
    reset_ms = DAY_MS - now_ms % DAY_MS
    assert abs(out[2][3] - reset_ms) <= 1000   # retry: until the day ends
