"""``aios check`` reads a project, not a file (issue 34): the script's own helper modules and the
configs it loads, ``os.environ`` writes as writes, libraries' launchers and device defaults as
data, and one finding per cause (a GradScaler, a loader's pin_memory: notes, named once)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from aios.check import LIBRARY_CALLS, check_config, check_file, check_project, check_source
from aios.cli.main import cli
from click.testing import CliRunner


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def _keys(found) -> set[tuple[str, int, str, str]]:
    return {(Path(f.path).name, f.line, f.code, f.level) for f in found}


def _by(src: str) -> dict[tuple[int, str], object]:
    return {(f.line, f.code): f for f in check_source(textwrap.dedent(src), "t.py")}


def test_environment_writes_of_the_launchers_world_are_errors_and_reads_written_back_are_not():
    by = _by(
        """\
        import os
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        os.environ["RANK"] = str(comm.rank)
        os.environ["WORLD_SIZE"] = str(comm.size)
        os.environ["MASTER_PORT"] = "29500"
        local_rank = int(os.environ["LOCAL_RANK"])
        os.environ["LOCAL_RANK"] = str(local_rank)
        if "RANK" not in os.environ:
            os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["OMP_NUM_THREADS"] = "1"
        """
    )
    for line in (4, 5, 6):
        f = by[(line, "AIOS210")]
        assert f.level == "error" and "overwriting what aios-run set" in f.message, str(f)
        assert (line, "AIOS206") not in by  # a write is not "reads RANK: this works"
    assert (7, "AIOS206") in by  # the read stays a note
    assert not {(8, "AIOS210"), (10, "AIOS210"), (11, "AIOS210")} & set(by)


def test_code_that_runs_only_without_a_launcher_is_not_judged():
    by = _by(
        """\
        import os, sys, torch
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            rank = int(os.environ["RANK"])
        elif "SLURM_PROCID" in os.environ:
            gpu = int(os.environ["SLURM_PROCID"]) % torch.cuda.device_count()
        elif torch.cuda.is_available():
            print("one GPU")
        else:
            sys.exit(1)
        """
    )
    assert set(by) == {(3, "AIOS206")}


def _project(tmp_path: Path) -> Path:
    _write(
        tmp_path,
        {
            "train.py": '''\
                """A script whose world lives in its helpers."""
                import argparse
                import torch
                import utils
                from helpers import dist_util

                p = argparse.ArgumentParser()
                p.add_argument("--world_size", default=1, type=int)
                p.add_argument("--config", default="configs/run.yaml")
                args = p.parse_args()
                utils.init(args)
                model = torch.nn.Linear(2, 2).to(dist_util.dev())
                if args.cuda:
                    model = dist_util.wrap(model)
                if utils.is_master(args):
                    utils.save_ckpt(model, "m.pt")
                ''',
            "utils.py": """\
                import os
                import torch

                def init(args):
                    args.rank = int(os.environ["RANK"])
                    args.world_size = int(os.environ["WORLD_SIZE"])

                def is_global(args):
                    return args.rank == 0

                def is_master(args, local=False):
                    return is_global(args) if not local else is_global(args)

                def save_ckpt(model, path):
                    torch.save(model.state_dict(), path)
                """,
            "helpers/__init__.py": "",
            "helpers/dist_util.py": """\
                import torch
                from torch.nn.parallel import DistributedDataParallel as DDP
                from . import other

                def dev():
                    if torch.cuda.is_available():
                        return torch.device("cuda")
                    return torch.device("cpu")

                def wrap(model):
                    return DDP(model)
                """,
            "helpers/other.py": "import torch\nfrom .. import top\nx = torch.zeros(1).cuda()\n",
            "top.py": "import torch\ny = torch.ones(1).cuda()\n",
            "configs/run.yaml": "lr: 0.1\ndevice: cuda  # the recipe's device\nseed: 1\n",
        },
    )
    return tmp_path / "train.py"


def test_the_scripts_own_modules_and_configs_are_read_with_what_they_define(tmp_path):
    script = _project(tmp_path)
    found = check_project(str(script))
    keys = _keys(found)
    # the device helper that falls back to the CPU, named once, in its file
    assert ("dist_util.py", 6, "AIOS106", "error") in keys
    assert not any(k[0] == "dist_util.py" and k[1] == 7 for k in keys)  # not again as a note
    # a module the helper imports relatively is read too
    assert ("other.py", 3, "AIOS102", "error") in keys
    assert ("top.py", 2, "AIOS102", "error") in keys  # from .. import top: the script's folder
    # DDP inside a helper, called only where the script found CUDA
    ddp = next(f for f in found if f.code == "AIOS208")
    assert Path(ddp.path).name == "train.py" and ddp.line == 14 and "dist_util.py:11" in ddp.message
    # a rank-0 save through the project's rank test and save helper
    save = next(f for f in found if f.code == "AIOS603")
    assert save.line == 16 and "utils.py:15" in save.message
    # the helper reads the launcher's WORLD_SIZE: --world_size 1 is no "copies never join"
    assert not any(f.code == "AIOS209" for f in found)
    # the config it loads asks for CUDA: named at the config's line
    assert ("run.yaml", 2, "AIOS101", "error") in keys
    # the single file alone knows none of it
    alone = {(f.line, f.code) for f in check_file(str(script))}
    assert not alone & {(14, "AIOS208"), (16, "AIOS603")}
    assert (8, "AIOS209") in alone


def test_cli_prints_a_shared_helpers_finding_once_and_exits_0_on_notes_only(tmp_path, monkeypatch):
    _project(tmp_path)
    (tmp_path / "eval.py").write_text("import utils\nfrom helpers import other\n")
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli, ["check", "train.py", "eval.py"])
    assert r.exit_code == 1
    lines = [ln for ln in r.stdout.splitlines() if " AIOS102 " in ln]
    # each helper's finding once, though both scripts import it
    assert sorted(ln.split(" ")[0] for ln in lines) == ["helpers/other.py:3:5", "top.py:2:5"]
    assert " in 2 file(s) and 5 file(s) they import or load" in r.stderr, r.stderr
    (tmp_path / "notes.py").write_text(
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "loader = DataLoader([1], pin_memory=True)\nscaler = torch.cuda.amp.GradScaler()\n"
    )
    r = CliRunner().invoke(cli, ["check", "notes.py"])
    assert r.exit_code == 0, r.stdout  # only notes: a torch warning differs, nothing breaks
    assert "(2 note(s))" in r.stderr


def test_a_grad_scaler_is_one_note_and_its_uses_are_no_findings():
    by = _by(
        """\
        import torch
        scaler = torch.cuda.amp.GradScaler()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
        """
    )
    assert set(by) == {(2, "AIOS302")} and by[(2, "AIOS302")].level == "note"


def test_device_ids_in_barrier_are_a_note_and_an_fsdp_rank_device_id_an_error():
    by = _by(
        """\
        import os
        import torch.distributed as dist
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        local_rank = int(os.environ["LOCAL_RANK"])
        dist.barrier(device_ids=[local_rank])
        model = FSDP(model, device_id=local_rank)
        """
    )
    assert by[(5, "AIOS202")].level == "note"
    assert by[(6, "AIOS202")].level == "error" and "cpu" in by[(6, "AIOS202")].backends


def test_compile_backend_from_the_environment_with_inductor_default_and_required_local_rank():
    by = _by(
        """\
        import os, argparse, torch
        model = torch.compile(model, backend=os.environ.get("COMPILE_BACKEND", "inductor"))
        p = argparse.ArgumentParser()
        p.add_argument("--local_rank", type=int, required=True)
        p.add_argument("--local-rank", type=int, default=0)
        """
    )
    assert by[(2, "AIOS413")].backends == ("xla", "tpu", "neuron")
    assert by[(4, "AIOS211")].level == "error"
    assert (5, "AIOS211") not in by


def test_fp16_the_user_turns_on_and_a_load_whose_kwargs_carry_map_location_are_no_findings():
    by = _by(
        """\
        import torch
        def load(path, **kwargs):
            return torch.load(path, **kwargs)
        if args.use_fp16:
            model.half()
        x = model.half()
        """
    )
    assert set(by) == {(6, "AIOS303")}


def test_a_tokenizer_saved_on_the_main_process_is_no_checkpoint_and_a_model_save_says_what_it_is():
    by = _by(
        """\
        import torch.distributed as dist
        from transformers import AutoModelForCausalLM, AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained("gpt2")
        net = AutoModelForCausalLM.from_pretrained("gpt2")
        if dist.get_rank() == 0:
            tokenizer.save_pretrained("out")
            net.save_pretrained("out")
        """
    )
    assert (6, "AIOS603") not in by
    assert "net.save_pretrained()" in by[(7, "AIOS603")].message
    assert "state_dict" not in by[(7, "AIOS603")].message.split(":")[0]


def test_libraries_launchers_and_device_defaults_are_judged_from_the_table():
    by = _by(
        """\
        from detectron2.engine import launch
        from detectron2.config import get_cfg
        from litgpt.utils import parse_devices
        from torchtune import training
        launch(main, 8, num_machines=1, args=(args,))
        cfg = get_cfg()
        devices = parse_devices("auto")
        stats = training.get_memory_stats(device=device)
        """
    )
    assert by[(5, "AIOS203")].level == "error"
    assert by[(6, "AIOS204")].level == "error"
    assert by[(7, "AIOS204")].level == "error"
    assert by[(8, "AIOS108")].level == "error" and "raises" in by[(8, "AIOS108")].message
    # a script that sets the device itself is not told the default
    ok = _by("from detectron2.config import get_cfg\ncfg = get_cfg()\n")
    assert (2, "AIOS204") in ok
    for spec in LIBRARY_CALLS.values():
        assert spec.source.startswith("https://") and spec.level in ("error", "warning", "note")


def test_detectron2_device_set_by_the_script_is_no_finding(tmp_path):
    (tmp_path / "t.py").write_text(
        "from detectron2.config import get_cfg\ncfg = get_cfg()\ncfg.MODEL.DEVICE = 'cpu'\n"
    )
    assert not any(f.code == "AIOS204" for f in check_project(str(tmp_path / "t.py")))


def test_lightning_left_to_count_its_devices_is_named_once():
    by = _by(
        """\
        import os
        import lightning as L
        import pytorch_lightning as pl
        a = pl.Trainer(max_epochs=1)
        b = L.Fabric(accelerator="auto", devices=-1)
        c = pl.Trainer(accelerator="gpu", devices=-1)
        d = pl.Trainer(devices=int(os.environ["LOCAL_WORLD_SIZE"]))
        e = L.Fabric(**settings)
        """
    )
    assert by[(4, "AIOS204")].level == "error" and "WORLD_SIZE" in by[(4, "AIOS204")].message
    assert (5, "AIOS204") in by
    assert (6, "AIOS204") not in by and (6, "AIOS101") in by  # one cause: the pinned GPU
    assert not {(7, "AIOS204"), (8, "AIOS204")} & set(by)


def test_a_device_only_package_is_named_once_and_a_gate_through_a_parameter_at_the_call():
    by = _by(
        """\
        import sys
        import apex
        from apex.optimizers import FusedAdam
        import torch

        def check(world_size):
            if world_size < 1:
                sys.exit("no GPU")

        n = torch.cuda.device_count()
        check(n)
        check(4)
        """
    )
    assert (2, "AIOS501") in by and (3, "AIOS501") not in by
    gate = by[(11, "AIOS118")]
    assert "t.py:7" in gate.message and "cpu" in gate.backends
    assert (7, "AIOS118") not in by and (12, "AIOS118") not in by


def test_every_code_the_checker_gives_is_in_the_readme_table():
    root = Path(__file__).resolve().parents[1]
    source = "".join(p.read_text() for p in (root / "src" / "aios" / "check").rglob("*.py"))
    readme = (root / "README.md").read_text()
    table = readme[readme.index("| code | finds | aios form named |") :]
    table = table[: table.index("\n\n")]
    documented = set(re.findall(r"AIOS\d{3}", table))
    for lo, hi in re.findall(r"`AIOS(\d{3})`-`(\d{3})`", table):  # ranges: AIOS106-109
        documented |= {f"AIOS{n}" for n in range(int(lo), int(hi) + 1)}
    assert set(re.findall(r'"(AIOS\d{3})"', source)) <= documented


def test_modules_on_folders_the_script_adds_to_sys_path_are_read(tmp_path):
    _write(
        tmp_path,
        {
            "scripts/train.py": """\
                import os
                import sys
                from pathlib import Path
                sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
                sys.path.append(str(Path(__file__).resolve().parent.parent / "lib"))
                import common
                import helpers
                """,
            "common.py": "import torch\nx = torch.zeros(1).cuda()\n",
            "lib/helpers.py": "import torch.distributed as dist\ndist.init_process_group('nccl')\n",
        },
    )
    keys = _keys(check_project(str(tmp_path / "scripts" / "train.py")))
    assert ("common.py", 2, "AIOS102", "error") in keys
    assert ("helpers.py", 2, "AIOS201", "error") in keys


def test_a_script_in_scripts_reads_the_repositorys_own_package_at_the_root(tmp_path):
    """OLMo's habit: ``scripts/train.py`` imports ``olmo.torch_util`` from the package at the
    repository root (installed editable): its helpers are the project's, read with the
    caller's values; a lone module up there is nobody's import."""
    _write(
        tmp_path,
        {
            "scripts/train.py": """\
                import torch
                from olmo.torch_util import peak_gpu_memory, get_local_rank
                from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
                import stray
                m = FSDP(torch.nn.Linear(2, 2), device_id=get_local_rank())
                print(peak_gpu_memory())
                """,
            "olmo/__init__.py": "",
            "olmo/torch_util.py": """\
                import os
                import torch
                def get_local_rank():
                    return int(os.environ.get("LOCAL_RANK") or 0)
                def peak_gpu_memory():
                    if not torch.cuda.is_available():
                        return None
                    peak = torch.cuda.max_memory_allocated()
                    torch.cuda.reset_max_memory_allocated()
                    return peak
                def on_cuda():
                    return torch.cuda.is_available() and torch.cuda.is_initialized()
                """,
            "stray.py": "import torch\nx = torch.zeros(1).cuda()\n",
        },
    )
    keys = _keys(check_project(str(tmp_path / "scripts" / "train.py")))
    assert ("train.py", 5, "AIOS202", "error") in keys  # a rank from the package's helper
    assert ("torch_util.py", 4, "AIOS206", "note") in keys
    # after the return when CUDA is absent: dead code elsewhere, notes
    assert ("torch_util.py", 8, "AIOS108", "note") in keys
    assert ("torch_util.py", 9, "AIOS108", "note") in keys
    assert not any(k[0] == "torch_util.py" and k[1] == 12 for k in keys)  # is_initialized()
    assert not any(k[0] == "stray.py" for k in keys)


def test_python_configs_a_config_loader_reads_from_the_command_line_are_scanned(tmp_path):
    """OpenMMLab's habit: ``Config.fromfile(args.config)`` loads a Python config from the
    command line; the configs/ folder at the repository root names nccl there. A YAML config
    the script names with ``dist_backend: nccl`` is the same fault."""
    _write(
        tmp_path,
        {
            "tools/train.py": """\
                import argparse
                from mmengine.config import Config
                p = argparse.ArgumentParser()
                p.add_argument("config")
                cfg = Config.fromfile(p.parse_args().config)
                """,
            "configs/_base_/default_runtime.py": """\
                env_cfg = dict(
                    cudnn_benchmark=False,
                    dist_cfg=dict(backend="nccl"),  # backend="gloo" for CPU
                )
                """,
            "configs/README.md": "backend: nccl\n",
            "plain/train.py": "import yaml\ncfg = yaml.safe_load(open('run.yaml'))\n",
            "plain/run.yaml": "dist_backend: nccl\nlr: 0.1\n",
            "other/train.py": "import torch\n",
            "other/configs/x.py": "dist_params = dict(backend='nccl')\n",
        },
    )
    keys = _keys(check_project(str(tmp_path / "tools" / "train.py")))
    assert keys == {("default_runtime.py", 3, "AIOS201", "error")}
    assert _keys(check_project(str(tmp_path / "plain" / "train.py"))) == {
        ("run.yaml", 1, "AIOS201", "error")
    }
    assert not check_project(str(tmp_path / "other" / "train.py"))  # no loader: not read


def test_a_package_the_project_imports_by_name_from_data_is_read_whole(tmp_path):
    """CompVis latent diffusion's habit: the model class is named in a YAML config
    (``target: ldm.models.diffusion.LatentDiffusion``) and imported with importlib by a helper
    of the script's own package: the package's other modules are the project's too."""
    files = {
        "main.py": "from ldm.util import instantiate_from_config\nm = instantiate_from_config(c)\n",
        "ldm/__init__.py": "",
        "ldm/util.py": """\
            import importlib
            def instantiate_from_config(config):
                module, cls = config["target"].rsplit(".", 1)
                return getattr(importlib.import_module(module), cls)()
            """,
        "ldm/models/__init__.py": "",
        "ldm/models/net.py": "import torch\nx = torch.zeros(1).cuda()\n",
    }
    _write(tmp_path / "dynamic", files)
    keys = _keys(check_project(str(tmp_path / "dynamic" / "main.py")))
    assert ("net.py", 2, "AIOS102", "error") in keys
    files["ldm/util.py"] = "def instantiate_from_config(config):\n    return None\n"
    _write(tmp_path / "static", files)  # nothing imported by name: only what is imported
    assert not any(
        k[0] == "net.py" for k in _keys(check_project(str(tmp_path / "static" / "main.py")))
    )


def test_a_cuda_device_a_caller_passes_into_the_scripts_function_is_named_at_the_call():
    by = _by(
        """\
        import torch

        def train(model, device, steps=1):
            x = torch.ones(2, device=device)
            return model.to(device)(x)

        def log(name):
            print(name)

        train(net, "cuda")
        train(net, device="cuda:0")
        log("cuda")
        train(net, "cpu")
        """
    )
    assert by[(10, "AIOS101")].level == "error" and "train()" in by[(10, "AIOS101")].message
    assert (11, "AIOS101") in by
    assert not {(12, "AIOS101"), (13, "AIOS101")} & set(by)


def test_aios_runs_hint_names_the_finding_in_a_helper_module_of_the_script(tmp_path):
    from aios.launcher.outcome import hint_from_stderr as _hint_from_stderr

    _write(
        tmp_path,
        {
            "train.py": "import utils\nutils.place()\n",
            "utils.py": "import torch\n\ndef place():\n    return torch.zeros(1).cuda()\n",
        },
    )
    script = tmp_path / "train.py"
    tb = (
        "Traceback (most recent call last):\n"
        f'  File "{script}", line 2, in <module>\n'
        f'  File "{tmp_path / "utils.py"}", line 4, in place\n'
        "AssertionError: Torch not compiled with CUDA enabled\n"
    )
    hint = _hint_from_stderr(str(script), tb)
    assert hint is not None and f"{tmp_path / 'utils.py'}:4:" in hint and "AIOS102" in hint


def test_a_recipe_deep_in_a_repository_reads_its_package_and_the_configs_beside_it(tmp_path):
    """icefall's habit: ``egs/<corpus>/ASR/<model>/train.py`` imports the repository's
    ``icefall`` package four folders up; dinov2's: a helper of the package loads its default
    YAML from ``Path(__file__).parent.parent / "configs"``, with fp16 parameters there. A
    ``MASTER_PORT`` written only when the environment lacks it is never written under aios-run;
    ``--world-size`` defaulting to 1 is a finding though a helper reads WORLD_SIZE, when the
    world size the script uses is not that one."""
    _write(
        tmp_path,
        {
            "egs/libri/ASR/conformer/train.py": """\
                import argparse
                from icefall.dist import setup_dist
                from pkg.util.config import load
                p = argparse.ArgumentParser()
                p.add_argument("--world-size", type=int, default=1)
                args = p.parse_args()
                world_size = args.world_size
                setup_dist(0, world_size)
                cfg = load()
                """,
            "icefall/__init__.py": "",
            "icefall/dist.py": """\
                import os
                import torch.distributed as dist
                def setup_dist(rank, world_size):
                    if "MASTER_PORT" not in os.environ:
                        os.environ["MASTER_PORT"] = "12354"
                    dist.init_process_group("nccl", rank=rank, world_size=world_size)
                def get_world_size():
                    return int(os.environ["WORLD_SIZE"])
                """,
            "egs/libri/ASR/conformer/pkg/__init__.py": "",
            "egs/libri/ASR/conformer/pkg/util/__init__.py": "",
            "egs/libri/ASR/conformer/pkg/util/config.py": """\
                import pathlib
                import yaml
                DEFAULT = pathlib.Path(__file__).parent.parent / "configs" / "default.yaml"
                def load():
                    return yaml.safe_load(DEFAULT.read_text())
                """,
            "egs/libri/ASR/conformer/pkg/configs/default.yaml": """\
                student:
                  param_dtype: fp16
                  reduce_dtype: fp16
                teacher:
                  param_dtype: bf16
                """,
        },
    )
    keys = _keys(check_project(str(tmp_path / "egs/libri/ASR/conformer/train.py")))
    assert keys == {
        ("train.py", 5, "AIOS209", "error"),
        ("dist.py", 6, "AIOS201", "error"),
        ("dist.py", 8, "AIOS206", "note"),
        ("default.yaml", 2, "AIOS303", "error"),
    }
    # the world size taken from the helper that reads the launcher's: the copies join
    train = tmp_path / "egs/libri/ASR/conformer/train.py"
    train.write_text(
        train.read_text().replace(
            "world_size = args.world_size",
            "from icefall.dist import get_world_size\nworld_size = get_world_size()",
        )
    )
    assert "AIOS209" not in {k[2] for k in _keys(check_project(str(train)))}


def test_a_configs_fp16_training_dtype_is_named_and_a_checkpoints_dtype_is_not(tmp_path):
    """``mixed_precision: fp16`` (Accelerate), ``precision: 16`` (Lightning) and a parameter
    dtype are what the run trains in; a model's saved ``"torch_dtype": "float16"`` is not."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("mixed_precision: fp16\ntrainer:\n  precision: 16\n  param_dtype: bf16\n")
    assert [(f.line, f.code) for f in check_config(str(cfg))] == [(1, "AIOS303"), (3, "AIOS303")]
    model = tmp_path / "config.json"
    model.write_text('{\n  "torch_dtype": "float16",\n  "hidden_size": 64\n}\n')
    assert check_config(str(model)) == []


def test_a_detection_trainers_helpers_are_judged_by_what_they_do(tmp_path):
    """Habits of YOLO-style trainers (issue 34, fourth round): a rank-0-first context manager
    with paired barriers, saves under ``RANK in {-1, 0}``, a half-precision EMA copy saved, a GPU
    count kept at least 1 for workers, a device choice through a ``cuda`` variable, an autocast
    helper whose device defaults to CUDA, and ``--local_rank`` defaulting to -1."""
    _write(
        tmp_path,
        {
            "utils/__init__.py": "",
            "utils/torch_utils.py": """\
                import os
                from contextlib import contextmanager
                import torch
                import torch.distributed as dist

                @contextmanager
                def zero_first(local_rank):
                    if local_rank not in {-1, 0}:
                        dist.barrier()
                    yield
                    if local_rank == 0:
                        dist.barrier()

                def select_device(device=""):
                    cuda = device != "cpu" and torch.cuda.is_available()
                    return torch.device("cuda:0" if cuda else "cpu")

                def amp(enabled, device="cuda"):
                    return torch.amp.autocast(device, enabled=enabled)

                def workers(n):
                    nd = torch.cuda.device_count()
                    return min((os.cpu_count() or 1) // max(nd, 1), n)
                """,
            "train.py": """\
                import argparse
                import os
                from copy import deepcopy
                import torch
                import torch.distributed as dist
                from utils.torch_utils import amp, select_device, workers, zero_first

                RANK = int(os.getenv("RANK", -1))

                def train(opt, model, device):
                    with zero_first(RANK):
                        data = workers(8)
                    with amp(True):
                        loss = model(data)
                    if RANK in {-1, 0}:
                        torch.save({"ema": deepcopy(model).half()}, "last.pt")

                if __name__ == "__main__":
                    p = argparse.ArgumentParser()
                    p.add_argument("--local_rank", type=int, default=-1)
                    opt = p.parse_args()
                    device = select_device()
                    if opt.local_rank != -1:
                        dist.init_process_group(backend="gloo", init_method="env://")
                    train(opt, None, device)
                """,
        },
    )
    found = _keys(check_project(str(tmp_path / "train.py")))
    assert ("torch_utils.py", 15, "AIOS106", "error") in found  # cuda = ... is_available()
    assert ("torch_utils.py", 19, "AIOS301", "error") in found  # the helper's "cuda" default
    assert ("train.py", 20, "AIOS209", "error") in found  # --local_rank -1, group behind it
    codes = {(name, code) for name, _, code, _ in found}
    assert ("torch_utils.py", "AIOS602") not in codes  # paired barriers: every rank reaches one
    assert ("torch_utils.py", "AIOS101") not in codes  # the choice is named at its test
    assert ("torch_utils.py", "AIOS105") not in codes  # max(nd, 1): workers per GPU
    assert ("train.py", "AIOS605") not in codes  # saved under RANK in {-1, 0}
    assert ("train.py", "AIOS303") not in codes  # a deepcopy cast for the checkpoint


def test_an_llm_trainers_helpers_are_judged_by_what_they_do(tmp_path):
    """Habits of LLM pretraining codebases: a backend from the helper's own default, shard
    files named by rank written by every rank, CUDA memory statistics looked up by key."""
    _write(
        tmp_path,
        {
            "dist_utils.py": """\
                import torch.distributed as dist

                def init_distributed(backend="nccl"):
                    dist.init_process_group(backend)
                """,
            "train.py": """\
                import torch
                import torch.distributed as dist
                from dist_utils import init_distributed

                init_distributed()
                rank = dist.get_rank()
                model = torch.nn.Linear(2, 2)
                torch.save(model.state_dict(), f"model_rank{rank}.pt")
                stats = torch.cuda.memory_stats()
                print(stats["active_bytes.all.peak"])
                """,
        },
    )
    found = _keys(check_project(str(tmp_path / "train.py")))
    assert ("dist_utils.py", 4, "AIOS201", "error") in found
    assert ("train.py", 9, "AIOS108", "error") in found  # empty without CUDA: KeyError
    assert not {k for k in found if k[2] == "AIOS605"}  # a file of its own per rank
