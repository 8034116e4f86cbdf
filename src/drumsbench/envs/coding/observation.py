"""What the coding kind shows a policy: a command's exit status and output (``ObservationModel``)."""

from __future__ import annotations

from typing import ClassVar

from drumsbench.envs.observations import CommandResult


class CodingObservation(CommandResult):
    """A shell command's result (a write or a patch answers in the same shape); the first one lists
    the work folder's files."""

    first: ClassVar[str] = "$ find . -type f | sort"
