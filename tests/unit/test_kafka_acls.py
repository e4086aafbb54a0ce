"""The ACLs of a topic prefix (``adapters.kafka_acls.grants``): only the worker
writes events; the client writes commands and nothing else; the projector writes
dead letters; every binding stays inside the prefix."""

from __future__ import annotations

import pytest

from es_agents.adapters.kafka_acls import grants
from es_agents.errors import ConfigError
from es_agents.settings import KafkaSettings

S = KafkaSettings(topic_prefix="shop")
ROLES = {"worker": "User:w", "client": "User:c", "projector": "User:p"}


def _writes(principal: str) -> set[str]:
    return {
        g.name
        for g in grants(S, **ROLES)
        if g.principal == principal and g.operation == "WRITE" and g.resource == "topic"
    }


def test_only_the_worker_writes_events() -> None:
    assert _writes("User:w") == {"shop.events", "shop.commands", "shop.dlq",
                                 "shop.stream"}  # fmt: skip
    assert _writes("User:c") == {"shop.commands"}
    assert _writes("User:p") == {"shop.dlq"}


def test_every_binding_stays_in_the_prefix() -> None:
    for g in grants(S, **ROLES):
        assert g.name.startswith("shop.") or g.resource == "cluster", g
        assert g.pattern == "literal" or g.name == "shop.", g
        g.binding()  # each makes a valid AclBinding


def test_a_principal_is_user_name() -> None:
    with pytest.raises(ConfigError, match="User:NAME"):
        grants(S, worker="w", client="User:c", projector="User:p")
