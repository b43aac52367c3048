# sluice - tests/integration/test_cost_from.py: limits charged what the response reports.
#
# An OpenAI-shaped upstream (tests/llm_upstream.py) answers with 300 tokens
# of usage, in a JSON body, an SSE stream's last chunk, a header or a
# chunked trailer; a budget of 1,000 tokens: the fourth call completes (and
# leaves the key in debt), the fifth gets 429 with a Retry-After that
# reflects the debt. The same over two proxies on one Redis, on each
# algorithm, with the memory backend; estimates taken at admission stop a
# parallel burst; a response without the value leaves the estimate.

import json
import os
import signal
import socket
import subprocess
import time
import uuid

import pytest

from conftest import (build_request, free_port, http_get, parallel, read_log, redis_cmd, redis_time_s,
                      sluice_bin, stop_process)
from proxylib import metrics, mval, start_proxy

HERE = os.path.dirname(os.path.abspath(__file__))
LLM_UPSTREAM = os.path.join(os.path.dirname(HERE), "llm_upstream.py")


@pytest.fixture
def llm():
    proc = subprocess.Popen(["/usr/bin/python3", LLM_UPSTREAM, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    port = int(proc.stdout.readline())
    yield port
    stop_process(proc)


def route(name, path, limit, **extra):
    """A route to the LLM upstream with one limit (a YAML flow mapping)."""
    opts = "".join(", %s: %s" % kv for kv in extra.items())
    return ("  - name: %s\n    match: { path: %s }\n    upstream: api\n    limits:\n"
            "      - { name: tokens, %s, key: [\"header:X-Key\"]%s }\n" % (name, path, limit, opts))


BUCKET = "algorithm: token_bucket, rate: 1000/1m, burst: 1000"
GCRA = "algorithm: gcra, rate: 1000/1m, burst: 1000"
FIXED = "algorithm: fixed_window, limit: 1000, window: 1h"
SLIDING = "algorithm: sliding_window, limit: 1000, window: 1h"

CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
CHAT_STREAM = json.dumps({"model": "m", "stream": True,
                          "messages": [{"role": "user", "content": "hi"}]}).encode()


def call(port, path, key, tokens=300, body=None, delay_ms=0):
    headers = [("X-Key", key), ("X-Tokens", str(tokens))]
    if delay_ms:
        headers.append(("X-Delay-Ms", str(delay_ms)))
    if body is not None:
        headers.append(("Content-Type", "application/json"))
        return http_get(port, path, method="POST", headers=headers, body=body)
    return http_get(port, path, headers=headers)


def away_from_hour_end(redis_port):
    """The 1h windows must not turn over during a test: wait out the last minute."""
    left = 3600 - redis_time_s(redis_port) % 3600
    if left < 60:
        time.sleep(left + 0.5)


def fifth_is_limited(ports, path, body=None, tokens=300):
    """Four calls of one key complete (spread over ports), the fifth gets 429;
    returns the 429."""
    key = uuid.uuid4().hex
    for i in range(4):
        r = call(ports[i % len(ports)], path, key, tokens=tokens, body=body)
        assert r.status == 200, (i, r.status, r.body[:200])
    r = call(ports[4 % len(ports)], path, key, tokens=tokens, body=body)
    assert r.status == 429, (r.status, r.body[:200])
    return r


def tokens_left(redis_port, route_name, key):
    """A token_bucket key's tokens in Redis (1000: absent, a full bucket)."""
    keys = redis_cmd(redis_port, "KEYS", "itest:{%s|tokens|*%s}" % (route_name, key))
    if not keys:
        return 1000.0
    return float(redis_cmd(redis_port, "GET", keys[0]).decode().split()[1])


def retry_after(r):
    return int(r.header("Retry-After"))


@pytest.mark.parametrize("source,path,body", [
    ("{ json: usage.total_tokens }", "/v1/chat/completions", CHAT),
    ("{ sse: usage.total_tokens }", "/v1/chat/completions", CHAT_STREAM),
    ("{ header: X-Usage-Tokens }", "/header", None),
    ("{ trailer: X-Usage-Tokens }", "/trailer", None),
])
def test_fourth_completes_fifth_waits_for_the_debt(sluice, llm, redis, source, path, body):
    s = start_proxy(sluice, route("llm", path, BUCKET, cost_from=source),
                    upstream_port=llm)
    r = fifth_is_limited([s.port], path, body)
    # 1,200 tokens charged on a budget of 1,000 refilled at 1000/min: the
    # debt of ~200 tokens plus the next estimate (1) take ~12 s to refill
    assert 10 <= retry_after(r) <= 13, r.header("Retry-After")


def test_algorithms_over_two_proxies(sluice, llm, redis):
    away_from_hour_end(redis.port)
    routes = "".join(route("r%d" % i, "/v1/chat/completions/%d" % i, algo,
                           cost_from="{ json: usage.total_tokens }")
                     for i, algo in enumerate([BUCKET, GCRA, FIXED, SLIDING]))
    a = start_proxy(sluice, routes, upstream_port=llm)
    b = start_proxy(sluice, routes, upstream_port=llm)
    for i in range(4):
        r = fifth_is_limited([a.port, b.port], "/v1/chat/completions/%d" % i, CHAT)
        if i < 2:       # bucket, gcra: the debt's refill
            assert 10 <= retry_after(r) <= 13, (i, r.header("Retry-After"))
        else:           # windows: until the window ends
            assert retry_after(r) >= 1


def test_memory_backend(sluice, llm):
    routes = (route("tb", "/v1/chat/completions/tb", BUCKET,
                    cost_from="{ json: usage.total_tokens }") +
              route("fw", "/v1/chat/completions/fw", FIXED,
                    cost_from="{ sse: usage.total_tokens }"))
    s = start_proxy(sluice, routes, top="backend: memory\n", wait_redis=False,
                    redis_port=free_port(), workers=2, upstream_port=llm)
    r = fifth_is_limited([s.port], "/v1/chat/completions/tb", CHAT)
    assert 10 <= retry_after(r) <= 13, r.header("Retry-After")
    fifth_is_limited([s.port], "/v1/chat/completions/fw", CHAT_STREAM)


def test_estimate_stops_a_parallel_burst(sluice, llm, redis):
    s = start_proxy(sluice, route("llm", "/v1/chat/completions", BUCKET,
                                  cost_from="{ json: usage.total_tokens }", estimate=400),
                    upstream_port=llm)
    key = uuid.uuid4().hex
    out = parallel([lambda: call(s.port, "/v1/chat/completions", key, body=CHAT,
                                 delay_ms=1500) for _ in range(5)])
    codes = sorted(r.status for r in out)
    # 2 x 400 fit in 1,000, a third estimate does not: the burst cannot
    # overdraw by more than its estimates
    assert codes == [200, 200, 429, 429, 429], codes
    # each reported 300: 100 of each estimate came back (1000 - 600, the
    # refill of the 1.5 s aside; a later request is still denied by this
    # proxy's deny cache until the retry time it was told)
    assert 400 <= tokens_left(redis.port, "llm", key) <= 460


def asking_burst(port, max_tokens, n):
    """n chat calls at once on one new key, each asking for max_tokens
    (answered after 1.5 s, so all are admitted on their estimates)."""
    body = json.dumps({"model": "m", "max_tokens": max_tokens,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    key = uuid.uuid4().hex
    return parallel([lambda: call(port, "/v1/chat/completions", key, body=body, delay_ms=1500)
                     for _ in range(n)])


PLAN_ESTIMATE = """\
plans:
  default: metered
  metered:
    limits:
      - { name: tokens, %s, key: ["header:X-Key"], cost_from: { json: usage.total_tokens },
          estimate: { json: max_tokens, default: 1 } }
""" % BUCKET


def test_a_plans_estimate_reads_the_request_body(sluice, llm, redis):
    """A plan's limit that estimates from the body: the route (no limit of
    its own) reads the body before its decision for it, as for its own."""
    routes = ("  - name: llm\n    match: { path: /v1/chat/completions }\n    upstream: api\n"
              "    plan_key: \"header:X-Key\"\n")
    s = start_proxy(sluice, routes, top=PLAN_ESTIMATE, upstream_port=llm)
    out = asking_burst(s.port, 400, 4)
    assert sorted(r.status for r in out) == [200, 200, 429, 429], out


def test_estimate_from_the_request_body(sluice, llm, redis):
    """estimate: {json: max_tokens}: read from the buffered request body, so
    a burst asking for 400 tokens each stops at two, while requests that
    ask for nothing take the default."""
    s = start_proxy(sluice, route("llm", "/v1/chat/completions", BUCKET,
                                  cost_from="{ json: usage.total_tokens }",
                                  estimate="{ json: max_tokens, default: 1 }"),
                    upstream_port=llm)
    out = asking_burst(s.port, 400, 4)
    assert sorted(r.status for r in out) == [200, 200, 429, 429], out
    assert all(r.json()["usage"]["total_tokens"] == 300 for r in out if r.status == 200)
    key = uuid.uuid4().hex
    out = parallel([lambda: call(s.port, "/v1/chat/completions", key, body=CHAT,
                                 delay_ms=1500) for _ in range(4)])
    assert [r.status for r in out] == [200] * 4, out


def test_no_value_keeps_the_estimate(sluice, llm, redis):
    s = start_proxy(sluice, route("llm", "/nousage", BUCKET,
                                  cost_from="{ json: usage.total_tokens }", estimate=250),
                    upstream_port=llm)
    key = uuid.uuid4().hex
    for i in range(4):
        assert call(s.port, "/nousage", key).status == 200, i
    assert call(s.port, "/nousage", key).status == 429


def test_failures_keep_the_estimate(sluice, llm, redis):
    """An upstream that cuts its body, and a client gone mid-stream: the
    estimate is what the request cost."""
    routes = (route("cut", "/cut", BUCKET, cost_from="{ json: usage.total_tokens }",
                    estimate=250) +
              route("sse", "/v1/chat/completions", BUCKET,
                    cost_from="{ sse: usage.total_tokens }", estimate=250))
    s = start_proxy(sluice, routes, upstream_port=llm)
    key = uuid.uuid4().hex
    try:
        call(s.port, "/cut", key, tokens=900)
    except Exception:               # noqa: BLE001 - the body is cut: either way
        pass
    assert 750 <= tokens_left(redis.port, "cut", key) <= 760
    key = uuid.uuid4().hex
    c = socket.create_connection(("127.0.0.1", s.port), timeout=5)
    c.sendall(build_request("POST", "/v1/chat/completions",
                            [("X-Key", key), ("X-Tokens", "900"), ("X-Gap-Ms", "1000"),
                             ("Content-Type", "application/json")], CHAT_STREAM))
    head = b""
    while b"\r\n\r\n" not in head and len(head) < 65536:
        more = c.recv(4096)
        if not more:
            break
        head += more
    assert head.startswith(b"HTTP/1.1 200 "), head
    c.close()                       # before the final chunk with its usage
    time.sleep(3.5)                 # the upstream finishes its stream meanwhile
    assert 750 <= tokens_left(redis.port, "sse", key) <= 810


def test_a_frozen_redis_holds_the_end_at_most_its_timeout(sluice, llm, own_redis):
    """The response's end waits for its settlement, but no longer than
    redis.timeout: Redis frozen (SIGSTOP) while the upstream answers, the
    client still gets the whole response."""
    s = start_proxy(sluice, route("llm", "/header", BUCKET,
                                  cost_from="{ header: X-Usage-Tokens }"),
                    upstream_port=llm, redis_port=own_redis.port, redis_timeout="500ms")
    key = uuid.uuid4().hex
    assert call(s.port, "/header", key).status == 200       # the script is loaded

    def freeze():
        time.sleep(0.3)             # the second request was decided meanwhile
        os.kill(own_redis.proc.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        out = parallel([lambda: call(s.port, "/header", key, delay_ms=1000), freeze])
        took = time.monotonic() - t0
    finally:
        os.kill(own_redis.proc.pid, signal.SIGCONT)
    assert not isinstance(out[0], Exception), out
    assert out[0].status == 200 and out[0].body == b"ok\n", out[0]
    assert 1.4 <= took < 5, took    # 1 s upstream + 0.5 s redis.timeout


def test_log_and_metrics_show_the_charge(sluice, llm, redis, tmp_path):
    log = tmp_path / "access.log"
    s = start_proxy(sluice, route("llm", "/v1/chat/completions", BUCKET,
                                  cost_from="{ json: usage.total_tokens }", estimate=50),
                    top="access_log: %s\n" % log, upstream_port=llm)
    key = uuid.uuid4().hex
    assert call(s.port, "/v1/chat/completions", key, tokens=321, body=CHAT).status == 200
    assert call(s.port, "/v1/chat/completions", key, tokens=7, body=CHAT).status == 200
    lines = read_log(log, 2)
    costs = [e.get("cost") for e in lines]
    assert costs == [321, 7], lines
    assert mval(metrics(s.admin_port), "sluice_cost_charged_total", route="llm") == 328
    # 1000 - 328 left (the refill in between at most adds to it)
    assert 672 <= tokens_left(redis.port, "llm", key) <= 700


@pytest.mark.parametrize("limit,expect", [
    ("{ name: t, %s, key: [ip], cost_from: { xml: a } }" % BUCKET,
     "unknown cost source 'xml' (use header, trailer, json or sse)"),
    ("{ name: t, %s, key: [ip], cost_from: { json: 'usage..total' } }" % BUCKET,
     "bad JSON path 'usage..total'"),
    ("{ name: t, algorithm: sliding_log, limit: 5, window: 1m, key: [ip], "
     "cost_from: { header: X-U } }",
     "'cost_from' does not apply to sliding_log"),
    ("{ name: t, %s, key: [ip], estimate: 5 }" % BUCKET, "'estimate' needs cost_from"),
    ("{ name: t, %s, key: [ip], cost_from: { header: X-U }, count_status: [2xx] }" % BUCKET,
     "'cost_from' does not combine with count_status"),
])
def test_config_errors(tmp_path, limit, expect):
    conf = tmp_path / "bad.yaml"
    conf.write_text("listen: 127.0.0.1:%d\nbackend: memory\nupstreams:\n  api:\n"
                    "    servers: [127.0.0.1:1]\nroutes:\n  - name: r\n    match: { path: / }\n"
                    "    upstream: api\n    limits:\n      - %s\n" % (free_port(), limit))
    p = subprocess.run([sluice_bin(), "-t", "-c", str(conf)], capture_output=True, timeout=10)
    err = p.stderr.decode()
    assert p.returncode != 0
    assert ("%s:11:" % conf) in err and expect in err, err


NODE_DIR = os.path.join(os.path.dirname(HERE), "node")


def test_openai_client_honours_retry_after(sluice, llm, redis):
    """The openai npm client: four calls complete, the fifth gets 429, and the
    client's own retry (maxRetries) waits out Retry-After and succeeds."""
    assert os.path.isdir(os.path.join(NODE_DIR, "node_modules", "openai")), \
        "run `make deps` (npm ci in tests/node)"
    s = start_proxy(sluice, "  - name: llm\n    match: { path: /v1/chat/completions }\n"
                    "    upstream: api\n    limits:\n"
                    "      - { name: tokens, algorithm: token_bucket, rate: 1000/3s, burst: 1000,"
                    " key: [\"header:Authorization\"], cost_from: { json: usage.total_tokens } }\n",
                    upstream_port=llm)
    p = subprocess.run(["node", os.path.join(NODE_DIR, "openai_calls.js"),
                        "http://127.0.0.1:%d/v1" % s.port, "sk-" + uuid.uuid4().hex],
                       capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    calls = json.loads(p.stdout)
    assert calls[:4] == [{"ok": True, "tokens": 300}] * 4, calls
    # 1,200 on 1,000 refilled at 1000/3s: the debt of ~200 refills in ~0.6 s
    assert calls[4] == {"ok": False, "status": 429, "retry_after": "1"}, calls
    assert calls[5]["ok"] and calls[5]["tokens"] == 300, calls
    assert calls[5]["waited_ms"] >= 900, calls     # it waited the Retry-After
