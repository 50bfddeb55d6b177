"""A private fusemld for the benchmark: its own socket and a fresh database in a temp
directory, so the first compile of a row is cold (empty cache) by construction."""

import os
import shutil
import signal
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def find_fusemld(explicit=None):
    """The fusemld to start: explicit, else $FUSEMLD_BIN, else a build tree of this checkout
    (build-gpu first: the device build). None when there is none."""
    for cand in (explicit, os.environ.get("FUSEMLD_BIN")):
        if cand:
            return cand if os.path.exists(cand) else None
    for build in ("build-gpu", "build-table", "build", "build-test"):
        cand = os.path.join(ROOT, build, "daemon", "fusemld")
        if os.path.exists(cand):
            return cand
    return None


class Daemon:
    def __init__(self, exe, tag="row"):
        self.dir = tempfile.mkdtemp(prefix=f"fm-table-{tag}-")
        self.socket = os.path.join(self.dir, "fm.sock")
        self.db = os.path.join(self.dir, "kernels.db")
        self.log = os.path.join(self.dir, "fusemld.log")
        self.proc = subprocess.Popen(
            [
                exe,
                "--foreground",
                "--socket",
                self.socket,
                "--db",
                self.db,
                "--log-level",
                "info",
                "--log-file",
                self.log,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"fusemld did not start (log {self.log})")
            time.sleep(0.02)

    def stop(self, keep_log_to=None):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if keep_log_to and os.path.exists(self.log):
            shutil.copy(self.log, keep_log_to)
        shutil.rmtree(self.dir, ignore_errors=True)
