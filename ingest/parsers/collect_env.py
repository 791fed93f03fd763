"""``python -m torch.utils.collect_env`` output: the torch ``Key: value`` layout (2020 and 2025)
and vLLM's sectioned ``Key   : value`` variant. Multi-line values (the GPU list, cuDNN
candidates, ``[pip3]``/``[conda]`` packages) attach to the key above them.

Records: ``env`` rows (key, value); well-known keys get stable names (KEYS), others a slug of
the printed key.
"""
from __future__ import annotations

import re

from ingest.parsers import LineParser, ParseResult, run_parsers, slug

KEYS = {  # pattern table: printed key -> env key
    "PyTorch version": "torch_version", "CUDA used to build PyTorch": "cuda_build_version",
    "CUDA runtime version": "cuda_runtime_version", "Nvidia driver version": "driver_version",
    "GPU models and configuration": "gpu_models", "OS": "os", "Python version": "python_version",
    "cuDNN version": "cudnn_version", "NCCL version": "nccl_version", "Is CUDA available": "cuda_available",
    "GCC version": "gcc_version", "Python platform": "python_platform", "Libc version": "libc_version",
    "ROCM used to build PyTorch": "rocm_build_version", "Is debug build": "torch_debug_build",
    "CUDA_MODULE_LOADING set to": "cuda_module_loading", "CMake version": "cmake_version",
    "Clang version": "clang_version",
}
# more keys only collect_env prints (torch/utils/collect_env.py's env_info_fmt), read by their slug: each
# opens a block too (a block broken by another process's lines goes on at the next of its keys)
OWN_KEYS = ("HIP runtime version", "MIOpen runtime version", "Is XNNPACK available", "CUDA runtime version",
            "GPU models and configuration", "Versions of relevant libraries")
_KV = re.compile(r"(?P<key>[A-Za-z][\w .()/\-]*?)\s*:(?: (?P<value>.*)|$)")  # (':' then a blank: 'host:pid:tid' is no key)
_SECTION = re.compile(r"(?:System|PyTorch|Python Environment|CUDA / GPU|CPU|Versions of relevant libraries|"
                      r"Environment Variables|vLLM|Python)(?: Info)?:?$")  # vLLM's sectioned variant
# `accelerate env`: "- `Accelerate` version: 0.27.2", "- PyTorch version (GPU?): 2.2.0 (True)", its
# default config nested one level deeper ("- distributed_type: DEEPSPEED")
_ACCELERATE = re.compile(r"- (?P<key>[^:]+): ?(?P<value>.*)$")
ACCELERATE_KEYS = {"`Accelerate` version": "accelerate_version", "PyTorch version (GPU?)": "torch_version",
                   "Python version": "python_version", "Numpy version": "numpy_version", "Platform": "python_platform",
                   "GPU type": "gpu_models", "System RAM": "host_memory"}
_PKG = re.compile(r"\[(?P<mgr>pip3?|conda)\] (?P<pkg>.+)$")


class CollectEnvParser(LineParser):
    kind = "collect_env"
    # its banner, a key of its own (KEYS) or a package line opens a block; other keys only inside one
    gate = ("Collecting environment information", "- `Accelerate` version:", _SECTION, re.compile("=+$"), re.compile("(?:" + "|".join(map(re.escape, (*KEYS, *OWN_KEYS))) + r")\s*:"), _PKG,
            re.compile(r"/\S*/libcudnn"))  # (cuDNN's candidate libraries: continue their key across another log's lines)
    busy = property(lambda self: self._active)
    _open: dict | None = None  # record whose value continues on the next lines
    _active = False

    def feed(self, lineno: int, body: str, ts, rank) -> bool:
        ok = self._read(lineno, body)
        # a rule line alone opens nothing (vLLM's banners are rule, title, rule); another process's lines
        # written into the report do not close it (block_goes_on)
        if not self.block_goes_on(ok) or ok and body[0] != "=":
            self._active = ok
        return ok

    def _read(self, lineno: int, body: str) -> bool:
        if (body.startswith("Collecting environment information") or re.fullmatch(r"=+", body)
                or _SECTION.fullmatch(body)):
            self._open = None
            return True
        if body.startswith("- ") and (self._active or body.startswith("- `Accelerate` version:")):
            m = _ACCELERATE.match(body)
            if m:
                key, value = m.group("key").strip(), m.group("value").strip()
                if key == "PyTorch version (GPU?)":
                    value = value.split(" (")[0]
                nested = key not in ACCELERATE_KEYS and self._open is not None and self._open["key"].startswith("accelerate")
                name = ACCELERATE_KEYS.get(key) or ("accelerate." + slug(key) if nested or "config" in key else slug(key))
                rec = self.env(lineno, name, value, record="accelerate_env")
                self._open = rec if name.startswith("accelerate") else None
                return True
        m = _PKG.match(body)
        if m:
            name, _, ver = m.group("pkg").partition("==")
            self.env(lineno, f"{m.group('mgr')}.{name.split()[0]}", ver or m.group("pkg"), record="collect_env")
            return True
        if self._open is not None and (body.startswith("GPU ") and re.match(r"GPU \d+: ", body) or body.startswith("/")):
            self._open["value"] = (self._open["value"] + "; " if self._open["value"] else "") + body
            return True
        m = _KV.match(body)
        if m:
            key, value = m.group("key").strip(), (m.group("value") or "").strip()
            if key not in KEYS and not value and not self._active:
                return False  # 'Traceback (most recent call last):' is not an environment key
            value = "" if value.startswith("Probably one of the following") else value
            rec = self.env(lineno, KEYS.get(key, slug(key)), value, record="collect_env")
            self._open = rec if not value or key == "cuDNN version" else None
            return True
        return False


def parse_collect_env(text, *, source: str) -> ParseResult:
    """Parse collect_env output (see module doc). Pure; never raises on content."""
    return run_parsers(text, [CollectEnvParser(source)], kind="collect_env")
