"""What the dashboards take from the alert rule file: thresholds, alerts and their runbooks.

The rule file (``alerts/vllm-headroom.rules.yml``, generated from the table in
``alerts/rules.py``) is the one source of truth for every tunable threshold: each is a recording
rule ``headroom:threshold:<name>`` with ``expr: vector(<default>)`` in the group
``vllm-headroom-thresholds``. Panels draw their thresholds at those defaults and
link to the runbooks of the alerts that use them, so a panel turns red exactly where the alert
would fire with its default settings.

:func:`parse_rules` is pure (a parsed YAML document in, :class:`RuleFacts` out);
:func:`load_rules` is the I/O seam that reads and parses the file.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import yaml

from exporter.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

#: The group of threshold recording rules, and the prefix of their names.
THRESHOLD_GROUP = "vllm-headroom-thresholds"
THRESHOLD_PREFIX = "headroom:threshold:"
#: Every alert we ship shares this prefix.
ALERT_PREFIX = "VllmHeadroom"

#: The expression of a threshold that is off until the user sets it (the SLO objectives): it
#: records nothing, so the rules and panels that read it show nothing.
UNSET = "absent(vector(0))"
_VECTOR_DEFAULT = re.compile(r"^\s*vector\(\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*\)\s*$")
_THRESHOLD_REF = re.compile(re.escape(THRESHOLD_PREFIX) + r"([A-Za-z0-9_]+)")


class RulesFileError(UsageError):
    """The alert rule file is missing, malformed, or lacks what a dashboard needs."""


@dataclass(frozen=True, slots=True)
class AlertRule:
    """One alert of the rule file, as much of it as the dashboards use."""

    name: str
    #: ``critical`` (page), ``warning`` (ticket) or ``info``.
    severity: str
    runbook_url: str
    #: Names (without the prefix) of the thresholds its expression compares against.
    thresholds: frozenset[str]


@dataclass(frozen=True, slots=True)
class RuleFacts:
    """The thresholds, alerts and recorded series of the rule file."""

    #: Threshold name (without ``headroom:threshold:``) -> its default value.
    thresholds: Mapping[str, float]
    alerts: tuple[AlertRule, ...]
    #: Every series name a recording rule defines (thresholds included).
    recorded: frozenset[str]

    def threshold(self, name: str) -> float:
        """The default of threshold ``name``; a clear error when the rule file has no such rule."""
        try:
            return self.thresholds[name]
        except KeyError:
            known = ", ".join(sorted(self.thresholds)) or "none"
            raise RulesFileError(
                f"the rule file defines no threshold {THRESHOLD_PREFIX}{name} (it defines: "
                f"{known}); add it to group {THRESHOLD_GROUP} or fix the dashboard's reference"
            ) from None

    def alerts_using(self, name: str) -> tuple[AlertRule, ...]:
        """The alerts whose expression compares against threshold ``name``, by name."""
        return tuple(sorted((a for a in self.alerts if name in a.thresholds), key=_by_name))

    def alert(self, name: str) -> AlertRule:
        """The alert called ``name``; a clear error when the rule file has none."""
        for candidate in self.alerts:
            if candidate.name == name:
                return candidate
        known = ", ".join(sorted(a.name for a in self.alerts)) or "none"
        raise RulesFileError(f"the rule file defines no alert {name} (it defines: {known})")

    @property
    def runbook_base(self) -> str:
        """The URL every runbook lives under: ``<base><AlertName>.md`` for every alert."""
        if not self.alerts:
            raise RulesFileError(
                "the rule file defines no alerts; the dashboards link to their runbooks"
            )
        bases = {a.runbook_url.removesuffix(f"{a.name}.md") for a in self.alerts}
        if len(bases) != 1 or any(not a.runbook_url.endswith(f"/{a.name}.md") for a in self.alerts):
            raise RulesFileError(
                "every alert's runbook_url must be <one base URL>/<AlertName>.md so that the "
                f"alert table can link each alert to its runbook; found {sorted(bases)}"
            )
        return bases.pop()


def _by_name(alert: AlertRule) -> str:
    return alert.name


def _fail(where: str, problem: str) -> RulesFileError:
    return RulesFileError(f"{where}: {problem}")


def parse_rules(document: object, *, where: str = "rule file") -> RuleFacts:
    """Extract thresholds, alerts and recorded names from a parsed Prometheus rule file.

    ``where`` names the file in error messages. Raises :class:`RulesFileError` on anything
    that is not a rule file of the agreed shape (a threshold whose ``expr`` is not
    ``vector(<number>)``, an alert without a ``severity`` label or ``runbook_url``...).
    """
    if not isinstance(document, dict) or not isinstance(document.get("groups"), list):
        raise _fail(where, "not a Prometheus rule file (no top-level 'groups' list)")
    thresholds: dict[str, float] = {}
    alerts: list[AlertRule] = []
    recorded: set[str] = set()
    for group in document["groups"]:
        if not isinstance(group, dict) or not isinstance(group.get("rules", []), list):
            raise _fail(where, f"group {group!r} is not a mapping with a 'rules' list")
        group_name = str(group.get("name", ""))
        for rule in group.get("rules", []):
            if not isinstance(rule, dict):
                raise _fail(where, f"group {group_name}: rule {rule!r} is not a mapping")
            if "record" in rule:
                record = str(rule["record"])
                recorded.add(record)
                if group_name == THRESHOLD_GROUP and str(rule.get("expr", "")).strip() != UNSET:
                    name, value = _threshold(rule, record, where)
                    thresholds[name] = value
            elif "alert" in rule:
                alerts.append(_alert(rule, where))
    return RuleFacts(thresholds=thresholds, alerts=tuple(alerts), recorded=frozenset(recorded))


def _threshold(rule: Mapping[str, object], record: str, where: str) -> tuple[str, float]:
    if not record.startswith(THRESHOLD_PREFIX):
        raise _fail(where, f"{record} in group {THRESHOLD_GROUP} is not named {THRESHOLD_PREFIX}*")
    match = _VECTOR_DEFAULT.match(str(rule.get("expr", "")))
    if match is None:
        raise _fail(
            where, f"threshold {record} must have expr: vector(<number>), got {rule.get('expr')!r}"
        )
    value = float(match.group(1))
    if not math.isfinite(value):
        raise _fail(where, f"threshold {record} is not a finite number")
    return record.removeprefix(THRESHOLD_PREFIX), value


def _alert(rule: Mapping[str, object], where: str) -> AlertRule:
    name = str(rule["alert"])
    labels = rule.get("labels")
    annotations = rule.get("annotations")
    severity = labels.get("severity") if isinstance(labels, dict) else None
    runbook = annotations.get("runbook_url") if isinstance(annotations, dict) else None
    if not isinstance(severity, str) or not severity:
        raise _fail(where, f"alert {name} has no labels.severity")
    if not isinstance(runbook, str) or not runbook:
        raise _fail(where, f"alert {name} has no annotations.runbook_url")
    used = _compared_thresholds(str(rule.get("expr", "")))
    return AlertRule(name=name, severity=severity, runbook_url=runbook, thresholds=used)


def _compared_thresholds(expr: str) -> frozenset[str]:
    """Thresholds ``expr`` compares a value against: those it reads as ``scalar(<threshold>)``.

    That is how the rule file's alerts use their thresholds (its agreed convention). Other
    references are not comparisons: the meta-alert that fires when a threshold rule is missing
    or duplicated names every threshold inside ``absent()`` and ``count()``.
    """
    used = set()
    for match in _THRESHOLD_REF.finditer(expr):
        if re.search(r"\bscalar\s*\(\s*$", expr[: match.start()]):
            used.add(match[1])
    return frozenset(used)


def load_rules(path: Path) -> RuleFacts:
    """Read and parse the rule file at ``path`` (the I/O seam of :func:`parse_rules`)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RulesFileError(
            f"cannot read the alert rule file {path} ({exc.strerror or exc}); the dashboards take "
            "their thresholds from it: restore it or pass --rules PATH"
        ) from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise RulesFileError(f"{path}: not valid YAML{at}; fix the rule file") from None
    return parse_rules(document, where=str(path))
