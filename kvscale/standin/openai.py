"""An OpenAI-compatible completions endpoint whose timing is kvscale's model: what
`kvscale bench` is tested against, and a way to try it without a GPU
(`kvscale sim serve-openai`).

What is modelled (kept simple on purpose): each request is prefilled alone, its first token
after `prefill(cfg, 1, prompt_tokens)` (kvscale.sizing.roofline); each later token after one
decode step `decode_step(cfg, running, context)` where `running` is the number of requests
decoding at that moment and `context` the request's prompt plus tokens so far. Prefills do
not stall the running decodes (no chunked-prefill interference) and there is no batch limit
or KV-cache limit: a stand-in for timing, not the simulator. The prompt's tokens are counted
as its whitespace-separated words (the bench sends N words for N tokens).

A tiny HTTP/1.1 server on asyncio streams (one request per connection, the answer streamed
as server-sent events in chunked encoding, as vLLM does); `error_every` answers every n-th
request with HTTP 500, the one fault a test cannot cause on a healthy engine."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

from kvscale.sizing.config import ServingConfig
from kvscale.sizing.roofline import decode_step, prefill

MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_OUTPUT_TOKENS = 1_000_000


@dataclass
class ModelledEngine:
    cfg: ServingConfig
    model_name: str
    error_every: int = 0  # 0: never fail
    running: int = 0  # requests decoding now
    served: int = 0
    received: list[tuple[int, int]] = field(default_factory=list)  # (prompt tokens, max_tokens) per request
    _prefill_cache: dict[int, float] = field(default_factory=dict)

    def prefill_s(self, prompt_tokens: int) -> float:
        if prompt_tokens not in self._prefill_cache:
            self._prefill_cache[prompt_tokens] = prefill(self.cfg, 1, max(1, prompt_tokens)).seconds
        return self._prefill_cache[prompt_tokens]

    def decode_s(self, running: int, context_tokens: float) -> float:
        return decode_step(self.cfg, max(1, running), context_tokens).seconds


def _chunk(payload: bytes) -> bytes:
    return f"{len(payload):x}\r\n".encode() + payload + b"\r\n"


def _event(engine: ModelledEngine, text: str, finish: str | None) -> bytes:
    body = {
        "id": "cmpl-kvscale",
        "object": "text_completion",
        "created": int(time.time()),
        "model": engine.model_name,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
    }
    return _chunk(f"data: {json.dumps(body)}\n\n".encode())


async def _reply(writer: asyncio.StreamWriter, status: str, message: str, err_type: str | None = None) -> None:
    error: dict[str, object] = {"message": message}
    if err_type is not None:  # vLLM's ErrorInfo (entrypoints/openai/protocol.py): message, type, code
        error.update(type=err_type, code=int(status.split(" ", 1)[0]))
    body = json.dumps({"error": error}).encode()
    writer.write(
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n".encode()
        + body
    )
    await writer.drain()


async def _handle(engine: ModelledEngine, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = ([*lines[0].split(" "), "", ""])[:3]
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        length = int(headers.get("content-length", "0"))
        if length > MAX_BODY_BYTES:
            await _reply(writer, "413 Payload Too Large", "body too large")
            return
        body = await reader.readexactly(length)
        if method != "POST" or path.split("?")[0] != "/v1/completions":
            await _reply(writer, "404 Not Found", f"no route {method} {path}")
            return
        engine.served += 1
        if engine.error_every and engine.served % engine.error_every == 0:
            await _reply(writer, "500 Internal Server Error", "injected fault")
            return
        request = json.loads(body)
        asked = request.get("model")
        if asked and asked != engine.model_name:
            # As vLLM 0.11.0 answers a name it does not serve (entrypoints/openai/serving_engine.py,
            # _check_model; an empty or absent name means the served model).
            await _reply(writer, "404 Not Found", f"The model `{asked}` does not exist.", "NotFoundError")
            return
        prompt = request.get("prompt", "")
        prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        max_tokens = int(request.get("max_tokens", 16))
        engine.received.append((prompt_tokens, max_tokens))
        if not 1 <= max_tokens <= MAX_OUTPUT_TOKENS:
            await _reply(writer, "400 Bad Request", f"max_tokens must be in [1, {MAX_OUTPUT_TOKENS}]")
            return
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
            b"Connection: close\r\n\r\n"
        )
        await writer.drain()
        await asyncio.sleep(engine.prefill_s(prompt_tokens))
        engine.running += 1
        try:
            for i in range(max_tokens):
                if i:
                    await asyncio.sleep(engine.decode_s(engine.running, prompt_tokens + i))
                writer.write(_event(engine, " tok", "length" if i == max_tokens - 1 else None))
                await writer.drain()
        finally:
            engine.running -= 1
        writer.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError, UnicodeError):
        pass  # a client that went away or sent garbage: nothing to answer
    finally:
        writer.close()


async def start(engine: ModelledEngine, host: str = "127.0.0.1", port: int = 0) -> asyncio.Server:
    """Listen on host:port (0: any free port; the server's sockets say which)."""
    return await asyncio.start_server(lambda r, w: _handle(engine, r, w), host, port)
