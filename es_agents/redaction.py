"""Secrets: fields a tool marks secret never reach the log, the projections or a
screen in plain text, and tools still receive the real value.

A field typed ``SecretStr`` in a tool's arguments model, or a ``SecretStr`` in what a
tool returns, is written as a token: ``sec1:`` + the value encrypted under the run's
data key (``es_agents.vault``). The model, the transcript, approvers and the CLI see
the token -- so a model can hand a secret from one tool to the next without ever
seeing it -- and the worker opens the tokens of a tool's secret fields just before
the call (only those: a token in any other field reaches the tool as the token).
``es-agents forget`` destroys the key, and with it every secret of the run.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Mapping
from typing import Any, final

from pydantic import BaseModel, JsonValue, SecretStr

from es_agents.core.events import ToolCall
from es_agents.core.step import canonical_json
from es_agents.tools import Tool
from es_agents.vault import Cipher

SECRET = "sec1:"  # noqa: S105 - a prefix, not a password


def secret_fields(model: type[BaseModel]) -> frozenset[str]:
    """The fields of ``model`` typed ``SecretStr`` (or ``SecretStr | None``)."""
    found = set()
    for name, info in model.model_fields.items():
        annotation = info.annotation
        options = (
            typing.get_args(annotation)
            if typing.get_origin(annotation) in (typing.Union, types.UnionType)
            else (annotation,)
        )
        if SecretStr in options:
            found.add(name)
    return frozenset(found)


def has_secrets(agent: object) -> bool:
    tools: Mapping[str, Tool[Any]] = getattr(agent, "tools", {}) or {}
    return any(secret_fields(t.args_model) for t in tools.values())


@final
class Redactor:
    """Seals an agent's secret fields into tokens, and opens them for its tools."""

    def __init__(self, cipher: Cipher, tools: Mapping[str, Tool[Any]]) -> None:
        self.cipher = cipher
        self.secret = {
            name: fields
            for name, tool in tools.items()
            if (fields := secret_fields(tool.args_model))
        }

    def _seal(self, run_id: str, text: str) -> str:
        if text.startswith(SECRET):
            return text
        return SECRET + self.cipher.encrypt_text(run_id, text).removeprefix("enc1:")

    def seal_calls(
        self, run_id: str, calls: tuple[ToolCall, ...]
    ) -> tuple[ToolCall, ...]:
        """A model's tool calls with their secret arguments sealed."""
        out = []
        for call in calls:
            fields = self.secret.get(call.name)
            if fields:
                try:
                    args = json.loads(call.args_json)
                except json.JSONDecodeError:
                    args = None
                if isinstance(args, dict):
                    for name in fields & args.keys():
                        if isinstance(args[name], str):
                            args[name] = self._seal(run_id, args[name])
                    out.append(
                        call.model_copy(update={"args_json": canonical_json(args)})
                    )
                    continue
            out.append(call)
        return tuple(out)

    def seal_result(self, run_id: str, value: Any) -> JsonValue:
        """A tool's result as JSON, each ``SecretStr`` in it sealed."""
        if isinstance(value, SecretStr):
            return self._seal(run_id, value.get_secret_value())
        if isinstance(value, BaseModel):
            return self.seal_result(run_id, value.model_dump(mode="python"))
        if isinstance(value, dict):
            return {str(k): self.seal_result(run_id, v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.seal_result(run_id, v) for v in value]
        sealed: JsonValue = value
        return sealed

    def open_args(
        self, run_id: str, tool: str, args: dict[str, JsonValue]
    ) -> dict[str, JsonValue]:
        """A tool's arguments with the tokens of its secret fields opened (what the
        tool receives). A token anywhere else stays a token: a secret handed to a
        tool in a field not declared secret (one that echoes it, say) would reach
        the log, the transcript and the model in plain text."""
        fields = self.secret.get(tool, frozenset())
        return {
            name: self._open(run_id, value) if name in fields else value
            for name, value in args.items()
        }

    def _open(self, run_id: str, value: Any) -> Any:
        if isinstance(value, str) and value.startswith(SECRET):
            return self.cipher.decrypt_text(run_id, "enc1:" + value[len(SECRET) :])
        return value
