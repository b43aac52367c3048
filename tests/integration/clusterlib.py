# sluice - tests/integration/clusterlib.py: Redis Cluster and Sentinel processes for tests.
#
# A real cluster (redis-server --cluster-enabled, formed by `redis-cli
# --cluster create`) and a real sentinel set (a master, a replica, three
# sentinels), started on free loopback ports in a temporary directory. Every
# process is ended by its PID in stop(); every wait is bounded in time.

import os
import random
import signal
import socket
import subprocess
import threading
import time

from conftest import RedisError, free_port, redis_cmd, stop_process, http_get, wait_until

START_TIMEOUT_S = 20.0


def cluster_port():
    """A free port whose cluster bus port (+10000) is free as well: the
    kernel's ephemeral ports are too high for that."""
    for _ in range(1000):
        port = random.randint(20000, 45000)
        socks = []
        try:
            for p in (port, port + 10000):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port pair")


def _spawn(args, workdir):
    return subprocess.Popen(args, cwd=str(workdir), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def _ping(port):
    try:
        return redis_cmd(port, "PING", timeout_s=0.5) == "PONG"
    except (OSError, ConnectionError, RedisError):
        return False


class Cluster:
    """masters x (1 + replicas) cluster-enabled redis-servers."""

    def __init__(self, workdir, masters=3, replicas=1, node_timeout_ms=2000):
        self.workdir = workdir
        self.nmasters = masters
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.ports = []
        while len(self.ports) < masters * (1 + replicas):
            p = cluster_port()
            if p not in self.ports:
                self.ports.append(p)
        self.procs = {}

    def start(self):
        try:
            for p in self.ports:
                self.procs[p] = _spawn(
                    ["redis-server", "--port", str(p), "--bind", "127.0.0.1",
                     "--cluster-enabled", "yes", "--cluster-config-file", "nodes-%d.conf" % p,
                     "--cluster-node-timeout", str(self.node_timeout_ms),
                     "--save", "", "--appendonly", "no", "--loglevel", "notice",
                     "--repl-diskless-sync-delay", "0",
                     "--logfile", "redis-%d.log" % p,
                     "--dir", str(self.workdir)], self.workdir)
            for p in self.ports:
                wait_until(lambda p=p: _ping(p), 5.0, step_s=0.05, what="redis-server on %d" % p)
            create = subprocess.run(
                ["redis-cli", "--cluster", "create"] +
                ["127.0.0.1:%d" % p for p in self.ports] +
                ["--cluster-replicas", str(self.replicas), "--cluster-yes"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
            if create.returncode != 0:
                raise RuntimeError("cluster create failed:\n" + create.stdout.decode())
            wait_until(self.healthy, START_TIMEOUT_S, step_s=0.05, what="the cluster to be ok")
        except Exception:
            self.stop()
            raise
        return self

    def alive(self):
        return [p for p, proc in self.procs.items() if proc.poll() is None]

    def info(self, port):
        text = redis_cmd(port, "CLUSTER", "INFO", timeout_s=1.0).decode()
        return dict(l.split(":", 1) for l in text.split("\r\n") if ":" in l)

    def healthy(self):
        """Every live node says ok, and every slot is on a live master whose
        replicas (if any are expected) are attached."""
        try:
            for p in self.alive():
                if self.info(p).get("cluster_state") != "ok":
                    return False
            owners = self.slot_owners()
        except (OSError, ConnectionError, RedisError):
            return False
        if len(owners) != 16384 or not all(o in self.alive() for o in owners.values()):
            return False
        return all(self.replica_synced(n[1]) for n in self.nodes()
                   if "slave" in n[2] and n[1] in self.alive())

    def replica_synced(self, port):
        """A replica that never finished its first sync cannot fail over."""
        try:
            text = redis_cmd(port, "INFO", "replication", timeout_s=1.0).decode()
        except (OSError, ConnectionError, RedisError):
            return False
        return "master_link_status:up" in text

    def nodes(self, port=None):
        """[(id, port, flags, master_id, slots ranges)] from CLUSTER NODES."""
        port = port or self.alive()[0]
        text = redis_cmd(port, "CLUSTER", "NODES", timeout_s=1.0).decode()
        out = []
        for line in text.strip().splitlines():
            f = line.split()
            addr = f[1].split("@")[0]
            out.append((f[0], int(addr.rsplit(":", 1)[1]), f[2].split(","), f[3], f[8:]))
        return out

    def masters(self):
        return [n[1] for n in self.nodes() if "master" in n[2] and "fail" not in n[2]
                and n[4]]

    def node_id(self, port):
        return redis_cmd(port, "CLUSTER", "MYID").decode()

    def slot_owners(self, port=None):
        """{slot: master port} from CLUSTER SLOTS."""
        port = port or self.alive()[0]
        out = {}
        for entry in redis_cmd(port, "CLUSTER", "SLOTS", timeout_s=1.0):
            for s in range(entry[0], entry[1] + 1):
                out[s] = entry[2][1]
        return out

    def owner(self, slot, port=None):
        return self.slot_owners(port).get(slot)

    def keyslot(self, key):
        return redis_cmd(self.alive()[0], "CLUSTER", "KEYSLOT", key)

    def keys(self, pattern="*"):
        """Every key on every live master (bounded SCAN)."""
        out = []
        for p in self.masters():
            cursor = b"0"
            for _ in range(1000):
                cursor, batch = redis_cmd(p, "SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
                out += batch
                if cursor == b"0":
                    break
        return out

    def cmd_for_key(self, key, *args):
        """Run a command on the master that holds key (ASKING first, so an
        importing node answers too)."""
        slot = self.keyslot(key)
        from conftest import redis_cmds
        last = None
        for p in [self.owner(slot)] + self.masters():
            try:
                return redis_cmds(p, [("ASKING",), args])[-1]
            except RedisError as e:
                last = e
        raise last

    def migrate_slot(self, slot, src, dst, between=None):
        """Move slot from master src to master dst as redis-cli does:
        IMPORTING/MIGRATING, MIGRATE every key, then SETSLOT NODE everywhere.
        between() is called after the keys moved and before SETSLOT NODE:
        the time when the source answers ASK."""
        src_id, dst_id = self.node_id(src), self.node_id(dst)
        redis_cmd(dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        redis_cmd(src, "CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        for _ in range(1000):
            keys = redis_cmd(src, "CLUSTER", "GETKEYSINSLOT", slot, 100)
            if not keys:
                break
            redis_cmd(src, "MIGRATE", "127.0.0.1", dst, "", 0, 5000, "KEYS", *keys)
        if between is not None:
            between()
        redis_cmd(dst, "CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        redis_cmd(src, "CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        for p in self.masters():
            if p not in (src, dst):
                redis_cmd(p, "CLUSTER", "SETSLOT", slot, "NODE", dst_id)

    def kill(self, port):
        proc = self.procs.get(port)
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)

    def stop(self):
        for proc in self.procs.values():
            stop_process(proc, sig=signal.SIGKILL)


class SentinelSet:
    """One master, one replica, three sentinels watching `name`."""

    def __init__(self, workdir, name="mymaster", down_after_ms=1000, password=None):
        self.workdir = workdir
        self.password = password
        self.name = name
        self.down_after_ms = down_after_ms
        self.master_port = free_port()
        self.replica_port = free_port()
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.procs = {}

    def _redis(self, port, extra):
        self.procs[port] = _spawn(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--loglevel", "warning", "--dir", str(self.workdir)] + extra,
            self.workdir)

    def start(self):
        try:
            self._redis(self.master_port, [])
            wait_until(lambda: _ping(self.master_port), 5.0, step_s=0.05, what="the master")
            self._redis(self.replica_port, ["--replicaof", "127.0.0.1", str(self.master_port)])
            wait_until(lambda: _ping(self.replica_port), 5.0, step_s=0.05, what="the replica")
            wait_until(self._replica_synced, 10.0, step_s=0.05, what="the replica to sync")
            for p in self.sentinel_ports:
                conf = self.workdir / ("sentinel-%d.conf" % p)
                conf.write_text(
                    "port %d\nbind 127.0.0.1\ndir %s\n"
                    "sentinel monitor %s 127.0.0.1 %d 2\n"
                    "sentinel down-after-milliseconds %s %d\n"
                    "sentinel failover-timeout %s 10000\n"
                    "sentinel parallel-syncs %s 1\n"
                    % (p, self.workdir, self.name, self.master_port, self.name,
                       self.down_after_ms, self.name, self.name) +
                    ("requirepass %s\nsentinel sentinel-pass %s\n" % (self.password, self.password)
                     if self.password else ""))
                self.procs[p] = _spawn(["redis-server", str(conf), "--sentinel"], self.workdir)
            for p in self.sentinel_ports:
                wait_until(lambda p=p: self._sentinel_cmd(p, "PING") == "PONG", 5.0,
                           step_s=0.05, what="sentinel on %d" % p)
            # A sentinel learns the replicas from the master's INFO, which it
            # polls every 10 s: 15 s left one poll of slack, and a slow
            # replication start (seen once in test-slow) missed it.
            wait_until(self._sentinels_see_replica, 35.0, step_s=0.05,
                       what="the sentinels to know the replica")
        except Exception:
            self.stop()
            raise
        return self

    def _replica_synced(self):
        try:
            text = redis_cmd(self.replica_port, "INFO", "replication").decode()
        except (OSError, ConnectionError, RedisError):
            return False
        return "master_link_status:up" in text

    def _sentinel_cmd(self, port, *args):
        from conftest import redis_cmds
        try:
            auth = [("AUTH", self.password)] if self.password else []
            return redis_cmds(port, auth + [args], timeout_s=1.0)[-1]
        except (OSError, ConnectionError, RedisError):
            return None

    def _sentinels_see_replica(self):
        return all(self._sentinel_cmd(p, "SENTINEL", "replicas", self.name)
                   for p in self.sentinel_ports)

    def master(self, sentinel_port=None):
        r = self._sentinel_cmd(sentinel_port or self.sentinel_ports[0],
                               "SENTINEL", "get-master-addr-by-name", self.name)
        return int(r[1]) if r else None

    def kill(self, port):
        proc = self.procs.get(port)
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)

    def stop(self):
        for proc in self.procs.values():
            stop_process(proc, sig=signal.SIGKILL)


class Load:
    """Bounded load: `threads` clients send GET path in a loop (at most
    `max_requests` in all, for at most `max_s`) to the given sluice ports,
    round robin, and record each outcome with its time."""

    def __init__(self, ports, path, headers, threads=4, max_requests=2000, max_s=30.0,
                 pause_s=0.005):
        self.ports = ports
        self.path = path
        self.headers = headers
        self.nthreads = threads
        self.max_requests = max_requests
        self.max_s = max_s
        self.pause_s = pause_s
        self.results = []          # (monotonic time, status or error text, has rate headers)
        self.lock = threading.Lock()
        self.stop_flag = threading.Event()
        self.threads = []

    def _run(self, i):
        deadline = time.monotonic() + self.max_s
        n = i
        while not self.stop_flag.is_set() and time.monotonic() < deadline:
            with self.lock:
                if len(self.results) >= self.max_requests:
                    return
            port = self.ports[n % len(self.ports)]
            n += 1
            try:
                r = http_get(port, self.path, headers=self.headers, timeout_s=5.0)
                out = (time.monotonic(), r.status, r.header("X-RateLimit-Limit") is not None)
            except Exception as e:      # recorded: the test counts failures
                out = (time.monotonic(), "error: %r" % (e,), False)
            with self.lock:
                self.results.append(out)
            time.sleep(self.pause_s)

    def start(self):
        for i in range(self.nthreads):
            t = threading.Thread(target=self._run, args=(i,), daemon=True)
            t.start()
            self.threads.append(t)
        return self

    def stop(self):
        self.stop_flag.set()
        for t in self.threads:
            t.join(timeout=10)
        return list(self.results)


def redirect_counts(stderr_text):
    """The latest (ask, moved) totals from sluice's redirect log lines."""
    ask = moved = 0
    for line in stderr_text.splitlines():
        if "cluster redirect" in line and "redirects so far" in line:
            tail = line.rsplit("redirects so far:", 1)[1]
            parts = dict(p.strip().split(" ") for p in tail.strip(" )").split(","))
            ask = max(ask, int(parts["ask"]))
            moved = max(moved, int(parts["moved"]))
    return ask, moved
