"""The whole-topic audit: every run of the events topic, checked from the log alone,
with a cost ledger.

Per run: sequence gaps and duplicates (the same event twice, or two events at one
seq), dangling intentions, effects in the ledger without an outcome in the log,
the ``runs`` row against the fold, and why a paused or blocked run waits. The cost
ledger prices each recorded completion (``ES_AGENTS_PRICES``), per run, per agent
and in total, and counts what resume saved: at each ``resumed``, the completions
already recorded are read back instead of asked for again -- a re-run from the
start would have paid for them once more.
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from es_agents.approvals import Keyring, verify
from es_agents.core.approvals import ApprovalPolicy, unproven
from es_agents.core.chain import ChainCheck
from es_agents.core.events import (
    Event,
    ModelResponded,
    Resumed,
    RunStarted,
    StatePatched,
    ToolCallRequested,
    ToolReturned,
)
from es_agents.core.fold import fold
from es_agents.core.run_row import run_row
from es_agents.core.snapshot import to_snapshot
from es_agents.core.state import (
    CHILD_PREFIX,
    PendingModelCall,
    PendingToolCall,
    RunState,
)
from es_agents.errors import EsAgentsError
from es_agents.ports import EffectLedger, EventLog, Projections
from es_agents.replay import first_difference, head_difference
from es_agents.settings import ModelPrice


@dataclass
class RunAudit:
    run_id: str
    agent: str = ""
    state: RunState | None = None
    problems: list[str] = field(default_factory=list)  # the log or views disagree
    dangling: str | None = None  # an intention with no outcome yet (a running run)
    projection_behind: bool = False
    model_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    unpriced_calls: int = 0
    saved_calls: int = 0  # completions read back at a resume instead of re-asked
    saved_usd: float = 0.0
    spent: list[float] = field(default_factory=list)  # cost of each completion so far
    keys_returned: set[str] = field(default_factory=set)
    keys_requested: dict[str, str] = field(default_factory=dict)  # call id -> key
    last_at: datetime | None = None
    broken: bool = False  # a gap or conflict: the fold stops here
    chain: ChainCheck | None = None
    unprojected: list[int] = field(default_factory=list)  # seqs without a row
    parent: str | None = None  # a child run's parent (sub-agents)
    children: list[str] = field(default_factory=list)  # the child runs it started


@dataclass
class AuditReport:
    runs: dict[str, RunAudit]
    events: int
    seconds: float
    fenced_writes: int = 0  # events of fenced workers (zombies) the log left out

    def tree_cost(self, run_id: str, depth: int = 0) -> float:
        """A run's cost with its child runs' (sub-agents) that the topic has."""
        run = self.runs.get(run_id)
        if run is None or depth > 8:
            return 0.0
        return run.cost_usd + sum(self.tree_cost(c, depth + 1) for c in run.children)

    def to_json(self) -> dict[str, Any]:
        agents: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        waiting: Counter[str] = Counter()
        for r in self.runs.values():
            a = agents[r.agent or "?"]
            a["runs"] += 1
            a["model_calls"] += r.model_calls
            a["prompt_tokens"] += r.prompt_tokens
            a["completion_tokens"] += r.completion_tokens
            a["cost_usd"] += r.cost_usd
            a["saved_usd"] += r.saved_usd
            if r.state is not None and r.state.status in ("paused", "blocked"):
                reason = r.state.waiting.reason if r.state.waiting else "?"
                waiting[f"{r.state.status}:{reason}"] += 1
        problems = {r.run_id: r.problems for r in self.runs.values() if r.problems}
        dangling = {r.run_id: r.dangling for r in self.runs.values() if r.dangling}
        return {
            "runs": len(self.runs),
            "events": self.events,
            "fenced_writes_left_out": self.fenced_writes,
            "seconds": round(self.seconds, 3),
            "events_per_s": round(self.events / max(self.seconds, 1e-9)),
            "statuses": dict(
                Counter(
                    r.state.status if r.state else "unfoldable"
                    for r in self.runs.values()
                )
            ),
            "waiting": dict(waiting),
            "problems": problems,
            "problem_count": sum(len(p) for p in problems.values()),
            "dangling_intentions": dangling,
            "projection_behind": sum(r.projection_behind for r in self.runs.values()),
            "cost": {
                "total_usd": round(sum(r.cost_usd for r in self.runs.values()), 6),
                "model_calls": sum(r.model_calls for r in self.runs.values()),
                "unpriced_calls": sum(r.unpriced_calls for r in self.runs.values()),
                "saved_by_resume_calls": sum(r.saved_calls for r in self.runs.values()),
                "saved_by_resume_usd": round(
                    sum(r.saved_usd for r in self.runs.values()), 6
                ),
                "per_agent": {
                    name: {
                        k: round(v, 6) if k.endswith("usd") else int(v)
                        for k, v in values.items()
                    }
                    for name, values in sorted(agents.items())
                },
                "per_run": {
                    r.run_id: {
                        "agent": r.agent,
                        **({"parent": r.parent} if r.parent else {}),
                        **(
                            {
                                "children": r.children,
                                "tree_cost_usd": round(self.tree_cost(r.run_id), 6),
                            }
                            if r.children
                            else {}
                        ),
                        "model_calls": r.model_calls,
                        "prompt_tokens": r.prompt_tokens,
                        "completion_tokens": r.completion_tokens,
                        "cost_usd": round(r.cost_usd, 6),
                        "saved_usd": round(r.saved_usd, 6),
                    }
                    for r in self.runs.values()
                },
            },
        }


def audit(
    log: EventLog,
    projections: Projections,
    ledger: EffectLedger,
    *,
    events_topic: str,
    partitions: int,
    prices: Mapping[str, ModelPrice],
    run_prefix: str = "",
    since: datetime | None = None,
    progress: Callable[[int, float], None] | None = None,
    purged: Mapping[str, Callable[[bytes], list[str]]] | None = None,
    keyring: Keyring | None = None,
) -> AuditReport:
    """``purged``: the runs whose projection rows were purged, each with the check
    of its archive against the log's head of its chain (``es_agents.retention``):
    their rows are not looked for, their archive is checked instead. ``keyring``:
    the approvers' keys, to verify again every signed approval the log keeps."""
    started = time.perf_counter()
    runs: dict[str, RunAudit] = {}
    count = 0
    # The projection as it is before the log is read: a row the projector writes
    # meanwhile is newer than the log as read, and is not compared.
    snapshots = projections.snapshot_states(run_prefix)
    digests = projections.event_digests(run_prefix)
    left_out = getattr(log, "left_out_records", None)
    seen_left_out = len(left_out) if left_out is not None else 0
    authored = getattr(log, "authored", None)
    gone = purged or {}
    for partition in range(partitions):
        for record in log.read_partition(events_topic, partition):
            count += 1
            if progress is not None and count % 100_000 == 0:
                progress(count, time.perf_counter() - started)
            if record.key is None or not record.key.startswith(run_prefix):
                continue
            if authored is not None and not authored((record.headers, record.value)):
                log.left_out(record)  # type: ignore[attr-defined]
                continue
            run = runs.get(record.key)
            if run is None:
                run = runs[record.key] = RunAudit(record.key)
                run.chain = ChainCheck(record.key)
            chain = run.chain
            assert chain is not None  # noqa: S101 - set with the run
            try:
                event = log.decode_event(record.value)
                if record.key not in gone:  # a purged run's payloads: its archive's
                    event = log.restore(event)
            except EsAgentsError as e:
                # Not a link of the chain: the next event names the one before it.
                run.problems.append(
                    f"{partition}@{record.offset}: undecodable, left out: {e}"
                )
                continue
            broken = chain.add(event, record.value)
            if broken is not None:
                run.problems.append(f"{partition}@{record.offset}: {broken}")
            _apply(run, event, prices)
            _check_signed(run, event, keyring)
            _check_projected(run, event, chain.head, digests, snapshots)
    # Records the reads left out as not written by a worker, reported by run.
    for gone in list(left_out or [])[seen_left_out:]:
        if gone.key is not None and gone.key.startswith(run_prefix):
            run = runs.get(gone.key) or runs.setdefault(gone.key, RunAudit(gone.key))
            run.problems.append(f"{gone.partition}@{gone.offset}: left out: {gone.why}")
    _check_rows_left(runs, digests)
    if since is not None:
        runs = {k: r for k, r in runs.items() if r.last_at and r.last_at >= since}
    _check_runs(runs, projections, ledger, run_prefix, purged or {})
    fenced: Mapping[int, int] = getattr(log, "fenced_writes", {})
    return AuditReport(runs, count, time.perf_counter() - started, sum(fenced.values()))


def _check_projected(
    run: RunAudit,
    event: Event,
    digest_of_event: bytes,
    digests: dict[str, dict[int, bytes | None]],
    snapshots: Mapping[str, tuple[int, object]],
) -> None:
    """The event has its ``run_events`` row, its bytes where the projection
    keeps them (``run_tails``) are the log's, and the run's latest snapshot, when
    taken at this event, is the fold of the log up to it."""
    runs_digests = digests.get(run.run_id, {})
    if event.seq not in runs_digests:
        run.unprojected.append(event.seq)  # a deleted row, if the projector passed it
        row = None
    else:
        row = runs_digests.pop(event.seq)
    if row is not None and row != digest_of_event:
        run.problems.append(
            f"run_tails seq {event.seq}: the row's bytes are not the log's "
            "(changed in Postgres)"
        )
    snapshot = snapshots.get(run.run_id)
    if snapshot is not None and snapshot[0] == event.seq and run.state is not None:
        folded = json.loads(
            json.dumps(to_snapshot(run.state, inline=False), default=str)
        )
        found = first_difference(
            f"run_snapshots@{event.seq}", snapshot[1], folded, projection_first=True
        )
        if found is not None:
            run.problems.append(found)


def _check_rows_left(
    runs: dict[str, RunAudit], digests: dict[str, dict[int, bytes | None]]
) -> None:
    """Rows of ``run_events`` with no event of that seq in the log (added), and
    events the projector passed with no row (deleted)."""
    for run in runs.values():
        for seq in sorted(digests.get(run.run_id, {})):
            run.problems.append(
                f"run_events seq {seq}: a row with no such event in the log (added)"
            )


def _check_signed(run: RunAudit, event: Event, keyring: Keyring | None) -> None:
    """A signed approval, verified again from the log: each signature kept with
    the decision against its approver's registered key, over the pause it answered
    and the arguments decided. (Which gates want signatures is the agents' code,
    which the audit does not load: a worker refuses an unsigned approval there.)"""
    if (
        keyring is None
        or run.broken
        or not isinstance(event, Resumed)
        or not event.signature
    ):
        return
    state = run.state
    resume = state.last_resume if state is not None else None
    if state is None or resume is None or resume.gate is None:
        return
    decided = state.gate_decisions.get(resume.gate, {})
    why = unproven(
        run.run_id,
        resume.gate,
        decided,
        ApprovalPolicy(signed=True),
        key_of=keyring.get,
        verifies=verify,
    )
    if why is not None:
        run.problems.append(f"seq {event.seq}: a signed approval: {why}")


def _apply(run: RunAudit, event: Event, prices: Mapping[str, ModelPrice]) -> None:
    run.last_at = event.at
    if run.broken:
        return
    state = run.state
    last = state.seq if state is not None else -1
    if event.seq <= last:
        run.problems.append(f"seq {event.seq}: appears again after seq {last}")
        run.broken = True
        return
    if event.seq > last + 1:
        run.problems.append(f"seq {last + 1}..{event.seq - 1}: missing (gap)")
        run.broken = True
        return
    try:
        run.state = fold(state if state is not None else RunState(run.run_id), event)
    except EsAgentsError as e:
        run.problems.append(f"seq {event.seq}: does not fold: {e}")
        run.broken = True
        return
    if isinstance(event, RunStarted):
        run.agent = event.agent
        run.parent = event.parent_run_id
    elif isinstance(event, StatePatched) and event.key.startswith(CHILD_PREFIX):
        run.children.append(str(json.loads(event.value_json)))
    elif isinstance(event, ModelResponded):
        usage = event.usage
        run.model_calls += 1
        run.prompt_tokens += usage.prompt_tokens
        run.completion_tokens += usage.completion_tokens
        price = prices.get(event.model_id)
        cost = (
            price.cost(usage.prompt_tokens, usage.completion_tokens) if price else 0.0
        )
        run.unpriced_calls += price is None
        run.cost_usd += cost
        run.spent.append(cost)
    elif isinstance(event, Resumed):
        run.saved_calls += len(run.spent)
        run.saved_usd += sum(run.spent)
    elif isinstance(event, ToolCallRequested):
        run.keys_requested[event.call_id] = event.idempotency_key
    elif isinstance(event, ToolReturned):
        key = run.keys_requested.get(event.call_id)
        if key is not None:
            run.keys_returned.add(key)


def _check_ledger(
    runs: dict[str, RunAudit], ledger: EffectLedger, run_prefix: str
) -> None:
    """A claim in the ledger whose run ended without recording the outcome."""
    for key, run_id, status in ledger.entries(run_prefix):
        run = runs.get(run_id)
        if run is None or run.broken or key in run.keys_returned:
            continue
        waiting = run.state.waiting if run.state else None
        if waiting is not None and waiting.reason == "uncertain_effect":
            continue  # the run already waits for a person to settle it
        if run.state is not None and run.state.status != "running":
            run.problems.append(
                f"effect {key}: {status} in the ledger, no outcome in the log"
            )


def _check_runs(
    runs: dict[str, RunAudit],
    projections: Projections,
    ledger: EffectLedger,
    run_prefix: str,
    purged: Mapping[str, Callable[[bytes], list[str]]],
) -> None:
    _check_ledger(runs, ledger, run_prefix)
    rows = projections.run_rows(run_prefix)
    for run in runs.values():
        state = run.state
        if state is None or run.broken:
            continue
        check_archive = purged.get(run.run_id)
        if check_archive is not None:  # its rows purged: its archive holds them
            run.problems += check_archive(run.chain.head if run.chain else b"")
            run.unprojected.clear()
        if state.status == "running" and isinstance(state.pending, PendingToolCall):
            run.dangling = (
                f"tool call {state.pending.idempotency_key} (seq "
                f"{state.pending.seq}): reconciled by key when the run resumes"
            )
        elif state.status == "running" and isinstance(state.pending, PendingModelCall):
            run.dangling = (
                f"model call (seq {state.pending.seq}): asked again when it resumes"
            )
        row = rows.get(run.run_id)
        if row is None:
            continue  # not projected (yet)
        seq = int(str(row["last_seq"]))
        deleted = [n for n in run.unprojected if n <= seq]
        if deleted:
            run.problems.append(
                f"run_events: no row for seq {', '.join(map(str, deleted[:10]))} "
                "though the projector passed it (deleted in Postgres)"
            )
        if seq == state.seq:
            columns = dict(row)
            head = run.chain.head if run.chain else b""
            found = head_difference(columns.pop("head", None), head)
            found = found or first_difference("runs", columns, run_row(state), True)
            if found is not None:
                run.problems.append(found)
        elif seq < state.seq:
            run.projection_behind = True
        else:
            run.problems.append(
                f"runs.last_seq: projection {seq}, log ends at {state.seq}"
            )
