"""Specification of vLLM versions: parsing, ordering, the default, and the guess from a payload."""

from __future__ import annotations

import re

import pytest

from exporter.core.snapshot import VllmSnapshot
from exporter.errors import UsageError
from exporter.sizing.model import GROUP_AWARE_CAPACITY_SINCE, HYBRID_ALLOCATOR_SINCE
from exporter.sizing.overhead import CUDA_GRAPHS_SUBTRACTED_SINCE
from exporter.vllm.metrics import parse_vllm_metrics
from exporter.vllm.version import (
    LATEST_KNOWN,
    VllmVersion,
    guess_vllm_version,
    parse_vllm_version,
)
from tests import paths

CAPTURES = paths.CAPTURES
ALL_CAPTURES = sorted(path.name for path in CAPTURES.glob("*.prom"))
#: vLLM's docs example has "..." elisions and does not parse (tests/vllm/test_metrics.py).
DOCS_CAPTURE = "14_v0.33.0-docs_V1_vllm-docs-examples.prom"
HELP_TYPE_ONLY = "05_v0.5.4-0.6.x_V0_meetkai-functionary-pr263_help-type-only.prom"
AFTER_LOAD = "vllm-0.32.0-cpu-after-load.prom"
PARSEABLE = [name for name in ALL_CAPTURES if name != DOCS_CAPTURE]


def _capture(name: str) -> str:
    return (CAPTURES / name).read_text(encoding="utf-8")


# --- parsing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.19.0", VllmVersion(0, 19, 0)),
        ("v0.10.1rc2", VllmVersion(0, 10, 1)),
        ("0.11.0 (V1)", VllmVersion(0, 11, 0)),
        ("0.6.4.post1", VllmVersion(0, 6, 4)),
        ("0.8.5+cu124", VllmVersion(0, 8, 5)),
        ("0.33", VllmVersion(0, 33, 0)),
        (" 0.9.2\n", VllmVersion(0, 9, 2)),
    ],
)
def test_versions_parse_as_major_minor_patch_ignoring_tags(
    text: str, expected: VllmVersion
) -> None:
    """A leading "v", pre-release, post-release and build tags are ignored; no patch means 0."""
    assert parse_vllm_version(text) == expected


@pytest.mark.parametrize("text", ["", "latest", "v", "0", "zero.one", "version 0.19.0"])
def test_an_unreadable_version_is_a_one_line_usage_error_naming_the_form(text: str) -> None:
    """Text not starting with MAJOR.MINOR is a UsageError quoting it and the expected form."""
    with pytest.raises(UsageError) as caught:
        parse_vllm_version(text)
    message = str(caught.value)
    assert "\n" not in message
    assert repr(text) in message
    assert "MAJOR.MINOR[.PATCH]" in message


def test_a_version_prints_as_three_numbers_and_parses_back() -> None:
    """str() gives "major.minor.patch", which parses back to the same version."""
    version = VllmVersion(0, 6, 4)
    assert str(version) == "0.6.4"
    assert str(VllmVersion(0, 33)) == "0.33.0"
    assert parse_vllm_version(str(version)) == version


# --- ordering --------------------------------------------------------------------------------


def test_versions_order_numerically_not_as_text() -> None:
    """0.9.2 comes before 0.10.0, and patches order within a minor release."""
    versions = [VllmVersion(0, 10, 1), VllmVersion(1, 0), VllmVersion(0, 9, 2), VllmVersion(0, 10)]
    assert sorted(versions) == [
        VllmVersion(0, 9, 2),
        VllmVersion(0, 10, 0),
        VllmVersion(0, 10, 1),
        VllmVersion(1, 0, 0),
    ]
    assert parse_vllm_version("0.9.2") < parse_vllm_version("0.10.0")


def test_at_least_includes_the_release_itself_and_reads_a_missing_patch_as_zero() -> None:
    """at_least(0, 21) holds for 0.21.0 and later, not for any 0.20.x or 0.21.0 below a patch."""
    assert VllmVersion(0, 21, 0).at_least(0, 21)
    assert VllmVersion(0, 22, 0).at_least(0, 21, 5)
    assert VllmVersion(1, 0, 0).at_least(0, 33)
    assert not VllmVersion(0, 20, 9).at_least(0, 21)
    assert not VllmVersion(0, 21, 0).at_least(0, 21, 1)


def test_versions_that_differ_only_in_tags_are_equal_and_hash_alike() -> None:
    """Two spellings of one release are one version, also as a dictionary key."""
    assert parse_vllm_version("v0.10.1rc2") == parse_vllm_version("0.10.1")
    assert len({parse_vllm_version("0.11.0 (V1)"), VllmVersion(0, 11, 0)}) == 1


# --- the default -----------------------------------------------------------------------------


def test_the_latest_known_version_is_0_33() -> None:
    """The default for a target that reports no version is vLLM 0.33.0."""
    assert parse_vllm_version("0.33.0") == LATEST_KNOWN
    assert str(LATEST_KNOWN) == "0.33.0"


def test_the_latest_known_version_has_every_behaviour_change_the_model_knows() -> None:
    """The default is no older than any release at which the sizing model changes behaviour."""
    for since in (GROUP_AWARE_CAPACITY_SINCE, HYBRID_ALLOCATOR_SINCE, CUDA_GRAPHS_SUBTRACTED_SINCE):
        assert LATEST_KNOWN.at_least(since.major, since.minor, since.patch), since


# --- version guess ---------------------------------------------------------------------------

# What each capture's header says about its version, and the guess we make from its content.
VERSIONS = {
    "02_v0.6.0_V0_korean-doc.prom": (["0.6.0", "0.6.2"], "<=0.6.2"),
    "04_v0.6.4-0.6.6_V0_test-fixture.prom": (["0.6.4", "0.6.6"], "0.6.4-0.7.x"),
    HELP_TYPE_ONLY: (["0.5.4", "0.6.3"], "<=0.10.x"),
    "07_v0.9.2-0.10.x_V0engine-cpu_full.prom": (["0.9.2", "0.10.9"], "0.9.2-0.10.x"),
    "08_v0.10.0_V1_production-stack-issue617.prom": (["0.10.0"], "0.9.2-0.11.x"),
    "10_v0.11+_V1_rhoai-lab-doc.prom": (["0.11.0", "0.33.0"], ">=0.9.2"),
    "vllm-0.32.0-cpu-idle.prom": (["0.32.0"], ">=0.32"),
    AFTER_LOAD: (["0.32.0"], ">=0.32"),
    "vllm-0.33.0-reconstructed.prom": (["0.33.0"], ">=0.32"),
}


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def _contains(guess: str, version: str) -> bool:
    """Whether a guessed range (">=0.30", "<=0.10.x", "0.9.2-0.10.x") contains ``version``."""
    actual = _version(version)
    match = re.fullmatch(r"(>=|<=)?([\d.]+?)(\.x)?(?:-([\d.]+?)(\.x)?)?", guess)
    assert match is not None, guess
    relation, first, first_series, second, second_series = match.groups()

    def at_most(bound: str, series: str | None) -> bool:
        return actual[:2] <= _version(bound) if series else actual <= _version(bound)

    if relation == ">=":
        return actual >= _version(first)
    if relation == "<=":
        return at_most(first, first_series)
    if second is None:
        return actual[:2] == _version(first)[:2] if first_series else actual == _version(first)
    return _version(first) <= actual and at_most(second, second_series)


@pytest.mark.parametrize("name", PARSEABLE)
def test_the_version_guess_covers_what_the_capture_header_states(name: str) -> None:
    """The guessed range contains every version the capture's provenance header allows."""
    stated, expected = VERSIONS[name]
    guess = guess_vllm_version(parse_vllm_metrics(_capture(name)))
    assert guess == expected
    assert all(_contains(guess, version) for version in stated)


def test_no_clue_gives_an_unknown_version() -> None:
    """A payload without version clues is "unknown", not a made-up range."""
    snapshot = parse_vllm_metrics('vllm:num_requests_running{model_name="m"} 1\n')
    assert guess_vllm_version(snapshot) == "unknown"


def test_contradictory_clues_give_an_unknown_version() -> None:
    """A V0-only family beside a 0.30+ family is no version at all: "unknown"."""
    snapshot = VllmSnapshot(
        engines={},
        families=frozenset({"vllm:num_requests_swapped", "vllm:request_num_preemptions"}),
    )
    assert guess_vllm_version(snapshot) == "unknown"


def test_an_engine_label_alone_dates_the_payload_from_0_8_3() -> None:
    """Series labelled by engine exist from vLLM 0.8.3 on: the guess is an open-ended range."""
    snapshot = parse_vllm_metrics('vllm:num_requests_running{engine="0"} 1\n')
    assert guess_vllm_version(snapshot) == ">=0.8.3"


@pytest.mark.parametrize(
    ("families", "expected"),
    [
        ({"vllm:num_requests_swapped"}, "<=0.10.x"),
        ({"vllm:num_requests_swapped", "vllm:kv_cache_usage_perc"}, "0.9.2-0.10.x"),
        ({"vllm:kv_cache_usage_perc", "vllm:request_num_preemptions"}, ">=0.30"),
    ],
)
def test_guessed_ranges_name_release_series_with_x(families: set[str], expected: str) -> None:
    """A last release series prints as "0.10.x"; a first release as the release itself."""
    snapshot = VllmSnapshot(engines={}, families=frozenset(families))
    assert guess_vllm_version(snapshot) == expected
