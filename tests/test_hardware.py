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


USER_HARDWARE = """
[gpu.acme_x1]
name = "ACME X1"
match = ["ACME X1.*"]
bf16 = 500e12
memory_gib = 40.0
fabric = "acme_link"
pcie = "pcie5"
source = "https://example.com/acme-x1 -- our own measurement"

[gpu.h100_sxm]
bf16 = 900e12
source = "https://example.com/h100-clocked-down -- our power-capped H100s"

[link.acme_link]
name = "ACME Link"
bus_bw_gbps = 100.0
latency_us = 5.0
scope = "intra"
source = "https://example.com/acme-link"
"""


@pytest.fixture
def user_hardware(tmp_path):
    """Whatever a test merges with use_hardware_file is taken back afterwards."""
    from core import hardware

    saved = list(hardware._USER_FILES)
    path = tmp_path / "my-hardware.toml"
    path.write_text(USER_HARDWARE)
    yield path
    hardware._USER_FILES[:] = saved
    hardware._clear_caches()


def test_hardware_file_merges_over_the_shipped_table(user_hardware):
    from core.hardware import use_hardware_file
    from core.perfmodel import load_links

    assert lookup_peak("ACME X1 80GB", "bf16") is None
    use_hardware_file(user_hardware)
    acme = lookup_peak("ACME X1 80GB", "bf16")
    assert acme is not None and acme.flops == 500e12 and acme.entry == "acme_x1"
    h100 = lookup_peak("NVIDIA H100 80GB HBM3", "bf16")  # the user's keys over the shipped entry's
    assert h100.flops == 900e12 and "power-capped" in h100.source
    assert lookup_peak("NVIDIA H100 80GB HBM3", "fp32").flops == 67e12  # keys the user left alone stay
    assert lookup_peak("NVIDIA H200", "bf16").flops == 989.4e12
    links = load_links()
    assert links["acme_link"].bus_bw_gbps == 100.0 and "nvlink4" in links


def test_runner_plan_uses_a_users_gpu(user_hardware, capsys, tmp_path):
    from runner.cli import main as runner_main

    out = tmp_path / "plan.json"
    code = runner_main(["plan", "--model", "gpt-125m", "--gpus", "2", "--gpu", "acme_x1", "--hardware",
                        str(user_hardware), "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0 and "ACME X1" in text and "ACME Link" in text, text


@pytest.mark.parametrize("content, expect", [
    (None, "no such file"),
    ("[gpu.acme]\nname = 'A'\nmatch = ['A']\nbf16 = -1\nsource = 's'\n", "peaks must be positive"),
    ("[gpu.acme]\nname = 'A'\nmatch = ['A']\nbf16 = 1e12\nsource = 's'\nflops = 3\n", "unknown keys ['flops']"),
    ("[gpus.acme]\nname = 'A'\n", "unknown key 'gpus'"),
    ("[link.x]\nname = 'X'\n", "[link.x]: KeyError"),
    ("[gpu\n", "malformed TOML"),
])
def test_bad_hardware_file_is_one_line_naming_it(user_hardware, tmp_path, capsys, content, expect):
    from report.cli import main as report_main
    from runner.cli import main as runner_main

    path = tmp_path / "bad.toml"
    if content is not None:
        path.write_text(content)
    for main, argv in ((runner_main, ["plan", "--model", "gpt-125m", "--gpus", "2", "--out", str(tmp_path / "p.json")]),
                       (report_main, ["build", str(tmp_path), "--out", str(tmp_path / "note")])):
        assert main([*argv, "--hardware", str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(path) in err and expect in err, err
    assert lookup_peak("NVIDIA H100 80GB HBM3", "bf16").flops == 989.4e12  # a refused file leaves the table as shipped
