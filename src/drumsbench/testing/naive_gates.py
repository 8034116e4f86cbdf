"""NAIVE gates — for positive controls of the red team only; never a choice of the benchmark.

A container sandbox's commands run as the container's root, who can replace any program of its
image. DrumsBench's container gates never run one (``substrates.containers.from_host``: processes
ended, files digested and scanned from the host). A naive harness runs them **in** the container,
with the container's own ``python3``, as DrumsBench did before: ``NaiveDockerSubstrate`` is the
docker substrate with such gates —

- ``end_processes``: ``python3`` in the container sends ``SIGKILL`` to every process it may signal;
- ``scan`` and ``tree_digest``: ``Sandbox``'s defaults, the scripts run by the container's ``python3``.

A strategy that breaks ``python3`` (``adversary.SHELL["replace_python3"]``) turns a failed attempt
into invalid (``substrate_failure``) here, and ends failed on ``docker``: tests/test_adversary.py.
No command, option or variable can choose it; tests build a ``Slot`` with it.

``WorkTreeTestsHarborEnv`` is Harbor's shared mode with a runner that takes ``tests/test.sh`` from
the task's working folder (a checkout's tests beside its code) rather than the uploaded ``/tests``:
the positive control of ``adversary.HARBOR["harbor_test_sh_in_workdir"]``.
"""

from __future__ import annotations

from drumsbench.envs.base import VerifierResult
from drumsbench.envs.harbor.env import HarborEnv
from drumsbench.envs.harbor.task import HarborTask
from drumsbench.substrates.base import Sandbox
from drumsbench.substrates.containers.docker import DockerSubstrate
from drumsbench.substrates.containers.docker_sandbox import DockerSandbox

NAIVE_END = "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass\n"


class NaiveDockerSandbox(DockerSandbox):
    """A docker sandbox whose gates run the container's own ``python3``."""

    def end_processes(self) -> None:
        self._run_checked(["python3", "-S", "-c", NAIVE_END], "ending the sandbox's processes")

    scan = Sandbox.scan
    tree_digest = Sandbox.tree_digest


class NaiveDockerSubstrate(DockerSubstrate):
    """``docker`` with ``NaiveDockerSandbox``es."""

    sandbox_class = NaiveDockerSandbox


class WorkTreeTestsHarborEnv(HarborEnv):
    """Harbor's shared mode, but test.sh is ``tests/test.sh`` of the working folder (NAIVE)."""

    def __init__(self) -> None:
        super().__init__(verifier="harbor-shared")

    def _run_shared(self, task: HarborTask, timeout: float, script: str = "tests/test.sh") -> VerifierResult:
        # the task's test.sh goes into the work tree only where the work tree has none
        self.box.exec(["sh", "-c", "[ -e tests/test.sh ] || { mkdir -p tests && cp /tests/test.sh tests/test.sh; }"],
                      timeout=30, cwd=task.workdir)
        return super()._run_shared(task, timeout, script=script)
