# sluice - tests/integration/test_redis_replies.py: Redis replies bounded, Sentinel for the
# admin API and the reset subscriber, decisions parsed without reply objects.
#
# A hostile "Redis" (a raw socket in this file that answers sluice's
# handshake, then answers a decision with a reply header declaring a huge
# array, or arrays nested deep) must cost sluice a closed connection, not
# memory: sluice stays up, its RSS stays bounded, the requests on that
# connection get on_error at once (not at redis.timeout), and it reconnects,
# here through the same port, which then relays to a real redis-server.
# Then: the admin API's override and reset through a real redis-sentinel,
# and a reset that reaches a second sluice's deny cache on the same sentinel
# set within 1 s; a failover (slow) moves both to the new master.

import hashlib
import os
import socket
import threading
import time

import pytest

from conftest import (RedisServer, free_port, http_get, make_conf, redis_cmd,
                      redis_with_limit_script, rl_headers,
                      stop_process, wait_port, wait_until)

ROUTES = """\
  - name: r
    match: { path: / }
    upstream: api
    limits:
      - { name: big, algorithm: fixed_window, limit: 1000000, window: 1h, key: ["header:X-K"] }
"""


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


class _Cmds:
    """RESP commands (arrays of bulk strings) read from a socket."""

    def __init__(self, sock):
        self.sock, self.buf = sock, b""

    def _fill(self):
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("closed")
        self.buf += data

    def _line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def command(self):
        n = int(self._line()[1:])
        args = []
        for _ in range(n):
            ln = int(self._line()[1:])
            while len(self.buf) < ln + 2:
                self._fill()
            args.append(self.buf[:ln])
            self.buf = self.buf[ln + 2:]
        return args


class HostileRedis:
    """Listens on a port of its own. While `hostile` holds bytes, a
    connection gets its handshake answered (SCRIPT LOAD: the script's sha,
    the rest +OK) and its first EVALSHA answered with those bytes, then
    with `trickle` repeated (at most `budget` bytes, 3 s) for as long as the
    peer reads; after that one, or when `hostile` is None, connections are
    relayed to the real Redis on relay_port."""

    def __init__(self, hostile, relay_port, trickle=b"", budget=0):
        self.hostile, self.trickle, self.budget = hostile, trickle, budget
        self.relay_port = relay_port
        self.port = free_port()
        self.sent = 0                   # hostile bytes the peer took
        self.evalsha_at = None          # when the hostile reply began
        self.closed_at = None           # when the peer stopped reading it
        self.lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", self.port))
        self.lsock.listen(16)
        self.lsock.settimeout(0.2)
        self.stopping = False
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self):
        while not self.stopping:
            try:
                c, _ = self.lsock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            fn = self._hostile if self.hostile is not None else self._relay
            t = threading.Thread(target=fn, args=(c,), daemon=True)
            self.threads.append(t)
            t.start()

    def _hostile(self, c):
        c.settimeout(3.0)
        rd = _Cmds(c)
        try:
            while not self.stopping:
                args = rd.command()
                name = args[0].upper()
                if name == b"SCRIPT" and len(args) == 3:
                    sha = hashlib.sha1(args[2]).hexdigest().encode()
                    c.sendall(b"$40\r\n" + sha + b"\r\n")
                elif name == b"EVALSHA":
                    break
                else:
                    c.sendall(b"+OK\r\n")
            self.evalsha_at = time.monotonic()
            hostile, self.hostile = self.hostile, None      # the next connection relays
            c.sendall(hostile)
            self.sent = len(hostile)
            chunk = self.trickle * max(1, 65536 // max(1, len(self.trickle)))
            while self.trickle and self.sent < self.budget and \
                    time.monotonic() - self.evalsha_at < 3.0:
                c.sendall(chunk)
                self.sent += len(chunk)
            # the peer closes a refused reply: wait (bounded) to see it
            c.settimeout(0.1)
            while time.monotonic() - self.evalsha_at < 3.0:
                try:
                    if not c.recv(65536):
                        break
                except socket.timeout:
                    continue
        except (OSError, ConnectionError):
            pass
        finally:
            self.closed_at = time.monotonic()
            c.close()

    def _relay(self, c):
        try:
            r = socket.create_connection(("127.0.0.1", self.relay_port), timeout=2.0)
        except OSError:
            c.close()
            return

        def pipe(a, b):
            a.settimeout(0.2)
            try:
                while not self.stopping:
                    try:
                        data = a.recv(65536)
                    except socket.timeout:
                        continue
                    if not data:
                        break
                    b.sendall(data)
            except OSError:
                pass
            finally:
                for s in (a, b):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
        t = threading.Thread(target=pipe, args=(r, c), daemon=True)
        self.threads.append(t)
        t.start()
        pipe(c, r)
        t.join(2.0)
        c.close()
        r.close()

    def stop(self):
        self.stopping = True
        self.lsock.close()
        for t in self.threads:
            t.join(3.0)


def hostile_case(sluice, redis, hostile, trickle=b"", budget=0):
    """sluice on a HostileRedis: (request seconds, its status, RSS growth
    in KiB while the hostile reply came, the fake, sluice)."""
    fake = HostileRedis(hostile, redis.port, trickle, budget)
    try:
        s = sluice(make_conf(ROUTES, on_error="deny", redis_timeout="2s"),
                   redis_port=fake.port, wait_redis=False)
        # the handshake goes to the fake: wait (bounded) for it to be done
        wait_until(lambda: "connected" in s.stderr, 5)
        rss0 = rss_kib(s.proc.pid)
        t0 = time.monotonic()
        r = http_get(s.port, "/x", headers=[("X-K", "h")], timeout_s=10)
        took = time.monotonic() - t0
        wait_until(lambda: fake.closed_at is not None, 5)
        assert s.proc.poll() is None, s.stderr[-3000:]
        grew = rss_kib(s.proc.pid) - rss0
        return took, r.status, grew, fake, s      # the caller stops the fake
    except BaseException:
        fake.stop()
        raise


def relays_again(s, fake, timeout_s=5.0):
    """After the hostile reply: sluice reconnects (through the fake, now a
    relay) and decides in Redis again (the rate-limit fields say so)."""
    def relayed(r):
        return r.status == 200 and rl_headers(r).get("X-RateLimit-Limit") == "1000000"
    return relayed(wait_until(lambda: http_get(s.port, "/x", headers=[("X-K", "after")], timeout_s=5),
                              timeout_s, until=relayed, step_s=0.1)[0])


# 8 MB of one-integer elements: about 18 bytes of hiredis reply objects per
# byte sent when the count is believed (150 MB and more of RSS).
@pytest.mark.parametrize("case", ["huge_count", "deep_nesting", "many_elements"])
def test_hostile_reply_header_is_refused(sluice, redis, case):
    if case == "huge_count":
        # one array header naming 2^31-1 elements, then elements, 8 MB of them
        args = dict(hostile=b"*2147483647\r\n", trickle=b":1\r\n", budget=8 << 20)
    elif case == "deep_nesting":
        # arrays within arrays, 7 deep (hiredis' own limit), then nothing
        args = dict(hostile=b"*2\r\n" * 7)
    else:
        # each array under the bound, their sum over it: 64 x 65536 declared
        args = dict(hostile=b"*64\r\n", trickle=b"*65536\r\n" + b":1\r\n" * 65536,
                    budget=8 << 20)
    took, status, grew, fake, s = hostile_case(sluice, redis, **args)
    try:
        print("%s: answered %d in %.3f s, RSS +%d KiB, %d hostile bytes taken"
              % (case, status, took, grew, fake.sent))
        # on_error (deny) at once: the connection failed, nothing waited
        # for redis.timeout (2 s)
        assert status == 503, status
        assert took < 1.0, took
        assert grew < 32 * 1024, grew     # the bounds allow about 19 MB of objects
        assert "rconn: reply refused" in s.stderr, s.stderr[-2000:]
        assert relays_again(s, fake), s.stderr[-3000:]
        assert s.proc.poll() is None
    finally:
        fake.stop()


# ---------------------------------------------------------------- Sentinel ----

TOKEN = "s3cret-token"

SENTINEL_ROUTES = """\
  - name: r
    match: { path: /r }
    upstream: api
    limits:
      - { name: fw, algorithm: fixed_window, limit: 2, window: 1h, key: ["header:X-K"] }
"""


class OneSentinel:
    """A master and one sentinel (quorum 1) watching it: a sentinel that
    names the master at once (clusterlib.SentinelSet waits for a replica)."""

    def __init__(self, workdir, name="mymaster"):
        self.workdir, self.name = workdir, name
        self.master = RedisServer(workdir)
        self.port = free_port()
        self.proc = None

    def start(self):
        self.master.start()
        conf = self.workdir / ("sentinel-%d.conf" % self.port)
        conf.write_text("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor %s 127.0.0.1 %d 1\n"
                        % (self.port, self.workdir, self.name, self.master.port))
        import subprocess
        self.proc = subprocess.Popen(["redis-server", str(conf), "--sentinel"],
                                     cwd=str(self.workdir), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)

        def master_known():
            try:
                return redis_cmd(self.port, "SENTINEL", "get-master-addr-by-name",
                                 self.name, timeout_s=0.5)
            except Exception:
                return None
        if wait_until(master_known, 10, step_s=0.05)[0]:
            return self
        self.stop()
        raise RuntimeError("the sentinel did not start")

    def stop(self):
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None
        self.master.stop()


def sentinel_api(sluice, sentinel_ports, master_port, name="mymaster"):
    """sluice on the sentinels, with the admin API (admin.token set: the
    overrides and the reset subscriber are on)."""
    admin_port = free_port()
    text = ("listen: 127.0.0.1:@LISTEN_PORT@\nworkers: 1\n"
            "admin:\n  listen: 127.0.0.1:%d\n  token: ${SLUICE_TEST_TOKEN}\n"
            "redis:\n  sentinel:\n    master: %s\n    nodes: [%s]\n"
            "  timeout: 1s\n  prefix: \"sl:\"\n  on_error: allow\n"
            "upstreams:\n  api:\n    servers: [127.0.0.1:@UPSTREAM_PORT@]\n"
            "routes:\n" % (admin_port, name,
                           ", ".join("127.0.0.1:%d" % p for p in sentinel_ports))
            ) + SENTINEL_ROUTES
    s = sluice(text, redis_port=master_port, env={"SLUICE_TEST_TOKEN": TOKEN})
    s.admin_port = admin_port
    assert wait_port(admin_port, s.proc), s.stderr
    return s


def api(s, method, path, body=None):
    import json
    hdrs = [("Authorization", "Bearer " + TOKEN)]
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        hdrs.append(("Content-Type", "application/json"))
    r = http_get(s.admin_port, path, method=method, headers=hdrs, body=data, timeout_s=10)
    try:
        return r.status, json.loads(r.body.decode()) if r.body else None
    except ValueError:
        return r.status, None


def get_k(s, key):
    return http_get(s.port, "/r", headers=[("X-K", key)]).status




def override_and_reset(a, b, key, master_port):
    """On two proxies of one sentinel set: a key at its limit on both
    (denied from both deny caches), a run-time override read back, then a
    reset: both pass it again within 1 s."""
    assert [get_k(a, key), get_k(b, key)] == [200, 200]
    for s in (a, b):
        assert [get_k(s, key) for _ in range(2)] == [429, 429]
    code, doc = api(a, "GET", "/api/limits/r/fw?key=" + key)
    assert code == 200 and doc["allowed"] is False and doc["remaining"] == 0, (code, doc)
    code, doc = api(a, "PUT", "/api/limits/r/fw/override?key=" + key, {"limit": 3})
    assert code == 200 and doc["source"] == "runtime", (code, doc)
    # written to the master the sentinels name
    assert redis_cmd(master_port, "EXISTS", "sl:{r|fw|%d:%s}:ovr" % (len(key), key)) == 1
    code, doc = api(b, "GET", "/api/limits/r/fw?key=" + key)
    assert code == 200 and doc["params"]["limit"] == 3, (code, doc)
    # the override's write reached b's deny cache: one more passes there
    ok, _ = wait_until(lambda: get_k(b, key) == 200 or None, 1.0)
    assert ok, "b still denies %s from its deny cache" % key
    assert get_k(a, key) == 429
    code, doc = api(b, "POST", "/api/limits/r/fw/reset?key=" + key)
    assert code == 200 and doc["reset"] is True and doc["existed"] is True, (code, doc)
    t0 = time.monotonic()
    ok_a, _ = wait_until(lambda: get_k(a, key) == 200 or None, 1.0)
    ok_b, _ = wait_until(lambda: get_k(b, key) == 200 or None, 1.0)
    took = time.monotonic() - t0
    print("sentinel reset: passed again on both proxies %.3f s after the POST" % took)
    assert ok_a and ok_b and took < 1.0, took


def test_sentinel_admin_api_and_reset(tmp_path, sluice):
    st = OneSentinel(tmp_path).start()
    try:
        a = sentinel_api(sluice, [st.port], st.master.port)
        b = sentinel_api(sluice, [st.port], st.master.port)
        override_and_reset(a, b, "sen1", st.master.port)
    finally:
        st.stop()


@pytest.mark.slow
def test_sentinel_admin_api_and_reset_follow_failover(tmp_path, sluice):
    """The master is killed: after the failover the admin API writes to the
    promoted replica and the subscribers of both proxies moved there too."""
    from clusterlib import SentinelSet
    ss = SentinelSet(tmp_path).start()
    try:
        a = sentinel_api(sluice, ss.sentinel_ports, ss.master_port)
        b = sentinel_api(sluice, ss.sentinel_ports, ss.master_port)
        override_and_reset(a, b, "before", ss.master_port)
        ss.kill(ss.master_port)
        ok, took = wait_until(lambda: ss.master() == ss.replica_port, 30.0)
        assert ok, "the sentinels did not fail over"
        # both stores follow (+switch-master): decisions in Redis again
        for s in (a, b):
            ok, _ = wait_until(lambda: http_get(s.port, "/r", headers=[("X-K", "warm")])
                         .header("X-RateLimit-Limit") is not None or None, 10.0)
            assert ok, s.stderr[-3000:]
        # the subscribers' new subscription counted as a reset: give it a moment
        ok, _ = wait_until(lambda: all("reset subscriber: sentinel master 'mymaster' is "
                                 "127.0.0.1:%d" % ss.replica_port in s.stderr
                                 for s in (a, b)) or None, 5.0)
        assert ok, (a.stderr[-2000:], b.stderr[-2000:])
        override_and_reset(a, b, "after", ss.replica_port)
    finally:
        ss.stop()


# ---------------------------------------- limit.lua's one-argument request ----

HERE = os.path.dirname(os.path.abspath(__file__))
LIMIT = os.path.join(os.path.dirname(os.path.dirname(HERE)), "src", "store", "scripts", "limit.lua")
HOUR = 3600000
# [algo, limit, window_ms, interval_us (concurrency: slot id), cost, flags]
SHORT_CASES = {
    "fixed": [0, 2, HOUR, 0, 1, 0], "sliding": [1, 2, HOUR, 0, 1, 0],
    "log": [2, 2, HOUR, 0, 1, 0], "bucket": [3, 2, 0, 10 ** 6, 1, 0],
    "gcra": [4, 2, 0, 10 ** 6, 1, 0], "bucket_delay": [3, 2, 500, 10 ** 6, 1, 4],
    "concurrency": [5, 2, 60000, 7, 1, 0], "check_only": [0, 2, HOUR, 0, 1, 2],
}


def shorten(args, requests):
    """The same call with each request of one limit of cost 1 and no marks
    in store.c's one-argument form, 32 + ref."""
    nk = args[2]
    np_ = args[3 + nk + 1]
    body_at = 3 + nk + 2 + 4 * np_ + 1
    out, i = list(args[:body_at]), body_at
    for req in requests:
        limits, marks, okeys = req[1], req[2], len(req) > 3
        m = args[i]
        i += 1
        if m == 1 and not marks and limits[0][4] == 1:
            out.append(32 + args[i])
            i += 2
        else:
            out.append(m)
            n = 2 * len(limits)
            out += args[i:i + n]
            i += n
            continue
        extra = (1 if limits[0][0] == 5 else 0) + (1 if okeys else 0)
        out += args[i:i + extra]
        i += extra
    out += args[i:]
    return out


@pytest.fixture(scope="module")
def script_srv(tmp_path_factory):
    yield from redis_with_limit_script(tmp_path_factory, "lean")


@pytest.mark.parametrize("name", sorted(SHORT_CASES))
def test_one_argument_request_decides_as_the_long_form(script_srv, name):
    from batchlib import batch_args
    from conftest import redis_cmds
    port, sha = script_srv
    lim = SHORT_CASES[name]
    t0 = 1764633600 * 10 ** 6
    got = {}
    for form in ("long", "short"):
        key, other = "%s:%s" % (form, name), "%s:%s:o" % (form, name)
        lim2 = list(lim)
        if lim[0] == 5:
            lim2[3] = 8             # another slot id
        # three requests of one key (the third over the limit), one with
        # marks on another key, a cost of 2: each in the form it can take
        reqs = [([key], [lim], False), ([key], [lim2], False), ([key], [lim], False),
                ([other], [lim], True), ([other], [lim[:4] + [2, lim[5]]], False)]
        replies = []
        for step, now in enumerate((t0, t0 + 300000)):
            args = batch_args(sha, reqs, mode="t", now_us=now)
            if form == "short":
                args = shorten(args, reqs)
                assert len(args) < len(batch_args(sha, reqs, mode="t", now_us=now))
            replies.append(redis_cmds(port, [args])[-1][2:])   # not Redis' own TIME
        ttls = [redis_cmd(port, "PTTL", k) for k in (key, other)]
        got[form] = (replies, [t is not None and t > 0 for t in ttls])
    assert got["short"] == got["long"], got


def test_one_argument_request_out_of_range_is_refused(script_srv):
    from batchlib import batch_args
    from conftest import RedisError, redis_cmds
    port, sha = script_srv
    reqs = [(["bad:1"], [SHORT_CASES["fixed"]], False)]
    args = shorten(batch_args(sha, reqs), reqs)
    body = len(args) - 1
    for bad in (17, 31, 32 + 16, -17):          # counts 17..31; a ref past the keys
        a = list(args)
        a[body] = bad
        with pytest.raises(RedisError):
            redis_cmds(port, [a])
    assert redis_cmd(port, "EXISTS", "bad:1") == 0
