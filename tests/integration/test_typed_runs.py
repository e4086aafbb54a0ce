"""A typed agent on the real stack: `start` with an input that does not fit the
input model is refused with the reasons (exit 1, nothing started); a fitting one
completes, its first answer sent back for not fitting the output model, and the
output reads back typed through the client."""

from __future__ import annotations

import pytest

from es_agents.client import Client
from es_agents.lab.demo import cli
from es_agents.settings import KafkaSettings, Settings
from tests.agents import TriageOut
from tests.integration.test_commands import worker

pytestmark = pytest.mark.integration


def test_a_typed_agent_checks_its_input_and_types_its_output(
    env: dict[str, str], kafka_settings: KafkaSettings, database_url: str
) -> None:
    with worker(env, "tests.agents:triage"):
        bad = cli(env, "start", "triage", "--input", '{"title": "x"}')
        assert bad.returncode == 1, bad.stderr
        assert "does not fit TicketIn" in bad.stderr
        assert "priority: Field required" in bad.stderr
        good = cli(env, "start", "triage", "--input", '{"title": "x", "priority": 1}')
        assert good.returncode == 0, good.stderr
        run = good.stdout.strip()
        settings = Settings(kafka=kafka_settings, database_url=database_url)
        with Client(settings) as client:
            done = client.wait(run, until=("completed", "failed"), timeout=60)
            assert done.status == "completed", done.state and done.state.error
            assert done.output_as(TriageOut) == TriageOut(team="ops", urgent=True)
            assert done.state is not None
            assert done.state.model_calls == 2  # the first answer did not fit
