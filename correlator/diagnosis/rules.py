"""Rule schema, loader and validation.

One YAML file per rule under `rules/<category>/<id>.yaml`. Every problem is reported as
`file:line: what is wrong`, so a broken rule can be fixed without reading a traceback.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from correlator.diagnosis.models import Role, Severity
from correlator.diagnosis.patterns import HYPERSCAN_VERSION, cache_dir, compile_single, pattern_flags

if TYPE_CHECKING:
    import yaml

RuleKind = Literal["signature", "fact"]
# The engine's confidence tiers (causality.tier): high from 0.7, middle from 0.45, low below. A rule's confidence
# says which tier it is in; within a tier, what explains more and came first wins, not the second decimal.
TIER_BOUNDARIES = (0.45, 0.7)
# A rule whose line is one rank's report naming another as the culprit (its extracted rank is the one named).
HINT_TAG = "hint"
# Classes that name no failure of their own, only that one happened: a last resort, never chosen over a
# specific class on the same line or in the same traceback, whatever the confidences.
GENERIC_CLASSES = frozenset({"python_exception"})
FactKind = Literal[
    "progress", "world_size", "heartbeat", "step", "checkpoint", "identity", "restart", "completion", "collective",
    "worker_failed",
]


class RuleError(Exception):
    """One or more `file:line: what` problems in the rule library."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


# The rule models are built on first validation (defer_build): a start-up that reads the rule set from the
# cache unpickles rules and never validates one.
class FailureClass(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow", defer_build=True)

    slug: str
    title: str
    category: str
    role: Role
    source: str
    detect: str


class Examples(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    match: list[str] = Field(min_length=2)
    no_match: list[str] = Field(min_length=2)


class Sequence_(BaseModel):
    """The rule's signal counts only when one of `after` matched earlier in the same job."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    after: list[str] = Field(min_length=1, description="hyperscan patterns of the earlier event")
    within_s: float = Field(default=3600.0, gt=0)
    same_process: bool = Field(default=False, description="the earlier event must come from the same rank/host")


class Absence(BaseModel):
    """The rule's patterns are a start marker; a signal is raised when no `end` follows within the deadline."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    end: list[str] = Field(min_length=1)
    deadline_s: float = Field(gt=0)
    progress: bool = Field(
        default=False,
        description=(
            "end markers are routine progress lines (loss/step lines): they are sampled, and any process's "
            "progress after the start clears it (a synchronous job cannot progress while one rank hangs)"
        ),
    )


class Metric(BaseModel):
    """A number extracted by `extract` (named group `field`) is compared across ranks or steps."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    field: str
    spike_ratio: float = Field(default=10.0, gt=1)
    min_points: int = Field(default=3, ge=2)


class SourceRef(BaseModel):
    """Where the message is emitted: a repository file (the code that raises or logs it) or a vendor doc."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    repo: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
    path: str | None = Field(default=None, min_length=1)
    url: str | None = Field(default=None, pattern=r"^https?://")
    versions: str | None = Field(default=None, description="the releases that print this wording, e.g. '>=2.2'")
    note: str | None = None

    @model_validator(mode="after")
    def _repo_file_or_url(self) -> SourceRef:
        if self.url is None and (self.repo is None or self.path is None):
            raise ValueError("a source is `repo` and `path` of the code that emits the message, or a vendor doc `url`")
        return self


class Rule(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True, defer_build=True)

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    title: str = Field(min_length=3)
    kind: RuleKind = "signature"
    class_: str | None = Field(default=None, alias="class")
    fact: FactKind | None = None
    severity: Severity = "high"
    role: Role | None = None
    patterns: list[str] = Field(min_length=1)
    caseless: bool = False
    extract: list[str] = Field(default_factory=list)
    explains: list[str] = Field(default_factory=list)
    yields_to: list[str] = Field(
        default_factory=list,
        description=(
            "classes that name this line's failure more precisely when a line of theirs is in the same "
            "traceback of the same process (a wrapper's message and the reason under it)"
        ),
    )
    explains_within_s: float | None = Field(
        default=None,
        gt=0,
        description=(
            "how long after this rule's signal an explained signal may come and still be its consequence; "
            "default: the logged collective timeout, else the engine's default horizon"
        ),
    )
    confidence: float = Field(default=0.8, ge=0.0, le=1.0)
    sequence: Sequence_ | None = None
    absence: Absence | None = None
    metric: Metric | None = None
    mechanism: str = ""
    fix: list[str] = Field(default_factory=list)
    verify: list[str] = Field(default_factory=list)
    references: list[str] = Field(default_factory=list)
    source: list[SourceRef] = Field(default_factory=list)
    examples: Examples
    version: int = Field(default=1, ge=1)
    tags: list[str] = Field(default_factory=list)

    @field_validator("extract")
    @classmethod
    def _extract_compiles(cls, value: list[str]) -> list[str]:
        for pattern in value:
            try:
                compiled = re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"extract regex {pattern!r} does not compile: {exc}") from exc
            if not compiled.groupindex:
                raise ValueError(f"extract regex {pattern!r} has no named group (?P<name>...)")
        return value

    @model_validator(mode="after")
    def _kind_fields(self) -> Rule:
        if self.kind == "signature":
            missing = [n for n in ("mechanism", "fix", "verify", "references", "source") if not getattr(self, n)]
            if self.class_ is None:
                missing.insert(0, "class")
            if missing:
                raise ValueError(f"a signature rule needs {', '.join(missing)}")
        else:
            if self.fact is None:
                raise ValueError("a fact rule needs `fact` (progress, world_size, heartbeat, step, checkpoint, identity, "
                                 "restart, completion, collective)")
        for url in self.references:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"reference {url!r} is not a URL")
        return self


@dataclass(frozen=True)
class LoadedRule:
    rule: Rule
    path: Path
    line: int
    pattern_lines: tuple[int, ...]
    example_lines: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def where(self, line: int | None = None) -> str:
        return f"{self.path}:{line or self.line}"


@dataclass(frozen=True)
class RuleSet:
    rules: tuple[LoadedRule, ...]
    classes: dict[str, FailureClass]
    version: str
    # The on-disk cache entry this set was loaded from or saved to (see `load_ruleset`); None: not cached.
    cache_key: str | None = field(default=None, compare=False)

    def by_id(self) -> dict[str, Rule]:
        return {lr.rule.id: lr.rule for lr in self.rules}

    def signatures(self) -> list[Rule]:
        return [lr.rule for lr in self.rules if lr.rule.kind == "signature"]

    def role_of(self, rule: Rule) -> Role:
        if rule.role is not None:
            return rule.role
        if rule.class_ and rule.class_ in self.classes:
            return self.classes[rule.class_].role
        return "either"


def default_rules_dir() -> Path:
    return Path(str(resources.files("rules")))


# --- YAML with line numbers -------------------------------------------------------------


def _loader() -> type[yaml.SafeLoader]:
    """libyaml's parser when present: the pure-Python one made loading the library take seconds. (yaml is
    imported here, not at the top: a start-up that finds its rule set in the cache parses no YAML.)"""
    import yaml

    loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return loader


# Where a value sits in a rule file: its keys and list indices from the top (('examples', 'match', 0)).
Location = tuple[str | int, ...]


def _collect_lines(node: yaml.Node, lines: dict[Location, int], path: Location) -> None:
    import yaml

    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key_path = (*path, key_node.value)
            lines[key_path] = key_node.start_mark.line + 1
            _collect_lines(value_node, lines, key_path)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[(*path, i)] = item.start_mark.line + 1
            _collect_lines(item, lines, (*path, i))


def load_yaml_with_lines(path: Path) -> tuple[object, dict[Location, int]]:
    """The parsed document and a map from key paths (('examples', 'match', 0)) to 1-based lines."""
    text = path.read_text(encoding="utf-8")
    lines: dict[Location, int] = {}
    import yaml

    node = yaml.compose(text, Loader=_loader())
    if node is not None:
        _collect_lines(node, lines, ())
    return yaml.load(text, Loader=_loader()), lines


def _line_for(loc: Location, lines: dict[Location, int]) -> int:
    loc_list = list(loc)
    # pydantic reports the alias `class` as `class`; models use class_ internally.
    while loc_list:
        key = tuple(loc_list)
        if key in lines:
            return lines[key]
        loc_list.pop()
    return 1


# --- loading ----------------------------------------------------------------------------


def load_classes(path: Path) -> dict[str, FailureClass]:
    import yaml

    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return {c["slug"]: FailureClass(**c) for c in data["classes"]}


def _hyperscan_problem(pattern: str, caseless: bool) -> str | None:
    import hyperscan

    try:
        compile_single(pattern, caseless=caseless)
    except hyperscan.error as exc:  # it carries the compiler's message
        return str(exc) or type(exc).__name__
    return None


def _rule_files(root: Path) -> list[Path]:
    """Every rule file under `root`, in path order. Hidden files and folders inside `root` are skipped,
    not the folders above it: a library installed under ~/.venv or ~/.local is read."""
    found: list[Path] = []
    for folder, folders, names in os.walk(root, followlinks=True):
        folders[:] = [name for name in folders if not name.startswith(".")]
        found.extend(Path(folder, name) for name in names
                     if name.endswith(".yaml") and not name.startswith(".") and name != "classes.yaml")
    return sorted(found)


def _all_patterns(rule: Rule) -> list[str]:
    return [*rule.patterns, *(rule.sequence.after if rule.sequence else []), *(rule.absence.end if rule.absence else [])]


def _all_compile(rule: Rule) -> bool:
    import hyperscan


    patterns = _all_patterns(rule)
    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    try:
        db.compile(expressions=[p.encode("utf-8") for p in patterns], ids=list(range(len(patterns))),
                   flags=[pattern_flags(rule.caseless)] * len(patterns))
    except hyperscan.error:  # which pattern is wrong is found one by one, for file:line
        return False
    return True


def _pattern_problems(path: Path, rule: Rule, lines: dict[Location, int]) -> list[str]:
    problems: list[str] = []
    for i, pattern in enumerate(rule.patterns):
        err = _hyperscan_problem(pattern, rule.caseless)
        if err:
            problems.append(f"{path}:{lines.get(('patterns', i), 1)}: patterns[{i}]: hyperscan cannot compile {pattern!r}: {err}")
    for block, key in ((rule.sequence, "after"), (rule.absence, "end")):
        if block is None:
            continue
        name = "sequence" if block is rule.sequence else "absence"
        for i, pattern in enumerate(getattr(block, key)):
            err = _hyperscan_problem(pattern, rule.caseless)
            if err:
                problems.append(f"{path}:{lines.get((name, key, i), 1)}: {name}.{key}[{i}]: hyperscan cannot compile: {err}")
    return problems


def load_rule_file(
    path: Path, classes: dict[str, FailureClass], *, check_patterns: bool = True
) -> tuple[LoadedRule | None, list[str]]:
    import yaml

    problems: list[str] = []
    try:
        data, lines = load_yaml_with_lines(path)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        return None, [f"{path}:{line}: YAML syntax: {getattr(exc, 'problem', exc)}"]
    except (OSError, UnicodeDecodeError) as exc:
        return None, [f"{path}:1: cannot read: {exc}"]
    if not isinstance(data, dict):
        return None, [f"{path}:1: a rule file must be a mapping of fields"]
    try:
        rule = Rule.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors():
            loc = tuple(err["loc"])
            where = ".".join(str(p) for p in loc) or "rule"
            problems.append(f"{path}:{_line_for(loc, lines)}: {where}: {err['msg']}")
        return None, problems
    if rule.id != path.stem:
        problems.append(f"{path}:{lines.get(('id',), 1)}: id {rule.id!r} must equal the file name {path.stem!r}")
    for key, slugs in (("class", [rule.class_] if rule.class_ else []), ("explains", rule.explains),
                       ("yields_to", rule.yields_to)):
        for i, slug in enumerate(slugs):
            if slug not in classes:
                line = lines.get((key, i), lines.get((key,), 1)) if key != "class" else lines.get((key,), 1)
                problems.append(f"{path}:{line}: {key}: unknown class {slug!r} (see rules/classes.yaml)")
    if check_patterns and not _all_compile(rule):
        problems.extend(_pattern_problems(path, rule, lines))
    if problems:
        return None, problems
    loaded = LoadedRule(
        rule=rule,
        path=path,
        line=lines.get(("id",), 1),
        pattern_lines=tuple(lines.get(("patterns", i), 1) for i in range(len(rule.patterns))),
        example_lines={
            kind: tuple(lines.get(("examples", kind, i), 1) for i in range(len(getattr(rule.examples, kind))))
            for kind in ("match", "no_match")
        },
    )
    return loaded, []


def _whole_set_compiles(files: list[Path], classes: dict[str, FailureClass]) -> bool:
    import hyperscan


    patterns: list[bytes] = []
    flags: list[int] = []
    for path in files:
        rule, _ = load_rule_file(path, classes, check_patterns=False)
        if rule is None:
            continue
        for pattern in _all_patterns(rule.rule):
            patterns.append(pattern.encode("utf-8"))
            flags.append(pattern_flags(rule.rule.caseless))
    key = hashlib.sha256(b"\0".join(patterns) + repr(flags).encode() + HYPERSCAN_VERSION.encode()).hexdigest()[:20]
    marker = cache_dir() / f"patterns-ok-{key}"
    if marker.exists():
        return True
    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    try:
        db.compile(expressions=patterns, ids=list(range(len(patterns))), flags=flags)
    except hyperscan.error:
        return False
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    except OSError:
        pass
    return True


def load_ruleset(root: Path | None = None, *, strict: bool = True, use_cache: bool = True) -> RuleSet:
    """Load and validate every rule under `root`.

    strict: raise RuleError listing every problem; otherwise skip broken files (hot reload keeps
    serving the rules that are fine and reports the rest).

    use_cache: a rule set that validated is kept on disk (`cache_dir()`), keyed by the content of every
    rule file and classes.yaml, the package version and the versions of what validates and compiles
    them; the next load with the same content reads that one file (with the compiled hyperscan
    databases the matcher added to it) instead of parsing and validating every YAML file. Changing,
    adding or removing a rule file changes the key.
    """
    root = root or default_rules_dir()
    classes_path = root / "classes.yaml"
    if not classes_path.exists():
        classes_path = default_rules_dir() / "classes.yaml"
    files = _rule_files(root)
    cache_key = _ruleset_cache_key(root, classes_path, files) if use_cache else None
    if cache_key is not None:
        cached = _read_cached_ruleset(cache_key)
        if cached is not None:
            return cached
    ruleset = _load_ruleset_files(root, classes_path, files, strict)
    if cache_key is not None and len(ruleset.rules) == len(files):  # every file valid: worth keeping
        ruleset = RuleSet(rules=ruleset.rules, classes=ruleset.classes, version=ruleset.version, cache_key=cache_key)
        _write_cached_ruleset(ruleset, {})
    return ruleset


def _load_ruleset_files(root: Path, classes_path: Path, files: list[Path], strict: bool) -> RuleSet:
    classes = load_classes(classes_path)
    problems: list[str] = []
    loaded: list[LoadedRule] = []
    seen: dict[str, Path] = {}
    digest = hashlib.sha256()
    # One compile of every pattern (remembered by content hash) proves them all; only when it fails
    # is each file compiled on its own, to say which pattern is wrong and where.
    check_each = not _whole_set_compiles(files, classes)
    for path in files:
        rule, errs = load_rule_file(path, classes, check_patterns=check_each)
        problems.extend(errs)
        if rule is None:
            continue
        if rule.rule.id in seen:
            problems.append(f"{path}:{rule.line}: id {rule.rule.id!r} already used by {seen[rule.rule.id]}")
            continue
        seen[rule.rule.id] = path
        digest.update(path.read_bytes())
        loaded.append(rule)
    if not loaded and not problems:
        problems.append(f"{root}:1: no rule files found")
    if problems and strict:
        raise RuleError(problems)
    return RuleSet(rules=tuple(loaded), classes=classes, version=digest.hexdigest()[:12])


# --- the on-disk cache of validated rule sets ---------------------------------------------

_CACHE_FORMAT = 1
# cache key -> the compiled databases (matcher key -> hyperscan.dumpb bytes) stored with that rule set
_DATABASES: dict[str, dict[str, bytes]] = {}


def _package_version() -> str:
    try:
        from importlib.metadata import version

        return version("rootrank")
    except Exception:  # noqa: BLE001  (not installed: a source checkout on PYTHONPATH)
        return "source"


def _yaml_build() -> str:
    """Which PyYAML would parse the files (its module file's path, size and time), without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("yaml")
    if spec is None or spec.origin is None:
        return "none"
    try:
        stat = os.stat(spec.origin)
    except OSError:
        return spec.origin
    return f"{spec.origin}:{stat.st_size}:{stat.st_mtime_ns}"


def _ruleset_cache_key(root: Path, classes_path: Path, files: list[Path]) -> str | None:
    """sha256 of what the loaded set depends on: where the rules are, every rule file's path and bytes,
    classes.yaml's bytes, the package version and the validating and compiling libraries' versions."""
    import pydantic

    digest = hashlib.sha256(
        f"{_CACHE_FORMAT}|{_package_version()}|{sys.version_info[:2]}|{pydantic.VERSION}|{HYPERSCAN_VERSION}|"
        f"{_yaml_build()}".encode()
    )
    try:
        # The loaded rules carry their files' paths (for file:line reports): the same content elsewhere is
        # another entry.
        digest.update(str(root.resolve()).encode() + b"\0" + str(classes_path.resolve()).encode() + b"\0")
        digest.update(classes_path.read_bytes())
        for path in files:
            digest.update(b"\0" + str(path.relative_to(root)).encode() + b"\0")
            digest.update(path.read_bytes())
    except (OSError, ValueError):
        return None  # unreadable now: the full load reports it
    return digest.hexdigest()[:32]


def _cache_path(cache_key: str) -> Path:
    return cache_dir() / f"ruleset-{cache_key}.pickle"


def _read_cached_ruleset(cache_key: str) -> RuleSet | None:
    try:
        with _cache_path(cache_key).open("rb") as fh:
            entry = pickle.load(fh)
        ruleset, databases = entry["ruleset"], entry["databases"]
    except Exception:  # noqa: BLE001  (absent, torn or from another version: the full load rebuilds it)
        return None
    if not isinstance(ruleset, RuleSet) or ruleset.cache_key != cache_key:
        return None
    _DATABASES[cache_key] = dict(databases)
    return ruleset


def _write_cached_ruleset(ruleset: RuleSet, databases: dict[str, bytes]) -> None:
    assert ruleset.cache_key is not None
    path = _cache_path(ruleset.cache_key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        with tmp.open("wb") as fh:
            pickle.dump({"ruleset": ruleset, "databases": databases}, fh, protocol=pickle.HIGHEST_PROTOCOL)
        tmp.replace(path)
    except OSError:
        pass  # a read-only cache only costs the next start-up its full load
    _DATABASES[ruleset.cache_key] = dict(databases)


def cached_database(ruleset: RuleSet, key: str) -> bytes | None:
    """A compiled database (hyperscan.dumpb) stored with the rule set's cache entry, by the matcher's key."""
    if ruleset.cache_key is None:
        return None
    return _DATABASES.get(ruleset.cache_key, {}).get(key)


def store_databases(ruleset: RuleSet, databases: dict[str, bytes]) -> None:
    """Add compiled databases to the rule set's cache entry, so the next start-up reads one file."""
    if ruleset.cache_key is None or not databases:
        return
    known = _DATABASES.get(ruleset.cache_key, {})
    if all(known.get(k) == v for k, v in databases.items()):
        return
    _write_cached_ruleset(ruleset, {**known, **databases})


def rule_json_schema() -> dict[str, object]:
    return Rule.model_json_schema(by_alias=True)
