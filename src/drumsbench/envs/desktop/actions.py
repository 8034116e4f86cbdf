"""The desktop kind's actions (``envs/actions.py``), in gymnasium's order: key, type, click,
double_click, drag, scroll, move, wait, shell, submit. Pixels are of the virtual screen
(``Settings.width`` x ``height``), origin top left."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from drumsbench.envs.actions import ActionModel, ActionSet, Slot
from drumsbench.envs.base import SUBMIT

# the slots of the flat space (gymnasium's): one text (keys, typed text, a command), a pixel and a
# second pixel (a drag's end), wheel clicks
TEXT, X, Y = Slot("text", "text"), Slot("x", "column"), Slot("y", "row")
X2, Y2, DY = Slot("x2", "column"), Slot("y2", "row"), Slot("dy", "wheel")


class Key(ActionModel):
    """Press a key or a chord (xdotool names: ctrl+s, Return, alt+F4), or several in turn."""

    kind = "key"
    keys: Annotated[str | list[str], TEXT] = Field(..., description="a key or chord, or a list of them pressed in turn")


class Type(ActionModel):
    """Type text at the keyboard focus (a newline presses Return)."""

    kind = "type"
    text: Annotated[str, TEXT] = Field(..., description="the text typed")


class Click(ActionModel):
    """Click at a pixel."""

    kind = "click"
    x: Annotated[int, X] = Field(..., description="pixel column")
    y: Annotated[int, Y] = Field(..., description="pixel row")
    button: int = Field(1, description="1 left, 2 middle, 3 right")


class DoubleClick(ActionModel):
    """Double-click at a pixel."""

    kind = "double_click"
    x: Annotated[int, X] = Field(..., description="pixel column")
    y: Annotated[int, Y] = Field(..., description="pixel row")
    button: int = Field(1, description="1 left, 2 middle, 3 right")


class Drag(ActionModel):
    """Press a button at one pixel, move to another, release."""

    kind = "drag"
    x1: Annotated[int, X] = Field(..., description="start column")
    y1: Annotated[int, Y] = Field(..., description="start row")
    x2: Annotated[int, X2] = Field(..., description="end column")
    y2: Annotated[int, Y2] = Field(..., description="end row")
    button: int = Field(1, description="1 left, 2 middle, 3 right")


class Scroll(ActionModel):
    """Scroll the wheel at a pixel: dy clicks, positive down."""

    kind = "scroll"
    x: Annotated[int, X] = Field(..., description="pixel column")
    y: Annotated[int, Y] = Field(..., description="pixel row")
    dy: Annotated[int, DY] = Field(..., description="wheel clicks, positive down, negative up")


class Move(ActionModel):
    """Move the pointer to a pixel."""

    kind = "move"
    x: Annotated[int, X] = Field(..., description="pixel column")
    y: Annotated[int, Y] = Field(..., description="pixel row")


class Wait(ActionModel):
    """Wait some seconds, or until the active window's title matches a pattern."""

    kind = "wait"
    seconds: float | None = Field(None, description="how long (default 0.1 s)")
    title: str | None = Field(None, description="a regular expression the active window's title must match")


class Shell(ActionModel):
    """Run a shell command in the desktop's sandbox (where the substrate offers it); see its output."""

    kind = "shell"
    command: Annotated[str, TEXT] = Field(..., description="the command line (/bin/sh -c)")


class Submit(ActionModel):
    """Submit: the task's checker judges the open document as it is now."""

    kind = SUBMIT


ACTIONS = ActionSet(Key, Type, Click, DoubleClick, Drag, Scroll, Move, Wait, Shell, Submit)

INSTRUCTIONS = ("You edit a document in LibreOffice through its screen, keyboard and mouse. Use the tools, then "
                "call submit. Call exactly one tool per answer.")
