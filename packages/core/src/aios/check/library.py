"""Library knowledge as data, kept with the rules: what torch.cuda, torch_xla and widely used
training libraries' helpers do when a script runs under aios-run on another backend, and the
aios form that replaces each."""

from __future__ import annotations

import re
from dataclasses import dataclass

from aios.check.findings import BACKENDS, NOT_CUDA

RT_DEVICE = "use rt.device (aios.init() picks each rank's device for the backend aios-run selects)"
CUDA_CALLS: dict[str, tuple[str, str, str]] = {
    # name -> (code, replacement, fix kind)
    "set_device": ("AIOS103", "remove it: aios-run gives each rank its device; use rt.device", ""),
    "current_device": ("AIOS103", RT_DEVICE, ""),
    "device": ("AIOS103", RT_DEVICE, ""),
    "synchronize": (
        "AIOS104",
        "torch.accelerator.synchronize() when torch.accelerator.is_available() (every native "
        "device); rt.step(opt) already cuts the XLA graph",
        "guard",
    ),
    "empty_cache": (
        "AIOS104",
        "torch.accelerator.empty_cache() when torch.accelerator.is_available()",
        "guard",
    ),
    "device_count": (
        "AIOS105",
        "rt.world_size for process counts (torch.accelerator.device_count() is 0 on CPU and "
        "under torch_xla, so it cannot divide a rank)",
        "rename",
    ),
    "is_available": ("AIOS106", "rt.device", ""),
    "manual_seed": (
        "AIOS107",
        "rt.seed_everything(seed) or config seed=N (every device's RNG)",
        "",
    ),
    "manual_seed_all": ("AIOS107", "rt.seed_everything(seed) or config seed=N", ""),
    "is_bf16_supported": (
        "AIOS106",
        "precision=bf16-mixed (aios refuses bf16 where the device has none, in one line)",
        "",
    ),
}
MEMORY_CALLS = {
    "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
    "reset_peak_memory_stats", "memory_stats", "mem_get_info", "get_device_name",
    "get_device_properties", "get_device_capability", "reset_max_memory_allocated",
    "reset_max_memory_cached", "reset_accumulated_memory_stats",
}  # fmt: skip
# torch.cuda queries that answer False without CUDA (nothing raises): no finding of their own
CUDA_QUERIES = {"is_initialized", "is_current_stream_capturing"}
# torch.cuda calls that do nothing (no error) without CUDA
NOOP_ELSEWHERE = {"empty_cache", "manual_seed", "manual_seed_all"}
# torch.cuda statistics that return 0 (or {}) without CUDA rather than raise
ZERO_ELSEWHERE = {
    "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
    "memory_stats",
}  # fmt: skip
ACCEL_MEMORY = {
    n: f"torch.accelerator.{n}() when torch.accelerator.is_available()"
    for n in (
        "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
        "reset_peak_memory_stats", "memory_stats", "get_device_capability",
    )
}  # fmt: skip
ACCEL_MEMORY["mem_get_info"] = "torch.accelerator.get_memory_info() when available"

XLA_REPLACEMENTS: dict[str, tuple[str, str]] = {
    # last name -> (code, replacement)
    "xla_device": ("AIOS406", "rt.device"),
    "device": ("AIOS406", "rt.device"),
    "mark_step": ("AIOS404", "rt.step(opt) (reduces, steps and cuts the graph once per step)"),
    "sync": ("AIOS404", "rt.step(opt) (reduces, steps and cuts the graph once per step)"),
    "optimizer_step": ("AIOS404", "rt.step(opt)"),
    "reduce_gradients": ("AIOS404", "rt.step(opt)"),
    "spawn": (
        "AIOS403",
        "`aios-run --backend xla --nprocs N` (it starts the processes; call the function once)",
    ),
    "launch": (
        "AIOS403",
        "`aios-run --backend xla --nprocs N` (it starts the processes; call the function once)",
    ),
    "MpDeviceLoader": ("AIOS405", "rt.setup(loader) (shards by rank, background device transfer)"),
    "ParallelLoader": ("AIOS405", "rt.setup(loader) (shards by rank, background device transfer)"),
    "get_ordinal": ("AIOS407", "rt.rank"),
    "global_ordinal": ("AIOS407", "rt.rank"),
    "get_local_ordinal": ("AIOS407", "rt.local_rank"),
    "local_ordinal": ("AIOS407", "rt.local_rank"),
    "xrt_world_size": ("AIOS407", "rt.world_size"),
    "world_size": ("AIOS407", "rt.world_size"),
    "is_master_ordinal": ("AIOS407", "rt.is_main"),
    "master_print": ("AIOS408", "rt.print(...)"),
    "rendezvous": ("AIOS408", "rt.barrier()"),
    "all_reduce": ("AIOS408", "rt.all_reduce(x)"),
    "mesh_reduce": ("AIOS408", "rt.all_reduce(x)"),
    "all_gather": ("AIOS408", "rt.all_gather(t)"),
    "save": ("AIOS408", "rt.save() (every rank calls it; aios writes from the right ranks)"),
    "wait_device_ops": ("AIOS404", "rt.step(opt); nothing to wait for elsewhere"),
    "get_rng_state": ("AIOS407", "rt.rng_state() (checkpoints carry every rank's RNG)"),
    "set_rng_state": ("AIOS407", "rt.set_rng_state(state)"),
    "metrics_report": ("AIOS409", "the run record's diagnostics (compile counts per step)"),
}
# calls that start the XLA runtime: at module level they run before xmp.spawn's workers exist
XLA_RUNTIME_START = {
    "xla_device", "device", "get_ordinal", "global_ordinal", "get_local_ordinal", "local_ordinal",
    "xrt_world_size", "world_size", "is_master_ordinal", "devices", "xla_device_hw",
    "global_runtime_device_count", "addressable_device_count", "local_process_count",
}  # fmt: skip
DEVICE_PACKAGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "flash_attn": ("torch.nn.functional.scaled_dot_product_attention (every backend)", NOT_CUDA),
    "xformers": ("torch.nn.functional.scaled_dot_product_attention", NOT_CUDA),
    "bitsandbytes": ("torch.optim.AdamW (8-bit optimizers are CUDA kernels)", NOT_CUDA),
    "apex": (
        "torch.optim.AdamW and precision=bf16-mixed|fp16-mixed; rt.setup(model) for DDP",
        NOT_CUDA,
    ),
    "transformer_engine": ("precision=bf16-mixed (FP8 kernels are NVIDIA-only)", NOT_CUDA),
    "triton": ("torch.compile (generates kernels for each backend)", NOT_CUDA),
    "liger_kernel": ("plain torch ops (Triton kernels are GPU-only)", NOT_CUDA),
    "mamba_ssm": ("a plain-torch implementation (CUDA kernels)", NOT_CUDA),
    "cupy": ("torch tensor ops", NOT_CUDA),
    "pynvml": ("rt.summary() / the run record (device memory), aios devices", NOT_CUDA),
    "deepspeed": (
        "strategy=deepspeed (cuda, cpu) or strategy=fsdp (every native device)",
        ("xla", "tpu", "neuron"),
    ),
}
# Saves a training library makes collective (all ranks must call them): Lightning's
# ``Trainer.save_checkpoint`` (a barrier inside) and ``Fabric.save``; keyed by the receiver's
# last name as scripts spell it (``trainer``, ``self.fabric``)
COLLECTIVE_SAVES = {"trainer": "save_checkpoint", "fabric": "save"}
# Mechanisms that import the project's modules by a name held in data (a config's
# ``target: ldm.models.diffusion.LatentDiffusion``, a registry): where a module of the project
# uses one, the packages of its own that the script imports are read whole
DYNAMIC_IMPORTS = (
    "importlib.import_module", "hydra.utils.instantiate", "hydra.utils.get_class",
    "hydra.utils.get_method",
)  # fmt: skip
# A list of GPU indices (``--gpu_ids 0,1``): an item of it as a device is a CUDA index
GPU_LIST_NAMES = {"gpu_ids", "gpus", "gpu_list", "cuda_ids"}
RANK_ATTRS = {
    "rank",
    "local_rank",
    "global_rank",
    "process_index",
    "local_process_index",
    "node_rank",
    "gpu_id",  # the DDP tutorial's rank-as-GPU (`if self.gpu_id == 0:`)
}
RANK_CALLS = {
    "get_rank", "get_ordinal", "global_ordinal", "get_local_ordinal", "local_ordinal",
    "get_global_rank", "get_node_local_rank", "get_local_rank",
}  # fmt: skip
MAIN_FLAGS = {
    "master_process", "is_master", "is_main", "is_main_process", "is_global_zero",
    "is_rank_zero", "is_master_process", "main_process", "is_local_main_process",
    "is_local_main", "is_master_ordinal", "is_rank0", "rank0", "is_first_rank",
    "is_world_process_zero", "is_local_process_zero",
}  # fmt: skip
COLLECTIVES = {
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "broadcast",
    "broadcast_object_list", "barrier", "reduce", "reduce_scatter", "reduce_scatter_tensor",
    "gather", "gather_object", "scatter", "scatter_object_list", "all_to_all",
    "all_to_all_single", "monitored_barrier",
}  # fmt: skip
RT_COLLECTIVES = {"barrier", "all_reduce", "all_gather", "broadcast", "gather_object"}
RT_SAVES = {"save", "load", "resume"}
PG_DEVICE_BACKENDS = {"nccl", "xla", "tpu", "neuron", "hccl", "ucc"}
ENV_RANKS = {
    "RANK": "rt.rank", "WORLD_SIZE": "rt.world_size", "LOCAL_RANK": "rt.local_rank",
    "NODE_RANK": "rt.node_rank",
}  # fmt: skip
DEVICE_TOOLS = {"nvidia-smi", "nvcc", "nvidia-settings", "dcgmi", "nvtop", "rocm-smi"}
SHELL_CALLS = {
    "subprocess.run", "subprocess.call", "subprocess.check_call", "subprocess.check_output",
    "subprocess.Popen", "subprocess.getoutput", "subprocess.getstatusoutput", "os.system",
    "os.popen",
}  # fmt: skip
FP16_NAMES = ("fp16", "float16", "16", "16-mixed", "half")
EXITS = {"sys.exit", "exit", "quit", "os._exit", "os.abort"}
OWN_PARALLELISM = {
    "init_device_mesh": "builds its own device mesh: aios builds one for the selected backend "
    "and strategy (rt.mesh; mesh.tp=N for tensor parallel), or keep this one and hand rt.setup "
    "the model it parallelizes",
    "fully_shard": "shards the model itself: keep it and pass the sharded model to "
    "rt.setup(model) (aios keeps a model the script already parallelized), or leave sharding "
    "to strategy=fsdp",
    "FullyShardedDataParallel": "wraps the model in FSDP1: pass the model to rt.setup(model) with "
    "strategy=fsdp (FSDP2 on every native device)",
    "parallelize_module": "applies its own tensor-parallel plan: keep it on rt.mesh['tp'] and pass "
    "the model to rt.setup(model), or give the plan as tp_plan with strategy=tp",
    "DistributedModelParallel": "(TorchRec) shards the embedding tables over the ranks itself: "
    "keep it (its kernels are fbgemm's, CUDA and CPU) and train the dense part through it, or "
    "shard with rt.setup(model) and strategy=fsdp on other backends",
}
# Packages whose functions above are the script's own parallelism (torch's, TorchRec's).
OWN_PARALLELISM_PACKAGES = ("torch.distributed", "torchrec.distributed", "torchrec")
# What aios-run sets for every rank: a script that writes one of these overwrites it.
LAUNCHER_ENV = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
    "MASTER_ADDR", "MASTER_PORT",
}  # fmt: skip
CONFIG_SUFFIXES = (".yaml", ".yml", ".json", ".toml")
# Loaders of Python configs whose path comes from the command line (OpenMMLab's mmengine and
# mmcv ``Config.fromfile(args.config)``): the ``*.py`` under the project's ``configs/`` folder
# are what they load, read like the YAML a script names.
PY_CONFIG_LOADERS = ("Config.fromfile",)
PY_CONFIG_FOLDER = "configs"
# ``dist_cfg=dict(backend="nccl")`` / ``dist_params = dict(backend='nccl')`` / ``backend: nccl``
# / ``dist_backend: nccl`` in a config the script loads: the process group joins with NCCL
CONFIG_BACKEND = re.compile(r"""(?<![A-Za-z])(backend)["']?\s*[:=]\s*["']?(nccl)\b""")
# ``device: cuda`` / ``device = "cuda:0"`` / ``"accelerator": "gpu"`` in a config the script loads
# A config's parameter or compute dtype, or its training precision, set to fp16 (TPUs and
# Trainium have no fp16 training): ``param_dtype: fp16``, ``mixed_precision: fp16``,
# ``precision: 16``. A reduce or buffer dtype follows the parameters' and is not named again;
# a ``torch_dtype`` describes a saved checkpoint (a model's config.json), not the training.
CONFIG_FP16 = re.compile(
    r"""^\s*["']?((?:param_|compute_)?dtype|(?:mixed_)?precision)["']?\s*[:=]\s*"""
    r"""["']?(fp16|float16|half|16|16-mixed|fp16-mixed)["']?\s*,?\s*(#.*)?$"""
)
CONFIG_DEVICE = re.compile(
    r"""^\s*["']?(device|device_type|accelerator)["']?\s*[:=]\s*["']?(cuda(:\d+)?|gpu)["']?\s*,?"""
    r"""\s*(#.*)?$"""
)


@dataclass(frozen=True)
class LibraryCall:
    """What a widely used training library's helper does when the script runs under aios-run:
    kept as data beside the rules, so a call into a library is judged by what it does."""

    code: str
    level: str
    backends: tuple[str, ...]
    message: str
    source: str  # where the behaviour is documented (or the code that does it)


_D2_LAUNCH = LibraryCall(
    "AIOS203",
    "error",
    BACKENDS,
    "detectron2's launch(main, num_gpus, ...) starts num_gpus processes per machine itself "
    "(torch.multiprocessing): under aios-run --nprocs N each rank would start more, and with "
    "num_gpus=1 it runs main in-process with its own world; call main(args) once (aios-run starts "
    "one process per rank: rt.rank, rt.world_size)",
    "https://detectron2.readthedocs.io/en/latest/modules/engine.html#detectron2.engine.launch",
)
_TUNE_MEMORY = LibraryCall(
    "AIOS108",
    "error",
    NOT_CUDA,
    "torchtune's get_memory_stats(device) reads torch.cuda memory counters and raises ValueError "
    "for a CPU device: the run record has each rank's device memory; call it only when "
    'rt.backend == "cuda"',
    "https://pytorch.org/torchtune/stable/generated/torchtune.training.get_memory_stats.html",
)
LIBRARY_CALLS: dict[str, LibraryCall] = {
    "detectron2.engine.launch": _D2_LAUNCH,
    "detectron2.engine.launch.launch": _D2_LAUNCH,
    "detectron2.engine.defaults.launch": _D2_LAUNCH,
    "accelerate.notebook_launcher": LibraryCall(
        "AIOS203",
        "error",
        BACKENDS,
        "accelerate's notebook_launcher(fn, num_processes=...) starts its own processes: under "
        "aios-run each rank would start more; call fn() once",
        "https://huggingface.co/docs/accelerate/package_reference/launchers",
    ),
    "torch.distributed.launcher.api.elastic_launch": LibraryCall(
        "AIOS203",
        "error",
        BACKENDS,
        "elastic_launch(config, fn) starts its own worker processes: under aios-run each rank "
        "would start more; call fn() once",
        "https://pytorch.org/docs/stable/elastic/customization.html",
    ),
    "detectron2.config.get_cfg": LibraryCall(
        "AIOS204",
        "error",
        NOT_CUDA,
        'detectron2\'s get_cfg() defaults MODEL.DEVICE to "cuda" and the script never sets it: '
        "elsewhere the model is built on CUDA and fails; set cfg.MODEL.DEVICE = str(rt.device)",
        "https://detectron2.readthedocs.io/en/latest/modules/config.html#yaml-config-references",
    ),
    "litgpt.utils.parse_devices": LibraryCall(
        "AIOS204",
        "error",
        NOT_CUDA,
        'litgpt\'s parse_devices("auto") is torch.cuda.device_count() or 1: elsewhere one device, '
        "whatever aios-run --nprocs N started, so Fabric's world disagrees with the launcher's; "
        "pass devices=rt.world_size // rt.num_nodes (or let aios-run size the run)",
        "https://github.com/Lightning-AI/litgpt/blob/main/litgpt/utils.py (parse_devices)",
    ),
    "torchtune.training.get_memory_stats": _TUNE_MEMORY,
    "torchtune.training.memory.get_memory_stats": _TUNE_MEMORY,
    "torchtune.utils.get_memory_stats": _TUNE_MEMORY,
}


VERB_NAMES = re.compile(
    r"^(get|load|save|write|read|build|create|make|init|wrap|unwrap|setup|prepare|print|log|"
    r"export|copy|sync|update|train|evaluate|eval|test|configure|compile)_"
)
MODEL_NAME = re.compile(r"^(.*_)?(model|net)$")
CUDA_STR = re.compile(r"^cuda(:\d+)?$")
