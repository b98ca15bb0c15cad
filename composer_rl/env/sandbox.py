"""Run shell commands in a bubblewrap sandbox; backends are chosen by name from `SANDBOXES`.

Design (each layer closes a hole measured on a root-run host, see BUILD_NOTES_env.md):
  * The host side drops root first: `setpriv` switches to a per-sandbox unprivileged host uid
    (so RLIMIT_NPROC is enforced -- it is ignored for uid 0 -- and nothing the sandbox does
    carries root's rights), then `prlimit` sets CPU / address-space / file-size / process /
    open-file limits, then `bwrap` builds the namespaces.
  * bwrap: `--unshare-all` (user, pid, net, ipc, uts, cgroup namespaces; no network at all,
    only a private loopback), `--disable-userns` (no nested namespaces), `--cap-drop ALL`,
    `--die-with-parent`, `--new-session` (no TIOCSTI into our tty), `--clearenv`, sandbox
    uid/gid 1000.
  * Filesystem: read-only `/usr` (+ the /bin /lib /lib64 /sbin links), a synthetic read-only
    `/etc`, a read-only pytest site dir at /opt/pysite, private size-capped tmpfs `/tmp` and
    `/dev/shm`, and exactly one writable host path: the world's work dir at /work. The root
    is remounted read-only. Nothing else of the host (/work, /root, /home, host /tmp) exists.
  * Lifetime: output goes to files (never pipes a leftover child could hold open), a wall-clock
    timeout SIGKILLs the process group; killing bwrap kills the pid namespace's init, and the
    kernel then kills every process left in it (this is what reaps a `setsid` survivor).
  * Where a cgroup hierarchy is writable, a per-sandbox pids+memory cgroup is a second layer.
A missing `bwrap` (or `setpriv`/`prlimit`) raises `SandboxUnavailable`: there is never an
unsandboxed fallback.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

from composer_rl.env import rootfs
from composer_rl.env.cgroup import Cgroup
from composer_rl.env.registry import Registry

SANDBOXES: Registry = Registry("sandbox backend")

WORK_MOUNT = "/work"  # where the world's files appear inside the sandbox
TRUNCATION_MARKER = "\n[... output truncated: {dropped} of {total} bytes omitted ...]\n"


class SandboxUnavailable(RuntimeError):
    """Raised when the sandbox cannot be built; callers must not fall back to running bare."""


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Resource bounds for one sandboxed command.

    wall_timeout_s: wall-clock seconds before the whole sandbox is SIGKILLed (hangs, sleeps).
    cpu_seconds: RLIMIT_CPU per process; SIGXCPU/SIGKILL on a busy loop.
    address_space_bytes: RLIMIT_AS per process; a memory hog gets MemoryError/ENOMEM.
    memory_bytes: cgroup memory limit for the whole sandbox, where a cgroup is writable.
    file_size_bytes: RLIMIT_FSIZE; caps every file written, including captured stdout/stderr.
    max_processes: RLIMIT_NPROC on the sandbox's own host uid (and pids.max); stops fork bombs.
    max_open_files: RLIMIT_NOFILE.
    tmp_size_bytes: size of the private tmpfs /tmp and /dev/shm.
    output_limit_bytes: bytes of each of stdout/stderr returned; the middle is cut with a
      visible marker (head and tail are kept, since test summaries are at the end).
    """

    wall_timeout_s: float = 20.0
    cpu_seconds: int = 20
    address_space_bytes: int = 2 << 30
    memory_bytes: int = 2 << 30
    file_size_bytes: int = 32 << 20
    max_processes: int = 64
    max_open_files: int = 256
    tmp_size_bytes: int = 64 << 20
    output_limit_bytes: int = 16 << 10


@dataclasses.dataclass
class SandboxResult:
    """What a sandboxed command did. `killed_reason` is None for a normal exit."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    killed_reason: Optional[str]
    duration_s: float = 0.0
    stdout_bytes: int = 0
    stderr_bytes: int = 0

    def to_json_dict(self) -> dict:
        return {"exit_code": self.exit_code, "stdout": self.stdout, "stderr": self.stderr,
                "timed_out": self.timed_out, "killed_reason": self.killed_reason}

    def to_json(self) -> str:
        return json.dumps(self.to_json_dict())


@dataclasses.dataclass(frozen=True)
class Mount:
    host: str
    dest: str
    writable: bool = False


# Host uids handed to sandboxes. Each world/grading run gets its own uid so RLIMIT_NPROC is
# per sandbox; the base is far above normal users. Reuse after wrap-around only shares a
# process budget between two sandboxes, it never shares files (each world is chowned anew).
HOST_UID_BASE = 200_000
HOST_UID_SPAN = 50_000
_uid_counter = itertools.count()
_uid_lock = threading.Lock()


def allocate_host_uid() -> int:
    with _uid_lock:
        n = next(_uid_counter)
    return HOST_UID_BASE + ((os.getpid() % 500) * 100 + n) % HOST_UID_SPAN


def _which(name: str) -> str:
    path = shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")
    if not path:
        raise SandboxUnavailable(
            f"`{name}` not found: install it (apt-get install -y bubblewrap util-linux). "
            "Commands are never run outside the sandbox.")
    return path


_SIGNAL_REASONS = {signal.SIGXCPU: "cpu_limit", signal.SIGXFSZ: "file_size_limit",
                   signal.SIGKILL: "killed", signal.SIGSEGV: "segfault"}


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def read_capped(path: str, limit: int) -> Tuple[str, int]:
    """Read a captured output file: head+tail within `limit` bytes, undecodable bytes replaced."""
    total = os.path.getsize(path)
    with open(path, "rb") as f:
        if total <= limit:
            data = f.read()
            return data.decode("utf-8", errors="replace"), total
        head = f.read(limit // 2)
        f.seek(total - (limit - limit // 2))
        tail = f.read()
    text = (head.decode("utf-8", errors="replace")
            + TRUNCATION_MARKER.format(dropped=total - limit, total=total)
            + tail.decode("utf-8", errors="replace"))
    return text, total


@SANDBOXES.register("bwrap")
class BwrapSandbox:
    """bubblewrap backend. Stateless apart from its limits; safe to share across threads."""

    def __init__(self, limits: SandboxLimits = SandboxLimits(), use_cgroup: bool = True):
        self.limits = limits
        self.use_cgroup = use_cgroup
        self.bwrap = _which("bwrap")
        self.setpriv = _which("setpriv")
        self.prlimit = _which("prlimit")
        self.python = rootfs.check_interpreter()
        self.etc = rootfs.etc_dir()
        self.pysite = rootfs.pysite_dir()

    def argv(self, command: Sequence[str], host_uid: int, work_dir: Optional[str],
             read_only_work: bool = False, mounts: Sequence[Mount] = (),
             env: Optional[Dict[str, str]] = None, cwd: str = WORK_MOUNT) -> List[str]:
        L = self.limits
        cmd = [self.setpriv, f"--reuid={host_uid}", f"--regid={host_uid}", "--clear-groups",
               "--", self.prlimit, f"--cpu={L.cpu_seconds}:{L.cpu_seconds + 1}", f"--as={L.address_space_bytes}",
               f"--fsize={L.file_size_bytes}", f"--nproc={L.max_processes}",
               f"--nofile={L.max_open_files}", "--core=0", "--", self.bwrap,
               "--unshare-all", "--unshare-user", "--disable-userns", "--cap-drop", "ALL",
               "--die-with-parent", "--new-session", "--clearenv",
               "--uid", str(rootfs.SANDBOX_UID), "--gid", str(rootfs.SANDBOX_UID),
               "--hostname", "sandbox", "--ro-bind", "/usr", "/usr"]
        for top in ("bin", "lib", "lib64", "sbin"):
            p = "/" + top
            if os.path.islink(p):
                cmd += ["--symlink", os.readlink(p), p]
            elif os.path.isdir(p):
                cmd += ["--ro-bind", p, p]
        cmd += ["--ro-bind", self.etc, rootfs.ETC_MOUNT, "--ro-bind", self.pysite,
                rootfs.PYSITE_MOUNT, "--symlink", self.python, "/opt/bin/python",
                "--proc", "/proc", "--dev", "/dev",
                "--size", str(L.tmp_size_bytes), "--tmpfs", "/tmp",
                "--size", str(L.tmp_size_bytes), "--tmpfs", "/dev/shm"]
        if work_dir is not None:
            cmd += ["--ro-bind" if read_only_work else "--bind", work_dir, WORK_MOUNT]
        for m in mounts:
            cmd += ["--bind" if m.writable else "--ro-bind", m.host, m.dest]
        base_env = {"PATH": "/opt/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8",
                    "TMPDIR": "/tmp", "USER": "agent"}
        base_env.update(env or {})
        for k, v in base_env.items():
            cmd += ["--setenv", k, v]
        cmd += ["--remount-ro", "/", "--chdir", cwd, "--"] + list(command)
        return cmd

    def run(self, command, work_dir: Optional[str] = None, *, host_uid: Optional[int] = None,
            read_only_work: bool = False, mounts: Sequence[Mount] = (),
            env: Optional[Dict[str, str]] = None, cwd: str = WORK_MOUNT,
            timeout_s: Optional[float] = None) -> SandboxResult:
        """Run `command` (a shell string, or an argv list) and return a SandboxResult."""
        if isinstance(command, str):
            command = ["/bin/sh", "-c", command]
        host_uid = allocate_host_uid() if host_uid is None else host_uid
        timeout_s = self.limits.wall_timeout_s if timeout_s is None else timeout_s
        argv = self.argv(command, host_uid, work_dir, read_only_work, mounts, env, cwd)
        cg = (Cgroup.create(self.limits.max_processes, self.limits.memory_bytes)
              if self.use_cgroup else None)
        if cg is not None:
            argv = cg.wrap(argv)
        outdir = tempfile.mkdtemp(prefix="composer_rl_out_")
        out_path, err_path = os.path.join(outdir, "stdout"), os.path.join(outdir, "stderr")
        timed_out = False
        t0 = time.monotonic()
        try:
            with open(out_path, "wb") as fo, open(err_path, "wb") as fe:
                try:
                    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fo, stderr=fe,
                                            start_new_session=True, close_fds=True,
                                            env={"PATH": "/usr/bin:/bin"})
                except OSError as e:
                    raise SandboxUnavailable(f"cannot start bwrap: {e}") from e
                # A timer kills the group at the deadline while we block in waitid (no
                # polling: Popen.wait(timeout) sleeps in steps and added ~40 ms per command).
                # WNOWAIT leaves the child unreaped until `finished` is set, so the timer can
                # never signal a recycled process group.
                lock, state = threading.Lock(), {"finished": False, "fired": False}

                def on_deadline():
                    with lock:
                        if not state["finished"]:
                            state["fired"] = True
                            _killpg(proc.pid)

                timer = threading.Timer(timeout_s, on_deadline)
                timer.daemon = True
                timer.start()
                try:
                    while True:
                        try:
                            os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
                            break
                        except ChildProcessError:
                            break
                        except InterruptedError:
                            continue
                finally:
                    with lock:
                        state["finished"] = True
                    timer.cancel()
                    _killpg(proc.pid)  # leftovers in our group (bwrap dies -> namespace dies)
                    rc = proc.wait()
                timed_out = state["fired"]
            oom = cg.oom_killed() if cg is not None else False
            if cg is not None:
                cg.destroy()
            duration = time.monotonic() - t0
            stdout, nout = read_capped(out_path, self.limits.output_limit_bytes)
            stderr, nerr = read_capped(err_path, self.limits.output_limit_bytes)
        finally:
            shutil.rmtree(outdir, ignore_errors=True)
        exit_code = rc if rc >= 0 else 128 - rc
        reason = None
        if timed_out:
            reason, exit_code = "wall_timeout", 124
        elif rc < 0 or rc > 128:
            sig = -rc if rc < 0 else rc - 128
            reason = _SIGNAL_REASONS.get(sig, f"signal_{sig}") if sig < 65 else None
            if oom and reason == "killed":
                reason = "memory_limit"
        if reason is None and rc == 1 and "bwrap:" in stderr and nout == 0:
            reason = "sandbox_setup_failed"
        return SandboxResult(exit_code, stdout, stderr, timed_out, reason,
                             duration, nout, nerr)


def make_sandbox(name: str = "bwrap", **kwargs):
    """Build a sandbox backend by registry name."""
    return SANDBOXES.get(name)(**kwargs)
