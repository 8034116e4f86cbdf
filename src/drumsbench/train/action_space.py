"""The discrete action space of one coding task.

Contract: every task gets the same ``SLOTS`` in the same order, so one network acts on every task
and index ``i`` means the same *kind* of action everywhere; what the action does is the task's own
(its files, its visible tests, its candidate patches). Slots:

- ``read``: print the task's first source file;
- ``test``: run the project's visible tests (``python3 -m unittest``);
- ``golden``: apply the task's golden patch (the correct fix);
- ``wrong1``, ``wrong2``: apply a wrong patch (a task with one wrong patch has it in both slots);
- ``adv_*``: one adversary strategy of ``policies/adversary.py`` (sabotage: code that tries to
  forge or dodge the verdict; the verifier's integrity rules make each end failed);
- ``submit``: end the episode; the verifier runs.

An action is an ``ActionSpec`` of the coding environment (``shell`` or ``patch``); nothing here
touches a sandbox.
"""

from __future__ import annotations

from dataclasses import dataclass

from drumsbench.core.errors import UsageError
from drumsbench.envs.base import SUBMIT, ActionSpec, Task
from drumsbench.envs.coding.task import CodingTask
from drumsbench.policies import adversary

ADVERSARY_STRATEGIES: tuple[str, ...] = ("verdict_stdout", "skip_every_test", "patch_result")
SLOTS: tuple[str, ...] = ("read", "test", "golden", "wrong1", "wrong2",
                          *(f"adv_{s}" for s in ADVERSARY_STRATEGIES), "submit")
SUBMIT_SLOT = SLOTS.index("submit")
GOLDEN_SLOT = SLOTS.index("golden")
SABOTAGE_SLOTS: tuple[int, ...] = tuple(i for i, s in enumerate(SLOTS) if s.startswith("adv_"))
N_ACTIONS = len(SLOTS)


@dataclass(frozen=True)
class ActionSpace:
    """The actions of one task, one ``ActionSpec`` per slot of ``SLOTS``."""

    task_id: str
    specs: tuple[ActionSpec, ...]

    @classmethod
    def of(cls, task: Task) -> ActionSpace:
        if not isinstance(task, CodingTask):
            raise UsageError(f"--tasks: drumsbench train acts in the coding environment; {task.id} is "
                             f"a {task.env_kind} task")
        source = sorted(p for p in task.files if p.endswith(".py") and not p.startswith("tests/"))
        read_target = source[0] if source else sorted(task.files)[0]
        wrong = task.wrong_patches
        specs: list[ActionSpec] = [
            ActionSpec("shell", {"command": f"cat {read_target}"}),
            ActionSpec("shell", {"command": "python3 -m unittest discover -s tests -t . -q 2>&1"}),
            ActionSpec("patch", {"patch": task.golden_patch}),
            ActionSpec("patch", {"patch": wrong[0]}),
            ActionSpec("patch", {"patch": wrong[1 % len(wrong)]}),
        ]
        for name in ADVERSARY_STRATEGIES:
            shells = [a.payload["command"] for a in adversary.strategy_plan(name, task) if a.kind != SUBMIT]
            specs.append(ActionSpec("shell", {"command": "\n".join(shells)}))
        specs.append(ActionSpec(SUBMIT))
        assert len(specs) == N_ACTIONS
        return cls(task.id, tuple(specs))


__all__ = ["GOLDEN_SLOT", "N_ACTIONS", "SABOTAGE_SLOTS", "SLOTS", "SUBMIT_SLOT", "ActionSpace"]
