"""A restarted operator and its own metrics port (issue 31, LOW): the previous process holds the
port until it has stopped; the new one waits for it a few seconds instead of failing at once."""

from __future__ import annotations

import socket
import threading

import httpx
import pytest

from kvscale.control.settings import SettingsError
from kvscale.operator.run import serve_metrics


def listening() -> socket.socket:
    held = socket.socket()
    held.bind(("0.0.0.0", 0))
    held.listen()
    return held


def test_a_port_let_go_within_the_wait_is_served() -> None:
    held = listening()
    port = held.getsockname()[1]
    letting_go = threading.Timer(1.0, held.close)  # the previous operator exits a second later
    letting_go.start()
    try:
        serve_metrics(port)
    finally:
        letting_go.cancel()
        held.close()
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert metrics.status_code == 200 and "kvscale_" in metrics.text


def test_a_port_held_past_the_wait_still_stops_the_start_naming_it() -> None:
    with listening() as held:
        port = held.getsockname()[1]
        with pytest.raises(SettingsError, match=f"KVSCALE_METRICS_PORT: port {port} cannot be served"):
            serve_metrics(port, wait_s=0.5)
