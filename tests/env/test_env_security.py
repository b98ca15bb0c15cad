"""Security suite: every attack from issue 3, each asserting its concrete outcome."""
import os
import socket
import threading
import time
import uuid

import pytest

from composer_rl.env.sandbox import SandboxUnavailable, BwrapSandbox
from envtest_helpers import cli, host_pids_with


# ---- network -------------------------------------------------------------------------------
def test_tcp_to_host_loopback_server_is_unreachable(sandbox, world):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    srv.settimeout(0.2)
    port = srv.getsockname()[1]
    accepted = []

    def serve():
        end = time.time() + 5
        while time.time() < end:
            try:
                c, _ = srv.accept()
                accepted.append(c)
            except OSError:
                pass
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    r = world.run(f"python -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2); print('CONNECTED')\"")
    t.join()
    srv.close()
    assert "CONNECTED" not in r.stdout
    assert "ConnectionRefusedError" in r.stderr  # the sandbox's own, empty loopback
    assert accepted == []


def test_dns_and_external_network_fail(world):
    r = world.run("python -c \"import socket; socket.getaddrinfo('pypi.org', 443)\"")
    assert r.exit_code != 0 and "gaierror" in r.stderr
    r = world.run("python -c \"import socket; socket.create_connection(('1.1.1.1', 53), 2)\"")
    assert r.exit_code != 0 and "Network is unreachable" in r.stderr
    r = world.run("cat /proc/net/dev | grep -v -E 'lo:|Inter|face' | wc -l")
    assert r.stdout.strip() == "0"  # no interface but loopback


# ---- writes outside the world -------------------------------------------------------------
@pytest.mark.parametrize("target", ["/etc/pwned", "/root/pwned", "/usr/pwned", "/pwned"])
def test_writes_outside_world_fail(world, target):
    r = world.run(f"echo x > {target}")
    assert r.exit_code != 0
    assert not os.path.exists(target)


def test_tmp_and_dev_shm_are_private(world):
    name = "composer_rl_probe_" + uuid.uuid4().hex
    r = world.run(f"echo x > /tmp/{name} && echo x > /dev/shm/{name} && ls /tmp /dev/shm")
    assert r.exit_code == 0 and name in r.stdout  # writable inside...
    assert not os.path.exists(f"/tmp/{name}") and not os.path.exists(f"/dev/shm/{name}")  # ...not on host


def test_tmp_is_size_capped(world):
    # Several files each under RLIMIT_FSIZE, together over the tmpfs size.
    r = world.run("for i in 1 2 3 4; do head -c 6000000 /dev/zero > /tmp/f$i; done; du -sm /tmp")
    assert "No space left on device" in r.stderr
    assert int(r.stdout.split()[0]) <= 16


# ---- reads of the host -------------------------------------------------------------------
def test_host_paths_are_absent(world):
    r = world.run("ls /work; ls /root 2>&1; ls /home 2>&1; ls /work/main 2>&1; cat /etc/shadow 2>&1")
    assert r.stdout.split("\n")[0] == "a.py"
    assert "No such file" in r.stdout
    assert "setup.py" not in r.stdout and "composer_rl" not in r.stdout
    assert "root:" not in r.stdout


def test_etc_is_synthetic(world):
    r = world.run("cat /etc/hostname; ls /etc")
    assert r.stdout.split() == ["sandbox", "group", "hostname", "hosts", "nsswitch.conf", "passwd"]


def test_host_env_vars_do_not_leak(world, monkeypatch):
    monkeypatch.setenv("COMPOSER_SECRET_TOKEN", "s3cr3t")
    r = world.run("env; cat /proc/1/environ | tr '\\0' '\\n'")
    assert "s3cr3t" not in r.stdout
    keys = {l.split("=", 1)[0] for l in r.stdout.splitlines() if "=" in l}
    assert keys <= {"PATH", "HOME", "LANG", "TMPDIR", "USER", "PYTHONPATH", "PWD", "SHLVL", "_"}


def test_hidden_tests_absent_during_episode():
    from composer_rl.env import get_task, make_env
    from composer_rl.env.tool_call_format import format_tool_call
    task = get_task("generated", "train", 3)
    (hidden_path, hidden_text), = task.hidden_tests.items()
    needle = [l for l in hidden_text.splitlines() if "assert" in l][0].strip()
    env = make_env(task)
    env.reset()
    try:
        cmd = ("find / -path /proc -prune -o -path /sys -prune -o -name '*hidden*' -print "
               "2>/dev/null; grep -rslF %r /work /tmp /opt /etc /dev/shm 2>/dev/null; "
               "echo done" % needle)
        r = env.step(format_tool_call("run", {"cmd": cmd}))
        assert r.observation.splitlines() == ["done", "[exit code 0]"], r.observation
        r = env.step(format_tool_call("read_file", {"path": hidden_path}))
        assert "no such file" in r.observation
    finally:
        env.close()


# ---- resource abuse -------------------------------------------------------------------------
def test_fork_bomb_is_bounded(sandbox, world):
    t0 = time.time()
    r = world.run("python -c \"\nimport os,time\nn=0\ntry:\n    while True:\n        if os.fork()==0:\n"
                  "            time.sleep(30); os._exit(0)\n        n+=1\nexcept OSError as e:\n"
                  "    print('LIMIT', n, e.errno)\n\"", timeout_s=8)
    assert "LIMIT" in r.stdout
    n = int(r.stdout.split()[1])
    assert n < sandbox.limits.max_processes
    assert time.time() - t0 < 8
    # Classic shell bomb: NPROC stops its growth, and the pid namespace dies with the command.
    r2 = world.run("bomb(){ bomb | bomb & }; bomb; sleep 1; echo survived", timeout_s=3)
    assert r2.duration_s < 4
    assert _live_processes_of(world.uid) == []  # nothing of the bomb is left running


def _live_processes_of(uid):
    """Non-zombie host processes of a uid (an exited bwrap may linger as a zombie until the
    container's init reaps it; a zombie holds no resources and runs nothing)."""
    live = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and os.stat(f"/proc/{pid}").st_uid == uid:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                        live.append(pid)
        except OSError:
            pass
    return live


def test_memory_hog_fails(world):
    r = world.run("python -c \"x = bytearray(3 * 1024**3); print('ALLOCATED')\"")
    assert "ALLOCATED" not in r.stdout and "MemoryError" in r.stderr


def test_cpu_loop_is_killed(world):
    t0 = time.time()
    r = world.run("python -c 'while True: pass'", timeout_s=9)
    assert r.killed_reason == "cpu_limit" and not r.timed_out
    assert time.time() - t0 < 8


def test_hang_is_killed_at_wall_timeout(world):
    t0 = time.time()
    r = world.run("sleep 100", timeout_s=1)
    assert r.timed_out and r.exit_code == 124 and time.time() - t0 < 4


def test_huge_file_is_capped(sandbox, world):
    r = world.run("head -c 50000000 /dev/zero > big.bin")
    assert r.killed_reason == "file_size_limit" or "File too large" in r.stderr
    assert os.path.getsize(os.path.join(world.root, "big.bin")) <= sandbox.limits.file_size_bytes


def test_huge_output_is_truncated_with_marker(sandbox, world):
    r = world.run("yes abcdefgh | head -c 5000000; echo; echo THE-END")
    assert "output truncated" in r.stdout and r.stdout.rstrip().endswith("THE-END")
    assert len(r.stdout) < sandbox.limits.output_limit_bytes + 200
    assert r.stdout_bytes > 4_000_000


def test_setsid_survivor_is_reaped(world):
    marker = str(900000 + os.getpid() % 99999)
    r = world.run(f"setsid sh -c 'sleep {marker}' > /dev/null 2>&1 & echo started")
    assert r.exit_code == 0 and "started" in r.stdout
    time.sleep(0.3)
    assert host_pids_with(f"sleep\x00{marker}") == [] and host_pids_with(f"sleep {marker}") == []


# ---- capabilities ------------------------------------------------------------------------
def test_no_capabilities(world):
    r = world.run("grep -E 'Cap(Eff|Prm|Bnd)' /proc/self/status; id -u")
    assert r.stdout.count("0000000000000000") == 3 and r.stdout.split()[-1] == "1000"


def test_remount_mount_chroot_fail(world):
    r = world.run("mount -o remount,rw / 2>&1; echo rc=$?; mount -t tmpfs none /tmp 2>&1; echo rc=$?;"
                  " python -c \"import os; os.chroot('/tmp')\" 2>&1 | tail -1;"
                  " unshare -r true 2>&1; echo rc=$?")
    out = r.stdout
    assert out.count("rc=0") == 0
    assert "PermissionError" in out
    r = world.run("touch /usr/pwned 2>&1; touch /etc/pwned 2>&1")
    assert "Read-only file system" in r.stdout
    assert not os.path.exists("/usr/pwned") and not os.path.exists("/etc/pwned")


# ---- harness-side escapes ---------------------------------------------------------------
def test_symlink_out_of_world_is_refused_by_tools(world):
    from composer_rl.env.world import PathError
    world.run("ln -s /etc/passwd leak; ln -s / rootlink")
    with pytest.raises(PathError):
        world.read_text("leak")
    with pytest.raises(PathError):
        world.write_text("rootlink/etc/x", "x")
    with pytest.raises(PathError):
        world.read_text("/work/../etc/passwd")


def test_missing_bwrap_is_a_clear_error(monkeypatch):
    import composer_rl.env.sandbox as sb
    monkeypatch.setattr(sb.shutil, "which", lambda name, path=None: None)
    with pytest.raises(SandboxUnavailable, match="bwrap"):
        BwrapSandbox()


def test_non_utf8_output_is_replaced(world):
    r = world.run("printf 'ok \\377\\376 end'")
    assert r.stdout == "ok \ufffd\ufffd end"


# ---- the CLI ---------------------------------------------------------------------------
def test_cli_json_shows_sandbox_view():
    d = cli("cat /etc/hostname; id -u")
    assert set(d) == {"exit_code", "stdout", "stderr", "timed_out", "killed_reason"}
    assert d == {"exit_code": 0, "stdout": "sandbox\n1000\n", "stderr": "", "timed_out": False,
                 "killed_reason": None}


def test_cli_exit_status_and_timeout():
    import subprocess, sys
    from envtest_helpers import REPO
    p = subprocess.run([sys.executable, "launch/sandbox_exec.py", "--", "echo hi; exit 7"],
                       capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 7 and p.stdout == "hi\n"
    d = cli("sleep 30", "--timeout=1")
    assert d["timed_out"] is True and d["killed_reason"] == "wall_timeout"
