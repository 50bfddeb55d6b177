"""Logging for the backend: the logger "fuseml", one warning per cause, detail at
FUSEML_LOG=debug.

Where records go: wherever the application's logging sends them. FUSEML_LOG=<level> sets the
level and adds a stderr handler that stays silent while any other handler would print the
record (the application's, or torch's under TORCH_LOGS), so nothing prints twice. Without
FUSEML_LOG, warnings reach stderr through logging's last resort, as for any library.

The logger is also registered with torch's logging as "fuseml", so TORCH_LOGS=+fuseml (debug)
or TORCH_LOGS=fuseml (info) and torch._logging.set_logs(modules={"fuseml": level}) configure
it like one of torch's own logs (torch then owns its level and handler)."""

import logging
import sys
import threading

from . import settings

log = logging.getLogger("fuseml")


class _StderrUnlessHandled(logging.Handler):
    """stderr (looked up at each record, as logging's last resort does), unless another
    handler between this logger and the root would print the record."""

    def _others(self, record):
        c = log
        while c is not None:
            if any(h is not self and record.levelno >= h.level for h in c.handlers):
                return True
            if not c.propagate:
                return False
            c = c.parent
        return False

    def emit(self, record):
        if self._others(record):
            return
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:
            self.handleError(record)


def _register_with_torch():
    """register_log(setting_name, log_name) has been torch._logging's way to name a log for
    TORCH_LOGS since torch 2.1 (it is in torch 2.11 and 2.15 alike); a torch without it, or
    one whose signature moved, leaves TORCH_LOGS to its own lookup of module names."""
    try:
        from torch._logging._internal import log_registry, register_log
    except ImportError:
        return False
    try:
        if not log_registry.is_log("fuseml"):
            register_log("fuseml", "fuseml")
        return True
    except Exception:  # another torch's internals: logging must never stop an import
        return False


_level = settings.log_level()
if _level:
    log.setLevel(getattr(logging, _level.upper()))
    log.addHandler(_StderrUnlessHandled())
registered_with_torch = _register_with_torch()

_warned = set()
_lock = threading.Lock()


def _first(cause):
    with _lock:
        first = cause not in _warned
        _warned.add(cause)
    return first


def warn_once(cause, message, *args, suffix=" (running eager)"):
    """Warns the first time `cause` happens in this process; later ones go to debug. A job
    that falls back to eager must hear it once, not once per launch. `suffix` ends the
    warning (a cause that is not a fallback to eager says what it is itself)."""
    if _first(cause):
        log.warning("fuseml: " + message + suffix, *args)
    else:
        log.debug("fuseml: " + message, *args)


def info_once(cause, message, *args):
    """As warn_once, at info level: a note, not a fallback anyone has to act on."""
    log.log(logging.INFO if _first(cause) else logging.DEBUG, "fuseml: " + message, *args)


def reset_warnings():
    """For tests: forget which causes were already reported."""
    with _lock:
        _warned.clear()
