"""Generate the dashboards' JSON from code: ``python -m dashboards.generate [--check]``.

Reads the alert rule file for thresholds and runbook links, builds both dashboards and writes
them beside this package as stable, sorted, indented JSON. ``--check`` writes nothing and exits
with 1 when a checked-in file differs from what the code generates (what CI's test asserts).
Bad input (a missing or malformed rule file) is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from grafana_foundation_sdk.cog.encoder import JSONEncoder

from dashboards import fleet, instance
from dashboards.rules import load_rules
from exporter.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from grafana_foundation_sdk.models import dashboard as dm

    from dashboards.rules import RuleFacts

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "alerts" / "vllm-headroom.rules.yml"
OUT = Path(__file__).resolve().parent


def render(model: dm.Dashboard) -> str:
    """The dashboard as the JSON we check in: sorted keys, two-space indent, final newline."""
    return json.dumps(model, cls=JSONEncoder, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def generate(facts: RuleFacts) -> dict[str, str]:
    """File name -> JSON text of every dashboard (pure: the rule facts in, text out)."""
    models = [fleet.build(facts), instance.build(facts)]
    return {f"{model.uid}.json": render(model) for model in models}


def _stale(files: dict[str, str], out: Path) -> list[str]:
    """Names of generated files whose checked-in copy is missing or different."""
    stale = []
    for name, text in files.items():
        path = out / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            stale.append(name)
    return stale


def main(argv: Sequence[str] | None = None) -> int:
    """Write (or with ``--check``, compare) the dashboards; return the exit code."""
    parser = argparse.ArgumentParser(prog="python -m dashboards.generate", description=__doc__)
    parser.add_argument("--rules", type=Path, default=RULES, help="the alert rule file")
    parser.add_argument("--out", type=Path, default=OUT, help="where the JSON files go")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a file is out of date"
    )
    args = parser.parse_args(argv)
    try:
        files = generate(load_rules(args.rules))
    except UsageError as exc:
        print(f"dashboards: error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        stale = _stale(files, args.out)
        for name in stale:
            print(
                f"dashboards: {args.out / name} is out of date: run python -m dashboards.generate"
            )
        return 1 if stale else 0
    for name, text in files.items():
        (args.out / name).write_text(text, encoding="utf-8")
        print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
