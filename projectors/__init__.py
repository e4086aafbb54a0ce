"""Projectors: consumers of ``es.events`` that materialize Postgres read models."""
