# sluice - tests/integration/test_workers.py: workers and the deny cache.
#
# `workers: 2` with many connections: every worker serves (the per-worker
# counter on the admin endpoint) and the totals are exact across threads.
# A flood for one denied key costs at most a few Redis calls (INFO
# commandstats before and after), the rest are deny-cache hits.

import threading
import uuid

from conftest import Conn, build_request
from proxylib import metrics, mval, script_calls, series, start_proxy

ROUTES = """\
  - name: w
    match: { path: /w }
    upstream: api
    limits:
      - { name: big, algorithm: sliding_log, limit: 1000000, window: 1m, key: [ip] }
  - name: flood
    match: { path: /flood }
    upstream: api
    limits:
      - { name: one, algorithm: sliding_log, limit: 1, window: 1m, key: ["header:X-K"] }
"""


def run_parallel(port, path, conns, per_conn, headers=None):
    """conns threads, each one keep-alive connection sending per_conn
    requests; returns the list of statuses (exceptions fail the test)."""
    results, errors = [], []
    lock = threading.Lock()

    def one():
        try:
            got = []
            with Conn(port) as c:
                for _ in range(per_conn):
                    c.send(build_request("GET", path, headers))
                    got.append(c.read_response().status)
            with lock:
                results.extend(got)
        except Exception as e:      # noqa: BLE001 - reported below
            with lock:
                errors.append(repr(e))

    threads = [threading.Thread(target=one, daemon=True) for _ in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "client threads stuck"
    assert not errors, errors[:5]
    return results


def test_two_workers_both_serve_and_counts_are_exact(sluice, redis):
    s = start_proxy(sluice, ROUTES, workers=2)
    before = metrics(s.admin_port)
    n_conns, per_conn = 24, 10
    got = run_parallel(s.port, "/w", n_conns, per_conn)
    assert got == [200] * (n_conns * per_conn)
    after = metrics(s.admin_port)

    per_worker = {dict(k).get("worker"): v - before.get(("sluice_worker_requests_total", k), 0)
                  for k, v in series(after, "sluice_worker_requests_total").items()}
    served = {w: n for w, n in per_worker.items() if n > 0}
    # 24 connections spread by SO_REUSEPORT: all on one worker has odds 2**-23
    assert len(served) == 2, per_worker
    assert sum(per_worker.values()) == n_conns * per_conn, per_worker
    # exact across threads
    d = (mval(after, "sluice_requests_total", route="w", decision="allowed")
         - mval(before, "sluice_requests_total", route="w", decision="allowed"))
    assert d == n_conns * per_conn
    d = (mval(after, "sluice_responses_total", route="w", code="200")
         - mval(before, "sluice_responses_total", route="w", code="200"))
    assert d == n_conns * per_conn


def test_workers_auto_starts(sluice, redis):
    s = start_proxy(sluice, ROUTES, workers="auto")
    got = run_parallel(s.port, "/w", 8, 5)
    assert got == [200] * 40


def test_deny_cache_flood_costs_few_redis_calls(sluice, redis):
    s = start_proxy(sluice, ROUTES, workers=2)
    key = uuid.uuid4().hex
    hdr = [("X-K", key)]
    with Conn(s.port) as c:
        c.send(build_request("GET", "/flood", hdr))
        assert c.read_response().status == 200
        c.send(build_request("GET", "/flood", hdr))
        r = c.read_response()
        assert r.status == 429, r
    before_calls = script_calls(redis.port)
    before = metrics(s.admin_port)

    got = run_parallel(s.port, "/flood", 10, 100, headers=hdr)
    assert got == [429] * 1000

    calls = script_calls(redis.port) - before_calls
    after = metrics(s.admin_port)
    hits = (mval(after, "sluice_deny_cache_hits_total")
            - mval(before, "sluice_deny_cache_hits_total"))
    limited = (mval(after, "sluice_requests_total", route="flood", decision="limited")
               - mval(before, "sluice_requests_total", route="flood", decision="limited"))
    # one script call may carry several requests (batching): count the decisions
    decided = (mval(after, "sluice_redis_batch_size_sum")
               - mval(before, "sluice_redis_batch_size_sum"))
    print("deny cache: 1000 denied requests, %d Redis script calls carrying %d decisions, "
          "%d cache hits" % (calls, decided, hits))
    # one worker may not have seen the denial yet: at most one call each, and slack;
    # such a call carries at most the 10 requests in flight
    assert calls <= 4, calls
    assert decided <= 4 * 10, decided
    assert hits + decided == 1000, (hits, decided)
    assert limited == 1000
