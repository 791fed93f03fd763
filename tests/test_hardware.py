"""hardware.toml: dense peaks, name matching, no fallback."""
from __future__ import annotations

import pytest

from core.errors import ConfigError
from core.hardware import build_hardware_table, lookup_peak


@pytest.mark.parametrize("name, dtype, flops", [
    ("NVIDIA H200", "bf16", 989.4e12),
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4e12),
    ("NVIDIA H100 PCIe", "bf16", 756.5e12),
    ("NVIDIA A100-SXM4-40GB", "bf16", 312e12),
    ("NVIDIA A100-SXM4-80GB", "fp16", 312e12),
    ("NVIDIA A100-SXM4-80GB", "tf32", 156e12),
    ("NVIDIA L40S", "bf16", 362.05e12),
    ("NVIDIA L4", "bf16", 121e12),
    ("NVIDIA A10", "bf16", 125e12),
    ("NVIDIA B200", "bf16", 2.25e15),
    ("AMD Instinct MI300X", "bf16", 1307.4e12),
    ("nvidia h200", "bf16", 989.4e12),  # case-insensitive
])
def test_known_dense_peaks(name, dtype, flops):
    peak = lookup_peak(name, dtype)
    assert peak is not None and peak.flops == flops
    assert peak.source.startswith("https://")


def test_never_the_sparsity_number():
    assert lookup_peak("NVIDIA H200", "bf16").flops < 1e15  # 1979e12 is the 2:4 sparse figure


@pytest.mark.parametrize("name, dtype", [
    ("NVIDIA L40", "bf16"),  # not an L4 nor an L40S: no guess
    ("NVIDIA H100", "bf16"),  # ambiguous SXM/PCIe
    ("NVIDIA GeForce RTX 4090", "bf16"),
    ("cpu", "fp32"), (None, "bf16"), ("", "bf16"),
    ("NVIDIA H200", "fp8"), ("NVIDIA H200", None),
])
def test_unknown_gives_none(name, dtype):
    assert lookup_peak(name, dtype) is None


def test_h200_nvl_is_not_h200_sxm():
    assert lookup_peak("NVIDIA H200 NVL", "bf16").entry == "h200_nvl"
    assert lookup_peak("NVIDIA H200", "bf16").entry == "h200_sxm"


def test_table_names_are_unique_matches():
    """No device name used above is claimed by two entries."""
    from core.hardware import _default_table
    table = _default_table()
    for name in ("NVIDIA H200", "NVIDIA H200 NVL", "NVIDIA H100 PCIe", "NVIDIA L4", "NVIDIA L40S", "NVIDIA A10"):
        assert sum(any(p.fullmatch(name) for p in e.patterns) for e in table) == 1


def test_invalid_table_lists_every_problem():
    with pytest.raises(ConfigError) as err:
        build_hardware_table({"gpu": {"x": {"match": ["X"], "bf16": 1.0, "foo": 2}, "y": {"bf16": 1.0}}})
    assert "unknown keys ['foo']" in str(err.value) and "[gpu.y]" in str(err.value)
