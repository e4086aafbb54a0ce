"""``es-agents bench stream``: how late a streamed piece of a model's answer
reaches a client following the run, and what streaming costs the worker.

A model server of its own process (``lab.stream_server``, OpenAI's wire) answers
each call with ``pieces`` pieces of text ``gap`` apart and logs when it wrote each.
1. Latency: runs one after another, each followed by ``Client.stream`` in this
   process; per piece, the time from the server's write to the follower's receipt
   (same machine, same clock): p50 and p95.
2. CPU: ``cpu_runs`` runs of one model call each, driven by a worker in this
   process, for three variants: not streamed (one JSON answer), streamed with the
   pieces discarded (the SDK's streaming alone), and streamed with every piece
   published to the stream topic (what es-agents adds). CPU seconds of this process
   per model call, the median of ``repeats`` rounds.
3. The same costs alone, where the machine's noise is small: publishing a piece,
   reading one through the SDK, and reading one with nothing but asyncio's streams
   (the floor: what being woken once per piece costs a process on this machine).
"""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import JsonValue

from es_agents.agent import ToolAgent
from es_agents.app import build_ports, build_worker
from es_agents.client import Client
from es_agents.core.budget import Budget
from es_agents.core.commands import StartRun
from es_agents.lab.bench import scratch_settings
from es_agents.ports import Delta
from es_agents.settings import Settings


class _Discard:
    """A stream that drops every delta (the SDK streams; nothing is published)."""

    def publish(self, delta: Delta) -> None:
        pass


def _agent(url: str, stream: bool) -> ToolAgent:
    from es_agents.adapters.openai_model import OpenAIChatModel  # noqa: PLC0415

    return ToolAgent(
        name="bench-stream",
        system_prompt="Answer.",
        model=OpenAIChatModel(url, "bench-model", timeout=30),
        stream=stream,
        budget=Budget.unlimited(),
    )


@contextmanager
def _model_server(pieces: int, gap: float, sent: Path) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = subprocess.Popen(
        [sys.executable, "-m", "es_agents.lab.stream_server", "--port", str(port),
         "--pieces", str(pieces), "--gap", str(gap), "--sent", str(sent)],
    )  # fmt: skip
    deadline = time.monotonic() + 30
    try:
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("the bench's model server did not start")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.terminate()
        server.wait(10)


def _latencies(
    settings: Settings, url: str, runs: int
) -> dict[str, tuple[float, float]]:
    worker = build_worker(settings, _agent(url, stream=True), idle_seconds=0.1)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    received: dict[str, tuple[float, float]] = {}  # text: (published, received)
    try:
        with Client(settings) as client:
            for _ in range(runs):
                run_id = f"stream-{uuid.uuid4().hex[:8]}"
                client.start("bench-stream", '"hi"', run_id=run_id, wait=0)
                for delta in client.stream(run_id, timeout=60):
                    if delta.kind == "text":
                        received[delta.text] = (delta.sent_at, time.time())
    finally:
        worker.stop()
        thread.join(30)
    return received


def _cpu_per_call(settings: Settings, url: str, variant: str, runs: int) -> float:
    """CPU seconds of this process (every thread, librdkafka's too) per model call."""
    ports = build_ports(settings)
    try:
        for _ in range(runs):
            run_id = f"cpu-{uuid.uuid4().hex[:8]}"
            ports.log.send(StartRun(run_id=run_id, agent="bench-stream"))
    finally:
        ports.close()
    agent = _agent(url, stream=variant != "plain")
    worker = build_worker(settings, agent, until_idle=True, idle_seconds=0.3)
    if variant == "discarded":
        worker.ctx.deltas = _Discard()  # type: ignore[assignment]
    started = time.process_time()
    worker.run()
    return (time.process_time() - started) / runs


def _publish_us(settings: Settings, pieces: int, calls: int = 64) -> float:
    """CPU of this process per piece published to the stream topic, ``calls``
    calls at once each publishing ``pieces`` pieces 20 ms apart, beyond the same
    loop publishing nothing (librdkafka's threads included)."""
    from es_agents.adapters.kafka_deltas import (  # noqa: PLC0415
        KafkaDeltas,
        ensure_stream_topic,
    )

    ensure_stream_topic(settings.kafka)

    def spent(publish: bool) -> float:
        deltas = KafkaDeltas(settings.kafka) if publish else None

        async def call(n: int) -> None:
            for k in range(pieces):
                await asyncio.sleep(0.02)
                if deltas is not None:
                    deltas.publish(Delta(f"p-{n}", 1, 1, "text", f"{k} ", time.time()))

        async def all_calls() -> None:
            await asyncio.gather(*(call(n) for n in range(calls)))

        started = time.process_time()
        asyncio.run(all_calls())
        if deltas is not None:
            deltas.close()
        return time.process_time() - started

    rounds = [spent(True) - spent(False) for _ in range(3)]
    return statistics.median(rounds) / (calls * pieces) * 1e6


def _parse_us(url: str, pieces: int, calls: int) -> float:
    """CPU of this process per piece to take a streamed answer through the SDK
    (the adapter's reading of the events), beyond taking the same answer whole;
    ``calls`` calls at once, the pieces as far apart as in the worker's runs."""
    from es_agents.adapters.openai_model import OpenAIChatModel  # noqa: PLC0415

    model = OpenAIChatModel(url, "bench-model", timeout=30)
    messages: list[dict[str, JsonValue]] = [{"role": "user", "content": "hi"}]

    async def call(stream: bool) -> None:
        if stream:
            await model.astream(messages, {}, (), lambda _: None)
        else:
            await model.acomplete(messages, {}, ())

    return _per_piece(call, pieces, calls)


def _floor_us(url: str, pieces: int, calls: int) -> float:
    """The same measure for a reader with nothing but asyncio's streams (no
    SDK, no HTTP client, no parsing): what being woken once per piece costs a
    process on this machine, the floor under any streaming reader."""
    where = urlsplit(url)
    host, port = where.hostname or "127.0.0.1", where.port or 80

    async def call(stream: bool) -> None:
        body = json.dumps({"model": "m", "messages": [], "stream": stream}).encode()
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json"
            b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        while await reader.read(65536):
            pass
        writer.close()

    return _per_piece(call, pieces, calls)


def _per_piece(
    call: Callable[[bool], Awaitable[None]], pieces: int, calls: int
) -> float:
    """CPU µs per piece of ``calls`` streamed calls at once beyond as many whole
    answers (the server takes as long for both), median of three rounds."""

    async def spent(stream: bool) -> float:
        started = time.process_time()
        await asyncio.gather(*(call(stream) for _ in range(calls)))
        return time.process_time() - started

    async def rounds() -> list[float]:
        await spent(True)  # the client's connections, warm
        return [await spent(True) - await spent(False) for _ in range(3)]

    return statistics.median(asyncio.run(rounds())) / (calls * pieces) * 1e6


def bench_stream(  # noqa: PLR0917 - the bench's knobs
    runs: int,
    pieces: int,
    gap_ms: float,
    cpu_runs: int,
    repeats: int,
    echo: Callable[[str], None],
) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        sent_log = Path(tmp) / "sent.jsonl"
        result: dict[str, object] = {"pieces": pieces, "gap_ms": gap_ms}
        with (
            _model_server(pieces, gap_ms / 1000, sent_log) as url,
            scratch_settings(partitions=1) as settings,
        ):
            result["fencing"] = settings.fencing
            received = _latencies(settings, url, runs)
            sent = {
                line["text"]: line["at"]
                for line in map(json.loads, sent_log.read_text().splitlines())
            }
            late = sorted(
                (received[t][1] - sent[t]) * 1000 for t in received if t in sent
            )
            # Where the time goes: server -> the worker's publish, publish -> client.
            to_worker = sorted(
                (received[t][0] - sent[t]) * 1000 for t in received if t in sent
            )
            to_client = sorted((r - p) * 1000 for p, r in received.values())
            result["worker_ms_p50"] = round(statistics.median(to_worker), 2)
            result["topic_ms_p50"] = round(statistics.median(to_client), 2)
            result["pieces_received"] = f"{len(late)}/{runs * pieces}"
            result["latency_ms_p50"] = round(statistics.median(late), 2)
            result["latency_ms_p95"] = round(late[int(len(late) * 0.95) - 1], 2)
            echo(
                f"{runs} runs x {pieces} pieces {gap_ms:g} ms apart: "
                f"{len(late)} of {runs * pieces} pieces followed; server write -> "
                f"client: p50 {result['latency_ms_p50']} ms, "
                f"p95 {result['latency_ms_p95']} ms (to the worker's publish "
                f"{result['worker_ms_p50']} ms, through the topic "
                f"{result['topic_ms_p50']} ms)"
            )
            variants = ("plain", "discarded", "published")
            rounds: dict[str, list[float]] = {v: [] for v in variants}
            for _ in range(repeats):  # interleaved: the machine's drift hits all
                for variant in variants:
                    rounds[variant].append(
                        _cpu_per_call(settings, url, variant, cpu_runs)
                    )
            cpu = {v: statistics.median(rounds[v]) * 1e6 for v in variants}
            result["cpu_us_per_call"] = {k: round(v) for k, v in cpu.items()}
            added = (cpu["published"] - cpu["discarded"]) / cpu["discarded"]
            over_plain = (cpu["published"] - cpu["plain"]) / cpu["plain"]
            result["publishing_adds"] = round(added, 3)
            result["streaming_adds"] = round(over_plain, 3)
            # The same costs measured alone, where the machine's noise is small, and
            # the floor: a reader of the same answers with nothing but asyncio.
            publish_us = _publish_us(settings, pieces)
            concurrent = min(cpu_runs, 100)
            parse_us = _parse_us(url, pieces, concurrent)
            floor_us = _floor_us(url, pieces, concurrent)
            alone = (publish_us + parse_us) * pieces / cpu["plain"]
            floor = floor_us * pieces / cpu["plain"]
            result["publish_us_per_piece"] = round(publish_us, 1)
            result["parse_us_per_piece"] = round(parse_us, 1)
            result["floor_us_per_piece"] = round(floor_us, 1)
            result["streaming_adds_alone"] = round(alone, 4)
            result["floor_adds"] = round(floor, 4)
            echo(
                f"worker CPU per model call ({cpu_runs} runs, median of {repeats}): "
                f"not streamed {cpu['plain']:.0f} us, streamed {cpu['discarded']:.0f} "
                f"us (the SDK), streamed and published {cpu['published']:.0f} us: "
                f"publishing adds {added:+.1%}, streaming in all {over_plain:+.1%}"
            )
            echo(
                f"measured alone ({concurrent} calls at once): publishing "
                f"{publish_us:.1f} us and reading {parse_us:.1f} us of CPU per "
                f"piece: {pieces} pieces add {alone:.1%} to a model call's "
                f"{cpu['plain']:.0f} us; a bare asyncio reader of the same answers "
                f"spends {floor_us:.1f} us per piece ({floor:.1%}): the floor of "
                f"being woken once per piece on this machine"
            )
    echo(json.dumps(result))
    return result
