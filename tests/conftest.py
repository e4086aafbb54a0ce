"""Shared fixtures. Integration tests run against the real stack that `dev up` starts.

Every test session gets its own topic prefix and database, so reruns never collide.
A missing service fails the session; nothing is skipped.
"""

from __future__ import annotations

import base64
import faulthandler
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from es_agents.settings import KafkaSettings

SESSION = uuid.uuid4().hex[:8]

# The writer key (ES_AGENTS_WRITER_KEY) of this session: every worker, projector and
# CLI command the tests start reads it from the environment, and logs the tests build
# by hand sign what they append with it, as a worker would (``signing_logs``). Tests
# of the default -- the key kept in Postgres -- remove it from their environment.
WRITER_KEY = base64.b64encode(os.urandom(32)).decode()
os.environ.setdefault("ES_AGENTS_WRITER_KEY", WRITER_KEY)


# Where a test still running after STUCK_AFTER seconds leaves every thread's stack
# (pytest-timeout ends it at 600 s; under pytest-xdist the stacks it prints are lost
# with the worker process). A file left here names a test that was stuck.
STACKS = Path(
    os.environ.get("ES_AGENTS_TEST_STACKS")
    or Path(tempfile.gettempdir()) / "es-agents-test-stacks"
)
STUCK_AFTER = 540


@pytest.fixture(autouse=True)
def stacks_if_stuck(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every thread's stack written to a file (faulthandler's own thread, so even a
    thread holding the GIL cannot stop it) when the test runs past STUCK_AFTER; the
    file is removed when the test ends in time."""
    STACKS.mkdir(parents=True, exist_ok=True)
    name = request.node.nodeid.replace("/", "_").replace("::", "--")[-150:]
    path = STACKS / f"{os.getpid()}-{name}.txt"
    with path.open("w") as out:
        out.write(f"{request.node.nodeid}: still running after {STUCK_AFTER} s\n")
        out.flush()
        faulthandler.dump_traceback_later(STUCK_AFTER, file=out)
        native = threading.Timer(STUCK_AFTER + 5, _native_stacks, (path,))
        native.daemon = True
        native.start()
        try:
            yield
        finally:
            faulthandler.cancel_dump_traceback_later()
            native.cancel()
    path.unlink(missing_ok=True)


def _native_stacks(path: Path) -> None:
    """Every thread's C stack too (gdb, where there is one): a thread stuck in a
    C library shows nothing below its last Python line in faulthandler's dump. Run
    from a Python thread, so it needs the GIL: no native stacks in the file means
    a thread held the GIL throughout."""
    gdb = shutil.which("gdb")
    if gdb is None:
        return
    found = subprocess.run(
        [gdb, "-p", str(os.getpid()), "-batch", "-ex", "thread apply all bt 40"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    with path.open("a") as out:
        out.write("\nnative stacks (gdb):\n" + found.stdout[-60000:])


@pytest.fixture(autouse=True)
def signing_logs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Logs built by hand in tests (``KafkaEventLog(settings)``) sign their appends
    with the session's writer key; the composition root sets it on the others."""
    from es_agents.adapters.coded_log import CodedLog  # noqa: PLC0415
    from es_agents.core.authorship import Authenticator  # noqa: PLC0415

    key = os.environ.get("ES_AGENTS_WRITER_KEY")
    if key is None:
        return
    auth = Authenticator({"set": base64.b64decode(key)}, "set")
    init = CodedLog.__init__

    def signing_init(self: CodedLog, *args: object, **kwargs: object) -> None:
        init(self, *args, **kwargs)  # type: ignore[arg-type]
        self.auth = auth

    monkeypatch.setattr(CodedLog, "__init__", signing_init)


@pytest.fixture(scope="session")
def dev_stack() -> object:
    from es_agents.dev import DevStack  # noqa: PLC0415

    stack = DevStack()
    stack.up(log=lambda _line: None)
    return stack


@pytest.fixture(scope="session")
def database_url(dev_stack: object) -> Iterator[str]:
    from es_agents.dev import DevStack  # noqa: PLC0415

    assert isinstance(dev_stack, DevStack)
    from tests.test_support import migrated_database  # noqa: PLC0415

    name = f"es_test_{SESSION}"
    # Migrated now, not by whichever test happens to run first in this process
    # (tests run in several processes, each with its own session database).
    url = migrated_database(dev_stack, name)
    yield url
    dev_stack.postgres.drop_database(name)


@pytest.fixture
def kafka_settings(
    dev_stack: object, request: pytest.FixtureRequest
) -> Iterator[KafkaSettings]:
    """Settings with a topic prefix unique to this test (and this session); its
    topics are deleted after the test (a broker keeping every test's topics grows
    slower to start with each `make test`)."""
    from es_agents.adapters.kafka_admin import delete_topics, ensure_topics  # noqa: PLC0415
    from es_agents.dev import DevStack  # noqa: PLC0415

    assert isinstance(dev_stack, DevStack)
    full = request.node.name
    digest = hashlib.sha256(full.encode()).hexdigest()[:6]
    name = full.replace("[", "-").replace("]", "")[:50] + "-" + digest
    replicas, min_isr = dev_stack.dev.replication  # a cluster: replicated topics
    settings = KafkaSettings(
        bootstrap_servers=dev_stack.dev.kafka_bootstrap,
        topic_prefix=f"t{SESSION}.{name}",
        partitions=int(os.environ.get("ES_AGENTS_TEST_PARTITIONS", "3")),
        replication_factor=replicas,
        min_insync_replicas=min_isr,
    )
    ensure_topics(settings)
    yield settings
    delete_topics(settings, timeout=10)
