"""The largest count a float holds exactly, named once for every layer that reads counts.

Up to 2**53 every whole number is a float; past it floats skip some (``2.0**53 + 1`` is
``2.0**53``), so a count, a byte size or a flag's number beyond it cannot be taken at its word.
"""

from __future__ import annotations

from typing import Final

#: 2**53: every whole number up to it is exactly a float, and no KV cache, histogram count or
#: flag of vLLM comes near it. Anything larger is no real figure (a typo, or a broken payload).
MAX_EXACT_WHOLE: Final = 2**53
