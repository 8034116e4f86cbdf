"""``knob``: the smallest environment kind, added in this one package and nowhere else.

A sandbox's work folder holds ``knob``, the position of a knob (an integer as text). The policy turns
it (``turn``: -10..10 clicks at a time) and submits; the verifier reads the position from the host.
The policy runs no code of its own, so the verdict is the host's reading of one file it cannot
forge. ``tests/test_example_kind.py`` serves it over OpenEnv, checks it with gymnasium, drives it
with the endpoint policy and runs it with ``drumsbench run``: nothing of it is named outside this
package (the entry point ``drumsbench.env_kinds``, in ``knob_kind-0.1.dist-info``, registers it).
"""

from __future__ import annotations

from drumsbench.envs.suites import EnvKind

KIND = EnvKind("knob", "knob_kind.env:KnobEnv", "knob_kind.task:load_suite", "knob_kind.task:compute_fingerprints",
               docs="tests/data/kinds/knob/knob_kind/__init__.py")
