"""``es-agents bench chaos``: inject faults on a seeded schedule, then check invariants.

``schedule`` (pure): which fault happens when, from a seed. ``effects``: the local HTTP
service the chaos agent's tools change, counting every effect per key. ``agent``: the
agent the workers run (an approval gate, two side-effecting tools, a timer).
``harness``: the processes, the faults, the heal phase and the checks.
"""
