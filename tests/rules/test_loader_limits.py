"""Rule files past the loader's limits are refused as `path:line: reason` before anything
large is read or reaches egglog (benchmarks/fuzz.py found each: a 50 MB string ran
Python's regex out of memory, 100k rules took egglog past 20 GB, forms nested 10k deep
overflowed egglog's stack)."""
import pytest

from apsat.errors import RuleError
from apsat.rules.library import RuleLibrary
from apsat.rules.loader import MAX_FILE_BYTES, MAX_FORMS, MAX_NESTING

RULE = '(rewrite (compute (relu) (compute (relu) x)) (compute (relu) x) :ruleset big :name "big/r{}")\n'


def _refused(tmp_path, data: bytes) -> str:
    path = tmp_path / "big.egg"
    path.write_bytes(data)
    with pytest.raises(RuleError) as err:
        RuleLibrary([path])
    message = str(err.value)
    assert message.startswith(f"{path}:") and "\n" not in message, message
    return message


def test_file_over_the_size_limit(tmp_path):
    data = b"(ruleset big)\n(rewrite (compute (relu) x) x :ruleset big :name \"" + b"n" * MAX_FILE_BYTES + b"\")\n"
    assert "over the limit of 1048576 (1 MiB)" in _refused(tmp_path, data)


def test_too_many_rules(tmp_path):
    text = "(ruleset big)\n" + "".join(RULE.format(i) for i in range(MAX_FORMS))
    message = _refused(tmp_path, text.encode())
    assert f":{MAX_FORMS + 1}: more than {MAX_FORMS} rules and declarations" in message


def test_forms_nested_too_deep(tmp_path):
    depth = MAX_NESTING
    text = f"(ruleset big)\n(rewrite {'(compute (relu) ' * depth}x{')' * depth} x :ruleset big)\n"
    assert f":2: forms nest more than {MAX_NESTING} deep" in _refused(tmp_path, text.encode())


def test_just_under_the_limits_loads(tmp_path):
    depth = MAX_NESTING // 2 - 1          # each (compute (relu) ...) is two levels
    text = ("(ruleset big)\n" + "".join(RULE.format(i) for i in range(MAX_FORMS - 2))
            + f"(rewrite {'(compute (relu) ' * depth}x{')' * depth} x :ruleset big)\n")
    path = tmp_path / "big.egg"
    path.write_text(text)
    assert len(RuleLibrary([path]).rulesets["big"]) == MAX_FORMS - 1


@pytest.mark.parametrize("data", [b"(ruleset a)\n; caf\xe9\n", b"\xff\xfe(\x00r\x00", b"(ruleset a)\x80\n"])
def test_bytes_that_are_not_utf8(tmp_path, data):
    assert ":1: cannot read rule file (UnicodeDecodeError)" in _refused(tmp_path, data)


def test_a_byte_order_mark_is_skipped(tmp_path):
    """An editor's UTF-8 BOM: it was an atom before the first form (the limit check then
    raised AttributeError on it)."""
    path = tmp_path / "bom.egg"
    path.write_bytes(b"\xef\xbb\xbf; comment\n(ruleset bom)\n(rewrite (compute (relu) x) x :ruleset bom)\n")
    assert len(RuleLibrary([path]).rulesets["bom"]) == 1


def test_a_stray_atom_at_top_level(tmp_path):
    assert ":2: unexpected 'stray' at top level" in _refused(tmp_path, b"(ruleset a)\nstray\n")


def test_an_integer_past_i64(tmp_path):
    """`rules check` passed it; egglog refused the file only when optimize loaded it."""
    text = "(ruleset a)\n(rewrite (access-slice x 0 0 99999999999999999999) x :ruleset a)\n"
    assert ":2: integer 99999999999999999999 does not fit in i64" in _refused(tmp_path, text.encode())
