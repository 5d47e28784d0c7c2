"""``aios check``: what ties a training script to one accelerator, found statically.

Reads the script's AST (never imports or runs it; no torch), resolves what each name refers to
through the script's imports (``import torch_xla.core.xla_model as xm``, ``from torch.cuda.amp
import GradScaler``; a parameter or local of the same name shadows an import), follows the
modules of its own project it imports and the configs it loads, and reports each line that breaks
on some backend, or hangs or diverges under a sharded strategy, with the aios form that replaces
it. :func:`fix_source` applies the rewrites that are safe (LibCST, imported only there).

Codes, by family: ``AIOS1xx`` NVIDIA-only calls and device strings, ``AIOS2xx`` process groups and
wrappers named for one device, ``AIOS3xx`` precision (CUDA AMP, fp16), ``AIOS4xx`` torch_xla /
torch-neuronx APIs and what XLA cannot run, ``AIOS5xx`` device-only packages, ``AIOS6xx`` patterns
that hang or diverge under ``strategy=fsdp|tp|hsdp`` or write one file from every rank.

The parts: :mod:`~aios.check.findings` (``Finding``, severities, backends),
:mod:`~aios.check.library` (library knowledge as data), :mod:`~aios.check.names`,
:mod:`~aios.check.reading` and :mod:`~aios.check.callgraph` (name and value resolution, the
project's call graph), :mod:`~aios.check.rules` (the rules as registered classes, by family),
:mod:`~aios.check.walker` (one walk per file, each node to the rules that asked for it),
:mod:`~aios.check.project` (the script's own modules and configs), :mod:`~aios.check.runner`
and :mod:`~aios.check.fixes` (``--fix``). Plugins add rules through the ``aios_check_rules`` hook.

The command is :mod:`aios.cli.check`. Nothing here imports torch.
"""

from aios.check.findings import BACKENDS, LEVELS, NOT_CUDA, CheckError, Finding
from aios.check.fixes import fix_source
from aios.check.library import LIBRARY_CALLS, LibraryCall
from aios.check.project import check_config, read_source
from aios.check.rules import CORE_RULES
from aios.check.rules.base import CheckRule, Example
from aios.check.runner import (
    check_file,
    check_project,
    check_source,
    expand,
    for_backend,
    rules_from,
)

__all__ = [
    "BACKENDS",
    "CORE_RULES",
    "LEVELS",
    "LIBRARY_CALLS",
    "NOT_CUDA",
    "CheckError",
    "CheckRule",
    "Example",
    "Finding",
    "LibraryCall",
    "check_config",
    "check_file",
    "check_project",
    "check_source",
    "expand",
    "fix_source",
    "for_backend",
    "read_source",
    "rules_from",
]
