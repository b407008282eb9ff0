"""Every built-in rule has tests: a rule whose name no test file under tests/rules/ names
(in a check_sound / check_reaches / check_refuses call) fails the suite."""
from pathlib import Path

import pytest

from harness import library

TESTS = Path(__file__).resolve().parent
RULES = sorted(library().rules)


def _test_text() -> str:
    return "\n".join(p.read_text() for p in TESTS.glob("test_*.py") if p.name != Path(__file__).name)


@pytest.mark.parametrize("rule", RULES or ["<no rules>"])
def test_rule_has_soundness_and_reach_tests(rule):
    if rule == "<no rules>":
        pytest.skip("no built-in rule files yet")
    text = _test_text()
    assert f'"{rule}"' in text, f"rule {rule} is named by no test under tests/rules/"


def test_every_builtin_file_is_documented_and_every_rule_named():
    for rf in library().files:
        lines = rf.path.read_text().splitlines()
        assert lines and lines[0].startswith(";"), f"{rf.path.name} must open with a comment saying what it is for"
        for rule in rf.rules:
            assert rule.name != f"{rf.path.stem}:{rule.line}", \
                f"{rf.path.name}:{rule.line}: built-in rules carry an explicit :name"
            above = [li for li in lines[: rule.line - 1] if li.strip()]
            assert above and above[-1].lstrip().startswith(";"), \
                f"{rf.path.name}:{rule.line}: a rule is preceded by a one-line '; lhs -> rhs' comment"
