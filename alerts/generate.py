"""Render the rule table into its two files: ``python -m alerts.generate [--check]``.

``alerts/vllm-headroom.rules.yml`` is the rules unscoped, the file users load as it stands and the
promtool tests evaluate; ``helm/vllm-headroom/files/alerts/vllm-headroom.rules.yml`` is the same
rules with the selector markers left in, which the chart's templates/_rules.tpl fills per release
(the chart holds a real copy: it must install from ``helm package`` output alone). ``make docs``
runs this; ``--check`` writes nothing and exits 1 naming each file that is missing or stale
(what the tests assert).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from alerts.rules import HEADER, NAMESPACE, RECORDED, SCRAPED, render

if TYPE_CHECKING:
    from collections.abc import Sequence

ROOT = Path(__file__).resolve().parents[1]
#: The rule file users load (relative to the repository).
UNSCOPED = Path("alerts/vllm-headroom.rules.yml")
#: The chart's copy, markers left in (relative to the repository).
CHART_COPY = Path("helm/vllm-headroom/files/alerts/vllm-headroom.rules.yml")

_GENERATED = """\
Generated from alerts/rules.py by `make docs` (python -m alerts.generate): edit the table there,
not this file.
"""
_MARKED = f"""\
The Helm chart's copy: {SCRAPED} and {RECORDED} mark where templates/_rules.tpl puts a release's
matchers (or, unscoped, nothing). The same rules without them: alerts/vllm-headroom.rules.yml.
"""


def generate() -> dict[Path, str]:
    """Path relative to the repository -> the text it must hold (pure)."""
    return {
        UNSCOPED: render(header=_GENERATED + "\n" + HEADER),
        CHART_COPY: render(
            SCRAPED, RECORDED, NAMESPACE, header=_GENERATED + _MARKED + "\n" + HEADER
        ),
    }


def stale(root: Path, files: dict[Path, str]) -> list[Path]:
    """The generated files under ``root`` that are missing or differ from what they must hold."""
    return [
        path
        for path, text in files.items()
        if not (root / path).is_file() or (root / path).read_text(encoding="utf-8") != text
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """Write (or with ``--check``, compare) the rule files; return the exit code."""
    parser = argparse.ArgumentParser(prog="python -m alerts.generate", description=__doc__)
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a file is out of date"
    )
    args = parser.parse_args(argv)
    files = generate()
    try:
        if args.check:
            found = stale(args.root, files)
            for path in found:
                print(f"alerts: {path} is out of date: run make docs", file=sys.stderr)
            return 1 if found else 0
        for path in stale(args.root, files):
            (args.root / path).parent.mkdir(parents=True, exist_ok=True)
            (args.root / path).write_text(files[path], encoding="utf-8")
            print(f"wrote {path}")
    except OSError as exc:
        print(f"alerts: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
