"""Checks on a policy pack's fields, run by its form and by policy_pack_save."""

from __future__ import annotations

from typing import Any

import regex
from django.core.exceptions import ValidationError

from models_registry.models import Alias, Model
from safety.detectors import PII_KINDS, deny_pattern_compile

MAX_ENTRIES = 500  # per list: each term and pattern runs on every request of the tenant
MAX_ENTRY_LENGTH = 200


def toxicity_threshold_validate(value: float | None) -> None:
    if value is not None and not 0 < value <= 1:
        raise ValidationError("the threshold must be above 0 and at most 1 (blank: off)")


def _strings(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValidationError("must be a list of strings")
    if len(value) > MAX_ENTRIES:
        raise ValidationError(f"at most {MAX_ENTRIES} entries")
    long = [v for v in value if len(v) > MAX_ENTRY_LENGTH]
    if long:
        raise ValidationError(f"entries are at most {MAX_ENTRY_LENGTH} characters: {long[0]!r}")
    return value


def pii_kinds_validate(value: Any) -> None:
    unknown = sorted(set(_strings(value)) - set(PII_KINDS))
    if unknown:
        raise ValidationError(
            f"unknown PII kinds {', '.join(unknown)}; choose from {', '.join(PII_KINDS)}"
        )


def deny_terms_validate(value: Any) -> None:
    if any(not term.strip() for term in _strings(value)):
        raise ValidationError("a term cannot be blank")


def deny_patterns_validate(value: Any) -> None:
    problems = []
    for number, pattern in enumerate(_strings(value), start=1):
        try:
            deny_pattern_compile(pattern)
        except regex.error as exc:
            problems.append(f"pattern {number} ({pattern!r}) does not compile: {exc}")
        except ValueError as exc:
            problems.append(f"pattern {number} ({pattern!r}) {exc}")
    if problems:
        raise ValidationError(problems)


def policy_name_validate(value: str) -> None:
    """Check the name an assignment covers: blank (the tenant's default), an alias or a model.

    A pack follows the model whatever name reaches it (safety.selectors.policy_load), so a
    pinned version (`model@version`) names no more than its model would; a name that is
    neither an alias nor a model would cover nothing.
    """
    if not value:
        return
    if "@" in value:
        model = value.partition("@")[0]
        raise ValidationError(
            f"a pack covers every version of a model: assign it to {model!r} (or an alias), "
            "not to a pinned version"
        )
    if "\x00" in value or not (
        Alias.objects.filter(name=value).exists() or Model.objects.filter(name=value).exists()
    ):
        raise ValidationError(f"no alias or model is named {value!r}")
