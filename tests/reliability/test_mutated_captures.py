"""Hostile inputs, round six: the real captures, mutated poll by poll, through the real poller.

Each poll serves one of the real vLLM captures (``tests/fixtures/vllm-metrics``) with a random
share of its lines changed: a value replaced by an extreme one (NaN, infinities, 1e308, 1e-320,
a 30-digit integer), a counter advanced, a label value replaced (empty, non-ASCII, 600
characters, an escape), an engine renumbered, a line dropped or written twice; now and then
binary noise instead. The clock jumps by 1 ms to 400 s between polls, and the prediction hands
the derivation one of several KV layouts, or none. Whatever comes in, a poll ends in figures or
in a refusal with its reason: never ``internal_error`` (a bug caught by the poller), and the
exposition of every view is finite UTF-8. Seeded: a failure names the seed and the poll, and
replays exactly.

This is how a histogram bucket count of 1e-320 was found dividing 0 by 0 in the context
estimate, and a ``_sum`` of 1e-320 dividing by zero in its two-piece shape (docs/reliability.md,
round six).
"""

from __future__ import annotations

import asyncio
import random
import re
from typing import TYPE_CHECKING

import httpx
import pytest

from exporter.cli.main import main
from exporter.core.pool import GroupBlocks, PoolLayout
from exporter.core.reasons import HttpReason
from exporter.core.views import PredictionView
from exporter.service.collector import target_rows
from exporter.service.poller import TargetPoller
from exporter.testing.fakevllm import FakeVllm, VllmState
from exporter.vllm.client import VllmClient
from exporter.vllm.metrics import parse_vllm_metrics
from tests import paths

if TYPE_CHECKING:
    from pathlib import Path

CAPTURES = [path.read_text() for path in sorted(paths.CAPTURES.glob("*.prom"))]
EXTREME_VALUES = (
    "0",
    "-0",
    "1e308",
    "-1e308",
    "nan",
    "+Inf",
    "-Inf",
    "1e-320",
    "4.9e-324",
    "9007199254740993",
    "1e16",
    "-1",
    "0.5",
    "123456789012345678901234567890",
    "1e-9",
)
EXTREME_LABELS = ("", "0", "²", "é", "\u202e", "a" * 600, 'x"y', "\\", "-1", "1e400", "nan")
LAYOUTS = (
    None,
    PoolLayout(
        (GroupBlocks("full", None, 128), GroupBlocks("state", None, 128, max_blocks=3)), 512, 7
    ),
    PoolLayout(
        (GroupBlocks("sliding", 64, 128, max_blocks=2), GroupBlocks("full", None, 128)), 512, 6
    ),
    PoolLayout((GroupBlocks("full", None, 16),), 512, 32),
)
_VALUE = re.compile(r"(\} | )([^ ]+)$")
_LABEL = re.compile(r'="([^"]*)"')


def mutated(text: str, rnd: random.Random, step: int) -> str:
    """``text`` with a random share of its sample lines changed (none to every line)."""
    share = rnd.choice((0.0, 0.05, 0.2, 0.5, 1.0))
    out: list[str] = []
    for line in text.split("\n"):
        roll = rnd.random() / share if share else 1.0
        if not line or line.startswith("#"):
            if roll >= 0.01:
                out.append(line)
            continue
        found = _VALUE.search(line)
        changed = line
        if roll < 0.03 and found:
            changed = line[: found.start(2)] + rnd.choice(EXTREME_VALUES)
        elif roll < 0.05 and found:
            try:
                value = float(found.group(2)) + step * rnd.choice((0, 1, 10, 1000))
            except ValueError:
                pass
            else:
                changed = line[: found.start(2)] + repr(value)
        elif roll < 0.06:
            label = rnd.choice(EXTREME_LABELS).replace("\\", "\\\\").replace('"', '\\"')
            found_label = _LABEL.search(line)
            if found_label:  # spliced, not substituted: a backslash is no template escape here
                changed = f'{line[: found_label.start()]}="{label}"{line[found_label.end() :]}'
        elif roll < 0.065:
            changed = line.replace('engine="0"', f'engine="{rnd.randint(0, 70)}"')
        elif roll < 0.07:
            continue
        elif roll < 0.072:
            out.append(line)
        out.append(changed)
    return "\n".join(out)


class _Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


class _AnyLayout:
    """A predictor handing the derivation a random layout and capacity, as a prediction may."""

    def __init__(self, rnd: random.Random) -> None:
        self.rnd = rnd

    def load(self, info: object) -> None:
        return None

    def predict(self, snapshot: object, info: object, gpus: object, flags: object = None) -> object:
        capacity = self.rnd.choice((None, 1.0, 1e300, 4096.0))
        return PredictionView(state="ok", capacity_tokens=capacity, layout=self.rnd.choice(LAYOUTS))


def _exposition(view: object) -> str:
    parts: list[str] = []
    target_rows(view).openmetrics(parts.append)  # type: ignore[arg-type]
    return "".join(parts)


async def _polls(seed: int, polls: int) -> list[str]:
    """What went wrong in ``polls`` polls of mutated captures (empty: nothing)."""
    rnd = random.Random(seed)  # noqa: S311 - reproducible test data
    clock = _Clock()
    served = {"payload": b""}
    fake = FakeVllm(
        state=VllmState(model="tiny", root="/models/tiny", max_model_len=512),
        payload=lambda _n: served["payload"],
        listen=False,
    )
    problems: list[str] = []
    async with httpx.AsyncClient(transport=fake.transport()) as http:
        client = VllmClient("http://vllm:8000", client=http, timeout_seconds=2.0, max_bytes=1 << 22)
        poller = TargetPoller(
            "http://vllm:8000",
            client=client,
            parse=parse_vllm_metrics,
            clock=clock,
            wall_clock=lambda: 1_800_000_000.0 + clock.now,
            predictor=_AnyLayout(rnd),  # type: ignore[arg-type]
        )
        base = rnd.choice(CAPTURES)
        for poll in range(polls):
            if poll % 50 == 0:
                base = rnd.choice(CAPTURES)
            if rnd.random() < 0.01:
                served["payload"] = rnd.randbytes(200)
            else:
                served["payload"] = mutated(base, rnd, poll).encode("utf-8", "surrogatepass")
            view = await poller.poll_once()
            health = view.sources.get("vllm_metrics")
            if health is not None and HttpReason.INTERNAL_ERROR in health.errors:
                problems.append(f"seed {seed} poll {poll}: internal_error: {health.last_error}")
                break
            text = _exposition(view)
            text.encode("utf-8")
            odd = [
                line
                for line in text.splitlines()
                if not line.startswith("#") and line.rsplit(" ", 1)[-1] in ("NaN", "+Inf", "-Inf")
            ]
            if odd:
                problems.append(f"seed {seed} poll {poll}: not finite: {odd[0][:120]}")
                break
            clock.now += rnd.choice((0.001, 1, 5, 5, 5, 15, 60, 400))
    return problems


@pytest.mark.parametrize("seed", range(4))
def test_mutated_real_captures_end_in_figures_or_a_reason(seed: int) -> None:
    """400 polls a seed: figures or a refusal with its reason, never an internal error."""
    assert asyncio.run(_polls(seed, 400)) == []


@pytest.mark.parametrize("seed", range(3))
def test_check_of_a_mutated_capture_is_a_report_or_one_line(
    seed: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`check FILE` of mutated captures: a report (exit 0 or 1) or one line (exit 2).

    Never a traceback, never a figure printed as nan, inf or past 2**53 (1e+16 running
    requests were reported before round six).
    """
    rnd = random.Random(100 + seed)  # noqa: S311 - reproducible test data
    path = tmp_path / "capture.prom"
    for step in range(40):
        path.write_text(mutated(rnd.choice(CAPTURES), rnd, step), encoding="utf-8")
        args = ["check", str(path), *(["--json"] if step % 2 else [])]
        code = main(args)
        out, err = capsys.readouterr()
        assert code in (0, 1, 2), (seed, step, code, err)
        if code == 2:
            assert err.count("\n") == 1, (seed, step, err)
        assert "Traceback" not in err
        assert not re.search(r"(?i)\bnan\b|\binf\b|infinity|e\+1[6-9]|e\+[2-9]\d", out), (
            seed,
            step,
            out,
        )
