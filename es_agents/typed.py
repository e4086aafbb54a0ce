"""Typed agents: a pydantic model for a run's input and one for its output.

The input is checked when the run starts (by the worker applying the start: a
start whose input does not fit is refused with the reasons, for the CLI and the
client alike). The output model is described to the model in the system prompt;
the final answer must be one JSON object that fits it, else the model is told why
and asked again (``OUTPUT_TRIES`` answers in a row at most, then the run fails with
``kind="output_invalid"``). The run's output is then the object itself, which
``RunView.output_as(Model)`` reads back. Both schemas are part of the version gate's
tools hash: a run does not resume verbatim under other ones.
"""

from __future__ import annotations

import hashlib
import re

from pydantic import BaseModel, ValidationError

from es_agents.core.step import canonical_json

OUTPUT_TRIES = 3
OUTPUT_INVALID = "output_invalid"
_FENCED = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)


def problems(error: ValidationError, whole: str = "value") -> str:
    """A validation error's problems, without the values (some may be secret);
    ``whole``: what a problem of the value as a whole is called."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or whole}: {e['msg']}"
        for e in error.errors(include_url=False, include_input=False)
    )


def input_problem(model: type[BaseModel], input_json: str) -> str | None:
    """Why ``input_json`` is not a valid ``model``, or None."""
    try:
        model.model_validate_json(input_json)
    except ValidationError as e:
        return f"the input does not fit {model.__name__}: {problems(e)}"
    return None


def output_instruction(model: type[BaseModel]) -> str:
    schema = canonical_json(model.model_json_schema())
    return (
        "When you give your final answer, answer with one JSON object and nothing "
        f"else, fitting this JSON Schema ({model.__name__}):\n{schema}"
    )


def parse_output(
    model: type[BaseModel], content: object
) -> tuple[BaseModel | None, str | None]:
    """The final answer as ``model`` (a JSON code fence around it is fine), or
    why it is not one."""
    text = content if isinstance(content, str) else ""
    fenced = _FENCED.match(text)
    if fenced:
        text = fenced.group(1)
    try:
        return model.model_validate_json(text), None
    except ValidationError as e:
        return None, problems(e)


def correction(model: type[BaseModel], why: str) -> str:
    return (
        f"That answer does not fit {model.__name__} ({why}). Answer again with the "
        "JSON object only."
    )


def io_hash(tools: str, input_model: object, output_model: object) -> str:
    """The tools hash with the input and output schemas folded in (unchanged for
    an agent that declares neither)."""
    declared = {
        name: model.model_json_schema()
        for name, model in (("input", input_model), ("output", output_model))
        if isinstance(model, type) and issubclass(model, BaseModel)
    }
    if not declared:
        return tools
    text = tools + canonical_json(declared)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()
