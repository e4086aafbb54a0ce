"""The dev stack's Kafka cluster ids."""

from __future__ import annotations

import base64
import uuid

import pytest

from es_agents.dev import kafka


def test_a_cluster_id_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kafka's storage tool reads an id starting with ``-`` as an option (``dev up``
    failed so in CI, 1 draw in 64): such a draw is drawn again."""
    dashed = uuid.UUID(bytes=b"\xf8" + bytes(15))  # base64url: "-" first
    plain = uuid.UUID(bytes=b"\x01" * 16)
    draws = iter([dashed, plain])
    monkeypatch.setattr(uuid, "uuid4", lambda: next(draws))
    assert base64.urlsafe_b64encode(dashed.bytes).decode().startswith("-")
    made = kafka.new_cluster_id()
    assert made == base64.urlsafe_b64encode(plain.bytes).decode().rstrip("=")
    assert len(made) == 22
