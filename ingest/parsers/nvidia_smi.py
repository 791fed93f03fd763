"""``nvidia-smi topo -m`` matrices and ``nvidia-smi -q`` reports.

topo: ``comm_topology`` rows ``record=smi_link`` (device, peer, link: X/NV#/PIX/PXB/PHB/NODE/
SYS/SOC) for every cell of the matrix (tabs or spaces, NIC columns old ``mlx5_N`` or new
``NICn``, missing affinity columns); ``env`` rows for CPU/NUMA affinity and the NIC legend.
-q: ``env`` rows ``nvsmi.<section>.<key>`` from the indented ``Key : value`` tree.
Deliberately not here: ``topo -p2p`` tables and the XML variant (counted unparsed).
"""
from __future__ import annotations

import re

from ingest.parsers import LineParser, Message, N_, ParseResult, TextBlocks, run_parsers
from ingest.parsers.failures import FailureScanner

_MULTI = (("CPU Affinity", "CPU_Affinity"), ("NUMA Affinity", "NUMA_Affinity"), ("GPU NUMA ID", "GPU_NUMA_ID"))
_LINK = re.compile(r"X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC|N/A$")
_ROW = re.compile(r"(?P<dev>(?:GPU|NIC)\d+|mlx\d_\w+)\s+(?P<rest>.*)$")
_LEGEND_NIC = re.compile(r"(?P<nic>NIC\d+): (?P<name>\S+)$")
_LEGEND = re.compile(r"(?:Legend:|NIC Legend:|X\s+= Self|(?:SYS|NODE|PHB|PXB|PIX|NV#|SOC)\s+= .*)$")


class TopoParser(LineParser):
    kind = "nvidia_smi_topo"
    gate = (re.compile(r"(?:GPU|NIC)\d+\s|mlx\d_\w+\s|NIC\d+: "), _LEGEND, "nvidia-smi topo -m")
    _cols: list[str] | None = None

    def __init__(self, source: str) -> None:
        super().__init__(source)
        self._headless: list[tuple[int, str, list[str]]] = []  # rows seen before any header: named in finish

    def feed(self, lineno: int, body: str, ts, rank) -> bool:
        if body.endswith("nvidia-smi topo -m"):
            return True
        if body.startswith("GPU0") and ("GPU1" in body or "Affinity" in body) and not _LINK.match(body.split()[1]):
            for a, b in _MULTI:
                body = body.replace(a, b)
            self._cols = body.split()
            return True
        m = _ROW.match(body)
        if m and (self._cols or m.group("dev").startswith(("GPU", "NIC"))):
            cells = m.group("rest").split()
            if not cells or not _LINK.match(cells[0]):
                return False
            if not self._cols:  # no header yet: a matrix row has its diagonal "X"
                if "X" not in cells:
                    return False
                self._headless.append((lineno, m.group("dev"), cells))
                return True
            self._row(lineno, m.group("dev"), self._cols, cells)
            return True
        m = _LEGEND_NIC.match(body)
        if m:
            self.env(lineno, f"topo.{m.group('nic')}", m.group("name"), record="smi_nic")
            return True
        return bool(_LEGEND.match(body))

    def _row(self, lineno: int, dev: str, cols: list[str], cells: list[str]) -> None:
        for col, cell in zip(cols, cells):
            if col in ("CPU_Affinity", "NUMA_Affinity", "GPU_NUMA_ID"):
                self.env(lineno, f"topo.{dev}.{col.lower()}", cell, record="smi_affinity")
            elif _LINK.match(cell):
                self.records.append({"table": "comm_topology", "source": self.source, "line": lineno,
                                     "record": "smi_link", "device": dev, "peer": col, "link": cell})

    def finish(self) -> None:
        """Rows read before any header. The matrix is nvidia-smi's: GPUs first, then NICs, then CPU
        affinity, NUMA affinity and GPU NUMA ID. The GPU count is known from a NIC row (its "X" sits
        at the GPU count plus its index) or the NIC legend (links less NICs); else it is at least
        the GPU rows' count and one past the last GPU-only cell (X, NV#), and a column past that
        bound is named by its position (``column<j>``), not guessed."""
        if not self._headless:
            return
        rows, nics = self._headless, sum(r.get("record") == "smi_nic" for r in self.records)
        num_links = max(next((i for i, c in enumerate(cells) if not _LINK.match(c)), len(cells)) for _, _, cells in rows)
        sure = [cells.index("X") - int(dev[3:]) for _, dev, cells in rows if dev.startswith("NIC")]
        sure += [num_links - nics] * bool(nics)
        bound = max([1 + int(dev[3:]) for _, dev, _ in rows if dev.startswith("GPU")]
                    + [1 + max(i for i, c in enumerate(cells) if c == "X" or c.startswith("NV")) for _, _, cells in rows])
        num_gpus = sure[0] if sure else bound
        for lineno, dev, cells in rows:
            links = next((i for i, c in enumerate(cells) if not _LINK.match(c)), len(cells))
            if dev.startswith("NIC"):
                links = len(cells)
            cols = [f"GPU{j}" if j < num_gpus else f"NIC{j - num_gpus}" if sure else f"column{j}" for j in range(links)]
            self._row(lineno, dev, cols + [b for _, b in _MULTI], cells)
        self.warnings.append(Message(N_("line %(line)s: topology rows without their header: columns named by position (GPUs, "
                                        "then NICs, then CPU / NUMA affinity)") if sure else N_("line %(line)s: topology rows "
                                        "without their header: columns named by position (GPUs, then NICs, then CPU / NUMA "
                                        "affinity); past the GPUs seen, by number"), line=rows[0][0]))
        self._headless = []


_Q_KEY = re.compile(r"[A-Za-z][\w /()\-.,%+]*? :")  # a key is words (a log line with ' : ' inside is no key)
# top-level -q keys that are also environment facts under our names (a new one is one row)
_Q_ENV_KEYS = {"Driver Version": "driver_version", "Attached GPUs": "num_gpus"}


class SmiQParser(LineParser):
    kind = "nvidia_smi_q"
    # its banner, a GPU section or a 'Key    : value' line (the key padded to a column) opens a block
    gate = (re.compile(r"=+NVSMI LOG=+$|GPU [0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d$|[A-Z][\w /()\-.]*?\s{2,}: "),)
    busy = property(lambda self: self._active)
    _active = False
    _gpu: str | None = None  # the GPU section (bus id) and the section inside it the lines are in
    _section: str | None = None
    _section_indent = -1

    def __init__(self, source: str, indents: dict[int, int] | None = None) -> None:
        super().__init__(source)
        self._indents = indents or {}  # lineno -> leading spaces (the normaliser strips them)

    def feed(self, lineno: int, body: str, ts, rank) -> bool:
        self._active = self._read(lineno, body)
        return self._active

    def _read(self, lineno: int, body: str) -> bool:
        indent = self._indents.get(lineno, 0)
        if self._section and indent <= self._section_indent:
            self._section = None
        if re.fullmatch(r"=+NVSMI LOG=+", body):
            return True
        m = re.match(r"GPU (?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)$", body)
        if m:
            self._gpu = m.group("bus")
            self._section = None
            return True
        if (" : " in body or body.endswith(" :")) and _Q_KEY.match(body):
            key, _, value = body.partition(" :")
            key, value = key.strip(), value.strip()
            full = ".".join(x for x in ("nvsmi", self._gpu and f"gpu[{self._gpu}]", self._section, key) if x)
            self.env(lineno, full, value, record="nvsmi")
            if not self._section and not self._gpu and key in _Q_ENV_KEYS and value:
                self.env(lineno, _Q_ENV_KEYS[key], value, record="nvsmi")
            return True
        if re.fullmatch(r"[A-Z][\w /()\-]*", body):
            self._section, self._section_indent = body, indent
            return True
        return False


def parse_nvidia_smi_topo(text, *, source: str) -> ParseResult:
    """Parse ``nvidia-smi topo -m`` output (see module doc). Pure; never raises on content."""
    return run_parsers(text, [TopoParser(source), FailureScanner(source)], kind="nvidia_smi_topo")


def parse_nvidia_smi_q(text, *, source: str, others: tuple[LineParser, ...] = ()) -> ParseResult:
    """Parse ``nvidia-smi -q`` output (see module doc), its tree read with its indentation; ``others``:
    the parsers offered the lines that are not the report's (another process's log interleaved with
    it). Pure; never raises on content."""
    blocks = None
    if not isinstance(text, str):
        blocks = text
        text = "\n".join(text)  # nesting is by indentation, which the normaliser strips; -q output is small
    indents = {i: len(line) - len(line.lstrip(" ")) for i, line in enumerate(text.split("\n"), start=1)}
    whole = TextBlocks([text])
    whole.ends_cut = getattr(blocks, "ends_cut", False)  # (a file that ends inside a line: its reader said so)
    return run_parsers(whole, [SmiQParser(source, indents), *others], kind="nvidia_smi_q")
