"""One run's failure is that run's alone: on one partition, 20 healthy runs beside one
poisoned run of each kind. The healthy runs complete, each poisoned run ends with its
reason in the log, the worker never exits on its own, and a restarted worker does not
loop on the poisoned runs."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from es_agents.adapters.kafka_admin import ensure_topics
from es_agents.client import Client
from es_agents.core import replay
from es_agents.core.events import RunFailed, RunStarted
from es_agents.lab.demo import run_worker
from es_agents.settings import KafkaSettings, Settings
from tests.integration.test_runtime import _events
from tests.model_server import model_server

pytestmark = pytest.mark.integration

POISONS = {
    "model_error": ("failed", "model_error: model refused the call"),
    "unparsable": ("failed", "model_error: unparsable model response"),
    "oversized": ("failed", "oversized_output: model_responded of"),
    "planner": ("failed", "planner_error: ValueError: the planner has a bug"),
    "reducer": ("failed", "reducer_error: StatePatched does not fold"),
}


@pytest.fixture
def model_url() -> Iterator[str]:
    with model_server() as url:
        yield url


def test_poisoned_runs_end_alone_and_the_worker_serves_the_rest(
    env: dict[str, str],
    kafka_settings: KafkaSettings,
    database_url: str,
    model_url: str,
) -> None:
    one = KafkaSettings(
        bootstrap_servers=kafka_settings.bootstrap_servers,
        topic_prefix=kafka_settings.topic_prefix + ".one",
        partitions=1,
    )
    ensure_topics(one)
    env = {
        **env,
        "ES_AGENTS_TOPIC_PREFIX": one.topic_prefix,
        "ES_AGENTS_PARTITIONS": "1",
        "ES_AGENTS_TEST_MODEL_URL": model_url,
        # No object store: a 2 MB completion cannot be claim-checked, so it is
        # too large for the log (with one, it travels by reference: test_payloads).
        "ES_AGENTS_PAYLOADS": "off",
    }
    settings = Settings(kafka=one, database_url=database_url)
    healthy: list[str] = []
    poisoned: dict[str, str] = {}
    with Client(settings) as client:
        for n in range(20):
            healthy.append(client.start("poison", json.dumps({"n": n}), wait=0).run_id)
            if n % 3 == 0 and len(poisoned) < len(POISONS) + 1:
                kind = [*POISONS, "tool_timeout"][len(poisoned)]
                run = client.start("poison", json.dumps({"poison": kind}), wait=0)
                poisoned[kind] = run.run_id

    done = run_worker(env, agent="tests.agents:poison", instance_id="", timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "worker task failed" not in done.stderr

    finished: list[float] = []
    for run_id in healthy:
        events = _events(one, run_id)
        assert replay(events).status == "completed", run_id
        finished.append(events[-1].at.timestamp())
    ended_in: dict[str, float] = {}
    for kind, (status, reason) in POISONS.items():
        events = _events(one, poisoned[kind])
        state = replay(events)
        assert state.status == status, (kind, state.error)
        assert state.error is not None
        assert state.error.startswith(reason), (kind, state.error)
        last = events[-1]
        assert isinstance(last, RunFailed)
        assert last.kind == reason.split(":")[0]
        assert isinstance(events[0], RunStarted)
        ended_in[kind] = (last.at - events[0].at).total_seconds()
    hung = replay(_events(one, poisoned["tool_timeout"]))
    assert hung.status == "paused"
    assert hung.waiting is not None
    assert hung.waiting.reason == "uncertain_effect"
    assert json.loads(hung.waiting.detail_json)["why"] == "timed out after 1.0 s"

    # A restarted worker does not take the poisoned runs up again.
    before = {k: len(_events(one, r)) for k, r in poisoned.items()}
    again = run_worker(env, agent="tests.agents:poison", instance_id="", timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    assert {k: len(_events(one, r)) for k, r in poisoned.items()} == before

    span = max(finished) - min(e.at.timestamp() for e in [_events(one, healthy[0])[0]])
    print(  # the figures for the record (pytest -s)
        json.dumps(
            {
                "poisoned_run_ended_in_s": {
                    k: round(v, 3) for k, v in ended_in.items()
                },
                "healthy_runs": len(healthy),
                "healthy_runs_per_s": round(len(healthy) / span, 1),
            }
        )
    )
