"""The library stays one that a newcomer can read and change: size budgets, enforced.

No module outside ``fp8lab/reference/`` (which mirrors TE's own layout) is longer than 450 lines,
and no function or method anywhere in ``fp8lab/`` or ``tools/`` is longer than 60 lines (from its
``def`` to its last line, docstring included).
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULE_LINES, FUNCTION_LINES = 450, 60
SOURCES = sorted([*ROOT.joinpath("fp8lab").rglob("*.py"), *ROOT.joinpath("tools").rglob("*.py")])


def test_no_module_is_over_its_budget():
    long = {
        str(path.relative_to(ROOT)): lines
        for path in SOURCES
        if "reference" not in path.relative_to(ROOT).parts
        and (lines := len(path.read_text().splitlines())) > MODULE_LINES
    }
    assert not long, f"modules over {MODULE_LINES} lines: {long}"


def test_no_function_is_over_its_budget():
    long = {}
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.name}"] = lines
    assert not long, f"functions over {FUNCTION_LINES} lines: {long}"
