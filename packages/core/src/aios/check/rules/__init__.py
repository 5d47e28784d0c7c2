"""``aios check``'s own rules, by family, as registered classes: core contributes them through
its ``aios_check_rules`` hook like any plugin (:data:`CORE_RULES`, in the order the walker asks
them; on one line and code the first finding stands)."""

from __future__ import annotations

from aios.check.rules.base import CheckRule, Example
from aios.check.rules.devices import (
    CudaCalls,
    DeviceStrings,
    DeviceTools,
    DotCuda,
    GpuGate,
    PinMemory,
    TorchLoad,
)
from aios.check.rules.precision import (
    AcceleratorApi,
    CudaAutocast,
    Fp16,
    GradScalerNote,
    Lightning,
)
from aios.check.rules.processes import (
    ArgparseDefaults,
    DDPWrap,
    DeviceIds,
    HelperDDP,
    LauncherEnv,
    LibraryCalls,
    OwnParallelism,
    OwnSpawn,
    ProcessGroupBackend,
)
from aios.check.rules.sharded import DownloadEveryRank, EveryRankSaves, RankGuarded
from aios.check.rules.xla import (
    Compile,
    DevicePackages,
    XlaCalls,
    XlaCannotRun,
    XlaImports,
)

CORE_RULES: tuple[type[CheckRule], ...] = (
    CudaCalls,
    DotCuda,
    ProcessGroupBackend,
    DDPWrap,
    DeviceIds,
    LibraryCalls,
    HelperDDP,
    CudaAutocast,
    GradScalerNote,
    Fp16,
    DeviceStrings,
    Lightning,
    XlaCalls,
    XlaCannotRun,
    ArgparseDefaults,
    AcceleratorApi,
    OwnSpawn,
    TorchLoad,
    PinMemory,
    Compile,
    DeviceTools,
    DownloadEveryRank,
    OwnParallelism,
    LauncherEnv,
    EveryRankSaves,
    RankGuarded,
    GpuGate,
    XlaImports,
    DevicePackages,
)

__all__ = ["CORE_RULES", "CheckRule", "Example"]
