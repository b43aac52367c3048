# sluice - tests/integration/test_run_demo.py: the `make run` demo on ports
# from the environment.
#
# tests/run-demo.sh starts a redis-server, the echo upstream and sluice with
# the config it is given. Its ports come from DEMO_PORT, DEMO_REDIS_PORT,
# DEMO_UPSTREAM_PORT and DEMO_ADMIN_PORT (defaults 8080, 6379, 9000, 9901),
# so the demo runs beside another Redis or another demo. Here every port is a
# free one; SIGTERM to the script must stop all it started.

import os
import signal
import subprocess

from conftest import ROOT, free_port, http_get, redis_cmd, redis_keys, sluice_bin, stop_process, wait_port

DEMO = os.path.join(ROOT, "tests", "run-demo.sh")
DEMO_START_S = 20.0


def start_demo(conf, tmp_path, **ports):
    env = dict(os.environ)
    env.update({k: str(v) for k, v in ports.items()})
    log = open(tmp_path / "demo.log", "w")
    proc = subprocess.Popen([DEMO, sluice_bin(), os.path.join(ROOT, "conf", conf)],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    log.close()
    return proc


def demo_log(tmp_path):
    return (tmp_path / "demo.log").read_text()


def stop_demo(proc):
    """SIGTERM the script by PID (it stops what it started); its process
    group only if it did not exit in time."""
    rc = stop_process(proc, timeout_s=15.0)
    if rc is None:
        os.killpg(proc.pid, signal.SIGKILL)
    return rc


def test_demo_takes_its_ports_from_the_environment(tmp_path):
    ports = {"DEMO_PORT": free_port(), "DEMO_REDIS_PORT": free_port(),
             "DEMO_UPSTREAM_PORT": free_port()}
    proc = start_demo("sluice.yaml", tmp_path, **ports)
    try:
        assert wait_port(ports["DEMO_PORT"], proc, DEMO_START_S), demo_log(tmp_path)
        assert redis_cmd(ports["DEMO_REDIS_PORT"], "PING") == "PONG"
        # conf/sluice.yaml's default route: token bucket, burst 5, 1/s.
        codes = [http_get(ports["DEMO_PORT"], "/").status for _ in range(15)]
        assert codes[:5] == [200] * 5
        assert 429 in codes[5:]
        assert any(k.startswith(b"sluice:") for k in redis_keys(ports["DEMO_REDIS_PORT"]))
        assert "http://127.0.0.1:%d/" % ports["DEMO_PORT"] in demo_log(tmp_path)
    finally:
        rc = stop_demo(proc)
    assert rc == 0, demo_log(tmp_path)
    for port in ports.values():
        assert not wait_port(port, timeout_s=0.5), "port %d still open after the demo stopped" % port


def test_memory_demo_takes_its_admin_port_from_the_environment(tmp_path):
    ports = {"DEMO_PORT": free_port(), "DEMO_UPSTREAM_PORT": free_port(),
             "DEMO_ADMIN_PORT": free_port()}
    proc = start_demo("standalone.yaml", tmp_path, **ports)
    try:
        assert wait_port(ports["DEMO_PORT"], proc, DEMO_START_S), demo_log(tmp_path)
        assert wait_port(ports["DEMO_ADMIN_PORT"], proc), demo_log(tmp_path)
        assert http_get(ports["DEMO_ADMIN_PORT"], "/healthz").status == 200
        assert http_get(ports["DEMO_PORT"], "/api").status == 200
    finally:
        rc = stop_demo(proc)
    assert rc == 0, demo_log(tmp_path)


def test_demo_refuses_a_port_that_is_not_one(tmp_path):
    proc = start_demo("sluice.yaml", tmp_path, DEMO_PORT="80x")
    try:
        rc = proc.wait(timeout=10)
    finally:
        stop_demo(proc)
    assert rc == 1
    assert "'80x' is not a port" in demo_log(tmp_path)
