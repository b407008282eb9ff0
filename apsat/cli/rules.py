"""`apsat rules`: list the rules, check rule files, and ask why a rule did or did not fire.

    apsat rules list [PATH ...]            every ruleset and rule, with file and line
    apsat rules check PATH ...             validate rule files without running a model
    apsat rules why [FILE] RULE MODEL      saturate MODEL (with FILE's rules) and say whether
                                           RULE fired and, if not, where its matching stopped

Bad input (an unknown rule, a bad rule file, an unreadable model) is a one-line error and
exit status 2, as for every command (apsat.cli).
"""
from __future__ import annotations

from pathlib import Path

from apsat.errors import ApsatError

EXIT_OK = 0


def rules_options(p) -> None:
    """The `rules` sub-command's arguments."""
    p.add_argument("action", choices=["list", "check", "why"])
    p.add_argument("paths", nargs="*",
                   help="check: rule files or directories; list: extra files; why: [RULE_FILE] RULE_NAME MODEL.onnx")
    p.add_argument("--target", default="gpu", help="why: the target whose plan saturates the model (default gpu)")


def cmd_rules(args) -> int:
    """Run `apsat rules ACTION` (module doc)."""
    from apsat.rules.library import RuleLibrary

    args.phase = "rules"
    if args.action == "why":
        return _why(args)
    if args.action == "check":
        if not args.paths:
            raise ApsatError("rules check: give one or more rule files or directories")
        lib = RuleLibrary(args.paths)
        names = lib.resolve(files=args.paths)
        checked = set(_rule_paths(args.paths))
        count = sum(len(rf.rules) for rf in lib.files if rf.path in checked)
        print(f"ok: {count} rules in ruleset(s) {', '.join(names) or '-'}")
        return EXIT_OK
    lib = RuleLibrary(args.paths)
    for name in sorted(lib.rulesets):
        where = lib.defined_in.get(name, "")
        print(f"{name}  ({where})")
        for rule in lib.rulesets[name]:
            print(f"  {rule.name}  {rule.path}:{rule.line}")
    return EXIT_OK


def _rule_paths(items) -> list[Path]:
    out = []
    for item in items:
        p = Path(item).resolve()
        out.extend(sorted(p.glob("*.egg")) if p.is_dir() else [p])
    return out


def _why(args) -> int:
    """`rules why [RULE_FILE] RULE_NAME MODEL`: print the answer of apsat.pipeline.why."""
    from apsat.pipeline.why import why_on_model
    from apsat.targets import parse_target

    if len(args.paths) not in (2, 3):
        raise ApsatError("rules why: give [RULE_FILE] RULE_NAME MODEL.onnx")
    *files, rule_name, model = args.paths
    parse_target(args.target)      # a bad --target is refused before the model loads
    print(why_on_model(model, rule_name, files, args.target))
    return EXIT_OK
