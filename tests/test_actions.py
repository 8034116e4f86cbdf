"""Typed actions (``envs/actions.py``): each kind declares its actions as pydantic models, and the
wire's check, the endpoint policy's tools and gymnasium's action names are made from them."""

from __future__ import annotations

import pytest

import drumsbench.gym as dgym
from drumsbench.envs.actions import ActionModel, ActionSet
from drumsbench.envs.suites import KINDS, environment_class
from drumsbench.serve.wire import DrumsAction, action_class, action_problem

CodingAction = action_class(environment_class("coding").actions)  # the wire's action when coding is served


@pytest.mark.parametrize("kind", ["coding", "desktop"])
def test_every_built_in_kind_declares_typed_actions_and_instructions(kind: str) -> None:
    env_class = environment_class(kind)
    actions = env_class.actions
    assert isinstance(actions, ActionSet) and "submit" in actions.names
    assert all(issubclass(m, ActionModel) for m in actions.models)
    assert env_class.instructions.strip()
    tools = actions.tools()
    assert [t["function"]["name"] for t in tools] == list(actions.names)
    for tool, model in zip(tools, actions.models, strict=True):
        params = tool["function"]["parameters"]
        assert params["type"] == "object" and set(params["properties"]) == set(model.model_fields)
        assert tool["function"]["description"] and not [p for p in params["properties"].values() if "title" in p]


def test_gymnasium_names_are_the_kinds_own() -> None:
    assert dgym.KindEnv(tasks="coding").actions.names == ("shell", "write", "patch", "submit")
    assert dgym.ScreenEnv(tasks="desktop").actions.names == environment_class("desktop").actions.names
    assert set(KINDS.names()) >= {"coding", "desktop"}


@pytest.mark.parametrize("kind,action,problem", [
    ("coding", DrumsAction(kind="shell"), "shell needs command"),
    ("coding", CodingAction(kind="write", path="a.py"), "write needs content"),
    ("coding", DrumsAction(kind="rm -rf"), "unknown action kind 'rm -rf'; choose one of shell, write, patch, submit"),
    ("coding", DrumsAction(kind="patch", args={"patch": 7}), "patch: patch: Input should be a valid string"),
    ("coding", DrumsAction(kind="submit"), None),
    ("coding", CodingAction(kind="write", path="a.py", content=""), None),
    ("desktop", DrumsAction(kind="click", args={"x": 10}), "click needs y"),
    ("desktop", DrumsAction(kind="click", args={"x": "left", "y": 3}), "click: x: Input should be a valid integer"),
    ("desktop", DrumsAction(kind="click", args={"x": "10", "y": 3}), None),
    ("desktop", DrumsAction(kind="key", args={"keys": ["ctrl+s", "Return"]}), None),
    ("desktop", DrumsAction(kind="wait"), None),
    ("desktop", DrumsAction(kind="write", args={"path": "a", "content": "b"}), "unknown action kind 'write'"),
])
def test_the_wire_checks_a_request_against_the_kinds_models(kind: str, action: DrumsAction,
                                                            problem: str | None) -> None:
    got = action_problem(environment_class(kind).actions, action)
    assert got == problem if problem is None else (got is not None and got.startswith(problem))


def test_an_action_set_refuses_two_actions_of_one_name() -> None:
    class A(ActionModel):
        kind = "same"

    class B(ActionModel):
        kind = "same"

    with pytest.raises(ValueError, match="share a name"):
        ActionSet(A, B)


def test_gymnasium_spaces_are_made_from_the_kinds_slots() -> None:
    from gymnasium import spaces

    coding = dgym.flat_space(environment_class("coding").actions, text_max=dgym.TEXT_MAX)
    assert coding == spaces.Dict({"kind": spaces.Discrete(4),
                                  "text": spaces.Text(dgym.TEXT_MAX, min_length=0, charset=dgym.PRINTABLE),
                                  "path": spaces.Text(dgym.PATH_MAX, min_length=1, charset=dgym.PATH_CHARS)})
    desktop = dgym.flat_space(environment_class("desktop").actions, text_max=256, width=64, height=48)
    assert set(desktop) == {"kind", "text", "x", "y", "x2", "y2", "dy"}
    assert desktop["kind"] == spaces.Discrete(10)
    assert desktop["x"] == desktop["x2"] == spaces.Discrete(64) and desktop["y"] == desktop["y2"] == spaces.Discrete(48)
    assert desktop["dy"] == spaces.Discrete(21, start=-10)
    with pytest.raises(dgym.UsageError, match="'x' is a pixel"):
        dgym.flat_space(environment_class("desktop").actions, text_max=256)


@pytest.mark.parametrize("kind", ["coding", "desktop"])
def test_every_sampled_flat_action_is_a_well_formed_request(kind: str) -> None:
    actions = environment_class(kind).actions
    space = dgym.flat_space(actions, text_max=64, width=64, height=48)
    space.seed(7)
    seen = set()
    for _ in range(400):
        sample = space.sample()
        values = {k: (v.item() if hasattr(v, "item") else v) for k, v in sample.items() if k != "kind"}
        name, payload = actions.from_slots(int(sample["kind"]), values)
        assert actions.problem(name, payload) is None, (name, payload)
        assert set(payload) <= set(actions.model(name).model_fields)  # type: ignore[union-attr]
        seen.add(name)
    assert seen == set(actions.names)


def test_a_flat_action_reads_each_field_from_its_slot_and_its_own_name_wins() -> None:
    desktop = environment_class("desktop").actions
    assert desktop.from_slots("drag", {"x": 1, "y": 2, "x2": 3, "y2": 4, "text": "a", "dy": 5}) == (
        "drag", {"x1": 1, "y1": 2, "x2": 3, "y2": 4})
    assert desktop.from_slots(0, {"text": "ctrl+s", "x": 9}) == ("key", {"keys": "ctrl+s"})
    assert desktop.from_slots("key", {"text": "a", "keys": ["ctrl+s", "Return"]}) == (
        "key", {"keys": ["ctrl+s", "Return"]})
    assert desktop.from_slots("scroll", {"x": 1, "y": 2, "dy": -3}) == ("scroll", {"x": 1, "y": 2, "dy": -3})
    assert desktop.from_slots("wait", {"text": "x", "seconds": 2}) == ("wait", {"seconds": 2})
    coding = environment_class("coding").actions
    assert coding.from_slots(1, {"text": "print(1)\n", "path": "a.py"}) == (
        "write", {"path": "a.py", "content": "print(1)\n"})
    name, payload = coding.from_slots(17, {"text": "ls"})
    assert (name, payload) == ("kind 17", {})
    assert coding.problem(name, payload).startswith("unknown action kind 'kind 17'")  # type: ignore[union-attr]


def test_slots_of_one_name_must_hold_one_thing() -> None:
    from typing import Annotated

    from drumsbench.envs.actions import Slot

    class A(ActionModel):
        kind = "a"
        v: Annotated[str, Slot("v", "text")]

    class B(ActionModel):
        kind = "b"
        v: Annotated[int, Slot("v", "column")]

    with pytest.raises(ValueError, match="slot 'v' holds text"):
        ActionSet(A, B)
    with pytest.raises(ValueError, match="holds 'colour'"):
        Slot("c", "colour")  # type: ignore[arg-type]
