"""SYNTHETIC campaign directory for ingest/report tests only (not measurements).

Writes the runner's directory contract with programmatically generated StepRows so the
loader and the note can be tested before/without real runs. The end-to-end test with real
runs lives elsewhere.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

from core.records import FixedConfig, LoadedRun, ModelConfig, RunInfo, RunSpec, RunStatus, StepRow, to_dict

MODEL = ModelConfig(num_layers=2, hidden_size=64, num_heads=4, ffn_hidden_size=256, seq_length=32,
                    vocab_size=500, padded_vocab_size=512)


def _fixed(steps: int, warmup_steps: int) -> FixedConfig:
    return FixedConfig(preset="tiny", model=MODEL, global_batch_size=8, dtype="bf16", seed=0, steps=steps,
                       warmup_steps=warmup_steps, lr=6e-4, min_lr=6e-5, lr_warmup_steps=2, weight_decay=0.1,
                       adam_beta1=0.9, adam_beta2=0.95, grad_clip=1.0, data="synthetic")


LAYOUTS = {  # name: (strategy, engine, tp, pp, dp, micro_batch_size, num_microbatches, base step time s)
    "ddp": ("ddp", "torch-ddp", 1, 1, 2, 2, 2, 0.10),
    "zero3": ("zero3", "deepspeed", 1, 1, 2, 4, 1, 0.13),
    "tp_pp": ("tp_pp", "torch", 1, 2, 1, 2, 4, 0.16),
}


def _write(path: Path, obj: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1))


DIAGNOSIS = {  # status -> status.json diagnosis, as runner.launch writes it
    "oom": {"rank": 1, "message": "CUDA out of memory. Tried to allocate 2.00 GiB (synthetic)"},
    "crash": {"rank": 0, "exception": "RuntimeError: boom (synthetic)"},
    "hang": {"source": "py-spy", "odd_ranks": [0], "majority_blocked_in": None, "ranks": {
        "0": {"blocked_in": "all_gather", "frame": "all_gather (torch/distributed/distributed_c10d.py:1)",
              "user_frame": "inject (runner/faults.py:70)"},
        "1": {"blocked_in": "backward (gradient all-reduce/reduce-scatter hooks)", "frame": "_engine_run_backward (x:1)",
              "user_frame": "DDPTrainer.train_step (runner/strategies/ddp.py:47)"}}},
}


def write_synthetic_campaign(root: Path, *, device_name: str | None = None, steps: int = 12, warmup_steps: int = 2,
                             failed: tuple[str, ...] = ("tp_pp",), statuses: Mapping[str, str | None] = {},
                             stop_step: int = 6, layouts: Mapping[str, tuple] | None = None,
                             cores_logical: int = 4) -> Path:
    """Write runs/<campaign> under ``root``; runs in ``failed`` get an OOM status and no metrics.

    statuses: run -> status written to status.json (None: no status.json, a stopped runner);
    a run listed there that is not "ok" keeps the step rows before ``stop_step`` (partial
    numbers) and gets ``DIAGNOSIS[status]``. layouts: replaces ``LAYOUTS``.
    device_name None -> a CPU campaign (mem_* null); else GPU rows with memory peaks.
    """
    layouts = LAYOUTS if layouts is None else layouts
    root.mkdir(parents=True, exist_ok=True)
    fixed = _fixed(steps, warmup_steps)
    on_gpu = device_name is not None
    _write(root / "campaign.json", {
        "schema_version": 1, "name": root.name, "created_at": "2026-11-29T10:00:00Z", "tool_version": "0.1",
        "tool_git_commit": "abc1234", "matrix_path": "examples/matrices/tiny.toml",
        "launch_command": ["runner", "all"], "fixed": to_dict(fixed), "runs": list(layouts)})
    _write(root / "env.json", {
        "schema_version": 1, "collected_at": "2026-11-29T10:00:00Z", "hostname": "synthetic", "os": "Linux",
        "python": "3.12", "cpu": {"model": "Synthetic CPU", "cores_logical": cores_logical, "cores_physical": 2},
        "host_memory_gib": 16.0, "disk": {"path": "/", "total_gib": 100.0, "free_gib": 50.0},
        "gpu_count": 2 if on_gpu else 0,
        "gpus": [{"index": i, "name": device_name, "memory_total_mib": 143771, "driver_version": "580.1",
                  "power_limit_w": 700.0, "clocks_sm_max_mhz": 1980} for i in range(2 if on_gpu else 0)],
        "topology": None, "versions": {"python": "3.12", "torch": "2.13", "cuda": None, "cudnn": None, "nccl": None,
                                       "deepspeed": None, "megatron_core": None},
        "launch_command": ["runner", "all"], "tool_git_commit": "abc1234", "env_vars": {"OMP_NUM_THREADS": "1"}})
    for k, (name, (strategy, engine, tp, pp, dp, mbs, nmb, base_s)) in enumerate(layouts.items()):
        world = tp * pp * dp
        spec = RunSpec(campaign=root.name, name=name, strategy=strategy, engine=engine, world_size=world, tp_degree=tp,
                       pp_degree=pp, dp_degree=dp, micro_batch_size=mbs, num_microbatches=nmb,
                       device="cuda" if on_gpu else "cpu", backend="nccl" if on_gpu else "gloo", fixed=fixed)
        run_dir = root / name
        _write(run_dir / "spec.json", to_dict(spec))
        status = statuses.get(name, "oom" if name in failed else "ok")
        if name not in statuses or status is not None:
            _write(run_dir / "status.json", to_dict(RunStatus(
                run=name, status=status, exit_code=1 if status != "ok" else 0,
                cause=f"{status} (synthetic)" if name in statuses and status != "ok" else
                "CUDA out of memory (synthetic)" if status != "ok" else None,
                started_at="2026-11-29T10:00:00Z", ended_at="2026-11-29T10:01:00Z", duration_s=60.0,
                command=("torchrun", "--nproc-per-node", str(world)), diagnosis=DIAGNOSIS.get(status))))
        if status != "ok" and name not in statuses:
            continue
        num_steps = steps if status == "ok" else stop_step
        pos = MODEL.seq_length * MODEL.hidden_size
        _write(run_dir / "run_info.json", to_dict(RunInfo(
            run=name, engine=engine, num_params=120_000 + pos, num_params_position_embedding=pos, torch_version="2.13",
            engine_version="synthetic", device_name=device_name or "cpu", num_gpus=world if on_gpu else 0)))
        (run_dir / "metrics").mkdir(parents=True, exist_ok=True)
        for rank in range(world):
            lines = []
            for step in range(num_steps):
                jitter = 0.01 * ((step * 7 + rank * 3 + k) % 5)
                last_stage = pp == 1 or rank == world - 1
                row = StepRow(run=name, rank=rank, step=step, step_time_s=base_s * (3 if step == 0 else 1) + jitter,
                              tokens=fixed.global_batch_size * MODEL.seq_length,
                              loss=math.log(500) - 0.1 * step if last_stage else None, lr=6e-4, grad_norm=1.0,
                              mem_peak_allocated_gib=(2.0 + rank) if on_gpu else None,
                              mem_peak_reserved_gib=(2.5 + rank) if on_gpu else None,
                              data_wait_s=0.001, wall_time_s=step * base_s)
                lines.append(json.dumps(to_dict(row)))
            (run_dir / "metrics" / f"rank{rank}.jsonl").write_text("\n".join(lines) + "\n")
    return root


def make_run(name: str, *, strategy: str = "ddp", engine: str = "torch-ddp", world_size: int = 1, tp_degree: int = 1,
             pp_degree: int = 1, dp_degree: int | None = None, status: str | None = "ok", device: str = "cuda",
             data_round: str = "synthetic", num_params: int | None = None, options: Mapping | None = None,
             cause: str | None = None, diagnosis: Mapping | None = None) -> LoadedRun:
    """A SYNTHETIC loaded run (core.records.LoadedRun) for report unit tests: the tiny model's
    fixed variables, the given layout; status None: no status.json; num_params None: no run_info."""
    spec = RunSpec(campaign="synthetic", name=name, strategy=strategy, engine=engine, world_size=world_size,
                   tp_degree=tp_degree, pp_degree=pp_degree, dp_degree=world_size if dp_degree is None else dp_degree,
                   micro_batch_size=1, num_microbatches=1, device=device,
                   backend="nccl" if device == "cuda" else "gloo", fixed=_fixed(12, 2), options=dict(options or {}),
                   data_round=data_round)
    run_status = None if status is None else RunStatus(
        run=name, status=status, exit_code=None, cause=cause, started_at=None, ended_at=None, duration_s=None,
        diagnosis=diagnosis)
    pos = MODEL.seq_length * MODEL.hidden_size
    info = None if num_params is None else RunInfo(
        run=name, engine=engine, num_params=num_params, num_params_position_embedding=pos, torch_version="2.13",
        engine_version="synthetic", device_name=None, num_gpus=world_size if device == "cuda" else 0)
    return LoadedRun(spec=spec, status=run_status, info=info)
