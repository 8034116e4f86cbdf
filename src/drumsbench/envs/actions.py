"""Typed actions: an environment kind declares each of its actions as a pydantic model.

Contract:

- an ``ActionModel`` subclass is one action: its class variable ``kind`` is the action's name
  (``Action.kind``), its fields are the action's payload (``Action.payload``), each with a
  description, and the first paragraph of its docstring says what it does;
- a field may name its ``Slot`` (``Annotated[int, Slot("x", "column")]``): where it sits in one
  flat action space shared by all the kind's actions (gymnasium's ``Dict``: ``kind`` plus every
  slot); fields of several actions share a slot of one name (``text``: a command, keys, typed text);
- a kind's ``ActionSet`` (``Environment.actions``) lists its actions in a fixed order, and generates
  what was once written by hand for each kind outside its package: the names in order (gymnasium's
  ``Discrete`` index), the check of a request (``problem``: the wire and the endpoint policy), the
  tools an endpoint model is offered (``tools``, OpenAI's function-tool format), the slots of the
  flat space (``slots``) and the request a flat action stands for (``from_slots``);
- a request that fails ``problem`` is the policy's own malformed step (a failed step it sees, with
  that text), never a harness error.

Validation is pydantic's own (lax: ``"12"`` is the int 12); fields beyond a model's are kept and
left to the environment, as before typed actions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

# What a slot holds: printable text, a relative file path, a pixel column or row of the screen,
# scroll-wheel clicks (-10..10, positive down)
Holds = Literal["text", "path", "column", "row", "wheel"]
HOLDS: tuple[Holds, ...] = ("text", "path", "column", "row", "wheel")


@dataclass(frozen=True)
class Slot:
    """Where a field sits in a kind's flat action space: the slot's ``name`` and what it ``holds``
    (``HOLDS``). Put it in the field's ``Annotated`` metadata."""

    name: str
    holds: Holds

    def __post_init__(self) -> None:
        if self.holds not in HOLDS:
            raise ValueError(f"slot {self.name!r}: holds {self.holds!r}; choose one of {', '.join(HOLDS)}")


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

    @classmethod
    def slot_fields(cls) -> dict[str, Slot]:
        """field name -> its ``Slot``, for the fields that declare one."""
        return {name: slot for name, f in cls.model_fields.items()
                for slot in f.metadata if isinstance(slot, Slot)}


class ActionSet:
    """A kind's actions, in order (``names[i]`` is index ``i`` of a discrete action space)."""

    def __init__(self, *models: type[ActionModel]) -> None:
        names = [m.kind for m in models]
        if len(set(names)) != len(names):
            raise ValueError(f"two actions share a name: {names}")
        self.models = models
        self.names: tuple[str, ...] = tuple(names)
        self._by_name = dict(zip(names, models, strict=True))
        self._slots: dict[str, Holds] = {}
        for m in models:
            for field, slot in m.slot_fields().items():
                if self._slots.setdefault(slot.name, slot.holds) != slot.holds:
                    raise ValueError(f"slot {slot.name!r} holds {self._slots[slot.name]} and, for "
                                     f"{m.kind}.{field}, {slot.holds}")
                if slot.name == "kind":
                    raise ValueError(f"{m.kind}.{field}: no slot may be called kind (the action's index)")

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

    def slots(self) -> dict[str, Holds]:
        """Every slot of the flat action space, in the order the actions declare them: name -> what
        it holds."""
        return dict(self._slots)

    def from_slots(self, kind: int | str, values: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        """The request a flat action stands for: ``kind`` (an index into ``names``, or a name) and
        its payload — each field of that action from its slot, a value under the field's own name
        winning; values of other actions' slots are dropped. An unknown kind or index comes back
        as a name ``problem`` refuses."""
        if not isinstance(kind, str):
            index = int(kind)
            kind = self.names[index] if 0 <= index < len(self.names) else f"kind {index}"
        model = self._by_name.get(kind)
        if model is None:
            return kind, {}
        payload = {field: values[slot.name] for field, slot in model.slot_fields().items() if slot.name in values}
        payload.update({field: values[field] for field in model.model_fields if field in values})
        return kind, {k: v for k, v in payload.items() if v is not None}

    def tools(self) -> list[dict[str, Any]]:
        """The actions as OpenAI function tools (name, description, parameters)."""
        return [{"type": "function", "function": {"name": m.kind, "description": m.description(),
                                                  "parameters": m.parameters()}} for m in self.models]


__all__ = ["HOLDS", "ActionModel", "ActionSet", "Holds", "Slot"]
