"""The harbor kind's actions (``envs/actions.py``): shell, write, submit — what Harbor's terminal agents do."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field

from drumsbench.envs.actions import ActionModel, ActionSet, Slot
from drumsbench.envs.base import SUBMIT
from drumsbench.envs.observations import CommandResult

TEXT = Slot("text", "text")


class Shell(ActionModel):
    """Run a shell command in the task's working folder; see its output."""

    kind = "shell"
    command: Annotated[str, TEXT] = Field(..., description="the command line (/bin/sh -c)")


class Write(ActionModel):
    """Write a file (an absolute path, or one relative to the task's working folder)."""

    kind = "write"
    path: Annotated[str, Slot("path", "path")] = Field(..., description="the file's path")
    content: Annotated[str, TEXT] = Field(..., description="the file's new content")


class Submit(ActionModel):
    """Submit: the task's own tests judge the working folder as it is now."""

    kind = SUBMIT


ACTIONS = ActionSet(Shell, Write, Submit)

INSTRUCTIONS = ("You do a task in a Linux container, as its root user, without network. Use the tools: run commands "
                "with shell, write files with write, then call submit. Call exactly one tool per answer.")


class HarborObservation(CommandResult):
    """A shell command's result (a write answers in the same shape); the first one lists the working folder."""

    first: ClassVar[str] = "$ pwd; ls -la"
