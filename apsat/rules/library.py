"""The rule library: built-in rule files plus user files, validated together.

`RuleLibrary(extra)` loads `apsat/rules/*.egg` and then the user's files or directories in
order; `resolve(rules, files)` turns the `rules=` / `--rules` argument (ruleset names; an
entry that reads as a path, or a pathlib.Path, is a rule file or directory) and the
`--rule-file` paths into ruleset names: names and paths never mix, so a folder named like
a ruleset in the current directory changes nothing. `load_into(eg, rulesets)` puts the
needed declarations and rules into an EGraph once.
"""
from __future__ import annotations

from pathlib import Path

from apsat.errors import RuleError
from apsat.rules.loader import BUILTIN_DIR, Rule, RuleFile, language_signatures, parse_rule_file
from apsat.rules.plans import ON_REQUEST


def builtin_rule_files() -> list[Path]:
    """The built-in rule files, one family a file."""
    return sorted(BUILTIN_DIR.glob("*.egg"))


def builtin_stamp() -> tuple:
    """The built-in rule files as (path, size, mtime_ns): what a library or a loaded
    e-graph was read from, to tell when a file has been edited since."""
    return tuple((str(p), s.st_size, s.st_mtime_ns) for p in builtin_rule_files() for s in [p.stat()])


def is_path_like(text: str) -> bool:
    """Whether a `--rules` / `rules=` entry names a file or directory rather than a ruleset:
    it starts with `./`, `../`, `/` or `~`, holds a path separator, or ends in `.egg`."""
    return text.startswith(("./", "../", "/", "~")) or "/" in text or text.endswith(".egg")


def _expand(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(path.glob("*.egg"))
    if not path.exists():
        raise RuleError(f"{path}:1: no such rule file or directory")
    return [path]


class RuleLibrary:
    """Validated rule files: `files`, `rulesets` (name -> its rules), `rules` (name -> Rule)."""

    def __init__(self, extra=()):
        self.files: list[RuleFile] = []
        self.rulesets: dict[str, list[Rule]] = {}
        self.rules: dict[str, Rule] = {}
        self.defined_in: dict[str, Path] = {}
        self.phase_of: dict[str, str] = {}     # ruleset -> the phase it joins (its `:phase`)
        self._signatures = dict(language_signatures())
        for path in builtin_rule_files():
            self.add_file(path)
        for rf in self.files:                  # the built-ins: none may be silently left out
            for name, line in rf.rulesets:
                if name not in self.phase_of:
                    raise RuleError(f"{rf.path}:{line}: built-in ruleset '{name}' joins no phase: declare "
                                    f"(ruleset {name} :phase PHASE), or :phase {ON_REQUEST} to run it only when named")
        for item in extra:
            for path in _expand(Path(item)):
                self.add_file(path)

    def add_file(self, path) -> RuleFile:
        """Validate and add one file; returns it. RuleError `path:line: reason`."""
        path = Path(path).resolve()
        if any(f.path == path for f in self.files):
            return next(f for f in self.files if f.path == path)
        rf = parse_rule_file(path, set(self.rulesets), self._signatures)
        for name, line in rf.rulesets:
            self.rulesets[name] = []
            self.defined_in[name] = path
        self.phase_of.update(rf.phases)
        for rule in rf.rules:
            if rule.name in self.rules:
                other = self.rules[rule.name]
                raise RuleError(f"{path}:{rule.line}: rule name '{rule.name}' is already used "
                                f"at {other.path}:{other.line}")
            self.rules[rule.name] = rule
            self.rulesets[rule.ruleset].append(rule)
        self.files.append(rf)
        return rf

    def resolve(self, rules=(), files=()) -> list[str]:
        """Ruleset names for a `rules=` argument and rule `files`, in order, each once.

        `rules` (one item or a list): a str is a ruleset name unless it reads as a path
        (is_path_like: it starts with `./`, `../`, `/` or `~`, holds a `/`, or ends in
        `.egg`); a pathlib.Path is always a path. A name is looked up, never the file
        system: `fusion` is the built-in ruleset even beside a folder named fusion.
        `files`: paths of rule files or directories (`--rule-file`). A path's files are
        added and the rulesets they declare or extend are used. RuleError for an unknown
        name (saying so when a file of that name is here), a missing path, and a path
        with no ruleset and no rule (an empty directory, a file of comments)."""
        names: list[str] = []
        items = [rules] if isinstance(rules, (str, Path)) else list(rules or ())
        for item in items + [Path(f) for f in files]:
            if isinstance(item, Path) or is_path_like(str(item)):
                names.extend(self._path_rulesets(Path(str(item)).expanduser(), str(item)))
            elif str(item) in self.rulesets:
                names.append(str(item))
            else:
                raise RuleError(self._unknown(str(item)))
        return list(dict.fromkeys(names))

    def joins_plan(self, rules) -> bool:
        """Whether a `rules=` argument is rule-file paths only, whose rulesets all join a
        phase of the plans (`:phase`, not on-request): they then run in the target's plan."""
        items = [rules] if isinstance(rules, (str, Path)) else list(rules or ())
        if not items or not all(isinstance(i, Path) or is_path_like(str(i)) for i in items):
            return False
        return all(self.phase_of.get(name, ON_REQUEST) != ON_REQUEST for name in self.resolve(items))

    def _path_rulesets(self, path: Path, given: str) -> list[str]:
        """The rulesets that the rule files under `path` declare or extend."""
        names = []
        for file in _expand(path):
            rf = self.add_file(file)
            names += [n for n, _ in rf.rulesets] + [r.ruleset for r in rf.rules]
        if not names:
            what = "directory holds no .egg file" if path.is_dir() else "file declares no ruleset and no rule"
            raise RuleError(f"{given}: no rules to run (the {what})")
        return names

    def _unknown(self, name: str) -> str:
        """The message for a --rules entry that names no ruleset."""
        known = ", ".join(sorted(self.rulesets)) or "none"
        hint = "a rule file or directory is given by path (--rule-file PATH, or ./NAME or NAME.egg)"
        if Path(name).exists():
            hint = f"'{name}' here is a file or directory: give it as --rule-file {name} or ./{name}"
        return f"unknown ruleset '{name}' (known: {known}); {hint}"

    def declarations_text(self) -> str:
        """Every ruleset declaration and helper declaration, in file order."""
        parts = []
        for rf in self.files:
            parts += [f"(ruleset {name})" for name, _ in rf.rulesets]
            parts += rf.declarations
        return "\n".join(parts)

    def load_into(self, eg, rulesets) -> None:
        """Load the declarations (once per e-graph) and the rules of `rulesets` not yet
        loaded into `eg` (an apsat EGraph)."""
        loaded = eg.__dict__.setdefault("_loaded_rules", set())
        decls = eg.__dict__.setdefault("_loaded_decl_files", set())
        new_files = [rf for rf in self.files if rf.path not in decls]
        if new_files:
            text = "\n".join([f"(ruleset {n})" for rf in new_files for n, _ in rf.rulesets] +
                             [d for rf in new_files for d in rf.declarations])
            if text:
                eg.load_text(text, what="loading rule declarations")
            decls.update(rf.path for rf in new_files)
        todo = [r for name in rulesets for r in self.rulesets[name] if r.name not in loaded]
        if todo:
            eg.load_text("\n".join(r.text for r in todo), what=f"loading rules of {', '.join(rulesets)}")
            loaded.update(r.name for r in todo)

    def load_single_rule(self, eg, rule_name: str) -> str:
        """Load one rule alone into its own ruleset; returns that ruleset's name."""
        rule = self.rules.get(rule_name)
        if rule is None:
            raise RuleError(f"unknown rule '{rule_name}'")
        self.load_into(eg, [])
        only = "only-" + "".join(ch if ch.isalnum() else "-" for ch in rule_name)
        eg.load_text(f"(ruleset {only})\n" + rule.text_in(only), what=f"loading rule {rule_name}")
        return only
