"""Draw docs/probe.md's real report: `vllm-headroom probe` against the reference tiny vLLM.

Run from the project root with the project's venv, after ``make deps`` (about 3 minutes on two
CPU cores, half of it vLLM's start-up)::

    .venv/bin/python scripts/e2e/probe_report.py                   # writes docs/images/
    .venv/bin/python scripts/e2e/probe_report.py --out /tmp/probe  # somewhere else

Starts the reference server of the end-to-end tests (the tiny Llama, ``--max-model-len 512``,
``--kv-cache-memory-bytes 1048576``: 7 usable blocks of 128 tokens), runs :data:`COMMAND` against
it, keeps its ``--report`` picture (``probe-tiny-vllm.png``) and prints its summary. Uses the e2e
harness (tests/e2e/harness.py); the server is stopped on the way out.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tests" / "e2e"))

from harness import (  # noqa: E402 - the harness lives with the tests, not in a package
    REFERENCE_KV_CACHE_MEMORY_BYTES,
    REFERENCE_MAX_MODEL_LEN,
    VllmServer,
    tiny_model,
)

#: The probe's arguments after ``--target URL`` (docs/probe.md quotes them).
COMMAND = (
    "--mode", "concurrency", "--levels", "1,2,3,4,5,6",
    "--prompt-tokens", "100", "--output-tokens", "150",
    "--step-seconds", "10", "--client", "builtin",
)  # fmt: skip
PICTURE = "probe-tiny-vllm.png"


def run_report(url: str, out: Path) -> int:
    """Run :data:`COMMAND` against ``url``: the picture into ``out``, the summary to stdout."""
    out.mkdir(parents=True, exist_ok=True)
    argv = [
        str(REPO_ROOT / ".venv" / "bin" / "vllm-headroom"),
        "probe", "--target", url, *COMMAND, "--report", str(out / PICTURE),
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=REPO_ROOT)
    sys.stderr.write(done.stderr)
    print(done.stdout, end="")
    return done.returncode


def main() -> int:
    """Start the reference vLLM, run the probe, keep its report."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "images")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as logs,
        VllmServer(
            tiny_model("llama"),
            kv_cache_memory_bytes=REFERENCE_KV_CACHE_MEMORY_BYTES,
            max_model_len=REFERENCE_MAX_MODEL_LEN,
            log_path=Path(logs) / "vllm.log",
        ) as server,
    ):
        return run_report(server.base_url, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
