"""Starting a per-user fusemld when none answers (as sccache does): which daemon, how it is
started, and the one line that says where it runs and logs.

Which daemon: FUSEML_DAEMON, else the one built in the checkout this package runs from (an
editable install or PYTHONPATH: build/daemon/fusemld, then any other build*/daemon/fusemld,
newest first), else fusemld on PATH. The daemon that belongs to this client comes first: after
scripts/quickstart nothing is on PATH, and an older fusemld installed elsewhere may not speak
this client's protocol.

An autostarted daemon exits once it has had no client and no compile for FUSEML_IDLE_EXIT
seconds (default 600; its --exit-when-idle), so a job that started one leaves nothing
running for long; its kernels stay in the store for the next start."""

import glob
import os
import shutil
import socket as socketlib
import struct
import subprocess
import tempfile

from . import settings
from ._log import warn_once

START_TIMEOUT_S = 15


class StartError(Exception):
    """The daemon could not be started; .code is the protocol slug transport reports."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def _checkout_root():
    """The source tree this package was imported from, or None (an installed copy)."""
    here = os.path.dirname(os.path.abspath(__file__))  # <root>/client/python/fuseml
    root = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    if os.path.exists(os.path.join(root, "daemon", "main.c")):
        return root
    return None


def _runnable(path):
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _built_daemons(root):
    """The checkout's build directories' daemons: build/ (scripts/build's) first, then the
    others, the most recently built first."""
    first = os.path.join(root, "build", "daemon", "fusemld")
    others = [p for p in glob.glob(os.path.join(root, "build*", "daemon", "fusemld")) if p != first]
    others.sort(key=lambda p: os.path.getmtime(p) if os.path.exists(p) else 0, reverse=True)
    return [p for p in [first] + others if _runnable(p)]


def daemon_binary():
    """The fusemld to start (see the module's docstring), or None."""
    exe = settings.daemon()
    if exe:
        return exe
    root = _checkout_root()
    built = _built_daemons(root) if root else []
    if built:
        return built[0]
    return shutil.which("fusemld")


def _peer_pid(sock):
    """The pid of the process at the other end of a connected Unix socket (SO_PEERCRED), or
    None."""
    try:
        creds = sock.getsockopt(socketlib.SOL_SOCKET, socketlib.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    return struct.unpack("3i", creds)[0] or None


def _log_of(pid):
    """Where a detached fusemld logs: its stderr, which it points at its log file."""
    try:
        target = os.readlink(f"/proc/{pid}/fd/2")
    except OSError:
        return None
    return target if target.startswith("/") and target != "/dev/null" else None


def _run(argv):
    """Runs fusemld until it has detached; (exit status, the end of its stderr)."""
    # fusemld daemonizes itself; the process we start exits once the daemon is listening or
    # has failed, so waiting on it is short.
    # A file, not a pipe: the detached daemon may keep our stderr open for its whole life.
    with tempfile.TemporaryFile() as errf:
        p = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errf, start_new_session=True
        )
        try:
            p.wait(timeout=START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            raise StartError("timeout", f"{argv[0]} did not start in {START_TIMEOUT_S} s") from None
        errf.seek(0)
        return p.returncode, errf.read(65536).decode(errors="replace").strip()


def start(path):
    """Starts the daemon on socket path (it detaches once listening). Raises StartError."""
    exe = daemon_binary()
    if not exe:
        raise StartError(
            "connection_closed",
            "no daemon at " + path + ", none built in this " "checkout and no fusemld on PATH (set FUSEML_DAEMON)",
        )
    idle = settings.idle_exit_s()
    argv = [exe, "--socket", path]
    rc, err = _run(argv + (["--exit-when-idle", str(idle)] if idle else []))
    if rc == 2 and idle and "exit-when-idle" in err.split("\n", 1)[0]:
        # a daemon older than the option: started as before, it runs until stopped
        idle = 0
        rc, err = _run(argv)
    if rc != 0:
        raise StartError("connection_closed", f"{exe} exited with {rc}: {err[-300:]}")
    return exe, idle


def say_started(exe, path, idle, sock):
    """The one line (a warning: a process that outlives this one deserves to be seen) that
    says which daemon now serves path (sock: a connection to it), where it logs and when it
    goes away."""
    pid = _peer_pid(sock)
    where = _log_of(pid) if pid else None
    warn_once(
        "autostart",
        "started %s (pid %s) on %s; it logs to %s%s",
        exe,
        pid or "?",
        path,
        where or "its --log-file (fusemld --help)",
        f" and exits after {idle} s without clients" if idle else "",
        suffix="",
    )
