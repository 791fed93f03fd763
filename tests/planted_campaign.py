"""The CPU planted campaign that tests/test_attribution.py (the note's section 5 on planted causes)
and tests/test_plants.py (the runner carries each plant out) both read: real DDP and torch-native
PP runs on CPU (gloo, the tiny preset widened so a layer costs something), each with a known cause
of known size. Built once per session by conftest.cpu_planted_campaign; tests only read it.

One campaign for both because the runs are the same ones: a host delay on rank 1, a data delay on
every rank, an uneven pipeline split and their clean twins. Its runs are timed and judged, so it
is built with no other test running beside it (conftest.cpu_alone)."""
from __future__ import annotations

HOST_DELAY_MS = 200.0
DATA_DELAY_MS = 200.0
PP_UNEVEN_LAYERS = (2, 6)
STEPS = 24
PROFILE_START_STEP = 14  # warm-up step 13, traced steps 14..18
PROFILE_NUM_STEPS = 5

MATRIX = f"""
[campaign]
name = "cpu-planted"
preset = "tiny"

[fixed]
steps = {STEPS}
profile_start_step = {PROFILE_START_STEP}
profile_num_steps = {PROFILE_NUM_STEPS}
num_layers = 8
hidden_size = 128
ffn_hidden_size = 512

[[runs]]
name = "clean"
strategy = "ddp"
world_size = 2

[[runs]]
name = "host-delay"
strategy = "ddp"
world_size = 2
plant = {{ host_delay_ms = {HOST_DELAY_MS}, host_delay_rank = 1 }}

[[runs]]
name = "data-delay"
strategy = "ddp"
world_size = 2
plant = {{ data_delay_ms = {DATA_DELAY_MS} }}

[[runs]]
name = "pp-even"
strategy = "tp_pp"
pp_degree = 2
world_size = 2

[[runs]]
name = "pp-uneven"
strategy = "tp_pp"
pp_degree = 2
world_size = 2
plant = {{ pp_layers = [{PP_UNEVEN_LAYERS[0]}, {PP_UNEVEN_LAYERS[1]}] }}

[[runs]]
name = "pp-m2"
strategy = "tp_pp"
pp_degree = 2
world_size = 2
micro_batch_size = 8

[[runs]]
name = "pp-m4"
strategy = "tp_pp"
pp_degree = 2
world_size = 2
micro_batch_size = 4

[[runs]]
name = "clean-last"
strategy = "ddp"
world_size = 2
"""
