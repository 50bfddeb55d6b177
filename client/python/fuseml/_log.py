"""Logging for the backend: one warning per cause, detail at FUSEML_LOG=debug."""
import logging
import os
import threading

log = logging.getLogger("fuseml")
_level = os.environ.get("FUSEML_LOG", "").lower()
if _level in ("debug", "info", "warning", "error"):
    log.setLevel(getattr(logging, _level.upper()))

_warned = set()
_lock = threading.Lock()


def warn_once(cause, message, *args, suffix=" (running eager)"):
    """Warns the first time `cause` happens in this process; later ones go to debug. A job
    that falls back to eager must hear it once, not once per launch. `suffix` ends the
    warning (a cause that is not a fallback to eager says what it is itself)."""
    with _lock:
        first = cause not in _warned
        _warned.add(cause)
    if first:
        log.warning("fuseml: " + message + suffix, *args)
    else:
        log.debug("fuseml: " + message, *args)


def reset_warnings():
    """For tests: forget which causes were already reported."""
    with _lock:
        _warned.clear()
