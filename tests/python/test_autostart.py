"""Starting a per-user daemon when none answers, with a real fusemld: the one built in this
checkout is found without PATH, one line says where it runs and logs, it exits once idle,
and it starts from inside a systemd service (INVOCATION_ID) without the 15 s hang."""

import logging
import os
import time

import pytest

from conftest import _fusemld_bin
from test_daemon import _stop_daemon_on

from fuseml import autostart, transport

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def auto(monkeypatch, tmp_path):
    """A private socket and home for the daemon connect() starts (its database and log go
    under $HOME/.cache), gone after the test whatever happens: stopped, and it would exit by
    itself after 5 idle seconds anyway."""
    exe = _fusemld_bin()
    if not exe:
        pytest.skip("no fusemld built (set FUSEMLD_BIN)")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("FUSEML_NO_AUTOSTART", raising=False)
    monkeypatch.setenv("FUSEML_DAEMON", exe)
    monkeypatch.setenv("FUSEML_IDLE_EXIT", "5")
    path = str(tmp_path / "auto.sock")
    monkeypatch.setenv("FUSEML_SOCKET", path)
    yield path
    _stop_daemon_on(path)


def _connect_once():
    conn = transport.connect(timeout=10)
    assert conn.hello["ok"] and conn.hello["server"] == "fusemld"
    conn.close()


def test_finds_the_checkout_build_without_path(auto, monkeypatch):
    """After scripts/quickstart nothing is on PATH: the daemon built in this checkout is the
    one started."""
    built = autostart._built_daemons(ROOT)
    if not built:
        pytest.skip("no build*/daemon/fusemld in this checkout")
    monkeypatch.delenv("FUSEML_DAEMON")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert autostart.daemon_binary() == built[0]
    _connect_once()


def test_says_once_where_it_runs_and_logs(auto, caplog):
    caplog.set_level(logging.INFO, logger="fuseml")
    _connect_once()
    _connect_once()  # the daemon answers now: nothing is started, nothing said
    said = [r.getMessage() for r in caplog.records if r.name == "fuseml" and r.levelno >= logging.INFO]
    assert len(said) == 1, said
    home = os.environ["HOME"]
    assert f"started {os.environ['FUSEML_DAEMON']} (pid " in said[0]
    assert f"on {auto}" in said[0]
    assert f"it logs to {home}/.cache/fusemld/fusemld.log" in said[0], said[0]
    assert "exits after 5 s without clients" in said[0]


def test_exits_when_idle(auto, monkeypatch):
    monkeypatch.setenv("FUSEML_IDLE_EXIT", "1")
    _connect_once()
    deadline = time.monotonic() + 30
    while os.path.exists(auto) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(auto), "the autostarted daemon is still serving after 30 s idle"


def test_starts_inside_a_systemd_service(auto, monkeypatch):
    """Every process of a systemd service has INVOCATION_ID; the daemon it starts must still
    detach (it used to stay in the foreground: DaemonError timeout after 15 s)."""
    monkeypatch.setenv("INVOCATION_ID", "0123456789abcdef0123456789abcdef")
    _connect_once()
