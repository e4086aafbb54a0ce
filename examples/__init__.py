"""Example agents and services used by the demo and the tests."""
