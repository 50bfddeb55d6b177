"""FUSEML_LOG and TORCH_LOGS, each in a fresh interpreter (both are read at import): the
detail reaches stderr, exactly once whoever else configured logging."""

import os
import subprocess
import sys

import pytest

import fuseml

CLIENT = os.path.dirname(os.path.dirname(os.path.abspath(fuseml.__file__)))

PROBE = """
import logging, sys
{setup}
import fuseml
from fuseml._log import log
log.debug("fuseml: probe debug")
log.info("fuseml: probe info")
log.warning("fuseml: probe warning")
"""


def _run(env, setup=""):
    """stderr of the probe run with env over a clean copy of ours (no FUSEML_LOG, TORCH_LOGS)."""
    base = {k: v for k, v in os.environ.items() if k not in ("FUSEML_LOG", "TORCH_LOGS")}
    base["PYTHONPATH"] = CLIENT + os.pathsep + base.get("PYTHONPATH", "")
    p = subprocess.run(
        [sys.executable, "-c", PROBE.format(setup=setup)],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    return p.stderr


def _count(err, text):
    return sum(text in line for line in err.splitlines())


def test_fuseml_log_debug_prints():
    err = _run({"FUSEML_LOG": "debug"})
    assert [_count(err, f"probe {w}") for w in ("debug", "info", "warning")] == [1, 1, 1], err


def test_fuseml_log_info_leaves_debug_out():
    err = _run({"FUSEML_LOG": "info"})
    assert [_count(err, f"probe {w}") for w in ("debug", "info", "warning")] == [0, 1, 1], err


def test_without_fuseml_log_only_warnings():
    err = _run({})
    assert [_count(err, f"probe {w}") for w in ("debug", "info", "warning")] == [0, 0, 1], err


def test_no_double_lines_when_the_application_configured_logging():
    err = _run(
        {"FUSEML_LOG": "debug"}, setup="logging.basicConfig(level=logging.DEBUG, format='app %(name)s %(message)s')"
    )
    assert [_count(err, f"probe {w}") for w in ("debug", "info", "warning")] == [1, 1, 1], err
    assert _count(err, "app fuseml fuseml: probe debug") == 1, err  # through the app's handler


@pytest.mark.parametrize("fuseml_log", ["", "debug"])
def test_torch_logs(fuseml_log):
    """TORCH_LOGS=+fuseml: torch's handler prints fuseml's debug detail, once even with
    FUSEML_LOG=debug too."""
    err = _run({"TORCH_LOGS": "+fuseml", **({"FUSEML_LOG": fuseml_log} if fuseml_log else {})})
    assert [_count(err, f"probe {w}") for w in ("debug", "info", "warning")] == [1, 1, 1], err


def test_registered_with_torch_logging():
    """The name torch's logging knows, so TORCH_LOGS and torch._logging.set_logs(modules=...)
    name it as a log of its own, not a module found by accident."""
    err = _run(
        {}, setup="from torch._logging._internal import log_registry\n" "assert not log_registry.is_log('fuseml')"
    )
    err = _run(
        {},
        setup="import fuseml._log\n"
        "from torch._logging._internal import log_registry\n"
        "assert fuseml._log.registered_with_torch and log_registry.is_log('fuseml')",
    )
    assert _count(err, "probe warning") == 1, err
