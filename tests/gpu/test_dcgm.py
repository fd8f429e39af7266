"""Specification of GPU memory from dcgm-exporter: its answers, and which GPUs are this pod's.

The answers are in ``tests/fixtures/dcgm`` (its README cites dcgm-exporter's templates and
default counters): 3.x and 4.x label sets, with and without the pod mapping, the old label
namespace, MIG instances, and a node of 8 GPUs of which vLLM's pod holds 2 (GPUs 2 and 5).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from exporter.core.reasons import DcgmReason, VisibilityState
from exporter.errors import SourceError
from exporter.gpu.dcgm import (
    FB_FREE,
    FB_USED,
    MAX_SAMPLES,
    MIB,
    DcgmAnswer,
    DcgmDevice,
    PodIdentity,
    pick_devices,
)
from exporter.gpu.memory import DEFAULT_RESERVED_BYTES
from exporter.gpu.model import IndexSelector, MemoryApi, UuidSelector
from exporter.gpu.visibility import GpuVisibility
from exporter.service.dcgm import DcgmGpuSource, parse_dcgm_metrics
from exporter.vllm.promtext import MAX_LINE_CHARS
from tests.dcgm import (
    DCGM,
    GPU2,
    GPU5,
    MIG_POD,
    RESERVED_MIB,
    TOTAL_MIB,
    V3_MAPPED,
    V3_UNMAPPED,
    V4_MAPPED,
    V4_MIG,
    V4_OLD_NAMES,
    VLLM_POD,
)

if TYPE_CHECKING:
    from collections.abc import Callable


def answer(name: str) -> DcgmAnswer:
    """A fixture answer, parsed."""
    return parse_dcgm_metrics((DCGM / name).read_bytes())


def served(name: str) -> Callable[[], bytes]:
    """A fetch that returns a fixture's bytes."""
    payload = (DCGM / name).read_bytes()
    return lambda: payload


def no_process(**_: object) -> GpuVisibility:
    """Discovery finding no vLLM process (the sidecar shares no process namespace)."""
    return GpuVisibility(VisibilityState.VLLM_NOT_FOUND, detail="no vLLM server process")


def vllm_env(*uuids: str) -> Callable[..., GpuVisibility]:
    """Discovery finding vLLM with these GPU UUIDs in its NVIDIA_VISIBLE_DEVICES."""

    def discover(**_: object) -> GpuVisibility:
        selectors = tuple(UuidSelector(u) for u in uuids)
        detail = f"NVIDIA_VISIBLE_DEVICES={','.join(uuids)}"
        return GpuVisibility(VisibilityState.FROM_PROCESS, selectors, frozenset({7}), detail)

    return discover


def failure_of(result: tuple[object, SourceError | None]) -> str:
    """The reason of a read's failure ('' when none)."""
    return result[1].reason if result[1] is not None else ""


# --- the answers of each version --------------------------------------------------------------


@pytest.mark.parametrize("name", [V3_MAPPED, V3_UNMAPPED, V4_MAPPED, V4_OLD_NAMES])
def test_every_gpu_of_an_8_gpu_node_is_read_whatever_the_version(name: str) -> None:
    """3.x and 4.x, current and old label names: 8 GPUs, each with used and free memory."""
    devices = answer(name).devices
    assert sorted(d.gpu for d in devices) == list(range(8))
    assert all(d.complete for d in devices)
    assert {d.model_name for d in devices} == {"NVIDIA H100 80GB HBM3"}


def test_the_pod_mapping_is_read_under_current_and_old_label_names() -> None:
    """pod/namespace and pod_name/pod_namespace both map GPUs 2 and 5 to vLLM's pod."""
    for name in (V3_MAPPED, V4_MAPPED, V4_OLD_NAMES):
        parsed = answer(name)
        assert parsed.pod_mapped
        assert sorted(d.gpu for d in parsed.devices if VLLM_POD in d.pods) == [2, 5]
    assert not answer(V3_UNMAPPED).pod_mapped


def test_mib_become_bytes_and_reserved_memory_comes_from_4x() -> None:
    """4.x has FB_RESERVED: total is used + free + reserved, the reading is v2-like."""
    device = next(d for d in answer(V4_MAPPED).devices if d.gpu == 2)
    reading = device.reading()
    assert reading.used_bytes == 72_981 * MIB
    assert reading.reserved_bytes == RESERVED_MIB * MIB
    assert reading.total_bytes == TOTAL_MIB * MIB
    assert reading.allocated_bytes == reading.used_bytes
    assert reading.memory_api is MemoryApi.V2
    assert reading.processes is None  # DCGM does not say which process holds the memory


def test_without_reserved_memory_the_reservation_is_estimated_as_for_nvml_v1() -> None:
    """3.x has no FB_RESERVED: the reading is v1-like and the views subtract the estimate."""
    parsed = answer(V3_MAPPED)
    picked, failure = pick_devices(parsed, pod=VLLM_POD)
    assert failure is None
    reading = picked[0].reading()
    assert reading.reserved_bytes is None
    assert reading.memory_api is MemoryApi.V1
    assert reading.total_bytes == (TOTAL_MIB - RESERVED_MIB) * MIB


def test_a_mig_instance_is_read_as_its_own_device_named_by_profile() -> None:
    """MIG: instances of one GPU are told apart by GPU_I_ID; the name carries the profile."""
    devices = answer(V4_MIG).devices
    instances = sorted(d.instance for d in devices if d.gpu == 0 and d.instance is not None)
    assert instances == ["1", "13", "5"]
    (ours,) = (d for d in devices if MIG_POD in d.pods)
    reading = ours.reading()
    assert reading.uuid.endswith("/gi1")
    assert reading.name == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    assert reading.used_bytes == 36_200 * MIB
    assert len({d.label_uuid for d in devices}) == len(devices)


#: Real answers pasted in public (tests/fixtures/dcgm/real, each file's first line its source):
#: the file, then per device (gpu, UUID, GPU_I_ID) its (used, free, reserved) MiB as written.
REAL_ANSWERS: dict[str, dict[tuple[int, str, str | None], tuple[int, int, int | None]]] = {
    "4.x_upcloud-l40s.prom": {
        (0, "GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43", None): (0, 45459, 608),
    },
    "4.x_linode-lke-rtx4000ada-pod.prom": {
        (0, "GPU-a8394b51-c086-568a-9f1a-c1e1c934c44c", None): (1, 20015, 457),
    },
    "3.x_a800-8gpu-mig-excerpt.prom": {
        (0, "GPU-1f027ee8-6e1e-2b8c-0108-3d370e5f0418", "3"): (10, 19957, None),
        (0, "GPU-1f027ee8-6e1e-2b8c-0108-3d370e5f0418", "6"): (10, 19957, None),
        (7, "GPU-4e75c9ab-0ed7-8a57-75f5-23761b9f053f", None): (2, 81226, None),
    },
    "1.4.6_hypercloud-2gpu-pod.prom": {
        (0, "GPU-c0b5694b-2b5d-6b20-f903-558341437f6b", None): (0, 5057, None),
        (1, "GPU-fbe0b676-9b79-be59-aad5-7e7560a23b26", None): (0, 5059, None),
    },
}


@pytest.mark.parametrize("name", sorted(REAL_ANSWERS))
def test_real_answers_are_read_as_written(name: str) -> None:
    """dcgm-exporter 1.4.6 to 4.x as pasted (curl noise, MIG, no FB_RESERVED): MiB as written."""
    devices = {d.key: d for d in answer(f"real/{name}").devices}
    for key, (used, free, reserved) in REAL_ANSWERS[name].items():
        device = devices[key]
        assert (device.used_mib, device.free_mib, device.reserved_mib) == (used, free, reserved)
        assert device.complete
    assert len(devices) == {
        "3.x_a800-8gpu-mig-excerpt.prom": 10,
        "1.4.6_hypercloud-2gpu-pod.prom": 2,
    }.get(name, 1)


@pytest.mark.parametrize(
    ("name", "pod", "uuid"),
    [
        (
            "4.x_linode-lke-rtx4000ada-pod.prom",
            PodIdentity("cuda-75454ffb9f-8ljq7", "default"),
            "GPU-a8394b51-c086-568a-9f1a-c1e1c934c44c",
        ),
        (
            "1.4.6_hypercloud-2gpu-pod.prom",
            PodIdentity("gpu-rs-joo-m4z6t", "default"),
            "GPU-fbe0b676-9b79-be59-aad5-7e7560a23b26",
        ),
    ],
)
def test_real_pod_mappings_pick_the_pods_gpu(name: str, pod: PodIdentity, uuid: str) -> None:
    """The 4.x labels (an empty pod_uid) and 1.4.6's (pod_name, GPU 0 held by no pod)."""
    views, failure = DcgmGpuSource(served(f"real/{name}"), pod=pod, discover=no_process).read(0.9)
    assert failure is None
    assert [v.uuid for v in views] == [uuid]


# --- which GPUs are this pod's ----------------------------------------------------------------


@pytest.mark.parametrize("name", [V3_MAPPED, V4_MAPPED, V4_OLD_NAMES])
def test_the_pod_mapping_picks_the_2_gpus_of_8_this_pod_holds(name: str) -> None:
    """Of a node's 8 GPUs, vLLM's pod holds 2: exactly those are read."""
    source = DcgmGpuSource(served(name), pod=VLLM_POD, discover=no_process)
    views, failure = source.read(0.9)
    assert failure is None
    assert sorted(v.uuid for v in views) == sorted([GPU2, GPU5])
    assert sorted(v.index for v in views) == ["2", "5"]


def test_a_mig_instance_of_the_pod_is_read_and_no_other() -> None:
    """On a MIG node only the pod's instance is read, not its GPU's other instances."""
    views, failure = DcgmGpuSource(served(V4_MIG), pod=MIG_POD, discover=no_process).read(0.9)
    assert failure is None
    assert [v.name for v in views] == ["NVIDIA H100 80GB HBM3 MIG 3g.40gb"]


def test_foreign_memory_is_unknown_and_unexplained_memory_carries_the_alert() -> None:
    """DCGM lists no processes: vLLM's and foreign shares are None, unexplained is measured.

    GPU 5 of the 4.x node holds 3,072 MiB more than vLLM claims at 0.9 of CUDA's total.
    """
    views, _ = DcgmGpuSource(served(V4_MAPPED), pod=VLLM_POD, discover=no_process).read(0.9)
    by_uuid = {v.uuid: v for v in views}
    assert all(v.vllm_bytes is None and v.foreign_bytes is None for v in views)
    cuda_total = (TOTAL_MIB - RESERVED_MIB) * MIB
    assert by_uuid[GPU5].cuda_total_bytes == cuda_total
    assert by_uuid[GPU5].unexplained_bytes == pytest.approx(
        76_053 * MIB - 0.9 * cuda_total, abs=MIB
    )
    assert by_uuid[GPU5].unexplained_bytes == pytest.approx(3072 * MIB, abs=MIB)
    assert by_uuid[GPU2].unexplained_bytes == pytest.approx(0, abs=MIB)


def test_the_3x_error_bound_without_reserved_memory_is_the_reservation_estimate() -> None:
    """Without FB_RESERVED, unexplained memory reads high by at most the estimate's share.

    CUDA's total is then used + free less DEFAULT_RESERVED_BYTES, so vLLM's claim is short by
    utilization x the estimate (docs/kubernetes.md's bound).
    """
    views, _ = DcgmGpuSource(served(V3_MAPPED), pod=VLLM_POD, discover=no_process).read(0.9)
    gpu2 = next(v for v in views if v.uuid == GPU2)
    assert gpu2.unexplained_bytes is not None
    assert 0 < gpu2.unexplained_bytes <= 0.9 * DEFAULT_RESERVED_BYTES + MIB


def test_the_gpus_setting_wins_over_the_pod_mapping() -> None:
    """Explicit GPU UUIDs (or indices) are read even where the mapping says otherwise."""
    parsed = answer(V4_MAPPED)
    picked, failure = pick_devices(parsed, explicit=(UuidSelector(GPU5),), pod=VLLM_POD)
    assert failure is None
    assert [d.uuid for d in picked] == [GPU5]
    picked, _ = pick_devices(parsed, explicit=(IndexSelector(7),), pod=VLLM_POD)
    assert [d.gpu for d in picked] == [7]


def test_without_a_pod_mapping_vllms_uuids_from_its_environment_are_the_fallback() -> None:
    """No pod labels: the GPU UUIDs of vLLM's NVIDIA_VISIBLE_DEVICES pick its GPUs."""
    source = DcgmGpuSource(served(V3_UNMAPPED), pod=VLLM_POD, discover=vllm_env(GPU2, GPU5))
    views, failure = source.read(0.9)
    assert failure is None
    assert sorted(v.uuid for v in views) == sorted([GPU2, GPU5])


def test_without_a_pod_mapping_or_uuids_nothing_is_read_and_the_line_says_what_to_enable() -> None:
    """Never every GPU of the node: no mapping and no UUID is no_pod_mapping, no views."""
    views, failure = DcgmGpuSource(served(V3_UNMAPPED), pod=VLLM_POD, discover=no_process).read(0.9)
    assert views == ()
    assert failure is not None
    assert failure.reason == DcgmReason.NO_POD_MAPPING
    assert "pod-resources" in str(failure)
    assert "\n" not in str(failure)


def test_a_pod_another_node_holds_is_pod_not_found() -> None:
    """The mapping is on but names no GPU of this pod: another node's dcgm-exporter."""
    stranger = PodIdentity("llama-70b-5c8d-zzzzz", "inference")
    result = DcgmGpuSource(served(V4_MAPPED), pod=stranger, discover=no_process).read(0.9)
    assert result[0] == ()
    assert failure_of(result) == DcgmReason.POD_NOT_FOUND
    assert "inference/llama-70b-5c8d-zzzzz" in str(result[1])


def test_uuids_this_exporter_does_not_list_are_gpus_not_found() -> None:
    """vLLM's UUIDs known but absent from the answer: the URL reads another node."""
    elsewhere = "GPU-00000000-0000-4000-8000-000000000000"
    source = DcgmGpuSource(served(V3_UNMAPPED), discover=vllm_env(elsewhere))
    assert failure_of(source.read(0.9)) == DcgmReason.GPUS_NOT_FOUND
    explicit = DcgmGpuSource(served(V4_MAPPED), explicit=(UuidSelector(elsewhere),))
    assert failure_of(explicit.read(0.9)) == DcgmReason.GPUS_NOT_FOUND


def test_discovery_off_means_the_environment_is_never_read() -> None:
    """gpu_discovery=none/settings: no /proc scan, so an unmapped answer stays unread."""

    def forbidden(**_: object) -> GpuVisibility:
        raise AssertionError("discovery must not run")

    source = DcgmGpuSource(served(V3_UNMAPPED), discover=forbidden, from_process=False)
    assert failure_of(source.read(0.9)) == DcgmReason.NO_POD_MAPPING


MIG_GPU = "GPU-3f1c2a9e-8b7d-4e21-9c0a-5d6e7f8a9b01"  # GPU 0 of the MIG answer: gi1, gi5, gi13


@pytest.mark.parametrize("selector", [UuidSelector(MIG_GPU), IndexSelector(0)])
def test_a_gpu_split_into_mig_instances_is_never_picked_whole(
    selector: UuidSelector | IndexSelector,
) -> None:
    """A UUID or index of a MIG GPU names every instance, other pods' too: refused, not summed."""
    result = DcgmGpuSource(served(V4_MIG), explicit=(selector,)).read(0.9)
    assert result[0] == ()
    assert failure_of(result) == DcgmReason.GPUS_NOT_FOUND
    message = str(result[1])
    assert "MIG instances (gi1, gi5, gi13; pod_name/pod_namespace unset)" in message
    assert "set pod_name/pod_namespace" in message
    assert "dcgm_url must be" not in message  # the node is the right one
    views, failure = DcgmGpuSource(served(V4_MIG), explicit=(selector,), pod=MIG_POD).read(0.9)
    assert failure is None
    assert [v.name for v in views] == ["NVIDIA H100 80GB HBM3 MIG 3g.40gb"]


def test_a_whole_gpu_beside_mig_gpus_is_picked_by_its_index() -> None:
    """GPU 1 of the MIG answer is not split: its index picks it."""
    views, failure = DcgmGpuSource(served(V4_MIG), explicit=(IndexSelector(1),)).read(0.9)
    assert failure is None
    assert [v.index for v in views] == ["1"]


def test_vllms_mig_uuids_are_said_to_be_mig_not_another_node() -> None:
    """Today's MIG UUIDs cannot be matched (dcgm-exporter never writes them): say so, truly."""
    mig = "MIG-5d1b3c7e-2a4f-5b6c-9d8e-1f2a3b4c5d6e"
    result = DcgmGpuSource(served(V4_MIG), discover=vllm_env(mig)).read(0.9)
    assert failure_of(result) == DcgmReason.GPUS_NOT_FOUND
    assert "vLLM's GPUs are MIG instances" in str(result[1])
    assert "dcgm_url must be" not in str(result[1])


def test_an_old_form_mig_uuid_names_its_gpu_and_instance() -> None:
    """Before R470, ``MIG-GPU-<uuid>/<gi>/<ci>``: the instance is found by its GPU and GI."""
    views, failure = DcgmGpuSource(served(V4_MIG), discover=vllm_env(f"MIG-{MIG_GPU}/1/0")).read(
        0.9
    )
    assert failure is None
    assert [v.name for v in views] == ["NVIDIA H100 80GB HBM3 MIG 3g.40gb"]


def test_a_pod_not_mapped_on_a_mapped_node_names_time_slicing_and_an_unnamed_pod() -> None:
    """The true causes: a GPU shared by time-slicing lists one pod; the pod may be unnamed."""
    stranger = PodIdentity("llama-70b-5c8d-zzzzz", "inference")
    result = DcgmGpuSource(served(V4_MAPPED), pod=stranger, discover=no_process).read(0.9)
    assert "--kubernetes-virtual-gpus" in str(result[1])
    unnamed = DcgmGpuSource(served(V4_MAPPED), discover=no_process).read(0.9)
    assert failure_of(unnamed) == DcgmReason.POD_NOT_FOUND
    assert "the pod is not named: set pod_name and pod_namespace" in str(unnamed[1])
    assert "dcgm_url must be" not in str(unnamed[1])


# --- answers that are not what dcgm-exporter writes ------------------------------------------


def gpu_line(family: str, value: str, *, gpu: str = "0", uuid: str = GPU2, extra: str = "") -> str:
    """One series line in dcgm-exporter's label order."""
    return (
        f'{family}{{gpu="{gpu}",UUID="{uuid}",device="nvidia{gpu}",'
        f'modelName="NVIDIA H100 80GB HBM3"{extra}}} {value}\n'
    )


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"<html><body>login</body></html>\n", DcgmReason.NOT_DCGM),
        (b'{"status": "ok"}', DcgmReason.NOT_DCGM),
        (b"\x00\xff\xfe garbage \x80\x81", DcgmReason.NOT_DCGM),
        (b"", DcgmReason.NOT_DCGM),
        (gpu_line(FB_USED, "NaN").encode(), DcgmReason.PARSE_ERROR),
        (gpu_line(FB_USED, "-5").encode(), DcgmReason.PARSE_ERROR),
        (gpu_line(FB_USED, "1e12").encode(), DcgmReason.PARSE_ERROR),
        (gpu_line(FB_USED, "12 junk junk").encode(), DcgmReason.PARSE_ERROR),
        (f'{FB_USED}{{gpu="0",UUID="{GPU2}" 12\n'.encode(), DcgmReason.PARSE_ERROR),
        (f'{FB_USED}{{UUID="{GPU2}"}} 12\n'.encode(), DcgmReason.MISSING_FIELDS),
        (f'{FB_USED}{{gpu="0"}} 12\n'.encode(), DcgmReason.MISSING_FIELDS),
        (gpu_line(FB_USED, "1", gpu="x1").encode(), DcgmReason.MISSING_FIELDS),
    ],
)
def test_what_is_not_a_dcgm_memory_answer_fails_with_one_line(payload: bytes, reason: str) -> None:
    """HTML, JSON, binary noise, NaN, negative or absurd MiB, broken lines: bounded reasons."""
    with pytest.raises(SourceError) as caught:
        parse_dcgm_metrics(payload)
    assert caught.value.reason == reason
    assert "\n" not in str(caught.value)


def test_a_gpu_with_used_but_no_free_memory_is_missing_fields_and_kept_out() -> None:
    """One of the pod's GPUs lacks FB_FREE: the other is read, the failure names the field."""
    payload = (
        gpu_line(FB_USED, "100", extra=',namespace="inference",pod="llama-70b-5c8d-qw7zt"')
        + gpu_line(FB_FREE, "200", extra=',namespace="inference",pod="llama-70b-5c8d-qw7zt"')
        + gpu_line(
            FB_USED,
            "100",
            gpu="5",
            uuid=GPU5,
            extra=',namespace="inference",pod="llama-70b-5c8d-qw7zt"',
        )
    ).encode()
    views, failure = DcgmGpuSource(lambda: payload, pod=VLLM_POD, discover=no_process).read(0.9)
    assert [v.uuid for v in views] == [GPU2]
    assert failure is not None
    assert failure.reason == DcgmReason.MISSING_FIELDS
    assert FB_FREE in str(failure)


#: A value dcgm-exporter 1.x prints for a field the GPU does not support (int64 max - 13).
SENTINEL = "9223372036854775794"


def test_an_unreadable_value_costs_only_its_gpu() -> None:
    """Another pod's GPU with a sentinel: this pod's GPU is read; its own names the line."""
    ours = ',namespace="inference",pod="llama-70b-5c8d-qw7zt"'
    theirs = ',namespace="inference",pod="other-0"'
    payload = (
        gpu_line(FB_USED, "100", extra=ours)
        + gpu_line(FB_FREE, "200", extra=ours)
        + gpu_line(FB_USED, SENTINEL, gpu="5", uuid=GPU5, extra=theirs)
        + gpu_line(FB_FREE, "200", gpu="5", uuid=GPU5, extra=theirs)
    )
    theirs_apart = payload.encode()
    views, failure = DcgmGpuSource(lambda: theirs_apart, pod=VLLM_POD, discover=no_process).read(
        0.9
    )
    assert failure is None
    assert [v.uuid for v in views] == [GPU2]
    mine = payload.replace(theirs, ours).encode()
    views, failure = DcgmGpuSource(lambda: mine, pod=VLLM_POD, discover=no_process).read(0.9)
    assert [v.uuid for v in views] == [GPU2]
    assert failure is not None
    assert failure.reason == DcgmReason.PARSE_ERROR
    assert f"line 3: {FB_USED} of GPU 5 is" in str(failure)


def test_a_pod_whose_only_gpu_is_unreadable_is_told_why_not_that_it_is_elsewhere() -> None:
    """The pod's GPU reads only sentinels: parse_error naming the line, not pod_not_found."""
    ours = ',namespace="inference",pod="llama-70b-5c8d-qw7zt"'
    payload = (
        gpu_line(FB_USED, SENTINEL, extra=ours)
        + gpu_line(FB_FREE, SENTINEL, extra=ours)
        + gpu_line(FB_USED, "1", gpu="5", uuid=GPU5)
        + gpu_line(FB_FREE, "2", gpu="5", uuid=GPU5)
    ).encode()
    views, failure = DcgmGpuSource(lambda: payload, pod=VLLM_POD, discover=no_process).read(0.9)
    assert views == ()
    assert failure is not None
    assert failure.reason == DcgmReason.PARSE_ERROR
    assert f"line 1: {FB_USED} of GPU 0 is" in str(failure)


def test_a_gpu_listed_once_per_pod_counts_once() -> None:
    """Time-slicing: dcgm-exporter repeats a shared GPU's series per pod; one device, both pods."""
    payload = "".join(
        gpu_line(family, value, extra=f',namespace="inference",pod="{pod}"')
        for family, value in ((FB_USED, "100"), (FB_FREE, "200"))
        for pod in ("llama-70b-5c8d-qw7zt", "other-0")
    ).encode()
    (device,) = parse_dcgm_metrics(payload).devices
    assert device.pods == {VLLM_POD, PodIdentity("other-0", "inference")}


def test_an_answer_with_more_memory_series_than_a_node_has_is_too_large() -> None:
    """Past MAX_SAMPLES memory series the answer is refused, its samples never built."""
    payload = "".join(
        gpu_line(FB_USED, "1", gpu=str(i % 100_000), uuid=f"GPU-{i:08x}")
        for i in range(MAX_SAMPLES + 1)
    ).encode()
    with pytest.raises(SourceError) as caught:
        parse_dcgm_metrics(payload)
    assert caught.value.reason == DcgmReason.TOO_LARGE


def test_a_reading_uses_fb_total_when_a_counters_file_adds_it() -> None:
    """FB_TOTAL, when exported, is the total (not used + free + reserved)."""
    device = DcgmDevice(0, GPU2, used_mib=10, free_mib=20, reserved_mib=5, total_mib=36)
    assert device.reading().total_bytes == 36 * MIB


# --- hostile answers: devices exported alike, labels no GPU has, lines too long ---------------


def _dev(uuid: str, used: int, extra: str = "", model: str = "NVIDIA H100 80GB HBM3") -> str:
    labels = f'gpu="0",UUID="{uuid}",modelName="{model}",pod="vllm-0",namespace="ns"{extra}'
    return "".join(
        f"{family}{{{labels}}} {value}\n"
        for family, value in ((FB_USED, used), (FB_FREE, 1000), ("DCGM_FI_DEV_FB_RESERVED", 500))
    )


_WHOLE = _dev("GPU-aaaa/gi1", 70000)
_MIG = _dev("GPU-aaaa", 9000, ',GPU_I_ID="1",GPU_I_PROFILE="1g.10gb"')
_POD = PodIdentity("vllm-0", "ns")


@pytest.mark.parametrize("text", [_WHOLE + _MIG, _MIG + _WHOLE], ids=["whole-first", "mig-first"])
def test_devices_exported_with_the_same_labels_are_one_unreadable_device(text: str) -> None:
    """Whole GPU "GPU-aaaa/gi1" and MIG instance 1 of GPU-aaaa: never two series of one name."""
    parsed = parse_dcgm_metrics(text)
    assert len(parsed.devices) == 1
    (device,) = parsed.devices
    assert (device.gpu, device.label_uuid) == (0, "GPU-aaaa/gi1")
    assert not device.complete
    picked, failure = pick_devices(parsed, pod=_POD)
    assert picked == ()
    assert failure is not None
    assert failure.reason == DcgmReason.PARSE_ERROR
    assert "both as MIG instance 1 of GPU-aaaa and as whole GPU GPU-aaaa/gi1" in str(failure)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (_dev("GPU-" + "a" * 4096, 1), "UUID of 4100 characters"),
        (_dev("GPU-aaaa", 1, ',GPU_I_ID="' + "1" * 2000 + '"'), "GPU_I_ID of '1111"),
        (_dev("GPU-aaaa", 1, ',GPU_I_ID="x"'), "GPU_I_ID of 'x'"),
    ],
    ids=["uuid-4k", "instance-2000-digits", "instance-not-a-number"],
)
def test_a_label_exported_as_uuid_must_be_one_a_gpu_has(text: str, words: str) -> None:
    """UUID and GPU_I_ID become the uuid label: past a GPU's, a parse_error, never a label."""
    with pytest.raises(SourceError) as caught:
        parse_dcgm_metrics(text)
    assert caught.value.reason == DcgmReason.PARSE_ERROR
    assert words in str(caught.value)
    assert len(str(caught.value)) < 200


_LONG_MODEL = "X" * 70_000  # a line past the parser's 64 KiB
_LONG_USED = _dev("GPU-aaaa", 70000, model=_LONG_MODEL).split("\n")[0] + "\n"


@pytest.mark.parametrize(
    ("text", "was"),
    [
        (_dev("GPU-aaaa", 70000, model=_LONG_MODEL), "not_dcgm"),
        (
            _dev("GPU-aaaa", 70000, model=_LONG_MODEL)
            + _dev("GPU-bbbb", 1).replace('pod="vllm-0"', 'pod="other"'),
            "pod_not_found",
        ),
        (
            _LONG_USED + "".join(_dev("GPU-aaaa", 70000).splitlines(keepends=True)[1:]),
            "missing_fields",
        ),
    ],
    ids=["all-lines", "pod-lines", "pod-fb-used-line"],
)
def test_lines_too_long_to_read_are_named_as_the_reason(text: str, was: str) -> None:
    """A 70 kB modelName line is skipped: the failure says so (it ``was`` another reason)."""
    try:
        parsed = parse_dcgm_metrics(text)
    except SourceError as exc:
        failure: SourceError | None = exc
    else:
        _, failure = pick_devices(parsed, pod=_POD)
    assert failure is not None
    assert failure.reason == DcgmReason.PARSE_ERROR, was
    assert "were skipped unread for their length (over 64 Ki characters" in str(failure)
    assert MAX_LINE_CHARS == 64 * 1024  # the figure the message names


def test_a_skipped_line_does_not_spoil_a_pick_that_found_the_pods_gpus() -> None:
    """Another pod's over-long line: this pod's GPU still reads."""
    text = _dev("GPU-aaaa", 70000) + _dev("GPU-bbbb", 1, model=_LONG_MODEL).replace(
        'pod="vllm-0"', 'pod="other"'
    )
    picked, failure = pick_devices(parse_dcgm_metrics(text), pod=_POD)
    assert failure is None
    assert [d.uuid for d in picked] == ["GPU-aaaa"]
