"""`rootrank` command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from correlator.rules import RuleError, load_ruleset


def _cmd_rules_validate(args: argparse.Namespace) -> int:
    try:
        rs = load_ruleset(Path(args.dir) if args.dir else None)
    except RuleError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
    print(f"{len(rs.rules)} rules valid (rule set {rs.version}); {len(rs.classes)} classes")
    return 0


def _cmd_rules_test(args: argparse.Namespace) -> int:
    from correlator.matcher import Matcher
    from correlator.ruletest import run_data_file, run_examples

    try:
        rs = load_ruleset(Path(args.dir) if args.dir else None)
    except RuleError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
    matcher = Matcher(rs)
    checked, failures = run_examples(rs, matcher)
    for failure in failures:
        print(failure, file=sys.stderr)
    print(f"{checked} examples in {len(rs.rules)} rules: {checked - len(failures)} passed, {len(failures)} failed")
    if args.data:
        for rule_id, count in sorted(run_data_file(rs, Path(args.data), matcher).items(), key=lambda kv: -kv[1]):
            if count:
                print(f"{count:8d}  {rule_id}")
    return 1 if failures else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rootrank",
        description="Find which rank broke a distributed training job, and why.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    rules = sub.add_parser("rules", help="validate and test the signature library")
    rules_sub = rules.add_subparsers(dest="rules_command", metavar="ACTION")
    validate = rules_sub.add_parser("validate", help="check every rule file; problems print as file:line: what")
    validate.add_argument("dir", nargs="?", help="rules folder (default: the installed library)")
    validate.set_defaults(func=_cmd_rules_validate)
    test = rules_sub.add_parser("test", help="run every rule's match/no_match examples")
    test.add_argument("dir", nargs="?", help="rules folder (default: the installed library)")
    test.add_argument("--data", help="also count hits per rule over this log file")
    test.set_defaults(func=_cmd_rules_test)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
