# sluice - tests/integration/test_override_denycache.py: a 429 answered from
# the deny cache shows the limit that denied, a run-time override's too.
#
# The deny cache remembers, with each denial, the limit the backend applied;
# before, its answers showed the configured limit (2 here) while Redis'
# answers for the same key showed the override's (4).

from apilib import api, deny_hits, start_api
from conftest import http_get

ROUTES = """\
  - name: r
    match: { path: /r }
    upstream: api
    limits:
      - { name: fw, algorithm: fixed_window, limit: 2, window: 1h, key: ["header:X-K"] }
"""


def limit_header(r):
    return {k.lower(): v for k, v in r.headers}.get("x-ratelimit-limit")


def test_cached_denial_shows_the_runtime_override(sluice, redis):
    s = start_api(sluice, ROUTES)
    code, doc, _ = api(s, "PUT", "/api/limits/r/fw/override?key=big", {"limit": 4})
    assert code == 200, (code, doc)
    rs = [http_get(s.port, "/r", headers=[("X-K", "big")]) for _ in range(4)]
    assert [r.status for r in rs] == [200] * 4
    hits0 = deny_hits(s)
    from_redis = http_get(s.port, "/r", headers=[("X-K", "big")])
    from_cache = http_get(s.port, "/r", headers=[("X-K", "big")])
    assert from_redis.status == 429 and from_cache.status == 429
    assert deny_hits(s) == hits0 + 1, "the second 429 did not come from the deny cache"
    assert limit_header(from_redis) == "4", from_redis.headers
    assert limit_header(from_cache) == "4", from_cache.headers
    # a key with no override still shows the configured limit from the cache
    for _ in range(4):
        last = http_get(s.port, "/r", headers=[("X-K", "plain")])
    assert last.status == 429 and limit_header(last) == "2", last.headers
