# sluice - tests/integration/test_script_cost.py: limit.lua does the least
# work per limit (issue 11), and its key layouts keep every rule.
#
# Counted, not timed: INFO commandstats counts the commands a script runs,
# so each decision's Redis commands are checked per algorithm (one TIME per
# call, one MGET for all keys, one SET per consumed key). Then the layouts:
# every key written has its TTL, integers stay integers at any size, a key
# of another type or of an older layout (HASH) reads as absent and is
# replaced, and refund.lua gives back exactly what was consumed.

import os
import re
import time

import pytest

from batchlib import decide_args, decide_reply
from conftest import RedisServer, redis_cmd, redis_cmds

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LIMIT = os.path.join(ROOT, "src", "store", "scripts", "limit.lua")
REFUND = os.path.join(ROOT, "src", "store", "scripts", "refund.lua")
HOUR = 3600000

# (algo limit window_ms interval_us cost flags)
FIXED = [0, 1000, HOUR, 0, 1, 0]
SLIDING = [1, 1000, HOUR, 0, 1, 0]
LOG = [2, 1000, HOUR, 0, 1, 0]
BUCKET = [3, 1000, 0, 1000000, 1, 0]
GCRA = [4, 1000, 0, 1000000, 1, 0]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    """A redis-server of this module's own (commandstats are reset); by PID."""
    s = RedisServer(tmp_path_factory.mktemp("script-cost"))
    s.start()
    try:
        with open(LIMIT, "rb") as f:
            sha = redis_cmd(s.port, "SCRIPT", "LOAD", f.read()).decode()
        with open(REFUND, "rb") as f:
            rsha = redis_cmd(s.port, "SCRIPT", "LOAD", f.read()).decode()
        yield s.port, sha, rsha
    finally:
        s.stop()


def decide(port, sha, keys, limits, mode="d"):
    """One request in the batch protocol, the reply in the per-limit shape
    (batchlib.py); mode "c" asks for the refund marks."""
    reply = redis_cmds(port, [decide_args(sha, keys, limits, mode)])[-1]
    return decide_reply(reply, keys, limits, mode)


def commands(port):
    """{command: calls} from INFO commandstats, scripts' own calls included."""
    info = redis_cmd(port, "INFO", "commandstats").decode()
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r"cmdstat_(\w+):calls=(\d+)", info)}


def calls_per_decision(port, sha, keys, limits, n=10):
    decide(port, sha, keys, limits)                 # the keys exist from here on
    redis_cmd(port, "CONFIG", "RESETSTAT")
    for _ in range(n):
        r = decide(port, sha, keys, limits)
        assert r[0] == 1, r
    got = commands(port)
    assert got.pop("evalsha") == n
    got.pop("config", None)
    got.pop("info", None)
    return {k: v / n for k, v in got.items()}


# A window's key written again in its window: SETRANGE (its expiry stands);
# a bucket or a TAT: PSETEX (its expiry moves).
@pytest.mark.parametrize("name,lim,write", [("fixed", FIXED, "setrange"),
                                            ("sliding", SLIDING, "setrange"),
                                            ("bucket", BUCKET, "psetex"),
                                            ("gcra", GCRA, "psetex")])
def test_one_limit_is_time_mget_and_one_write(srv, name, lim, write):
    port, sha, _ = srv
    assert calls_per_decision(port, sha, ["cost:{%s}" % name], [lim]) == \
        {"time": 1, "mget": 1, write: 1}


def test_three_limits_read_once(srv):
    port, sha, _ = srv
    keys = ["cost3:{a}", "cost3:{a}b", "cost3:{a}c"]
    assert calls_per_decision(port, sha, keys, [BUCKET, GCRA, FIXED]) == \
        {"time": 1, "mget": 1, "psetex": 2, "setrange": 1}


def test_denied_request_writes_nothing(srv):
    port, sha, _ = srv
    keys = ["deny:{a}", "deny:{a}b"]
    spent = [0, 0, HOUR, 0, 1, 0]
    redis_cmd(port, "CONFIG", "RESETSTAT")
    for _ in range(3):
        r = decide(port, sha, keys, [FIXED, spent])
        assert r[0] == 0 and r[1] == 1 and r[5] == 0
    got = commands(port)
    assert not {"set", "psetex", "setrange", "del"} & set(got), got
    assert redis_cmd(port, "EXISTS", *keys) == 0


def test_every_written_key_has_a_ttl_and_a_string(srv):
    port, sha, _ = srv
    for name, lim in (("fixed", FIXED), ("sliding", SLIDING), ("bucket", BUCKET),
                      ("gcra", GCRA)):
        key = "ttl:{%s}" % name
        for _ in range(2):          # created, then written again in its window
            assert decide(port, sha, [key], [lim])[0] == 1
            assert redis_cmd(port, "TYPE", key) == "string"
            assert 0 < redis_cmd(port, "PTTL", key) <= 2 * HOUR   # sliding: two windows
    assert decide(port, sha, ["ttl:{log}"], [LOG])[0] == 1
    assert redis_cmd(port, "TYPE", "ttl:{log}") == "zset"
    assert redis_cmd(port, "PTTL", "ttl:{log}") > 0


def test_large_integers_stay_exact(srv):
    """Counts, windows and TATs beyond 14 digits are written as integers."""
    port, sha, _ = srv
    big = 2 ** 50
    fixed = [0, big, HOUR, 0, 3 * 10 ** 14 + 7, 0]
    r = decide(port, sha, ["big:{f}"], [fixed])
    assert r[:3] == [1, 1, big - 3 * 10 ** 14 - 7]
    v = redis_cmd(port, "GET", "big:{f}").decode()
    assert re.fullmatch(r"F\d+ 300000000000007", v), v
    gcra = [4, 10 ** 6, 0, 10 ** 9, 10 ** 5, 0]            # TAT 1e14 us ahead
    r = decide(port, sha, ["big:{g}"], [gcra])
    assert r[:3] == [1, 1, 10 ** 6 - 10 ** 5]
    assert re.fullmatch(r"\d{16,}", redis_cmd(port, "GET", "big:{g}").decode())
    r = decide(port, sha, ["big:{g}"], [gcra])              # reads it back exactly
    assert r[:3] == [1, 1, 10 ** 6 - 2 * 10 ** 5]


def test_other_types_and_old_layouts_read_as_absent(srv):
    port, sha, _ = srv
    redis_cmd(port, "HSET", "old:{f}", "w", "1", "n", "999")   # an older sluice's HASH
    redis_cmd(port, "ZADD", "old:{g}", "1", "x")               # a sliding_log's ZSET
    redis_cmd(port, "SET", "old:{l}", "F1 2")                  # a string under a log
    redis_cmd(port, "SET", "old:{b}", "S1 2 3")                # another algorithm's value
    for key, lim in (("old:{f}", FIXED), ("old:{g}", GCRA), ("old:{l}", LOG),
                     ("old:{b}", BUCKET)):
        r = decide(port, sha, [key], [lim])
        assert r == [1, 1, 999, r[3], 0], (key, r)
        assert redis_cmd(port, "PTTL", key) > 0
    assert redis_cmd(port, "TYPE", "old:{l}") == "zset"
    assert redis_cmd(port, "TYPE", "old:{f}") == "string"


def test_shadow_and_check_only(srv):
    port, sha, _ = srv
    spent_shadow = [0, 0, HOUR, 0, 1, 1]
    r = decide(port, sha, ["sh:{a}", "sh:{a}b"], [FIXED, spent_shadow])
    assert r[0] == 1 and r[1:5] == [1, 999, r[3], 0] and r[5] == 0
    check = [0, 5, HOUR, 0, 1, 2]
    for _ in range(3):
        r = decide(port, sha, ["co:{a}"], [check])
        assert r[:3] == [1, 1, 5]               # checked, never consumed
    assert redis_cmd(port, "EXISTS", "co:{a}") == 0


@pytest.mark.parametrize("name,lim", [("fixed", FIXED), ("sliding", SLIDING),
                                      ("log", LOG), ("bucket", BUCKET), ("gcra", GCRA)])
def test_refund_gives_back_exactly(srv, name, lim):
    """Mode "c" then refund.lua: the next decision sees the state before."""
    port, sha, rsha = srv
    key = "rf:{%s}" % name
    first = decide(port, sha, [key], [lim], mode="c")
    assert first[:2] == [1, 1]
    r = decide(port, sha, [key], [lim], mode="c")
    assert r[:3] == [1, 1, first[2] - 1]
    ts, tus, mark = r[5], r[6], r[7]
    args = ["EVALSHA", rsha, 1, key, ts, tus, 1] + lim[:5] + [mark]
    assert redis_cmds(port, [args])[-1] == 1
    if name != "gcra" and name != "bucket":
        assert redis_cmd(port, "PTTL", key) > 0
    again = decide(port, sha, [key], [lim], mode="c")
    assert again[:3] == [1, 1, first[2] - 1], (first, again)
