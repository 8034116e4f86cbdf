"""The knob environment: its typed actions and observation, and the environment itself."""

from __future__ import annotations

import hashlib
from typing import Annotated, ClassVar

from pydantic import Field

from drumsbench.core.errors import InvalidAttempt
from drumsbench.core.outcome import InvalidCause
from drumsbench.envs.actions import ActionModel, ActionSet, Slot
from drumsbench.envs.base import SUBMIT, Action, Environment, Observation, VerifierResult
from drumsbench.envs.observations import ObservationModel
from knob_kind.task import MAX_TURN, KnobTask

FILE = "knob"
END = "--end of reading--"
READER = "read-knob.sh"


class Turn(ActionModel):
    """Turn the knob by some clicks (positive: up, negative: down)."""

    kind: ClassVar[str] = "turn"
    clicks: Annotated[int, Slot("clicks", "wheel")] = Field(..., ge=-MAX_TURN, le=MAX_TURN,
                                                            description="clicks, -10..10")


class Submit(ActionModel):
    """Submit: the knob is read where it stands now."""

    kind: ClassVar[str] = SUBMIT


class KnobObservation(ObservationModel):
    """Where the knob stands."""

    first: ClassVar[str] = "You look at the knob."

    position: int | None = Field(None, description="the knob's position")
    error: str | None = Field(None, description="what was wrong with the last action")

    def text(self) -> str:
        said = f"The knob stands at {self.position}." if self.position is not None else "The knob cannot be read."
        return f"{said}\n{self.error}" if self.error else said


class KnobEnv(Environment[KnobTask]):
    kind = "knob"
    actions = ActionSet(Turn, Submit)
    observations = KnobObservation
    instructions = "You turn a knob to its mark. Call exactly one tool per answer; submit when it is there."

    @property
    def _path(self) -> str:
        return f"{self.box.paths.work}/{FILE}"

    def _reading(self) -> tuple[int | None, bool]:
        """The knob's position read through the sandbox's transport (``exec``), and whether the
        reading arrived whole (its end marker came: gate 4 judges that, never the policy)."""
        res = self.box.exec(["/bin/sh", "-c", f"cat {FILE}; echo {END}"], timeout=10)
        text = res.stdout.decode(errors="replace")
        whole = text.endswith(f"{END}\n")
        value = text.removesuffix(f"{END}\n").removeprefix("knob=").strip()
        return (int(value) if value.lstrip("-").isdigit() else None), whole

    def _write_start(self, task: KnobTask) -> None:
        self.box.write_file(self._path, f"knob={task.start}\n".encode())

    def fingerprint(self) -> str:
        return "sha256:" + hashlib.sha256(self.box.read_file(self._path, limit=64)).hexdigest()

    def _look(self, error: str | None = None) -> Observation:
        position, whole = self._reading()
        return Observation(self.generation, self.step_count, {"position": position, "error": error, "whole": whole})

    def observe(self, timeout: float) -> Observation:
        return self._look()

    def _apply(self, action: Action, timeout: float) -> Observation:
        problem = self.actions.problem(action.kind, action.payload)
        if problem is not None or action.kind != "turn":
            return self._look(problem or f"{action.kind} is not an action that changes the knob")
        position, _ = self._reading()
        if position is None:
            return self._look("the knob cannot be read")
        self.box.write_file(self._path, f"knob={position + int(action.payload['clicks'])}\n".encode())
        return self._look()

    def observation_problem(self, obs: Observation) -> str | None:
        return None if obs.content.get("whole") else "the knob's reading lost its end in transport"

    def stage_verifier(self, task: KnobTask) -> None:
        """The reader of the knob, staged only now: a script in the verify folder."""
        self.box.write_file(f"{self.box.paths.verify}/{READER}", b'exec cat "$1"\n')

    def run_verifier(self, task: KnobTask, timeout: float) -> VerifierResult:
        """The staged reader's answer: at the mark, or not (with where it stands). A reader that
        does not answer is ``verifier_unavailable``: the policy's turns cannot stop a ``cat``."""
        res = self.box.exec(["/bin/sh", f"{self.box.paths.verify}/{READER}", self._path], timeout=timeout)
        if res.exit_code != 0 or res.timed_out:
            err = res.stderr.decode(errors="replace")[-200:]
            raise InvalidAttempt(InvalidCause.VERIFIER_UNAVAILABLE, f"the knob's reader exited {res.exit_code}: {err}")
        value = res.stdout.decode(errors="replace").removeprefix("knob=").strip()
        if value == str(task.mark):
            return VerifierResult.success(position=task.mark)
        return VerifierResult.failed(f"the knob stands at {value or 'nothing'}, not at the mark {task.mark}")

    def break_verifier(self) -> None:
        """Replace the staged reader by one that dies (fault injection, from the host)."""
        self.box.write_file(f"{self.box.paths.verify}/{READER}", b"kill -SEGV $$\n")
