"""Typed actions (``envs/actions.py``): each kind declares its actions as pydantic models, and the
wire's check, the endpoint policy's tools and gymnasium's action names are made from them."""

from __future__ import annotations

import pytest

import drumsbench.gym as dgym
from drumsbench.envs.actions import ActionModel, ActionSet
from drumsbench.envs.suites import KINDS, environment_class
from drumsbench.serve.wire import DrumsAction, action_problem


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
    assert dgym.KINDS == environment_class("coding").actions.names == ("shell", "write", "patch", "submit")
    assert environment_class("desktop").actions.names == dgym.DESKTOP_KINDS
    assert set(KINDS.names()) >= {"coding", "desktop"}


@pytest.mark.parametrize("kind,action,problem", [
    ("coding", DrumsAction(kind="shell"), "shell needs command"),
    ("coding", DrumsAction(kind="write", path="a.py"), "write needs content"),
    ("coding", DrumsAction(kind="rm -rf"), "unknown action kind 'rm -rf'; choose one of shell, write, patch, submit"),
    ("coding", DrumsAction(kind="patch", args={"patch": 7}), "patch: patch: Input should be a valid string"),
    ("coding", DrumsAction(kind="submit"), None),
    ("coding", DrumsAction(kind="write", path="a.py", content=""), None),
    ("desktop", DrumsAction(kind="click", args={"x": 10}), "click needs y"),
    ("desktop", DrumsAction(kind="click", args={"x": "left", "y": 3}), "click: x: Input should be a valid integer"),
    ("desktop", DrumsAction(kind="click", args={"x": "10", "y": 3}), None),
    ("desktop", DrumsAction(kind="key", args={"keys": ["ctrl+s", "Return"]}), None),
    ("desktop", DrumsAction(kind="wait"), None),
    ("desktop", DrumsAction(kind="write", path="a", content="b"), "unknown action kind 'write'"),
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
