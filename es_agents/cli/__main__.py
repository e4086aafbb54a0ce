"""``python -m es_agents.cli``: the same as ``es-agents``."""

from es_agents.cli import main

main()
