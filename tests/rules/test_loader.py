"""Rule files are validated before egglog sees them: each malformed file is refused with
`path:line: reason`, and nothing reaches stderr."""
import pytest

from apsat.errors import RuleError
from apsat.rules.library import RuleLibrary

GOOD = """; a user family
(ruleset userfam)
; relu(relu x) -> relu x
(rewrite (compute (relu) (compute (relu) x)) (compute (relu) x) :ruleset userfam :name "userfam/relu-idem")
"""


def _lib(tmp_path, text, name="user.egg"):
    path = tmp_path / name
    path.write_text(text)
    return RuleLibrary([path]), path


def test_good_file_loads_and_names_rules(tmp_path):
    lib, path = _lib(tmp_path, GOOD + '(rewrite (compute (negative) (compute (negative) x)) x :ruleset userfam)\n')
    assert set(lib.rulesets["userfam"][i].name for i in range(2)) == {"userfam/relu-idem", "user:5"}
    assert lib.resolve([str(path)]) == ["userfam"]
    assert lib.resolve(["userfam"]) == ["userfam"]


@pytest.mark.parametrize("text, line, reason", [
    ("(ruleset a)\n(run a 3)\n", 2, "`run` is not allowed"),
    ("(ruleset a)\n(let x (access-tensor \"t\"))\n", 2, "`let` is not allowed"),
    ('(include "other.egg")\n', 1, "`include` is not allowed"),
    ("(ruleset a)\n(extract (access-tensor \"t\"))\n", 2, "`extract` is not allowed"),
    ("(ruleset a)\n(rewrite (compute (relu) x)\n  (compute (relu) y) :ruleset a)\n", 3, "variable 'y' on the right side"),
    ("(ruleset a)\n(rewrite (frobnicate x) x :ruleset a)\n", 2, "unknown op 'frobnicate'"),
    ("(ruleset a)\n(rewrite (access x) x :ruleset a)\n", 2, "'access' takes 2 arguments, got 1"),
    ("(ruleset a)\n(rewrite (compute (relu) x) x)\n", 2, "no :ruleset"),
    ("(rewrite (compute (relu) x) x :ruleset nowhere)\n", 1, "unknown ruleset 'nowhere'"),
    ("(ruleset a)\n(ruleset a)\n", 2, "defined twice"),
    ("(ruleset a)\n(rewrite (compute (relu) x)\n", 2, "never closed"),
    ("(ruleset a)\n(rewrite x (compute (relu) x) :ruleset a)\n", 2, "not a bare variable"),
    ("(ruleset a)\n(rule ((= e (access a k))) ((union e (access b k))) :ruleset a)\n", 2, "variable 'b'"),
    ("(ruleset a)\n(rule ((= e (access a k))) ((panic \"x\")) :ruleset a)\n", 2, "`panic` is not allowed"),
    ("(ruleset shapes)\n", 1, "defined twice"),
    # named like an operator, a function or a relation of the language: egglog's own
    # "Shadowing is not allowed" would otherwise come in optimize, at no path:line
    ("; gelu\n(ruleset gelu-tanh)\n", 2, "ruleset 'gelu-tanh' is named like the language's operator"),
    ("(ruleset relu)\n", 1, "ruleset 'relu' is named like"),
    ("(ruleset tensor-shape)\n", 1, "ruleset 'tensor-shape' is named like"),
])
def test_malformed_files_are_refused_with_path_and_line(tmp_path, capfd, text, line, reason):
    with pytest.raises(RuleError) as err:
        _lib(tmp_path, text)
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 'user.egg'}:{line}: "), message
    assert reason in message and "\n" not in message
    assert capfd.readouterr().err == ""


def test_user_file_may_extend_but_not_redefine_a_builtin_ruleset(tmp_path):
    lib = RuleLibrary()
    if not lib.rulesets:
        pytest.skip("no built-in rulesets yet")
    builtin = sorted(lib.rulesets)[0]
    ext = tmp_path / "ext.egg"
    ext.write_text(f"; more\n(rewrite (compute (relu) (compute (relu) x)) (compute (relu) x) :ruleset {builtin} :name \"ext/r\")\n")
    lib2 = RuleLibrary([ext])
    assert any(r.name == "ext/r" for r in lib2.rulesets[builtin])
    redefine = tmp_path / "redef.egg"
    redefine.write_text(f"(ruleset {builtin})\n")
    with pytest.raises(RuleError, match=f"ruleset '{builtin}' is defined twice"):
        RuleLibrary([redefine])


def test_duplicate_rule_name_is_refused(tmp_path):
    text = GOOD + '(rewrite (compute (negative) (compute (negative) x)) x :ruleset userfam :name "userfam/relu-idem")\n'
    with pytest.raises(RuleError, match="already used"):
        _lib(tmp_path, text)


def test_unknown_ruleset_name_and_missing_path(tmp_path):
    lib = RuleLibrary()
    with pytest.raises(RuleError, match="unknown ruleset 'nosuch'"):
        lib.resolve(["nosuch"])
    with pytest.raises(RuleError, match="no such rule file"):
        lib.resolve([str(tmp_path / "missing.egg")])


def test_user_rule_runs_through_saturate(tmp_path):
    import apsat

    path = tmp_path / "user.egg"
    path.write_text(GOOD)
    eg = apsat.EGraph()
    root = eg.add(apsat.parse("(compute relu (compute relu (access-tensor x)))", {"x": (3,)}))
    report = eg.saturate(rules=[str(path)])
    assert report["phases"][0]["rule_matches"].get("userfam/relu-idem", 0) >= 1
    assert eg.matches("(compute relu (access-tensor x))", root)
