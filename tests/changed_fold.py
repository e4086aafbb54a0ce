"""The research agent of ``tests.agents`` under a fold that counts a model answer's
prompt tokens twice: the code an upgrade would ship when a fold rule changed in a
way the reducer version does not see (the rule is patched at import, the fold's
source is untouched). Imported only by the process checking the upgrade."""

from __future__ import annotations

import importlib

from es_agents.core.events import ModelResponded
from es_agents.core.state import RunState
from tests.agents import gated

# The module, not the function ``es_agents.core`` exports under the same name.
folding = importlib.import_module("es_agents.core.fold")

_responded = folding._apply.dispatch(ModelResponded)


def _counted_twice(event: ModelResponded, state: RunState) -> None:
    _responded(event, state)
    state.prompt_tokens += event.usage.prompt_tokens


folding._apply.register(ModelResponded, _counted_twice)


__all__ = ["gated"]
