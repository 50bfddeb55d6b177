"""Measured routing remembered across processes: what the first call of a group decided (its
kernel against its ATen ops, timed on the GPU), kept in a small SQLite file so that the next
process compiling the same graph on the same kind of GPU takes the decision without timing
again. On a filled kernel cache the timing was the largest part of a warm compile that fuseml
itself spends (188 groups of a T5 training step: 1.15 s of 8.5 s on an H200).

A decision is keyed by everything that made it: the kernel's bytes (a tuned kernel replacing a
verified one is a new decision), the group's ATen program and the inputs' shapes, dtypes and
strides, the GPU's name and compute capability, and torch's version (its ATen kernels are the
other side of the comparison). Either route computes the group's values correctly, so a stale
or edited entry can cost time and never a wrong result; an entry that does not read as one of
the two routes is ignored.

The file is per user ($XDG_CACHE_HOME/fuseml/routes.db, FUSEML_ROUTE_CACHE to move it or
"off"); concurrent processes share it through SQLite's locking. Anything wrong with it (a
read-only directory, a damaged file) turns remembering off for the process, with one debug
line: the routing is then measured as before."""

import hashlib
import os
import sqlite3
import threading
import time
import types

import torch

from . import settings
from ._log import log

ROUTES = ("kernel", "aten")
# Rows kept: past MAX_ROWS the oldest are dropped down to half of it when the file is opened.
MAX_ROWS = 200_000
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS routes (sig TEXT PRIMARY KEY, route TEXT NOT NULL, "
    "kernel_ms REAL, aten_ms REAL, at REAL NOT NULL)"
)

_lock = threading.Lock()
_conn = {}  # path -> sqlite3.Connection, or None where the file could not be used


def _open(path):
    """The connection for path (made once per process), or None when it cannot be used."""
    with _lock:
        if path in _conn:
            return _conn[path]
        conn = None
        try:
            os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
            conn = sqlite3.connect(path, timeout=2.0, check_same_thread=False, isolation_level=None)
            # A lost entry is measured again, so commits need not reach the disk before the
            # next group is timed; WAL lets readers in other processes run beside a writer.
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=OFF")
            conn.execute(_SCHEMA)
            (rows,) = conn.execute("SELECT count(*) FROM routes").fetchone()
            if rows > MAX_ROWS:
                conn.execute(
                    "DELETE FROM routes WHERE sig IN (SELECT sig FROM routes ORDER BY at, rowid LIMIT ?)",
                    (rows - MAX_ROWS // 2,),
                )
        except (sqlite3.Error, OSError) as e:
            log.debug("fuseml: routing is not remembered (%s: %s)", path, e)
            if conn is not None:
                conn.close()
            conn = None
        _conn[path] = conn
        return conn


def _connection():
    path = settings.route_cache()
    return None if path is None else _open(path)


def gpu_identity(dev):
    """What the ATen side of a decision depends on besides its inputs: the GPU's kind (never
    its index: identical GPUs share decisions) and torch's version."""
    props = torch.cuda.get_device_properties(dev)
    return (props.name, props.major, props.minor, props.multi_processor_count, torch.__version__)


def layouts(xs):
    """What a decision depends on of a group's inputs: their shapes, dtypes and strides."""
    return [(tuple(x.shape), x.dtype, x.stride()) for x in xs]


def signature(cubin, steps, inputs, gpu):
    """The key of one group's decision (above), a hex digest: the kernel's bytes, the group's
    ATen program (runtime.GroupRunner.steps), its inputs' layouts (`inputs`, as layouts()
    writes them) and gpu (gpu_identity)."""
    h = hashlib.blake2b(digest_size=20)
    h.update(bytes(cubin))
    # a Python function's repr holds its address, another each process: its name instead
    # (a scatter group's call, scatter_fragment.py); an op's repr is its name already
    named = [(_name(t) if isinstance(t, types.FunctionType) else t, a, k) for t, a, k in steps]
    h.update(repr(named).encode())
    for layout in inputs:
        h.update(repr(layout).encode())
    h.update(repr(gpu).encode())
    return h.hexdigest()


def _name(fn):
    return f"{fn.__module__}.{fn.__qualname__}"


def recall(sig):
    """(route, kernel ms, ATen ms) remembered for sig, or None."""
    conn = _connection()
    if conn is None:
        return None
    try:
        row = conn.execute("SELECT route, kernel_ms, aten_ms FROM routes WHERE sig = ?", (sig,)).fetchone()
    except sqlite3.Error as e:
        log.debug("fuseml: remembered routing unreadable: %s", e)
        return None
    if row is None or row[0] not in ROUTES or not all(isinstance(v, float) for v in row[1:]):
        return None  # none, or not a route with its two times: measured again
    return row


def remember(sig, route, kernel_ms, aten_ms):
    conn = _connection()
    if conn is None or route not in ROUTES:
        return
    try:
        conn.execute(
            "INSERT OR REPLACE INTO routes (sig, route, kernel_ms, aten_ms, at) VALUES (?, ?, ?, ?, ?)",
            (sig, route, kernel_ms, aten_ms, time.time()),
        )
    except sqlite3.Error as e:
        log.debug("fuseml: routing not remembered: %s", e)


def forget_connections():
    """Closes this process's connections (tests that move FUSEML_ROUTE_CACHE between files)."""
    with _lock:
        for conn in _conn.values():
            if conn is not None:
                conn.close()
        _conn.clear()
