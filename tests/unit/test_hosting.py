"""``es_agents.serve``'s keeping: a member that lost a service is built again after
a backoff, a configuration error stops every member and is raised, and ``stop``
ends them all -- with members that stand for a worker and a projector."""

from __future__ import annotations

import threading
import time

import pytest

from es_agents.errors import ConfigError, Unavailable
from es_agents.hosting import Member, Serving
from tests.integration.test_commands import until


class Flaky:
    """Fails ``outages`` times at run, then runs until stopped."""

    built = 0

    def __init__(self, outages: list[int]) -> None:
        self._outages = outages
        self._stop = threading.Event()

    def run(self) -> None:
        if self._outages[0] > 0:
            self._outages[0] -= 1
            raise Unavailable("Kafka at 127.0.0.1:9 did not answer")
        self._stop.wait()

    def stop(self) -> None:
        self._stop.set()


def test_a_member_that_lost_a_service_is_built_again() -> None:
    outages = [2]
    built: list[Member] = []

    def build() -> Member:
        member = Flaky(outages)
        built.append(member)
        return member

    serving = Serving({"worker": build, "projector": lambda: Flaky([0])}, 0.01)
    until(lambda: serving.states["worker"].state == "up" and len(built) == 3, 10)
    assert serving.states["worker"].restarts == 2
    assert serving.states["projector"].restarts == 0
    serving.stop(10)
    assert {s.state for s in serving.states.values()} == {"stopped"}


def test_a_configuration_error_stops_everything_and_is_raised() -> None:
    def broken() -> Member:
        raise ConfigError("database es_nope does not exist (createdb es_nope)")

    serving = Serving({"worker": broken, "projector": lambda: Flaky([0])}, 0.01)
    started = time.monotonic()
    with pytest.raises(ConfigError, match="es_nope"):
        serving.wait()
    assert time.monotonic() - started < 10
    assert serving.states["worker"].state == "failed"
    assert not serving.running
