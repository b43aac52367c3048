# sluice - tests/integration/test_bench_judge.py: bench/run.py's judge of the
# targets, on figures made up here (no servers): a repetition that completed
# no request (a row that stalled) must fail its row's targets instead of
# counting as a free 0.000.

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import run  # noqa: E402  bench/run.py


def rep(requests, cpu_s, calls=0):
    r = {"requests": requests, "rps": requests / 4.0, "p50_ms": 1.0 if requests else None,
         "p99_ms": 2.0 if requests else None, "non2xx": 0, "socket_errors": 0}
    n = requests
    r["proxy_cpu_s"], r["redis_cpu_s"], r["script_calls"] = cpu_s, 0.0, calls
    r["proxy_cpu_per_10k"] = cpu_s / n * 10000 if n else None
    r["redis_cpu_per_10k"] = 0.0 if n else None
    r["redis_calls_per_req"] = calls / n if n else None
    return r


def rows(sluice_reps, nginx_reps):
    return {k: {"reps": v, "median": run.medians(v)}
            for k, v in (("sluicegrpc", sluice_reps), ("nginxgrpc", nginx_reps))}


def test_every_repetition_measured_is_judged_on_its_figures():
    rs = rows([rep(40000, 1.2), rep(40000, 1.0), rep(40000, 1.1)],
              [rep(40000, 1.2), rep(40000, 1.2), rep(40000, 1.2)])
    out = run.judge(rs, None, None, 64)
    assert out["grpc_vs_nginx"]["met"] is True
    assert abs(out["grpc_vs_nginx"]["value"] - 1.1 / 1.2) < 1e-9


def test_a_repetition_without_requests_fails_the_target():
    # Two good repetitions well under nginx, one that completed nothing.
    rs = rows([rep(40000, 0.8), rep(0, 0.0), rep(40000, 0.8)],
              [rep(40000, 1.2), rep(40000, 1.2), rep(40000, 1.2)])
    assert rs["sluicegrpc"]["median"]["empty_reps"] == 1
    # The empty repetition is not a figure: the median is of the other two.
    assert abs(rs["sluicegrpc"]["median"]["proxy_cpu_per_10k"] - 0.2) < 1e-9
    out = run.judge(rs, None, None, 64)
    assert out["grpc_vs_nginx"]["met"] is False
    assert "completed no request" in out["grpc_vs_nginx"]["note"]


def test_a_row_that_never_completed_a_request_is_not_met():
    rs = rows([rep(0, 0.0), rep(0, 0.0), rep(0, 0.0)],
              [rep(40000, 1.2), rep(40000, 1.2), rep(40000, 1.2)])
    out = run.judge(rs, None, None, 64)
    assert out["grpc_vs_nginx"]["value"] is None
    assert out["grpc_vs_nginx"]["met"] is False


def test_every_target_names_its_rows():
    assert set(run.TARGET_ROWS) <= set(run.TARGETS_DOC)
