"""Per-job webhook registrations: what `PUT /jobs/{job_id}/webhooks` stores.

A registration is a receiver kind plus that kind's config (validated by the kind's own model)
plus optional filters. Stored values hold the secrets (the store is the worker's faust table);
what is shown (`public_view`) never does, and shows the URL redacted unless the caller holds
the API token (incoming-webhook URLs are credentials themselves).
"""

from __future__ import annotations

import re
from collections.abc import MutableMapping
from typing import Any, Protocol

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from correlator.diagnosis.models import Incident, Severity
from correlator.sinks.webhooks.notification import severity_at_least
from correlator.sinks.webhooks.receivers import Receiver, build_receiver, safe_errors
from correlator.sinks.webhooks.receivers.base import short_hash

JOB_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,199}$")
CLASS_GLOB_PATTERN = re.compile(r"^[A-Za-z0-9_*?.\[\]-]{1,100}$")
MAX_REGISTRATIONS_PER_JOB = 20
STORE_VERSION = 1


def check_job_id(job_id: str) -> str:
    if not JOB_ID_PATTERN.match(job_id):
        raise ValueError("job_id must be 1..200 characters of letters, digits and ._:@+=- (not starting with one of those)")
    return job_id


class RegistrationError(ValueError):
    """A registration that cannot be stored; the message names fields, never values."""


class Registration(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str = "generic_json"
    url: str | None = None
    secret: SecretStr | None = None
    routing_key: SecretStr | None = None
    min_severity: Severity | None = None
    classes: list[str] = Field(default_factory=list, max_length=20)

    @field_validator("classes")
    @classmethod
    def _check_classes(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if not CLASS_GLOB_PATTERN.match(pattern):
                raise ValueError("classes are class slugs or globs of [A-Za-z0-9_*?.[]-], 1..100 characters")
        return value

    @model_validator(mode="after")
    def _check_receiver(self) -> Registration:
        # The kind's own config model decides what is valid for it.
        self.receiver("validation")
        return self

    def receiver_config(self) -> dict[str, Any]:
        raw: dict[str, Any] = {"kind": self.kind}
        if self.url is not None:
            raw["url"] = self.url
        if self.secret is not None:
            raw["secret"] = self.secret.get_secret_value()
        if self.routing_key is not None:
            raw["routing_key"] = self.routing_key.get_secret_value()
        return raw

    def receiver(self, name: str) -> Receiver[Any]:
        return build_receiver(name, self.receiver_config())

    @property
    def id(self) -> str:
        return short_hash(self.kind + "\n" + self.receiver("id").config.identity(), 12)

    def wants(self, incident: Incident) -> bool:
        from fnmatch import fnmatchcase

        if not severity_at_least(incident.severity, self.min_severity):
            return False
        return not self.classes or any(fnmatchcase(incident.class_, pattern) for pattern in self.classes)

    def stored(self) -> dict[str, Any]:
        """The value kept in the store, secrets included."""
        value = self.receiver_config()
        if self.min_severity is not None:
            value["min_severity"] = self.min_severity
        if self.classes:
            value["classes"] = list(self.classes)
        return value

    def public_view(self, *, show_url: bool) -> dict[str, Any]:
        receiver = self.receiver("view")
        target = self.url if (show_url and self.url is not None) else receiver.display_target()
        return {
            "id": self.id,
            "kind": self.kind,
            "target": target,
            "signed": self.secret is not None,
            "min_severity": self.min_severity,
            "classes": list(self.classes),
        }

    @classmethod
    def parse(cls, raw: Any) -> Registration:
        if not isinstance(raw, dict):
            raise RegistrationError("a registration is a JSON object")
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            raise RegistrationError("; ".join(safe_errors(exc))) from None
        except ValueError as exc:
            raise RegistrationError(str(exc)) from None


class RegistrationStore(Protocol):
    """job_id -> stored value. A plain dict fits; so does a faust Table."""

    def get(self, key: str, default: Any = None, /) -> Any: ...

    def __setitem__(self, key: str, value: Any, /) -> None: ...

    def __delitem__(self, key: str, /) -> None: ...

    def __contains__(self, key: object, /) -> bool: ...


class EchoSafeStore:
    """A changelog-replicated table that does not read back stale copies of its own writes.

    Every worker keeps reading the registrations changelog, its own writes included, so right
    after a PUT then a DELETE the table briefly holds the PUT's value again (measured: a removed
    webhook was notified 300 ms after its removal). Local writes are kept here, stamped with
    this writer's id and a sequence number, and take precedence until the changelog shows that
    very write; everything before it in the changelog is older than it. Deletes are written as
    empty values so they carry the stamp too.
    """

    def __init__(self, table: MutableMapping[str, Any], writer_id: str | None = None) -> None:
        import uuid

        self.table = table
        self.writer_id = writer_id or uuid.uuid4().hex[:12]
        self._seq = 0
        self._pending: dict[str, dict[str, Any]] = {}

    def get(self, key: str, default: Any = None, /) -> Any:
        if key in self._pending:
            return self._pending[key]
        return self.table.get(key, default)

    def __contains__(self, key: object, /) -> bool:
        return isinstance(key, str) and self.get(key) is not None

    def __setitem__(self, key: str, value: Any, /) -> None:
        self._seq += 1
        stamped = {**value, "writer": self.writer_id, "seq": self._seq}
        self._pending[key] = stamped
        self.table[key] = stamped

    def __delitem__(self, key: str, /) -> None:
        self[key] = {"v": STORE_VERSION, "webhooks": []}

    def on_changelog(self, key: Any, value: Any) -> None:
        """Call for every changelog record the table applies (from faust's on_changelog_event)."""
        if isinstance(key, bytes):
            key = key.decode("utf-8", "replace")
        mine = self._pending.get(key)
        if mine is None:
            return
        if isinstance(value, bytes | str):
            import json

            try:
                value = json.loads(value)
            except ValueError:
                return
        if isinstance(value, dict) and value.get("writer") == self.writer_id and value.get("seq") == mine["seq"]:
            del self._pending[key]

    @property
    def pending(self) -> int:
        return len(self._pending)


class Registry:
    """Registrations per job over a key-value store."""

    def __init__(self, store: RegistrationStore | MutableMapping[str, Any] | None = None) -> None:
        self.store: RegistrationStore | MutableMapping[str, Any] = store if store is not None else {}

    def for_job(self, job_id: str) -> list[Registration]:
        value = self.store.get(job_id)
        if not value:
            return []
        registrations = []
        for raw in value.get("webhooks", []):
            try:
                registrations.append(Registration.model_validate(raw))
            except (ValidationError, ValueError):
                # A value written by an older, laxer version: skip it rather than stop notifications.
                continue
        return registrations

    def _write(self, job_id: str, registrations: list[Registration]) -> None:
        if registrations:
            self.store[job_id] = {"v": STORE_VERSION, "webhooks": [r.stored() for r in registrations]}
        elif job_id in self.store:
            del self.store[job_id]

    def upsert(self, job_id: str, registration: Registration) -> bool:
        """Add, or replace the registration with the same id; True when it is new."""
        check_job_id(job_id)
        current = self.for_job(job_id)
        new_id = registration.id
        kept = [r for r in current if r.id != new_id]
        created = len(kept) == len(current)
        if created and len(kept) >= MAX_REGISTRATIONS_PER_JOB:
            raise RegistrationError(f"a job has at most {MAX_REGISTRATIONS_PER_JOB} webhooks")
        self._write(job_id, [*kept, registration])
        return created

    def remove(self, job_id: str, registration_id: str) -> bool:
        current = self.for_job(job_id)
        kept = [r for r in current if r.id != registration_id]
        if len(kept) == len(current):
            return False
        self._write(job_id, kept)
        return True

    def clear(self, job_id: str) -> int:
        count = len(self.for_job(job_id))
        self._write(job_id, [])
        return count
