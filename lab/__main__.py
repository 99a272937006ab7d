"""The fault lab: `python -m lab run|score|list [--only a,b] [--out DIR] [--force]`.

run    jobs -> logs: every selected scenario as a real job (skipped when its output exists, unless --force)
score  rootrank diagnose on the output that exists; the last line is `lab: class X/N (P%) initiator Y/M (Q%)`
list   the scenarios: coverage, launcher, ranks, hosts, clock skew, label
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from lab.scenario import ScenarioError, derive_initiator, load_all, select

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "lab-out"


def _list(scenarios: list, stream=sys.stdout, markdown: bool = False) -> None:  # type: ignore[no-untyped-def]
    if markdown:
        print("| scenario | covers | launcher | ranks (hosts x per host) | rendezvous | logs kept as | clock skew | label |",
              file=stream)
        print("|---|---|---|---|---|---|---|---|", file=stream)
        for s in scenarios:
            skew = ", ".join(f"{h} {v:+g} s" for h, v in s.clocks.items()) or "-"
            restarts = f", {s.max_restarts} restart(s)" if s.max_restarts else ""
            shape = s.collect + (" + --log-dir trees" if s.launcher == "torchrun-logdir" else "")
            print(f"| `{s.name}` | {', '.join(s.covers)} | {s.launcher}{restarts} | {s.world} ({s.hosts} x {s.procs}) | "
                  f"{s.rdzv} | {shape} | {skew} | {s.label.class_} / {derive_initiator(s)} |", file=stream)
        return
    for s in scenarios:
        skew = ",".join(f"{h}{v:+g}s" for h, v in s.clocks.items()) or "-"
        print(f"{s.name:40s} {','.join(s.covers):28s} {s.launcher:16s} {s.world:2d} ranks {s.hosts} host(s) "
              f"{s.collect:8s} skew {skew:18s} {s.label.class_}/{derive_initiator(s)}", file=stream)
    print(f"{len(scenarios)} scenario(s)", file=stream)


def _run(scenarios: list, out: Path, force: bool, keep_work: bool) -> int:  # type: ignore[type-arg]
    import importlib.util

    from lab.runner import become_subreaper, load_result, run_scenario, save_result, write_tables

    if importlib.util.find_spec("torch") is None:
        print("lab: torch is not installed in this environment: run `make lab` (it installs the [lab] extra)",
              file=sys.stderr)
        return 2
    become_subreaper()
    out.mkdir(parents=True, exist_ok=True)
    total = time.monotonic()
    errors = 0
    for n, s in enumerate(scenarios, 1):
        meta = load_result(out, s.name)
        if meta is not None and not force and (out / "cases" / s.name).exists():
            print(f"[{n}/{len(scenarios)}] {s.name}: output exists ({meta['status']}), skipped (--force reruns)",
                  flush=True)
            errors += meta["status"] != "ok"
            continue
        print(f"[{n}/{len(scenarios)}] {s.name}: {s.world} ranks on {s.hosts} host(s), {s.launcher} ...",
              end=" ", flush=True)
        result = run_scenario(s, out, keep_work=keep_work)
        save_result(out, result)
        codes = " ".join(f"{h}={c}" for h, c in result.exit_codes.items())
        if result.status == "ok":
            print(f"fired ({result.duration_s:.0f} s; exit {codes})", flush=True)
        else:
            errors += 1
            print(f"ERROR ({result.duration_s:.0f} s): {result.error}", flush=True)
    write_tables(out, load_all())
    print(f"lab run: {len(scenarios)} scenario(s) in {time.monotonic() - total:.0f} s, {errors} error(s); "
          f"output in {out}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["run", "score", "list"])
    parser.add_argument("--only", help="scenario names or coverage items, comma-separated")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: lab-out/)")
    parser.add_argument("--force", action="store_true", help="run scenarios again even when their output exists")
    parser.add_argument("--keep-work", action="store_true", help="keep each job's work folder (data, config)")
    parser.add_argument("--markdown", action="store_true", help="list: the table of docs/lab.md")
    args = parser.parse_args(argv)
    args.out = args.out.resolve()  # jobs run in their own folders: every path they get is absolute
    try:
        scenarios = select(load_all(), args.only)
    except ScenarioError as exc:
        print(f"lab: {exc}", file=sys.stderr)
        return 2
    if args.command == "list":
        _list(scenarios, markdown=args.markdown)
        return 0
    if args.command == "run":
        return _run(scenarios, args.out, args.force, args.keep_work)
    from lab.score import score

    score(scenarios, args.out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
