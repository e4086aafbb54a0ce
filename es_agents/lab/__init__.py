"""Lab code: benchmarks, the demo, the chaos run and the test probes.

Nothing in the runtime imports this package; the composition root (``es_agents.app``)
builds a probe from it only when a crash point or an acknowledgement journal is set.
"""
