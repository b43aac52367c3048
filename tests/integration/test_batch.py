# sluice - tests/integration/test_batch.py: the decisions of one event-loop
# turn go to Redis in one script call (issue 11), and stay exact.
#
# First limit.lua's batch protocol by hand (a redis-server of this module's
# own; batchlib.py encodes as store.c does): requests of one key in one call
# see each other's consumption in order, a denied request consumes nothing
# even when a later one of the call passes, every key written has its TTL,
# refund marks come only with the requests that ask, a bad argument anywhere
# writes nothing, and Redis runs TIME and MGET once per call and one SET per
# key written. Then through sluice: requests sent while sluice is stopped
# (SIGSTOP) are all read in one loop turn on its return, so they form one
# batch (sluice_redis_batch_size shows it) of one key: exactly the limit is
# admitted, for sliding_log, token_bucket and gcra, and a NOSCRIPT answer to
# a batch reloads the script and answers every request of it. The slow
# test: 4 proxies x 200 concurrent clients on one key admit exactly 50.

import os
import re
import signal
import socket
import time
import uuid

import pytest

from batchlib import batch_args, split_reply
from conftest import (Conn, RedisError, build_request, http_get, parallel,
                      redis_with_limit_script,
                      redis_cmd, redis_cmds, redis_keys, wait_until)
from proxylib import metrics, mval, start_proxy, wait_metric

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LIMIT = os.path.join(ROOT, "src", "store", "scripts", "limit.lua")
HOUR = 3600000

# (algo limit window_ms interval_us cost flags); "one" admits one request
ONE = {"fixed": [0, 1, HOUR, 0, 1, 0], "sliding": [1, 1, HOUR, 0, 1, 0],
       "log": [2, 1, HOUR, 0, 1, 0], "bucket": [3, 1, 0, 3600 * 10 ** 6, 1, 0],
       "gcra": [4, 1, 0, 3600 * 10 ** 6, 1, 0]}
FIXED5 = [0, 5, HOUR, 0, 1, 0]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    """A redis-server of this module's own (commandstats are reset); by PID."""
    yield from redis_with_limit_script(tmp_path_factory, "batch")


def call(port, sha, requests):
    return split_reply(redis_cmds(port, [batch_args(sha, requests)])[-1], requests)


def commands(port):
    info = redis_cmd(port, "INFO", "commandstats").decode()
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r"cmdstat_(\w+):calls=(\d+)", info)}


# ------------------------------------------------------------ the script ----

@pytest.mark.parametrize("name", sorted(ONE))
def test_two_requests_of_one_key_in_one_call(srv, name):
    """Limit 1 (burst 1): of two requests of one key in one call, exactly
    the first passes; a third call sees the key spent."""
    port, sha = srv
    key = "b2:{%s}" % name
    lim = ONE[name]
    r = call(port, sha, [([key], [lim], False), ([key], [lim], False)])
    assert [x[0] for x in r] == [1, 0], r
    assert r[0][2] == 0 and r[1][4] >= 1, r      # remaining 0, then a retry time
    assert call(port, sha, [([key], [lim], False)])[0][0] == 0
    assert redis_cmd(port, "PTTL", key) > 0


@pytest.mark.parametrize("name", ["fixed", "sliding", "bucket", "gcra"])
def test_many_requests_of_one_key_count_down_in_order(srv, name):
    """64 requests of one key (limit 40) in one call: 40 pass, counting the
    remaining down 39..0, then 24 are denied; one write (SET PXAT for a
    window's new key, PSETEX for a bucket or a TAT) makes the key."""
    port, sha = srv
    key = "b64:{%s}" % name
    lim = list(ONE[name])
    lim[1] = 40
    if name in ("bucket", "gcra"):
        lim[3] = 90 * 10 ** 6                   # refills far slower than the call runs
    redis_cmd(port, "CONFIG", "RESETSTAT")
    r = call(port, sha, [([key], [lim], False)] * 64)
    assert [x[0] for x in r] == [1] * 40 + [0] * 24
    assert [x[2] for x in r[:40]] == list(range(39, -1, -1))
    got = commands(port)
    write = "set" if name in ("fixed", "sliding") else "psetex"
    assert got.get(write) == 1 and got.get("time") == 1 and got.get("mget") == 1, got
    assert got.get("set", 0) + got.get("psetex", 0) + got.get("setrange", 0) == 1, got
    assert redis_cmd(port, "PTTL", key) > 0


def test_short_forms_answer_as_the_long_form(srv):
    """store.c's short forms (32 + ref for one limit of cost 1; 15 + m and
    the refs for m limits of cost 1) answer and consume exactly as the long
    form does, on keys of their own: a request that passes, one denied by
    its last limit (what the earlier ones consumed is undone), a shadow
    limit's denial, a check-only limit, and a request of one limit."""
    port, sha = srv
    lims = [[3, 9, 0, 1000000, 1, 0], [4, 9, 0, 1000000, 1, 0], [0, 2, HOUR, 0, 1, 0]]
    shadow, check = [0, 0, HOUR, 0, 1, 1], [0, 1, HOUR, 0, 1, 2]

    def reqs(tag):
        k = ["bsf:{%s}%d" % (tag, i) for i in range(5)]
        return [(k[:3], lims, False), (k[:3], lims, False), (k[:3], lims, False),
                (k[:2] + [k[3]], lims[:2] + [shadow], False),
                (k[:2] + [k[4]], lims[:2] + [check], False), (k[:1], lims[:1], False)]
    got = {}
    for tag, short in (("l", False), ("s", True)):
        rq = reqs(tag)
        args = batch_args(sha, rq, short=short)
        # five requests of three limits lose their costs, the one of one
        # limit its count and cost
        assert len(args) == len(batch_args(sha, rq)) - (17 if short else 0)
        got[tag] = split_reply(redis_cmds(port, [args])[-1], rq)
        got[tag + "v"] = [redis_cmd(port, "GET", "bsf:{%s}%d" % (tag, i)) for i in range(5)]
    # (a window's reset and retry are its end less now: the two calls'
    # times differ)
    for tag in ("l", "s"):
        got[tag] = [[x[0]] + [y for j in range((len(x) - 1) // 4)
                              for y in (x[1 + 4 * j], x[2 + 4 * j], x[4 + 4 * j] > 0)]
                    for x in got[tag]]
    assert got["l"] == got["s"], got
    assert [x[0] for x in got["l"]] == [1, 1, 0, 1, 1, 1], got["l"]
    assert [v is None for v in got["lv"]] == [v is None for v in got["sv"]] == \
        [False, False, False, True, True], got         # shadow, check-only: unwritten
    assert got["lv"][2] == got["sv"][2] and re.match(rb"^F\d+ 2$", got["sv"][2]), got


def test_sliding_log_in_one_call(srv):
    port, sha = srv
    key = "blog:{a}"
    lim = [2, 3, HOUR, 0, 1, 0]
    r = call(port, sha, [([key], [lim], False)] * 5)
    assert [x[0] for x in r] == [1, 1, 1, 0, 0]
    assert redis_cmd(port, "ZCARD", key) == 3
    assert redis_cmd(port, "PTTL", key) > 0


def test_a_denied_request_consumes_nothing_in_a_call(srv):
    """Request 1 passes its first limit but not its second: it consumes from
    neither, so request 2 (first limit only) finds all 5 units."""
    port, sha = srv
    k1, k2 = "bden:{a}", "bden:{a}b"
    spent = [0, 0, HOUR, 0, 1, 0]
    r = call(port, sha, [([k1, k2], [FIXED5, spent], False), ([k1], [FIXED5], False)])
    assert r[0][0] == 0 and r[0][1:3] == [1, 5], r      # reported without itself
    assert r[1][:3] == [1, 1, 4], r
    assert redis_cmd(port, "EXISTS", k2) == 0


def test_shadow_and_check_only_in_a_call(srv):
    port, sha = srv
    shadow = [0, 0, HOUR, 0, 1, 1]
    check = [0, 2, HOUR, 0, 1, 2]
    r = call(port, sha, [(["bsh:{a}", "bsh:{a}s"], [FIXED5, shadow], False),
                         (["bsh:{a}"], [FIXED5], False),
                         (["bco:{a}"], [check], False), (["bco:{a}"], [check], False)])
    assert r[0][0] == 1 and r[0][5] == 0                # the shadow limit denied, it passed
    assert r[1][:3] == [1, 1, 3]                        # and it consumed
    assert r[2][:3] == [1, 1, 2] and r[3][:3] == [1, 1, 2]
    assert redis_cmd(port, "EXISTS", "bco:{a}") == 0


def test_a_new_window_and_its_same_window_keep_the_expiry(srv):
    """The first request of a fresh key writes PXAT, the second KEEPTTL: the
    one SET at the end must carry the PXAT."""
    port, sha = srv
    for name, lim in (("fixed", [0, 9, HOUR, 0, 1, 0]), ("sliding", [1, 9, HOUR, 0, 1, 0])):
        key = "bttl:{%s}" % name
        r = call(port, sha, [([key], [lim], False)] * 3)
        assert [x[2] for x in r] == [8, 7, 6], r
        assert 0 < redis_cmd(port, "PTTL", key) <= 2 * HOUR
        r = call(port, sha, [([key], [lim], False)] * 2)      # the same window, again
        assert [x[2] for x in r] == [5, 4]
        assert 0 < redis_cmd(port, "PTTL", key) <= 2 * HOUR


def test_marks_come_only_with_the_requests_that_ask(srv):
    port, sha = srv
    reqs = [(["bm:{a}"], [FIXED5], False), (["bm:{b}"], [[2, 5, HOUR, 0, 2, 0]], True),
            (["bm:{c}"], [FIXED5], False)]
    raw = redis_cmds(port, [batch_args(sha, reqs)])[-1]
    assert len(raw) == 2 + 2 + 3 + 2
    r = split_reply(raw, reqs)
    assert r[1][:3] == [1, 1, 3] and r[1][5:] == [raw[0], raw[1], 0]   # log: count before


def test_a_bad_argument_anywhere_writes_nothing(srv):
    """The last request of the call is malformed (a key index beyond KEYS):
    the sliding_log request before it must not have written its ZADD."""
    port, sha = srv
    good = batch_args(sha, [(["bbad:{a}"], [[2, 5, HOUR, 0, 1, 0]], False),
                            (["bbad:{a}"], [[2, 5, HOUR, 0, 1, 0]], False)])
    bad = list(good)
    bad[-2] = str(4 * 2)                      # ref: key 2 of 1
    with pytest.raises(RedisError):
        redis_cmds(port, [bad])
    assert redis_cmd(port, "EXISTS", "bbad:{a}") == 0
    for cut in (1, 2, 3):                     # truncated calls
        with pytest.raises(RedisError):
            redis_cmds(port, [good[:-cut]])
    assert redis_cmd(port, "EXISTS", "bbad:{a}") == 0


def test_concurrency_slots_in_one_call_share_one_parameter_set(srv):
    """Concurrency (algo 5) in a batch: the slot id goes per request, so two
    requests of one key (2 slots) send one parameter set; of three in one
    call two are admitted, the third denied; a renewal (same slot id) in
    the next call stays admitted; the key has a TTL (the lease)."""
    port, sha = srv
    key = "bconc:{a}"
    lims = [[5, 2, 60000, slot, 1, 0] for slot in (11, 12, 13)]
    reqs = [([key], [lim], False) for lim in lims]
    args = batch_args(sha, reqs)
    assert args[2:6] == [1, key, "d", 1], args         # K = 1, P = 1
    r = split_reply(redis_cmds(port, [args])[-1], reqs)
    assert [x[0] for x in r] == [1, 1, 0], r
    assert r[2][4] == 1000, r                          # denied: retry 1 s
    assert redis_cmd(port, "ZCARD", key) == 2
    assert 0 < redis_cmd(port, "PTTL", key) <= 60000
    renew = ([key], [[5, 2, 60000, 12, 1, 0]], False)
    assert call(port, sha, [renew])[0][0] == 1
    assert redis_cmd(port, "ZCARD", key) == 2


def test_delay_in_one_call_reports_each_wait(srv):
    """gcra burst 1, one per 100 ms, delay 250 ms (flag 4, the delay in the
    window's place): in one call the first passes at once, the next two are
    admitted with growing waits, the fourth is denied."""
    port, sha = srv
    key = "bdelay:{a}"
    lim = [4, 1, 250, 100000, 1, 4]
    r = call(port, sha, [([key], [lim], False)] * 4)
    assert [x[0] for x in r] == [1, 1, 1, 0], r
    waits = [x[4] for x in r[:3]]
    assert waits[0] == 0 and 90 <= waits[1] <= 100 and 190 <= waits[2] <= 200, waits
    assert r[3][4] >= 1, r


def test_overrides_in_one_call(srv):
    """Override keys are keys of the batch, named per limit (flag 8): key A
    has an override to 1 (its limit says 5), key B none; both in one call,
    twice each: A admits one, B two, and the reply names the limit applied."""
    port, sha = srv
    ka, kb = "bovr:{a}", "bovr:{b}"
    redis_cmd(port, "SET", ka + ":ovr", "0 1 0")
    lim = [0, 5, HOUR, 0, 1, 0]
    reqs = [([ka], [lim], False, [ka + ":ovr"]), ([kb], [lim], False, [kb + ":ovr"])] * 2
    r = call(port, sha, reqs)
    assert [x[0] for x in r] == [1, 1, 0, 1], r
    assert [x[-1] for x in r] == [1, 5, 1, 5], r
    assert redis_cmd(port, "GET", kb + ":ovr") is None       # never written


def test_one_time_and_one_mget_per_call(srv):
    """64 requests of three limits each on 192 keys: one TIME, one MGET, one
    write per key, PSETEX for the buckets and TATs, SET PXAT for the new
    windows (and nothing per request but the decision)."""
    port, sha = srv
    lims = [[3, 1000, 0, 1000, 1, 0], [4, 1000, 0, 1000, 1, 0], [0, 1000, HOUR, 0, 1, 0]]
    reqs = [(["bk:{%d}a" % i, "bk:{%d}b" % i, "bk:{%d}c" % i], lims, False) for i in range(64)]
    redis_cmd(port, "CONFIG", "RESETSTAT")
    r = call(port, sha, reqs)
    assert all(x[0] == 1 for x in r)
    got = commands(port)
    assert got.get("time") == 1 and got.get("mget") == 1 and got.get("set") == 64, got
    assert got.get("psetex") == 128 and "setrange" not in got, got
    args = batch_args(sha, reqs)
    # the parameter sets travel once: 3 sets of 4, then 64 x (1 + 3 x 2)
    assert len(args) == 3 + 192 + 2 + 12 + 1 + 64 * 7


# ------------------------------------------------------- through sluice ----

ROUTES = """\
  - name: sl
    match: { path: /sl }
    upstream: api
    limits:
      - { name: m, algorithm: sliding_log, limit: 5, window: 1m, key: ["header:X-K"] }
  - name: tb
    match: { path: /tb }
    upstream: api
    limits:
      - { name: m, algorithm: token_bucket, rate: 1/m, burst: 5, key: ["header:X-K"] }
  - name: gcra
    match: { path: /gcra }
    upstream: api
    limits:
      - { name: m, algorithm: gcra, rate: 1/m, burst: 5, key: ["header:X-K"] }
  - name: wide
    match: { path: /wide }
    upstream: api
    limits:
      - { name: m, algorithm: fixed_window, limit: 1000, window: 1m, key: ["header:X-K"] }
"""

N_CONNS = 40


def stop_and_wait(pid, timeout_s=5.0):
    """SIGSTOP pid and wait until every thread of it is stopped: kill()
    returns before the target has stopped."""
    os.kill(pid, signal.SIGSTOP)

    def stopped():
        states = []
        for tid in os.listdir("/proc/%d/task" % pid):
            try:
                with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except OSError:
                pass
        return states and all(st in ("T", "t") for st in states)
    wait_until(stopped, timeout_s, step_s=0.005, what="sluice to stop")


def one_turn(s, path, keys):
    """Open len(keys) connections, stop sluice, send one request on each,
    let it go: it reads them all in one loop turn. The statuses, in order."""
    conns = [Conn(s.port, timeout_s=10) for _ in keys]
    try:
        assert wait_metric(s.admin_port, "sluice_connections", len(keys), side="client") \
            >= len(keys), "sluice did not accept them"
        try:
            stop_and_wait(s.proc.pid)
            for c, k in zip(conns, keys):
                c.send(build_request("GET", path, headers=[("X-K", k)]))
            time.sleep(0.1)                   # every request is in sluice's socket buffers
        finally:
            os.kill(s.proc.pid, signal.SIGCONT)
        return [c.read_response().status for c in conns]
    finally:
        for c in conns:
            c.close()


def batches(admin_port):
    ms = metrics(admin_port)
    return (mval(ms, "sluice_redis_batch_size_count"), mval(ms, "sluice_redis_batch_size_sum"),
            mval(ms, "sluice_redis_batch_size_bucket", le="16"))


@pytest.mark.parametrize("path", ["/sl", "/tb", "/gcra"])
def test_one_batch_of_one_key_admits_exactly_the_limit(sluice, redis, path):
    s = start_proxy(sluice, ROUTES)
    key = uuid.uuid4().hex
    n0, sum0, small0 = batches(s.admin_port)
    got = one_turn(s, path, [key] * N_CONNS)
    n1, sum1, small1 = batches(s.admin_port)
    assert got.count(200) == 5 and got.count(429) == N_CONNS - 5, got
    assert sum1 - sum0 == N_CONNS                 # every decision went in a batch
    # and most of them in one batch of more than 16
    assert n1 - n0 - (small1 - small0) >= 1, (n0, n1, small0, small1)
    assert n1 - n0 <= N_CONNS // 2, (n0, n1)


def test_noscript_on_a_batch_reloads_and_answers_all(sluice, redis):
    s = start_proxy(sluice, ROUTES, on_error="deny")
    assert http_get(s.port, "/wide", headers=[("X-K", "warm")]).status == 200
    redis_cmd(redis.port, "SCRIPT", "FLUSH")
    n0, sum0, _ = batches(s.admin_port)
    got = one_turn(s, "/wide", ["k%d" % i for i in range(N_CONNS)])
    n1, sum1, _ = batches(s.admin_port)
    assert got == [200] * N_CONNS, got
    # sent as a batch, refused with NOSCRIPT, sent again after SCRIPT LOAD
    # (libevent reads 32 sockets per turn at first: the last 8 may go
    # after the reload)
    assert N_CONNS + 16 < sum1 - sum0 <= 2 * N_CONNS and n1 - n0 < N_CONNS, \
        (n0, n1, sum0, sum1)


def test_keys_of_a_batch_all_have_a_ttl(sluice, redis):
    s = start_proxy(sluice, ROUTES)
    one_turn(s, "/wide", ["t%d" % i for i in range(N_CONNS)])
    one_turn(s, "/sl", ["t%d" % (i % 4) for i in range(N_CONNS)])
    keys = [k for k in redis_keys(redis.port) if k.startswith(b"itest:")]
    assert len(keys) >= N_CONNS + 4
    for k in keys:
        assert redis_cmd(redis.port, "PTTL", k) > 0, k


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/sl", "/tb", "/gcra"])
def test_four_proxies_200_clients_one_key_exact(sluice, redis, path):
    routes = ROUTES.replace("limit: 5,", "limit: 50,").replace("burst: 5,", "burst: 50,")
    # no deny cache: every request is decided by Redis, in the batches
    proxies = [start_proxy(sluice, routes, workers=2, redis_timeout="2s",
                         top="deny_cache: { max_keys: 0 }\n") for _ in range(4)]
    key = uuid.uuid4().hex
    results = parallel([lambda i=i: http_get(proxies[i % 4].port, path, headers=[("X-K", key)],
                                             timeout_s=10).status for i in range(200)])
    assert len(results) == 200
    assert results.count(200) == 50 and results.count(429) == 150, results
    total = sum(mval(metrics(p.admin_port), "sluice_redis_batch_size_sum") for p in proxies)
    assert total == 200

