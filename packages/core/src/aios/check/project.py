"""Reading a script's project: the modules of its own it imports (same folder, packages under
it, folders it adds to ``sys.path``), the configs it loads (YAML/JSON/TOML), and what they tell
each other (a helper reading the launcher's world, a config setting the device)."""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from aios.check.findings import NO_FP16, NOT_CUDA, CheckError, Finding
from aios.check.library import (
    CONFIG_BACKEND,
    CONFIG_DEVICE,
    CONFIG_FP16,
    CONFIG_SUFFIXES,
    DYNAMIC_IMPORTS,
    PY_CONFIG_FOLDER,
    PY_CONFIG_LOADERS,
)
from aios.check.names import _dotted, _relative_base, _str
from aios.check.reading import _Project


def parse(source: str, path: str) -> ast.Module:
    """The AST of ``source``; :class:`CheckError` (one line) when it is not Python."""
    try:
        return ast.parse(source, filename=path)
    except SyntaxError as exc:
        raise CheckError(f"{path}:{exc.lineno or 0}: syntax error: {exc.msg}") from None
    except ValueError as exc:  # null bytes
        raise CheckError(f"{path}: not Python source: {exc}") from None


def read_source(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CheckError(f"{path}: cannot read: {reason}") from None


MAX_PROJECT_FILES = 40  # modules followed from one script (and configs read)
# A script in a repository's ``scripts/`` or ``tools/`` folder imports the repository's own
# package from the root above it (installed editable, or run from the root): the package folders
# up to this many levels above the script's folder are the project's too (a recipe folder deep
# in a repository, ``egs/librispeech/ASR/conformer_ctc/train.py`` importing ``icefall``, is four).
REPO_ROOT_LEVELS = 4


def _module_file(root: str, dotted: str) -> str | None:
    """``root/a/b.py`` or ``root/a/b/__init__.py`` for ``a.b``, if it exists."""
    base = os.path.join(root, *dotted.split("."))
    for cand in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(cand):
            return cand
    return None


def _repository_package(folder: str, dotted: str) -> str | None:
    """``a.b`` found in a package ``a/`` (with ``__init__.py``) of a folder up to
    :data:`REPO_ROOT_LEVELS` above the script's ``folder``: the repository's own package
    (``scripts/train.py`` importing ``olmo.config`` from ``olmo/`` at the root). Only packages:
    a lone module up there is nobody's import."""
    top = dotted.partition(".")[0]
    for level in range(1, REPO_ROOT_LEVELS + 1):
        up = os.path.normpath(os.path.join(folder, *[os.pardir] * level))
        if os.path.isfile(os.path.join(up, top, "__init__.py")):
            return _module_file(up, dotted)
    return None


def _local_imports(nodes: list[ast.AST], package: str | None) -> Iterator[str]:
    """Dotted names a module imports, absolute or relative (``from . import x`` in ``gd``:
    ``gd.x``), each also as its parent (``from util.misc import f``: ``util.misc``, ``util``).
    Imports inside functions count too (a helper imported where it is used)."""
    for node in nodes:
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module if not node.level else _relative_base(node, package or "")
            if base is None:
                continue
            if base:
                yield base
            for a in node.names:
                if a.name != "*":
                    yield f"{base}.{a.name}" if base else a.name


@dataclass
class _Module:
    path: str
    name: str  # dotted, from the script's folder ("" for the script)
    package: str | None
    source: str
    tree: ast.Module
    nodes: list[ast.AST] = field(init=False, repr=False)  # ast.walk(tree), walked once

    def __post_init__(self) -> None:
        self.nodes = list(ast.walk(self.tree))


def _path_value(node: ast.AST, script: str) -> str | None:
    """The folder a ``sys.path`` entry names, where it is spelled from ``__file__`` and literals:
    ``os.path.join(os.path.dirname(__file__), "..")``, ``str(Path(__file__).parent / "src")``."""
    if isinstance(node, ast.Name) and node.id == "__file__":
        return script
    text = _str(node)
    if text is not None:
        return os.path.join(os.path.dirname(script) or ".", text)
    if isinstance(node, ast.Call):
        name = _dotted(node.func) or ""
        args = [_path_value(a, script) for a in node.args]
        if None in args:
            return None
        parts = [a for a in args if a is not None]
        if name.endswith(("dirname",)) and len(parts) == 1:
            return os.path.dirname(parts[0])
        if name.endswith(("abspath", "realpath", "normpath", "Path", "str", "resolve")):
            return parts[0] if len(parts) == 1 else None
        if name.endswith("join") and parts:
            return os.path.join(*parts)
        if isinstance(node.func, ast.Attribute) and node.func.attr == "resolve" and not parts:
            return _path_value(node.func.value, script)
    if isinstance(node, ast.Attribute) and node.attr == "parent":
        inner = _path_value(node.value, script)
        return os.path.dirname(inner) if inner is not None else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        left, right = _path_value(node.left, script), _str(node.right)
        return os.path.join(left, right) if left is not None and right is not None else None
    return None


def _sys_path_roots(nodes: list[ast.AST], script: str) -> list[str]:
    """Folders the script adds to ``sys.path`` (``sys.path.insert(0, ...)``, ``append``)."""
    roots = []
    for node in nodes:
        if (
            isinstance(node, ast.Call)
            and (_dotted(node.func) or "") in ("sys.path.insert", "sys.path.append")
            and node.args
        ):
            folder = _path_value(node.args[-1], script)
            if folder is not None and os.path.isdir(folder):
                roots.append(os.path.normpath(folder))
    return roots


def _project_modules(path: str, source: str, tree: ast.Module) -> list[_Module]:
    """The script and the modules of its own project it imports (same folder, packages under
    it, folders it adds to ``sys.path``), breadth first, at most MAX_PROJECT_FILES. Third-party
    imports are not files here."""
    root = os.path.dirname(path) or "."  # relative stays relative: paths print as given
    mods = [_Module(path, "", "", source, tree)]
    roots = [root, *_sys_path_roots(mods[0].nodes, path)]
    seen = {os.path.abspath(path)}
    i, whole = 0, False
    while i < len(mods) and len(mods) < MAX_PROJECT_FILES:
        mod = mods[i]
        i += 1
        for dotted in _local_imports(mod.nodes, mod.package):
            found = next((f for r in roots if (f := _module_file(r, dotted))), None)
            found = found or _repository_package(root, dotted)
            if found is None or os.path.abspath(found) in seen:
                continue
            seen.add(os.path.abspath(found))
            found = os.path.normpath(found)
            try:
                text = read_source(found)
                sub = ast.parse(text, filename=found)
            except (CheckError, SyntaxError, ValueError):
                continue  # not ours to judge: the script's import fails there anyway
            package = dotted if found.endswith("__init__.py") else dotted.rpartition(".")[0]
            mods.append(_Module(found, dotted, package, text, sub))
            if len(mods) >= MAX_PROJECT_FILES:
                break
        if i == len(mods) and not whole:
            whole = True
            _whole_packages(mods, seen)
    return mods


def _imports_dynamically(nodes: list[ast.AST]) -> bool:
    return any(
        isinstance(node, ast.Call) and (_dotted(node.func) or "").endswith(DYNAMIC_IMPORTS)
        for node in nodes
    )


def _whole_packages(mods: list[_Module], seen: set[str]) -> None:
    """Where a module of the project imports by a name held in data (``importlib``, Hydra's
    ``instantiate``), the rest of the packages it was read from are the project's too: each
    ``*.py`` of theirs not read yet is added (to MAX_PROJECT_FILES), for the walk to follow."""
    if not any(_imports_dynamically(m.nodes) for m in mods):
        return
    tops: dict[str, str] = {}
    for m in mods:
        if m.package:  # a module inside a package of the project: its top folder
            top = m.package.partition(".")[0]
            depth = m.name.count(".") + (1 if m.path.endswith("__init__.py") else 0)
            tops.setdefault(top, os.path.normpath(os.path.join(m.path, *[os.pardir] * depth)))
    for _top, folder in sorted(tops.items()):
        for dirpath, dirs, files in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
            for f in sorted(files):
                path = os.path.join(dirpath, f)
                if not f.endswith(".py") or os.path.abspath(path) in seen:
                    continue
                if len(mods) >= MAX_PROJECT_FILES:
                    return
                rel = os.path.relpath(path, os.path.dirname(folder))[: -len(".py")]
                dotted = rel.replace(os.sep, ".").removesuffix(".__init__")
                try:
                    text = read_source(path)
                    sub = ast.parse(text, filename=path)
                except (CheckError, SyntaxError, ValueError):
                    continue
                seen.add(os.path.abspath(path))
                package = dotted if f == "__init__.py" else dotted.rpartition(".")[0]
                mods.append(_Module(os.path.normpath(path), dotted, package, text, sub))


def _config_files(root: str, modules: list[_Module]) -> list[str]:
    """YAML/JSON/TOML files under the script's folder whose name a module of the project spells
    out (``--config configs/train.yaml``, ``os.path.join(here, "configs", "train.yaml")``)."""
    names = set()
    roots = [root]  # and the package a helper module naming a config sits in (its parent)
    for mod in modules:
        for node in mod.nodes:
            text = _str(node)
            if text and text.endswith(CONFIG_SUFFIXES) and len(text) < 300:
                names.add(os.path.basename(text))
                if mod.package:  # ``Path(__file__).parent.parent / "configs" / "x.yaml"``
                    roots.append(os.path.dirname(os.path.dirname(mod.path)) or ".")
    if not names:
        return []
    out: list[str] = []
    seen: set[str] = set()
    skip = {".git", "__pycache__", "node_modules", ".venv", "venv", "site-packages"}
    for top in dict.fromkeys(roots):
        for visited, (dirpath, dirs, files) in enumerate(os.walk(top)):
            if visited >= 500:  # a script in a big folder (a home directory): look no further
                break
            depth = os.path.relpath(dirpath, top).count(os.sep)
            dirs[:] = sorted(
                d for d in dirs if d not in skip and not d.startswith(".") and depth < 3
            )
            for f in sorted(files):
                path = os.path.join(dirpath, f)
                if f in names and os.path.abspath(path) not in seen:
                    seen.add(os.path.abspath(path))
                    out.append(path)
            if len(out) >= MAX_PROJECT_FILES:
                return out
    return out


def _python_configs(root: str, modules: list[_Module]) -> list[str]:
    """The ``*.py`` configs a ``Config.fromfile(args.config)`` loader of the project reads: those
    under a ``configs/`` folder beside the script or at the repository root above it (the path
    comes from the command line, so every one of them is a candidate)."""
    loads = any(
        isinstance(node, ast.Call) and (_dotted(node.func) or "").endswith(PY_CONFIG_LOADERS)
        for mod in modules
        for node in mod.nodes
    )
    if not loads:
        return []
    out: list[str] = []
    for level in range(REPO_ROOT_LEVELS + 1):
        folder = os.path.normpath(os.path.join(root, *[os.pardir] * level, PY_CONFIG_FOLDER))
        if not os.path.isdir(folder):
            continue
        for dirpath, dirs, files in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
            out.extend(os.path.join(dirpath, f) for f in sorted(files) if f.endswith(".py"))
            if len(out) >= MAX_PROJECT_FILES:
                return out[:MAX_PROJECT_FILES]
        break  # the nearest configs/ folder is the project's
    return out


def check_config(path: str) -> list[Finding]:
    """A config the script loads that asks for a CUDA device (``device: cuda``), NCCL, or fp16
    parameters or training (``param_dtype: fp16``): the recipe's device, backend and dtype come
    from there, so the line to change is there.

    Wrong: ``device: cuda`` / ``device = "cuda:0"`` / ``"accelerator": "gpu"`` /
    ``param_dtype: fp16`` / ``precision: 16``.
    Right: ``device: cpu`` where the script maps it through rt.device; no device key;
    ``param_dtype: bf16``; ``reduce_dtype: fp16`` (follows the parameters')."""
    try:
        text = read_source(path)
    except CheckError:
        return []
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        pg = CONFIG_BACKEND.search(line.split("#")[0])
        if pg:
            out.append(
                Finding(
                    path,
                    i,
                    pg.start(1) + 1,
                    "AIOS201",
                    "the script loads this config and its process-group backend is 'nccl' "
                    "(NVIDIA's): the group fails to form on cpu, xla, tpu and neuron; drop the "
                    "backend (aios.init() joins with the selected backend's own)",
                    NOT_CUDA,
                )
            )
        half = CONFIG_FP16.match(line)
        if half:
            out.append(
                Finding(
                    path,
                    i,
                    line.index(half.group(1)) + 1,
                    "AIOS303",
                    f"the script loads this config and its {half.group(1)} is "
                    f"{half.group(2)!r}: TPUs and Trainium have no fp16 training; use bf16 "
                    "(precision=bf16-mixed or bf16-true)",
                    NO_FP16,
                )
            )
        m = CONFIG_DEVICE.match(line)
        if m:
            out.append(
                Finding(
                    path,
                    i,
                    line.index(m.group(1)) + 1,
                    "AIOS101",
                    f"the script loads this config and its {m.group(1)} is {m.group(2)!r}: run "
                    "unchanged it asks for CUDA; set the device from rt.device (aios.init() picks "
                    "each rank's device for the backend aios-run selects)",
                    NOT_CUDA,
                )
            )
    return out


def _reads_world(node: ast.AST) -> bool:
    """``os.environ["WORLD_SIZE"]``, ``os.getenv("WORLD_SIZE")`` somewhere in ``node``."""
    names = environ = False
    for sub in ast.walk(node):
        names = names or _str(sub) == "WORLD_SIZE"
        environ = environ or isinstance(sub, ast.Attribute) and sub.attr in ("environ", "getenv")
    return names and environ


def _world_value(value: ast.AST, readers: set[str]) -> bool:
    """A world size the launcher set: read from the environment here, or returned by a
    function of the project that reads it (``args.rank, args.world_size = world_info()``)."""
    if _reads_world(value):
        return True
    return any(
        isinstance(sub, ast.Call) and (_dotted(sub.func) or "").rpartition(".")[2] in readers
        for sub in ast.walk(value)
    )


def project_facts(modules: list[_Module], configs: list[str]) -> _Project:
    """What the project's modules and configs say to every file of it."""
    project = _Project()
    readers = set()  # functions of the project that read WORLD_SIZE from the environment
    for mod in modules:
        for node in mod.nodes:
            if isinstance(node, ast.Attribute):
                if node.attr == "DEVICE" and isinstance(node.ctx, ast.Store):
                    project.config_device = True  # cfg.MODEL.DEVICE = ...
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _reads_world(node):
                readers.add(node.name)
    for mod in modules:
        for node in mod.nodes:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [_dotted(e) or "" for t in targets for e in getattr(t, "elts", [t])]
                if any("world" in n.rpartition(".")[2].lower() for n in names):
                    project.env_world |= _world_value(node.value, readers)
            elif isinstance(node, ast.keyword) and node.arg in ("world_size", "num_replicas"):
                project.env_world |= _world_value(node.value, readers)
    for c in configs:
        if re.search(r"^\s*DEVICE\s*:", read_source(c), re.M):
            project.config_device = True
    return project
