"""What ``aios check`` reports: :class:`Finding` (file:line:col, code, severity, the aios
replacement in its message, the safe rewrite ``--fix`` applies) and the backends and strategies a
finding names.

Severities (``Finding.level``): ``error`` (breaks: raises, or silently changes what the script
trains), ``warning`` (runs, but not as the script asked: a statistic that reads 0), ``note``
(nothing breaks: code a CUDA guard makes dead elsewhere, a harmless torch warning, the aios form
of the script's own rank/mesh plumbing). ``aios check`` exits 1 only when an error remains.
"""

from __future__ import annotations

from dataclasses import dataclass

BACKENDS = ("cpu", "cuda", "xla", "tpu", "neuron")
NOT_CUDA = ("cpu", "xla", "tpu", "neuron")
NO_FP16 = ("xla", "tpu", "neuron")
NOT_XLA = (
    "cpu",
    "cuda",
    "tpu",
    "neuron",
)  # torch_xla APIs: only --backend xla (and Trn1's XLA runtime)
XLA_ONLY_BREAKS = ("xla", "neuron")  # what XLA devices cannot run (fused AdamW, device Generator)
SHARDED = ("fsdp", "tp", "hsdp")
LEVELS = ("error", "warning", "note")


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    col: int  # 1-based, in characters
    code: str
    message: str
    backends: tuple[str, ...]  # where the line breaks
    strategies: tuple[str, ...] = ()  # non-empty: breaks under these strategies, on any backend
    fix: str = ""  # a safe rewrite ``--fix`` applies ("" = none)
    # error: breaks there; warning: runs there but not as the script asked (precision, a
    # wasted option); note: nothing breaks (code a CUDA guard makes dead elsewhere, the aios form
    # of the script's own rank/mesh plumbing)
    level: str = "error"
    when: str = ""  # what happens, where ``strategies`` alone says too little

    def where(self) -> str:
        if self.level == "note":
            return "note"
        if self.when:
            return self.when
        if self.strategies:
            return "hangs or diverges under strategy=" + "|".join(self.strategies)
        verb = "breaks" if self.level == "error" else "silently differs"
        if set(self.backends) == set(BACKENDS):
            return f"{verb} on every backend"
        return f"{verb} on " + ", ".join(self.backends)

    def __str__(self) -> str:
        fix = " [--fix]" if self.fix else ""
        return (
            f"{self.path}:{self.line}:{self.col} {self.code} {self.message} ({self.where()}){fix}"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "path": self.path,
            "line": self.line,
            "col": self.col,
            "code": self.code,
            "message": self.message,
            "backends": list(self.backends),
            "strategies": list(self.strategies),
            "level": self.level,
            "fixable": bool(self.fix),
        }


class CheckError(Exception):
    """The input cannot be checked (unreadable, not Python): one line."""
