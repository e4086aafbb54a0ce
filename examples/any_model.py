"""The research agent on a real model: any OpenAI-compatible endpoint (OpenAI, vLLM,
Ollama, llama.cpp's server, a LiteLLM proxy) or Anthropic's Messages API, from env:

    ES_AGENTS_MODEL_PROVIDER=openai            # or anthropic
    ES_AGENTS_MODEL_BASE_URL=http://127.0.0.1:11434/v1   # unset: the provider's API
    ES_AGENTS_MODEL_NAME=llama3.1
    ES_AGENTS_MODEL_API_KEY=...                # if the endpoint wants one

    es-agents worker --agent examples.any_model:agent
    es-agents start research-live --input '{"topic": "durable agents"}'
"""

from __future__ import annotations

from es_agents.agent import ToolAgent
from es_agents.app import build_model
from es_agents.lab import research


def agent() -> ToolAgent:
    """Built when the worker loads it, so the model settings are read then."""
    return ToolAgent(
        name="research-live",
        system_prompt=research.agent.system_prompt,
        model=build_model(),
        tool_list=[research.search, research.create_ticket],
    )
