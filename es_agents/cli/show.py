"""Looking at runs as they go: ``show RUN [--follow]`` (a run's timeline, drawn with
rich) and ``events tail [--run RUN]`` (new events as they are appended)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

import click

from es_agents.cli.base import (
    OUTPUT,
    cli,
    complete_run_id,
    emit,
    emit_many,
    machine,
    output_option,
)
from es_agents.errors import DecodeError, NotFound

if TYPE_CHECKING:
    from es_agents.client import Client
    from es_agents.core.events import Event
    from es_agents.ports import EventLog

TERMINAL = ("completed", "failed", "cancelled")
# What each entry shows after its type, in this order, when present.
_SHOWN = (
    "agent", "parent", "child", "status", "model", "attempt", "prompt_tokens",
    "completion_tokens", "latency_ms",
    "cost_usd", "tool_calls", "content", "tool", "args", "key", "side_effect",
    "result", "error", "reconciled", "reason", "gate", "wake_at", "by", "detail",
    "output",
    "kind", "payloads",
)  # fmt: skip


def _what(entry: Mapping[str, object]) -> str:
    parts = []
    for key in _SHOWN:
        value = entry.get(key)
        if value in (None, "", [], False):
            continue
        parts.append(f"{key}={value}" if key != "content" else repr(value))
    return "  ".join(parts)


def _rows(entries: list[dict[str, object]]) -> Iterator[tuple[str, ...]]:
    before: datetime | None = None
    for entry in entries:
        at = datetime.fromisoformat(str(entry["at"]))
        took = "" if before is None else f"+{(at - before).total_seconds() * 1000:.1f}"
        before = at
        yield (
            str(entry["seq"]),
            str(entry["step"]),
            at.strftime("%H:%M:%S.%f")[:-3],
            took,
            str(entry["type"]),
            _what(entry),
        )


def _print(rows: list[tuple[str, ...]], header: bool) -> None:
    from rich.console import Console  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    table = Table(box=None, show_header=header, pad_edge=False)
    for name, style in (
        ("seq", "dim"),
        ("step", "dim"),
        ("at (UTC)", "cyan"),
        ("+ms", "yellow"),
        ("event", "bold"),
        ("what", ""),
    ):
        table.add_column(name, style=style, overflow="fold")
    for row in rows:
        table.add_row(*row)
    Console().print(table)


@cli.command()
@click.argument("run_id", shell_complete=complete_run_id)
@click.option("--follow", "-f", is_flag=True, help="Keep showing new events.")
@click.option(
    "--every", type=float, default=0.5, show_default=True, help="Seconds between looks."
)
@output_option
def show(run_id: str, follow: bool, every: float) -> None:
    """A run's timeline: each event with its time and the time since the one before
    (step durations), model calls (model, tokens, latency, cost), tool calls (args,
    result, key, reconciled), pauses, decisions and who took them, payload
    references. -o json: the timeline as one array; -o jsonl: an event a line.
    --follow keeps it going until the run ends (Ctrl-C stops), with the model's
    answers as they stream (on stderr; as JSON: an event or a "delta" a line)."""
    from es_agents.cli.commands import client  # noqa: PLC0415
    from es_agents.replay import timeline  # noqa: PLC0415

    shown = 0
    with client() as c, _streaming(c, run_id, follow):
        prices = c.settings.prices

        def more() -> None:
            nonlocal shown
            try:
                entries = timeline(c.events(run_id), prices)
            except NotFound:
                if not follow or not c.status(run_id).status == "pending":
                    raise
                entries = []  # followed from its start, once a worker applies it
            if machine() and not follow and OUTPUT.format == "json":
                emit_many(entries)  # one document: the timeline
            elif machine():  # a stream (--follow) or -o jsonl: an event a line
                for entry in entries[shown:]:
                    emit(entry)
            elif len(entries) > shown:
                _print(list(_rows(entries))[shown:], header=shown == 0)
            shown = len(entries)

        while True:
            more()
            status = c.status(run_id).status
            if not follow or status in TERMINAL:
                if follow:  # it may have ended after the read above: its last events
                    more()
                if not machine():
                    click.echo(f"status: {status}", err=True)
                    _family(c, run_id)
                return
            time.sleep(every)


def _family(c: Client, run_id: str) -> None:
    """The run's parent and child runs, when it has any (sub-agents)."""
    from es_agents.run_tree import lines, tree  # noqa: PLC0415

    family = tree(c.events, run_id)
    if family.get("parent") or family.get("children"):
        if family.get("parent"):
            click.echo(f"parent: {family['parent']}")
        click.echo("tree:\n" + "\n".join(lines(family, "  ")))


@contextlib.contextmanager
def _streaming(c: Client, run_id: str, follow: bool) -> Iterator[None]:
    """While following: the run's streamed answers printed as they come, by a
    thread of their own (``Client.stream``, again after each pause)."""
    if not follow or c.ports.deltas is None:
        yield
        return
    stop = threading.Event()

    def show_deltas() -> None:
        while not stop.is_set():
            for delta in c.stream(run_id, cancel=stop):
                if machine():
                    emit({"delta": {"kind": delta.kind, "step": delta.step,
                          "attempt": delta.attempt, "text": delta.text}})  # fmt: skip
                elif delta.kind == "start":
                    click.echo(f"step {delta.step} model ▸ ", nl=False, err=True)
                elif delta.kind == "text":
                    click.echo(delta.text, nl=False, err=True)
                else:
                    click.echo(f" ({delta.text})" if delta.text else "", err=True)
            stop.wait(1.0)  # the run waits: look for its next call in a while

    thread = threading.Thread(target=show_deltas, daemon=True, name="es-deltas")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


@cli.group()
def events() -> None:
    """The events topic as it grows."""


@events.command("tail")
@click.option("--run", "run_id", default=None, help="Only this run's events.")
@click.option("--from-start", is_flag=True, help="From the topic's start, not its end.")
@click.option("--every", type=float, default=0.2, show_default=True)
@click.option(
    "--max-events",
    type=click.IntRange(min=1),
    default=None,
    help="Stop after this many events.",
)
@output_option
def events_tail(
    run_id: str | None, from_start: bool, every: float, max_events: int | None
) -> None:
    """Print events as they are appended (of one run, or of all), one per line,
    until Ctrl-C (or --max-events)."""
    from es_agents.app import build_client_ports  # noqa: PLC0415
    from es_agents.settings import load_settings  # noqa: PLC0415

    settings = load_settings()
    ports = build_client_ports(settings)
    count = 0
    try:
        for event in _tail(
            ports.log, settings.kafka.events_topic, run_id, from_start, every
        ):
            _line(event)
            count += 1
            if max_events is not None and count >= max_events:
                return
    except KeyboardInterrupt:
        return
    finally:
        ports.close()


def _tail(
    log: EventLog, topic: str, run_id: str | None, from_start: bool, every: float
) -> Iterator[Event]:
    partitions = (
        [log.partition_for(run_id)]
        if run_id is not None
        else list(range(log.partition_count()))
    )
    offsets = {p: 0 if from_start else log.end_offset(topic, p) for p in partitions}
    from es_agents.core.epochs import EpochFence  # noqa: PLC0415

    # Carried from read to read, so a zombie write after a claim read before is
    # left out (from the end, the floors there are learnt from the events read).
    fences = {p: EpochFence() for p in partitions}
    while True:
        for partition, start in offsets.items():
            fence = fences[partition]
            for record in log.read_partition(topic, partition, start, floors=fence):
                offsets[partition] = record.offset + 1
                if run_id is not None and record.key != run_id:
                    continue
                try:
                    yield log.decode_event(record.value)
                except DecodeError as e:  # the projector dead-letters it
                    click.echo(f"{topic}[{partition}]@{record.offset}: {e}", err=True)
        time.sleep(every)


def _line(event: Event) -> None:
    from es_agents.replay import timeline  # noqa: PLC0415

    entry: dict[str, Any] = {"run_id": event.run_id, **timeline([event], {})[0]}
    if machine():
        emit(entry)
        return
    click.echo(
        f"{str(entry['at'])[11:23]}  {event.run_id}  {entry['seq']:>4}  "
        f"{entry['type']:<22} {_what(entry)}".rstrip()
    )
