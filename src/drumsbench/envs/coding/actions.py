"""The coding kind's actions (``envs/actions.py``): shell, write, patch, submit, in that order."""

from __future__ import annotations

from pydantic import Field

from drumsbench.envs.actions import ActionModel, ActionSet
from drumsbench.envs.base import SUBMIT


class Shell(ActionModel):
    """Run a shell command in the repository's folder; see its output."""

    kind = "shell"
    command: str = Field(..., description="the command line (/bin/sh -c)")


class Write(ActionModel):
    """Write a file (path relative to the repository's folder)."""

    kind = "write"
    path: str = Field(..., description="a path inside the repository's folder")
    content: str = Field(..., description="the file's new content")


class Patch(ActionModel):
    """Apply a unified diff to the repository (git apply)."""

    kind = "patch"
    patch: str = Field(..., description="a unified diff")


class Submit(ActionModel):
    """Submit: the hidden tests judge the repository as it is now."""

    kind = SUBMIT


ACTIONS = ActionSet(Shell, Write, Patch, Submit)

INSTRUCTIONS = ("You fix a bug in a Python repository. Use the tools: read with shell, change files with write or "
                "patch, then call submit. Call exactly one tool per answer.")
