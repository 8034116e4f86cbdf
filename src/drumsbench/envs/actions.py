"""Typed actions: an environment kind declares each of its actions as a pydantic model.

Contract:

- an ``ActionModel`` subclass is one action: its class variable ``kind`` is the action's name
  (``Action.kind``), its fields are the action's payload (``Action.payload``), each with a
  description, and the first paragraph of its docstring says what it does;
- a kind's ``ActionSet`` (``Environment.actions``) lists its actions in a fixed order, and generates
  what was once written by hand for each kind outside its package: the names in order (gymnasium's
  ``Discrete`` index), the check of a request (``problem``: the wire and the endpoint policy), and
  the tools an endpoint model is offered (``tools``, OpenAI's function-tool format);
- a request that fails ``problem`` is the policy's own malformed step (a failed step it sees, with
  that text), never a harness error.

Validation is pydantic's own (lax: ``"12"`` is the int 12); fields beyond a model's are kept and
left to the environment, as before typed actions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError


class ActionModel(BaseModel):
    """One action of an environment kind (subclass it; set ``kind``)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    kind: ClassVar[str]

    @classmethod
    def description(cls) -> str:
        """The first paragraph of the model's docstring, on one line."""
        doc = (cls.__doc__ or cls.kind).strip().split("\n\n", 1)[0]
        return " ".join(doc.split())

    @classmethod
    def parameters(cls) -> dict[str, Any]:
        """The JSON schema of the arguments, as a function tool takes it (no titles)."""
        schema = cls.model_json_schema()
        properties = {name: {k: v for k, v in prop.items() if k != "title"}
                      for name, prop in schema.get("properties", {}).items()}
        out: dict[str, Any] = {"type": "object", "properties": properties}
        if schema.get("required"):
            out["required"] = list(schema["required"])
        return out


class ActionSet:
    """A kind's actions, in order (``names[i]`` is index ``i`` of a discrete action space)."""

    def __init__(self, *models: type[ActionModel]) -> None:
        names = [m.kind for m in models]
        if len(set(names)) != len(names):
            raise ValueError(f"two actions share a name: {names}")
        self.models = models
        self.names: tuple[str, ...] = tuple(names)
        self._by_name = dict(zip(names, models, strict=True))

    def model(self, kind: str) -> type[ActionModel] | None:
        return self._by_name.get(kind)

    def required(self, kind: str) -> tuple[str, ...]:
        model = self._by_name[kind]
        return tuple(name for name, f in model.model_fields.items() if f.is_required())

    def problem(self, kind: str, payload: Mapping[str, Any]) -> str | None:
        """What makes the request ``kind`` with ``payload`` malformed, or None: an unknown kind, a
        missing required field (``None`` counts as missing), a field of the wrong type."""
        model = self._by_name.get(kind)
        if model is None:
            return f"unknown action kind {kind!r}; choose one of {', '.join(self.names)}"
        missing = [name for name in self.required(kind) if payload.get(name) is None]
        if missing:
            return f"{kind} needs {', '.join(missing)}"
        try:
            model.model_validate(dict(payload))
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            return f"{kind}: {where}: {first['msg']}"
        return None

    def tools(self) -> list[dict[str, Any]]:
        """The actions as OpenAI function tools (name, description, parameters)."""
        return [{"type": "function", "function": {"name": m.kind, "description": m.description(),
                                                  "parameters": m.parameters()}} for m in self.models]


__all__ = ["ActionModel", "ActionSet"]
