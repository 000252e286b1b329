"""The async Prometheus client against a slow Prometheus: N InferenceServices observed at once
(9 queries each, at most 16 in flight) against a fake Prometheus on 127.0.0.1 answering
after a delay, each observation under a deadline. Prints wall time, the longest event-loop stall (a 10 ms
heartbeat's worst gap) and how many observations came back stale.
Run: .venv/bin/python benchmarks/prometheus_client.py
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rich.console import Console
from rich.table import Table

from kvscale.metrics.client import AsyncPrometheusClient
from kvscale.metrics.observe import observe_async

DEADLINE_S = 2.0  # the operator passes half its tick (15 s by default); 2 s is stricter
ANSWER = json.dumps(
    {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, "1"]}]}}
).encode()


def fake_prometheus(delay_s: float) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as Prometheus does

        def setup(self) -> None:
            super().setup()
            # Headers and body go in two writes; without this, Nagle's algorithm and delayed
            # ACKs add 40 ms to every keep-alive answer (a real Prometheus does not).
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def handle(self) -> None:
            with contextlib.suppress(ConnectionResetError):  # the client gave up on a slow answer
                super().handle()

        def do_GET(self) -> None:
            time.sleep(delay_s)  # the slow Prometheus being measured
            try:
                self.send_response(200)
                self.send_header("Content-Length", str(len(ANSWER)))
                self.end_headers()
                self.wfile.write(ANSWER)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, format: str, *args: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 1024  # listen() backlog; the default 5 drops connections (1 s SYN retries)

    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


async def measure(url: str, services: int, deadline_s: float) -> tuple[float, float, int]:
    client = AsyncPrometheusClient(url, timeout_s=deadline_s, retries=0)
    worst_gap = 0.0

    async def heartbeat() -> None:
        nonlocal worst_gap
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            worst_gap = max(worst_gap, now - last - 0.01)
            last = now

    beat = asyncio.create_task(heartbeat())
    started = time.monotonic()
    results = await asyncio.gather(
        *(
            observe_async(client, "vllm", "ns", f"svc-{i}", 95, 1, 0, time.time(), deadline_s=deadline_s)
            for i in range(services)
        )
    )
    wall = time.monotonic() - started
    beat.cancel()
    await client.aclose()
    return wall, worst_gap, sum(1 for obs, _ in results if obs.stale)


def main() -> None:
    table = Table(title=f"Async Prometheus client: N services x 9 queries at once, {DEADLINE_S:g} s deadline")
    for col in ("services", "Prometheus delay", "wall s", "worst loop stall ms", "stale"):
        table.add_column(col, justify="right")
    for delay_s in (0.005, 10.0):
        server = fake_prometheus(delay_s)
        url = f"http://127.0.0.1:{server.server_address[1]}"
        for services in (50, 200):
            wall, gap, stale = asyncio.run(measure(url, services, DEADLINE_S))
            table.add_row(str(services), f"{delay_s:g} s", f"{wall:.2f}", f"{gap * 1e3:.0f}", f"{stale}/{services}")
        server.shutdown()
        server.server_close()
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
