#!/usr/bin/env bash
# exploration call (not committed)
set -u
T0=$(date +%s)
pip install --no-index --no-deps --quiet --target /tmp/pydeps .whl/*.whl
export PYTHONPATH=/tmp/pydeps:$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv
python -m runner.cli all --matrix scratch/m1.toml --out $OUT/m1 > $OUT/m1.log 2>&1; echo "m1 exit $? at $(( $(date +%s)-T0 ))s"
TORCHINDUCTOR_MAX_AUTOTUNE=1 python -m runner.cli all --matrix scratch/m2.toml --out $OUT/m2 > $OUT/m2.log 2>&1; echo "m2 exit $? at $(( $(date +%s)-T0 ))s"
for c in m1 m2; do python - $OUT/$c <<'PY'
import json, sys, pathlib, statistics
root = pathlib.Path(sys.argv[1])
for run in sorted(p for p in root.iterdir() if (p / "status.json").is_file()):
    st = json.loads((run / "status.json").read_text())
    rows = [json.loads(l) for l in (run / "metrics" / "rank0.jsonl").read_text().splitlines() if l.strip()] if (run / "metrics" / "rank0.jsonl").is_file() else []
    ts = [r["step_time_s"] for r in rows if r.get("step", 0) >= 10 and not r.get("profiled")]
    med = statistics.median(ts) if ts else None
    print(run.name, st.get("status"), "median step", med, "tokens/s", 131072 / med if med else None, "mem", max((r.get("mem_peak_allocated_gib") or 0) for r in rows) if rows else None)
PY
done
cd .nanogpt && timeout 150 python bench.py --batch_size=64 --compile=True --real_data=False --profile=False 2>&1 | grep -E "time per iteration" | tail -2
echo "done at $(( $(date +%s)-T0 ))s"
