"""nvidia-smi topo -m / -q and collect_env parsers on the real fixtures."""
from __future__ import annotations

from pathlib import Path

from ingest.parsers.collect_env import parse_collect_env
from ingest.parsers.nvidia_smi import parse_nvidia_smi_q, parse_nvidia_smi_topo

FIXTURES = Path(__file__).parent / "fixtures" / "real"


def read(name):
    return (FIXTURES / name).read_text(encoding="utf-8")


def env(result):
    return {r["key"]: r["value"] for r in result.records if r["table"] == "env"}


def links(result):
    return {(r["device"], r["peer"]): r["link"] for r in result.records if r.get("record") == "smi_link"}


def test_topo_dgx2_mlx5_columns_no_numa():
    r = parse_nvidia_smi_topo(read("40_topo_dgx2_nv6_16gpu_mlx5_no_numa.txt"), source="t")
    lk = links(r)
    assert len(lk) == 4 * 26
    assert (lk[("GPU0", "GPU0")], lk[("GPU0", "GPU15")], lk[("GPU2", "mlx5_1")], lk[("GPU3", "mlx5_9")]) == ("X", "NV6", "PIX", "SYS")
    assert env(r) == {f"topo.GPU{i}.cpu_affinity": "0-23,48-71" for i in range(4)}


def test_topo_2017_mlx4_trailing_whitespace_and_prompt():
    r = parse_nvidia_smi_topo(read("41_topo_2017_mlx4_trailing_whitespace.txt"), source="t")
    lk = links(r)
    assert (lk[("GPU0", "GPU1")], lk[("GPU0", "GPU2")], lk[("GPU4", "GPU0")], lk[("GPU4", "mlx4_0")]) == ("PIX", "PHB", "SYS", "SYS")
    assert env(r)["topo.GPU4.cpu_affinity"] == "10-19,30-39"
    assert r.unparsed == 0


def test_topo_mangled_nic_legend():
    r = parse_nvidia_smi_topo(read("43_topo_nic_legend_mangled_42nics.txt"), source="t")
    e = env(r)
    assert len(e) == 40 and e["topo.NIC2"] == "mlx5_2" and e["topo.NIC41"] == "mlx5_bond_8"
    assert r.unparsed_lines == (1, 2, 44)  # the overwritten NIC0/NIC1 rows and "ulimit soft"


def test_topo_modern_nic_rows_and_numa_columns():
    text = "\n".join([
        "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID",
        "GPU0\t X \tNV18\tPXB\t0-55,112-167\t0\t\tN/A",
        "GPU1\tNV18\t X \tSYS\t56-111\t1\t\tN/A",
        "NIC0\tPXB\tSYS\t X ",
        "",
        "Legend:",
        "  X    = Self",
        "  NV#  = Connection traversing a bonded set of # NVLinks",
        "NIC Legend:",
        "  NIC0: mlx5_0",
    ])
    r = parse_nvidia_smi_topo(text, source="t")
    lk = links(r)
    assert (lk[("GPU0", "GPU1")], lk[("GPU0", "NIC0")], lk[("NIC0", "GPU1")]) == ("NV18", "PXB", "SYS")
    e = env(r)
    assert (e["topo.GPU1.numa_affinity"], e["topo.GPU0.gpu_numa_id"], e["topo.NIC0"]) == ("1", "N/A", "mlx5_0")
    assert r.unparsed == 0


def test_nvsmi_q_nested_sections():
    r = parse_nvidia_smi_q(read("45_nvsmi_q_2020_driver450_mig_field.txt"), source="q")
    e = env(r)
    gpu = "nvsmi.gpu[00000000:41:00.0]"
    assert e["nvsmi.Driver Version"] == "450.51.06"
    assert e[f"{gpu}.Product Name"] == "TITAN Xp"
    assert e[f"{gpu}.MIG Mode.Current"] == "N/A"
    assert e[f"{gpu}.Accounting Mode"] == "Disabled"  # back at GPU level after the MIG section
    assert e[f"{gpu}.Inforom Version.Image Version"] == "G001.0000.01.04"
    assert r.unparsed == 0


def test_collect_env_2020_inline_gpu():
    e = env(parse_collect_env(read("47_collect_env_2020_torch1.7.txt"), source="c"))
    assert (e["torch_version"], e["cuda_build_version"], e["gpu_models"], e["driver_version"], e["python_version"]) == \
        ("1.7.0+cu101", "10.1", "GPU 0: Tesla T4", "418.67", "3.6 (64-bit runtime)")


def test_collect_env_2025_multi_gpu_and_cudnn_list():
    e = env(parse_collect_env(read("48_collect_env_2025_torch2.7_8xh100.txt"), source="c"))
    assert e["torch_version"] == "2.7.0+cu126"
    assert e["gpu_models"].split("; ")[7] == "GPU 7: NVIDIA H100 80GB HBM3"
    assert e["cudnn_version"].startswith("/usr/lib/x86_64-linux-gnu/libcudnn.so.9.8.0; ")
    assert e["driver_version"] == "550.127.05"


def test_collect_env_vllm_sectioned():
    r = parse_collect_env(read("50_collect_env_vllm_sectioned_2025.txt"), source="c")
    e = env(r)
    assert (e["os"], e["torch_version"], e["cuda_runtime_version"], e["driver_version"]) == \
        ("CentOS Linux 7 (Core) (x86_64)", "2.6.0+cu124", "12.4.99", "550.107.02")
    assert e["gpu_models"].count("RTX 3090") == 4
    assert r.unparsed_lines == (1,)


def test_collect_env_packages():
    e = env(parse_collect_env("Versions of relevant libraries:\n[pip3] nvidia-nccl-cu12==2.21.5\n[conda] numpy 1.26.4 py_0\n"
                              "NCCL version: 2.20.5\n", source="c"))
    assert e == {"pip3.nvidia-nccl-cu12": "2.21.5", "conda.numpy": "numpy 1.26.4 py_0", "nccl_version": "2.20.5"}


def test_topo_rows_without_header_named_by_position():
    """Rows pasted without the header: GPUs first, then NICs (the count from a NIC row's diagonal),
    then the affinity cells; without a NIC row or legend, columns past the GPUs seen are numbered."""
    rows = ["GPU0\t X \tNV18\tPXB\t0-55,112-167\t0\t\tN/A", "GPU1\tNV18\t X \tSYS\t56-111\t1\t\tN/A"]
    r = parse_nvidia_smi_topo("\n".join([*rows, "NIC0\tPXB\tSYS\t X "]), source="t")
    assert links(r) == {("GPU0", "GPU0"): "X", ("GPU0", "GPU1"): "NV18", ("GPU0", "NIC0"): "PXB",
                        ("GPU1", "GPU0"): "NV18", ("GPU1", "GPU1"): "X", ("GPU1", "NIC0"): "SYS",
                        ("NIC0", "GPU0"): "PXB", ("NIC0", "GPU1"): "SYS", ("NIC0", "NIC0"): "X"}
    assert env(r) == {"topo.GPU0.cpu_affinity": "0-55,112-167", "topo.GPU0.numa_affinity": "0", "topo.GPU0.gpu_numa_id": "N/A",
                      "topo.GPU1.cpu_affinity": "56-111", "topo.GPU1.numa_affinity": "1", "topo.GPU1.gpu_numa_id": "N/A"}
    assert r.unparsed == 0 and any("without their header" in w for w in r.warnings)
    alone = links(parse_nvidia_smi_topo("\n".join(rows), source="t"))
    assert alone[("GPU0", "GPU1")] == "NV18" and alone[("GPU0", "column2")] == "PXB"


def test_smi_q_report_with_another_log_interleaved_reads_both():
    """A report read whole (its tree by indentation) leaves the lines that are not its to the chain: an
    NCCL line with ' : ' inside is no key of the report."""
    from ingest.parsers.dispatch import parse_text
    nccl = "nodea:26799:27030 [4] NCCL INFO Channel 00 : 4[89000] -> 5[8e000] via P2P/direct pointer/read"
    text = "\n".join(["==============NVSMI LOG==============", "", "Driver Version                      : 396.44",
                      nccl, "Attached GPUs                       : 1"])
    r = parse_text(text, source="t", kind="nvidia_smi_q")
    assert env(r)["driver_version"] == "396.44" and env(r)["num_gpus"] == "1"
    assert not any("NCCL" in k for k in env(r)) and r.unparsed == 0 and set(r.kinds) == {"nvidia_smi_q", "nccl"}


def test_collect_env_block_goes_on_across_another_process_lines():
    """An NCCL line ('host:pid:tid ...') is no 'Key: value'; a line or two of another log inside the
    report do not end it (the keys after them are still read)."""
    from ingest.parsers.dispatch import parse_text
    nccl = "nodea:26799:27030 [4] NCCL INFO Channel 00 : 4[89000] -> 5[8e000] via P2P/direct pointer/read"
    text = "\n".join(["Collecting environment information...", "PyTorch version: 2.0.1", nccl, nccl,
                      "MIOpen runtime version: N/A", "Is XNNPACK available: True"])
    r = parse_text(text, source="t")
    e = env(r)
    assert e["torch_version"] == "2.0.1" and e["is_xnnpack_available"] == "True" and not any(k.startswith("nodea") for k in e)
    assert r.unparsed == 0 and set(r.kinds) == {"collect_env", "nccl"}
