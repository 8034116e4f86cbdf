"""What the desktop kind shows a policy: the screen, the active window's title, a shell's output."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from drumsbench.envs.observations import CommandResult, ObservationModel


class DesktopObservation(ObservationModel):
    """The screen after an action settled; a ``shell`` action's output in ``result``."""

    screen_field: ClassVar[str | None] = "png"

    png: bytes = Field(b"", description="the screen, PNG")
    title: str = Field("", description="the active window's title")
    result: CommandResult | None = Field(None, description="a shell action's exit status and output")

    def text(self) -> str:
        """A shell action's output (``CommandResult.text``); the screen speaks for the rest."""
        return self.result.text() if self.result is not None else ""

    def wire(self, wire_fields: set[str]) -> dict[str, Any]:
        """The title, and a shell action's output in the wire's own fields."""
        values: dict[str, Any] = {"title": self.title}
        if self.result is not None:
            values.update(self.result.wire(wire_fields))
        return {name: value for name, value in values.items() if name in wire_fields}
