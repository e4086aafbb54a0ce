"""Adapters: each implements a port of ``es_agents.ports`` with one technology."""
