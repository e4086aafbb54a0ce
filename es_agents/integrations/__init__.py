"""Integrations with what agents are built from elsewhere: MCP servers' tools
(``es_agents.integrations.mcp``), Pydantic AI agents
(``es_agents.integrations.pydantic_ai``). Each needs its extra installed
(``pip install 'es-agents[mcp]'``, ``'es-agents[pydantic-ai]'``)."""
