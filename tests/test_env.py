"""Environment record: allow-list, redaction, and a complete record on a machine without GPUs."""
from __future__ import annotations

import json

from core.records import env_record_from_dict, to_dict
from runner.env import collect_env, collect_env_vars


def test_env_vars_allow_list_and_redaction():
    env = {"NCCL_DEBUG": "INFO", "NCCL_IB_HCA": "mlx5", "HOME": "/root", "AWS_SECRET_ACCESS_KEY": "x",
           "TORCH_HUB_TOKEN": "hf_abc", "CUDA_VISIBLE_DEVICES": "0,1", "OMP_NUM_THREADS": "1", "PATH": "/bin"}
    got = collect_env_vars(env)
    assert got == {"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_DEBUG": "INFO", "NCCL_IB_HCA": "mlx5",
                   "OMP_NUM_THREADS": "1", "TORCH_HUB_TOKEN": "<redacted>"}


def test_env_record_without_gpu(tmp_path):
    env = collect_env(launch_command=["runner", "all"], data_dir=tmp_path)
    assert env.schema_version == 1
    assert env.gpu_count == 0 and env.gpus == () and env.topology is None
    assert env.cpu.cores_logical >= 1 and env.host_memory_gib > 0
    assert env.disk.total_gib > 0
    assert env.versions["torch"].startswith("2.") and env.versions["deepspeed"]
    assert env.versions["megatron_core"] and env.launch_command == ("runner", "all")
    # env.json is the record's to_dict, read back by the same record's decoder without a problem
    assert env_record_from_dict(json.loads(json.dumps(to_dict(env)))) == (env, [])
