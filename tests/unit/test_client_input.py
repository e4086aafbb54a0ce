"""A client takes a run's input as JSON text, any JSON value or a pydantic model,
and refuses what is not JSON before anything is sent."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

from es_agents.client import Client, as_json
from es_agents.errors import InvalidInput
from es_agents.testing import AgentHarness
from tests.unit.test_vault import Asker


class Plain(Asker):
    """Asker, in clear: its input is read back from the state as given."""

    name = "plain"
    encrypted = False


class Topic(BaseModel):
    topic: str
    depth: int = 1


def test_inputs_of_every_kind_reach_the_run(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    h = es_harness(Plain())
    client = Client(h.settings, ports=h.ports)
    for given, expected in (
        ('{"topic": "text"}', {"topic": "text"}),
        ({"topic": "dict"}, {"topic": "dict"}),
        (Topic(topic="model"), {"topic": "model", "depth": 1}),
        ([1, 2], [1, 2]),
    ):
        run_id = client.start("plain", given, wait=0).run_id
        h.run()
        assert json.loads(h.state(run_id).input_json) == expected
    answer = client.provide_input(run_id, "ann", Topic(topic="answer"), wait=0)
    assert answer.status == "queued"
    h.run()
    assert h.state(run_id).status == "completed"


def test_what_is_not_json_is_refused_before_it_is_sent(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    h = es_harness(Plain())
    client = Client(h.settings, ports=h.ports)
    with pytest.raises(InvalidInput, match="not JSON text"):
        client.start("plain", "{not json", run_id="bad-1", wait=0)
    with pytest.raises(InvalidInput, match="not a JSON value"):
        client.start("plain", {"when": object()}, run_id="bad-2", wait=0)
    with pytest.raises(InvalidInput, match="not a JSON value"):
        as_json(float("nan"), "the input")
    assert client.start("plain", "{}", run_id="bad-1", wait=0).status != "refused"
