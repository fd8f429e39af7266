"""Copy the files the Helm chart embeds into it: ``python scripts/sync_chart_files.py [--check]``.

The chart must install from ``helm package`` output and from a plain copy of helm/vllm-headroom
alone, so it holds real copies, never links leaving the chart: the generated dashboards
(dashboards/*.json) under helm/vllm-headroom/files/, at the same relative path. (Its rule file,
files/alerts/, is no copy: ``python -m alerts.generate`` writes it, selector markers included.)
``make docs`` runs this after regenerating the dashboards; ``--check`` writes nothing and exits 1,
naming each link under files/ and each copy that is missing, different from its source or no
longer has one (what the tests assert).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Where the copies live inside the chart; each is ``CHART_FILES / <its source's path>``.
CHART_FILES = Path("helm/vllm-headroom/files")
#: The sources the chart embeds, as globs relative to the repository.
SOURCES = ("dashboards/*.json",)


def wanted(root: Path) -> dict[Path, bytes]:
    """Chart copy path (relative to ``root``) -> the bytes it must hold."""
    files: dict[Path, bytes] = {}
    for pattern in SOURCES:
        matches = sorted(root.glob(pattern))
        if not matches:
            raise FileNotFoundError(f"{root / pattern} matches nothing")
        for source in matches:
            relative = source.relative_to(root)
            files[CHART_FILES / relative] = source.read_bytes()
    return files


def links(root: Path) -> list[Path]:
    """Every symbolic link under the chart's files/ (relative to ``root``), not followed."""
    found = []
    for folder, dirs, names in os.walk(root / CHART_FILES):
        for name in [*dirs, *names]:
            path = Path(folder) / name
            if path.is_symlink():
                found.append(path.relative_to(root))
    return sorted(found)


def problems(root: Path, files: dict[Path, bytes]) -> list[str]:
    """One line per link, and per chart copy that is missing, differs or has no source."""
    found = [f"{path} is a link: the chart must hold a real copy" for path in links(root)]
    if found:
        return found
    for path, data in files.items():
        target = root / path
        if not target.is_file():
            found.append(f"{path} is missing")
        elif target.read_bytes() != data:
            found.append(f"{path} differs from its source")
    found += [f"{path} has no source any more" for path in orphans(root, files)]
    return found


def orphans(root: Path, files: dict[Path, bytes]) -> list[Path]:
    """Copies matching a source glob inside the chart whose source is gone (a renamed dashboard)."""
    return sorted(
        p.relative_to(root)
        for pattern in SOURCES
        for p in (root / CHART_FILES).glob(pattern)
        if p.relative_to(root) not in files
    )


def sync(root: Path, files: dict[Path, bytes]) -> list[Path]:
    """Replace links by copies, write each copy that differs, drop orphans; return what changed."""
    changed = []
    for link in links(root):
        (root / link).unlink()
        changed.append(link)
    for path, data in files.items():
        target = root / path
        if not target.is_file() or target.read_bytes() != data:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            changed.append(path)
    for stale in orphans(root, files):
        (root / stale).unlink()
        changed.append(stale)
    return changed


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check``, compare) the chart's copies; return the exit code."""
    parser = argparse.ArgumentParser(prog="python scripts/sync_chart_files.py", description=__doc__)
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a copy is out of date"
    )
    args = parser.parse_args(argv)
    try:
        files = wanted(args.root)
        if args.check:
            found = problems(args.root, files)
            for line in found:
                print(f"chart files: {line}: run make docs", file=sys.stderr)
            return 1 if found else 0
        for path in sync(args.root, files):
            print(f"wrote {path}")
    except OSError as exc:
        print(f"chart files: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
