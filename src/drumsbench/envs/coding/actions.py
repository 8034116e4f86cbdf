"""The coding kind's actions (``envs/actions.py``): shell, write, patch, submit, in that order."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from drumsbench.envs.actions import ActionModel, ActionSet, Slot
from drumsbench.envs.base import SUBMIT

TEXT = Slot("text", "text")  # the command, the file's content or the diff: one slot of the flat space


class Shell(ActionModel):
    """Run a shell command in the repository's folder; see its output."""

    kind = "shell"
    command: Annotated[str, TEXT] = Field(..., description="the command line (/bin/sh -c)")


class Write(ActionModel):
    """Write a file (path relative to the repository's folder)."""

    kind = "write"
    path: Annotated[str, Slot("path", "path")] = Field(..., description="a path inside the repository's folder")
    content: Annotated[str, TEXT] = Field(..., description="the file's new content")


class Patch(ActionModel):
    """Apply a unified diff to the repository (git apply)."""

    kind = "patch"
    patch: Annotated[str, TEXT] = Field(..., description="a unified diff")


class Submit(ActionModel):
    """Submit: the hidden tests judge the repository as it is now."""

    kind = SUBMIT


ACTIONS = ActionSet(Shell, Write, Patch, Submit)

INSTRUCTIONS = ("You fix a bug in a Python repository. Use the tools: read with shell, change files with write or "
                "patch, then call submit. Call exactly one tool per answer.")
