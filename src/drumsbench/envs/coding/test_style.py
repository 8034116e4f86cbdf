"""Which framework a coding task's hidden tests are written for, and which tests they define — by syntax.

Read from the files' syntax trees only (nothing is imported): the loader (``task.py``), the trusted
judge (``judge.py``) and the tests' authors see the same answer.

- **unittest** style: every test is a ``test*`` method of a class (``unittest.TestCase``);
  ids ``module.Class.test_method``; the judge runs them with ``unittest`` (fast, no dependency).
- **pytest** style: a file that imports ``pytest``, defines a module-level ``test*`` function, or a
  ``Test*`` class that is not a ``TestCase``; the judge runs the files with pytest itself
  (``judge_pytest``). Expected ids follow pytest's default collection: ``file.py::test_func``,
  ``file.py::TestClass::test_method`` (a ``Test*`` class without ``__init__``, or a class whose base
  is named ``TestCase``); a parametrised function is one id whose every case must pass.

``conftest.py`` among the hidden files holds fixtures and hooks, never tests.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import TypeGuard

CONFTEST = "conftest.py"


def _is_test_function(node: ast.stmt) -> TypeGuard[ast.FunctionDef | ast.AsyncFunctionDef]:
    return isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")


def _is_testcase(node: ast.ClassDef) -> bool:
    return any((isinstance(b, ast.Name) and b.id == "TestCase") or
               (isinstance(b, ast.Attribute) and b.attr == "TestCase") for b in node.bases)


def _pytest_class(node: ast.ClassDef) -> bool:
    """A class pytest collects by default: named ``Test*`` without an ``__init__``."""
    return node.name.startswith("Test") and not any(
        isinstance(item, ast.FunctionDef) and item.name == "__init__" for item in node.body)


def top_imports(tree: ast.Module) -> set[str]:
    """Top-level modules a file imports itself (absolute imports, anywhere in it)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


def is_pytest_style(trees: Mapping[str, ast.Module]) -> bool:
    """Whether the hidden files (``{file name: tree}``) need pytest to run."""
    for name, tree in trees.items():
        if name == CONFTEST or "pytest" in top_imports(tree):
            return True
        for node in tree.body:
            if _is_test_function(node):
                return True
            if isinstance(node, ast.ClassDef) and _pytest_class(node) and not _is_testcase(node):
                return True
    return False


def unittest_expected(trees: Mapping[str, ast.Module]) -> list[str]:
    """``module.Class.test_method`` of every test method the files define."""
    expected: list[str] = []
    for name, tree in trees.items():
        module = name[:-3] if name.endswith(".py") else name
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                expected.extend(f"{module}.{node.name}.{item.name}" for item in node.body if _is_test_function(item))
    return expected


def pytest_expected(trees: Mapping[str, ast.Module]) -> list[str]:
    """pytest's ids of every test the files define (``file.py::test_func``, ``file.py::Class::test``),
    without parameters."""
    expected: list[str] = []
    for name, tree in trees.items():
        if name == CONFTEST:
            continue
        for node in tree.body:
            if _is_test_function(node):
                expected.append(f"{name}::{node.name}")
            elif isinstance(node, ast.ClassDef) and (_pytest_class(node) or _is_testcase(node)):
                expected.extend(f"{name}::{node.name}::{item.name}"
                                for item in node.body if _is_test_function(item))
    return expected


def expected_tests(trees: Mapping[str, ast.Module]) -> tuple[str, list[str]]:
    """(``"pytest"`` or ``"unittest"``, the expected test ids in that style's form)."""
    if is_pytest_style(trees):
        return "pytest", pytest_expected(trees)
    return "unittest", unittest_expected(trees)
