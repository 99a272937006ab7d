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


def _cmd_diagnose(args: argparse.Namespace) -> int:
    import orjson
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn, TimeRemainingColumn

    from correlator.diagnose import Diagnoser, DiagnoseStats, InputError, iter_sources
    from correlator.render_text import print_incidents

    err = Console(stderr=True)
    try:
        ruleset = load_ruleset(Path(args.rules) if args.rules else None)
    except RuleError as exc:
        for problem in exc.problems:
            err.print(problem, markup=False, highlight=False)
        return 1
    diagnoser = Diagnoser(ruleset)
    stats = DiagnoseStats()
    try:
        total = sum(s.size or 0 for s in iter_sources(args.paths, DiagnoseStats()))
    except InputError as exc:
        err.print(f"rootrank diagnose: {exc}", markup=False, highlight=False)
        return 2
    show_progress = args.progress == "always" or (args.progress == "auto" and err.is_terminal and total > 32 << 20)
    try:
        if show_progress:
            with Progress(
                "[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                TimeRemainingColumn(), console=err, transient=args.progress != "always",
            ) as bar:
                task = bar.add_task("scanning", total=total or None)
                incidents, signals = diagnoser.diagnose(
                    args.paths, args.job, stats=stats, progress=lambda n: bar.advance(task, n)
                )
        else:
            incidents, signals = diagnoser.diagnose(args.paths, args.job, stats=stats)
    except InputError as exc:
        err.print(f"rootrank diagnose: {exc}", markup=False, highlight=False)
        return 2
    for skipped in stats.skipped:
        err.print(f"skipped: {skipped}", markup=False, highlight=False)
    if stats.decode_errors:
        err.print(f"skipped {stats.decode_errors} undecodable JSON line(s)")
    if args.format == "json":
        payload = {"incidents": [i.to_json_dict() for i in incidents]}
        sys.stdout.buffer.write(orjson.dumps(payload, option=orjson.OPT_INDENT_2) + b"\n")
    elif args.format == "html":
        from correlator.report_html import render_incident_html

        out = Path(args.output or "rootrank-incident.html")
        if not incidents:
            err.print("No incident: nothing to draw.")
            return 0
        out.write_text(render_incident_html(incidents[0], signals), encoding="utf-8")
        err.print(f"wrote {out}")
    else:
        print_incidents(incidents, Console())
    if args.format != "json" and not stats.files and stats.skipped:
        return 2
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rootrank",
        description="Find which rank broke a distributed training job, and why.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    diagnose = sub.add_parser(
        "diagnose",
        help="name the rank that broke a job, from its log files (offline, no services)",
        description="All given paths form one job: files, folders (recursive), .gz, or - for stdin.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    diagnose.add_argument("paths", nargs="+", metavar="PATH")
    diagnose.add_argument("--format", choices=["text", "json", "html"], default="text")
    diagnose.add_argument("--job", help="job id for the incident (default: from the file names)")
    diagnose.add_argument("--output", "-o", help="with --format html: the file to write")
    diagnose.add_argument("--rules", help="rules folder (default: the installed library)")
    diagnose.add_argument(
        "--progress", choices=["auto", "always", "never"], default="auto",
        help="progress bar on stderr (auto: on a terminal, for inputs over 32 MiB)",
    )
    diagnose.set_defaults(func=_cmd_diagnose)
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
