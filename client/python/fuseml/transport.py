"""Talking to fusemld: the Unix socket, frames (u32 big-endian length + one msgpack map), the
hello handshake, pipelined compile requests matched to replies by id, timeouts, and starting
a per-user daemon when none answers (autostart.py)."""

import itertools
import os
import socket
import stat
import struct
import time

import msgpack

from . import autostart, settings

PROTO = 1
CLIENT = "fuseml-py/0.1"
MAX_REPLY = 256 << 20


class DaemonError(Exception):
    """An error reply or a transport failure; .code is the protocol slug."""

    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self.code = code


def default_socket_path():
    """FUSEML_SOCKET, else $XDG_RUNTIME_DIR/fusemld.sock, else /tmp/fusemld-<uid>/fusemld.sock."""
    path = settings.socket()
    if path:
        return path
    run = os.environ.get("XDG_RUNTIME_DIR")
    if run:
        return os.path.join(run, "fusemld.sock")
    return f"/tmp/fusemld-{os.getuid()}/fusemld.sock"


def _check_private_dir(path):
    """The /tmp fallback directory must be ours and 0700 (PROTOCOL.md, Transport): anyone
    could otherwise put a socket there and serve us kernels."""
    d = os.path.dirname(path)
    if not d.startswith("/tmp/fusemld-"):
        return
    st = os.lstat(d)
    if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) != 0o700 or not stat.S_ISDIR(st.st_mode):
        raise DaemonError("permission_denied", f"{d} is not a directory of ours with mode 0700")


class Connection:
    def __init__(self, path, timeout):
        self.path = path
        self.timeout = timeout
        self.ids = itertools.count(1)
        _check_private_dir(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(path)
        except OSError:
            self.sock.close()
            raise
        self.buf = bytearray()
        self.hello = self.call({"op": "hello", "proto": PROTO, "client": CLIENT, "pid": os.getpid()})
        if not self.hello.get("ok"):
            self.sock.close()
            raise DaemonError(self.hello.get("code", "protocol_error"), self.hello.get("detail", ""))

    def close(self):
        self.sock.close()

    def send(self, req):
        rid = next(self.ids)
        req = dict(req, id=rid)
        payload = msgpack.packb(req, use_bin_type=True)
        self.sock.sendall(struct.pack(">I", len(payload)) + payload)
        return rid

    def _recv_exact(self, n, deadline):
        while len(self.buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DaemonError("timeout", f"no reply from {self.path} in {self.timeout:g} s")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(max(65536, n - len(self.buf)))
            except socket.timeout:
                raise DaemonError("timeout", f"no reply from {self.path} in {self.timeout:g} s") from None
            if not chunk:
                raise DaemonError("connection_closed", "the daemon closed the connection")
            self.buf += chunk
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def recv(self, deadline):
        (n,) = struct.unpack(">I", self._recv_exact(4, deadline))
        if n == 0 or n > MAX_REPLY:
            raise DaemonError("protocol_error", f"reply frame of {n} bytes")
        reply = msgpack.unpackb(self._recv_exact(n, deadline), raw=False, strict_map_key=False)
        if not isinstance(reply, dict):
            raise DaemonError("protocol_error", "reply is not a map")
        return reply

    def call(self, req):
        rid = self.send(req)
        return self.gather([rid])[rid]

    def gather(self, rids, timeout=None):
        """Replies for rids, in any order they come; an error reply is returned as is (its
        `ok` is false), not raised, so one bad fragment does not lose the others."""
        deadline = time.monotonic() + (timeout or self.timeout)
        want, got = set(rids), {}
        while want:
            reply = self.recv(deadline)
            rid = reply.get("id")
            if rid in want:
                want.discard(rid)
                got[rid] = reply
            elif rid == 0 and not reply.get("ok", False):
                raise DaemonError(reply.get("code", "protocol_error"), reply.get("detail", ""))
        return got


def connect(path=None, timeout=5.0):
    """A handshaken Connection; starts the per-user daemon first when none answers (unless
    FUSEML_NO_AUTOSTART=1; autostart.py)."""
    path = path or default_socket_path()
    try:
        return Connection(path, timeout)
    except (FileNotFoundError, ConnectionRefusedError):
        if not settings.autostart():
            raise DaemonError("connection_closed", f"no daemon at {path} (autostart off)") from None
    try:
        exe, idle = autostart.start(path)
    except autostart.StartError as e:
        raise DaemonError(e.code, str(e)) from None
    deadline = time.monotonic() + 10
    while True:
        try:
            conn = Connection(path, timeout)
            break
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() > deadline:
                raise DaemonError("connection_closed", f"started fusemld but {path} does not answer") from None
            time.sleep(0.05)
    autostart.say_started(exe, path, idle, conn.sock)
    return conn


# Compile requests one connection keeps in flight: under fusemld's --max-client-compiles (256
# by default), past which it refuses a request ("busy") and the group would run eager. A
# ResNet-50's training step has about 600 groups.
WINDOW = 128


def compile_all(conn, fragments, timeout):
    """Sends one compile request per distinct fragment, WINDOW at a time, each window's all
    before reading any of its replies; returns the replies in the fragments' order (a copy
    each: identical fragments, a model's repeated layers, are asked once). `timeout` bounds
    each window."""
    keys = [msgpack.packb(f, use_bin_type=True) for f in fragments]
    first = dict(zip(keys, fragments))  # a distinct fragment by its encoding
    distinct, replies = list(first), {}
    for i in range(0, len(distinct), WINDOW):
        window = distinct[i : i + WINDOW]
        rids = [conn.send({"op": "compile", "fragment": first[k]}) for k in window]
        got = conn.gather(rids, timeout)
        replies.update((k, got[r]) for k, r in zip(window, rids))
    return [dict(replies[k]) for k in keys]
