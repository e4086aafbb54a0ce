"""`es-agents upgrade check` on the real stack: runs paused under the code of today,
checked against the code about to ship -- the same code, a new prompt (allowed and
recorded), a new agent version with and without its migration, new tool schemas
(refused), a fold rule changed -- and a projection that no longer matches the fold."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from es_agents.dev import DevStack
from es_agents.lab.demo import cli
from tests.integration.test_commands import until, worker

pytestmark = pytest.mark.integration


@pytest.fixture
def own_db(dev_stack: DevStack, env: dict[str, str]) -> Iterator[dict[str, str]]:
    """The env with a database of its own (the runs table is per database)."""
    name = f"es_upgrade_{uuid.uuid4().hex[:10]}"
    dev_stack.postgres.create_database(name)
    url = dev_stack.dev.database_url.rsplit("/", 1)[0] + f"/{name}"
    yield {**env, "ES_AGENTS_DATABASE_URL": url}
    dev_stack.postgres.drop_database(name)


def _check(env: dict[str, str], agent: str, code: int) -> dict[str, object]:
    spec = agent if ":" in agent else f"tests.agents:{agent}"
    done = cli(env, "upgrade", "check", "--agent", spec, "-o", "json")
    assert done.returncode == code, (done.stdout[-2000:], done.stderr[-2000:])
    report = json.loads(done.stdout)
    assert isinstance(report, dict)
    return report


def test_the_check_says_what_new_code_would_do_with_runs_in_flight(
    own_db: dict[str, str],
) -> None:
    env = own_db
    runs = []
    with worker(env, "tests.agents:gated"):
        for n in range(2):
            started = cli(env, "start", "research", "--input", f'{{"topic": "u{n}"}}')
            assert started.returncode == 0, started.stderr
            runs.append(started.stdout.strip())
        for run in runs:
            until(lambda r=run: "paused" in cli(env, "status", r).stdout,  # type: ignore[misc]
                  what="the gate")  # fmt: skip
    assert cli(env, "projector", "--until-caught-up").returncode == 0
    assert _check(env, "gated", 0)["decisions"] == {"same": 2}
    prompt = _check(env, "gated_new_prompt", 0)
    assert prompt["decisions"] == {"verbatim": 2}
    assert "prompt_hash" in json.dumps(prompt["verdicts"])
    assert _check(env, "gated_v2_migrating", 0)["decisions"] == {"migrate": 2}
    refused = _check(env, "gated_new_tools", 1)
    assert refused["decisions"] == {"refuse": 2}
    assert refused["failing"] == 2
    assert "tools_hash" in json.dumps(refused["verdicts"])
    assert _check(env, "gated_v2", 1)["decisions"] == {"refuse": 2}  # no migration
    # A fold rule changed where the reducer version does not see it (patched at
    # import): the version gate lets the runs go on, the fold tells them apart.
    changed = _check(env, "tests.changed_fold:gated", 1)
    assert changed["decisions"] == {"same": 2}
    assert changed["failing"] == 2
    assert all("prompt_tokens" in str(v["differs"]) for v in changed["verdicts"])  # type: ignore[attr-defined]
    # A fold that says otherwise than the projection (here: the projection edited,
    # as a changed fold rule would leave it) fails the check, naming the run.
    with psycopg.connect(env["ES_AGENTS_DATABASE_URL"], autocommit=True) as conn:
        conn.execute("UPDATE runs SET step = step + 5 WHERE run_id = %s", (runs[0],))
    differs = _check(env, "gated", 1)
    assert differs["failing"] == 1
    verdicts = differs["verdicts"]
    assert isinstance(verdicts, list)
    (bad,) = [v for v in verdicts if v["differs"]]
    assert bad["run_id"] == runs[0]
    assert "step" in bad["differs"]
    text = cli(env, "upgrade", "check", "--agent", "tests.agents:gated")
    assert text.returncode == 1
    assert "2 runs of 'research' not finished: 2 same; 1 would not go on" in text.stderr
