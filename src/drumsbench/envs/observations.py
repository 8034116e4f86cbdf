"""Typed observations: an environment kind declares what it shows a policy as a pydantic model.

Contract:

- an ``ObservationModel`` subclass (``Environment.observations``) names the fields of
  ``Observation.content`` a policy sees, each with a description; ``of(obs)`` reads an observation's
  content into the model (content the model does not declare stays the environment's own: gate
  evidence such as a lost end marker, a raw frame);
- ``text()`` is the kind's one rendering for readers of text: the endpoint policy's prompt,
  gymnasium's ``text`` channel and the wire's ``text`` field all show it (printable or not: each
  reader escapes what it cannot carry);
- ``screen_field`` (class variable) names a field holding the screen as PNG bytes, or is ``None``: a kind
  with a screen gets gymnasium's ``screen`` Box and the wire's ``screenshot_png``;
- ``wire()``: the fields of the wire's observation (``serve/wire.py``) this observation fills by
  name; the default fills every field of the same name and JSON type (``exit_code``, ``stdout``,
  ``title``, ...). A kind whose content nests (the desktop's shell output) overrides it.

Nothing here knows a kind: the wire, gymnasium and the endpoint policy read every kind through this
contract.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from drumsbench.envs.base import Observation


class ObservationModel(BaseModel):
    """What one environment kind shows a policy (subclass it; see the module docstring)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    # the field holding the screen as PNG bytes, or None (a kind without a screen)
    screen_field: ClassVar[str | None] = None
    # what the first observation of an episode shows, said after the task (coding: the command
    # whose output it is); "" says nothing
    first: ClassVar[str] = ""

    @classmethod
    def of(cls, obs: Observation) -> ObservationModel:
        """The model of ``obs.content`` (undeclared content ignored; a declared field that does not
        validate is a defect of the kind, raised as pydantic's ``ValidationError``)."""
        return cls.model_validate(obs.content)

    def text(self) -> str:
        """The kind's rendering for readers of text. Default: one ``name: value`` line per field
        that is set (the screen left out)."""
        shown = self.model_dump(exclude=self._not_text(), exclude_none=True)
        return "\n".join(f"{name}: {value}" for name, value in shown.items())

    def screen_png(self) -> bytes | None:
        """The screen as PNG bytes (``screen_field``), or None: no screen, or none this time."""
        if self.screen_field is None:
            return None
        value = getattr(self, self.screen_field)
        return value if isinstance(value, bytes) and value else None

    def wire(self, wire_fields: set[str]) -> dict[str, Any]:
        """The values of the wire's fields this observation fills (``wire_fields``: the names the
        wire has): by default each of this model's fields of the same name that is set."""
        values = self.model_dump(exclude=self._not_text(), exclude_none=True)
        return {name: value for name, value in values.items() if name in wire_fields}

    def _not_text(self) -> set[str] | None:
        return {self.screen_field} if self.screen_field else None


class CommandResult(ObservationModel):
    """A command's exit status and output: the shape of every kind whose actions run commands (the
    coding kind's observation; the desktop's ``shell`` action's ``result``)."""

    exit_code: int | None = Field(None, description="the command's exit status")
    stdout: str = Field("", description="its standard output")
    stderr: str = Field("", description="its standard error")
    truncated: bool = Field(False, description="the output was cut at the observation limit")

    def text(self) -> str:
        """``[exit N]`` (``, truncated`` when cut), the output, then ``[stderr]`` and the errors."""
        parts = []
        if self.exit_code is not None:
            parts.append(f"[exit {self.exit_code}{', truncated' if self.truncated else ''}]")
        if self.stdout:
            parts.append(self.stdout)
        if self.stderr:
            parts.append(f"[stderr]\n{self.stderr}")
        return "\n".join(parts)
