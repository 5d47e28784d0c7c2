"""What a training script will need, read from its source before anything runs.

:func:`needs_checkpoint_dir`: the script calls ``rt.save_best(...)`` or ``rt.save()`` without a
path on the runtime ``aios.init()`` returned; both write under ``checkpoint.dir``, so without one
the run would fail only when it first saves (after an epoch). ``aios-run`` refuses such a launch
(exit 2, one line), and ``rt.setup`` raises the same for a script run without ``aios-run``.
A script that passes ``aios.init`` settings of its own (``defaults=``, ``config=``, ``overrides=``
or a section such as ``checkpoint={...}``) is trusted, and
so is a save under a condition about saving of the script's own (``if args.save_dir:``), under a
condition on a switch the user sets when launching (a module-level name read from the
environment or the command line: ``stop_after = int(os.environ.get("STOP_AFTER", "0"))``, then
``if stop_after and ...: rt.save()``: the run without that switch never saves) or in a ``try``.

Nothing here imports torch.
"""

from __future__ import annotations

import ast


def _init_call(node: ast.AST) -> bool:
    """``aios.init(...)`` or ``init(...)`` (imported from aios)."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (
        isinstance(f, ast.Attribute)
        and f.attr == "init"
        and isinstance(f.value, ast.Name)
        and f.value.id == "aios"
    ) or (isinstance(f, ast.Name) and f.id == "init")


def _launch_switches(tree: ast.Module) -> set[str]:
    """Module-level names whose value comes from the environment or the command line
    (``X = int(os.environ.get("X", "0"))``, ``X = os.getenv(...)``, ``X = sys.argv[2]``)."""
    out: set[str] = set()
    for node in tree.body:
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        text = ast.unparse(node.value)
        if not any(src in text for src in ("os.environ", "os.getenv", "getenv(", "sys.argv")):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        out.update(t.id for t in targets if isinstance(t, ast.Name))
    return out


def _unguarded(tree: ast.Module) -> list[ast.AST]:
    """Nodes not under a condition of the script's own about checkpoints (an ``if``/``elif``
    or conditional expression whose test names a checkpoint or a directory, e.g. ``if
    rt.config.checkpoint.dir: rt.save()``, or a switch set at launch, :func:`_launch_switches`)
    nor inside ``try`` (a save the script guards)."""
    out: list[ast.AST] = []
    switches = _launch_switches(tree)

    def about_saving(test: ast.AST) -> bool:
        text = ast.unparse(test).lower()
        if "checkpoint" in text or "dir" in text or "save" in text:
            return True
        return any(isinstance(n, ast.Name) and n.id in switches for n in ast.walk(test))

    def walk(node: ast.AST) -> None:
        out.append(node)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Try):
                continue
            if isinstance(child, (ast.If, ast.IfExp)) and about_saving(child.test):
                walk(child.test)  # a save in the test itself still counts
                continue
            walk(child)

    walk(tree)
    return out


def needs_checkpoint_dir(source: str) -> tuple[int, str] | None:
    """``(line, call)`` of the first save that needs ``checkpoint.dir``, or ``None`` (also for
    source that does not parse, or whose ``aios.init`` call passes settings of its own)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    runtimes: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _init_call(node.value):
            call = node.value
            assert isinstance(call, ast.Call)
            if call.args or call.keywords:
                # the script brings settings of its own (config, defaults, overrides or a
                # section such as checkpoint={...}): they may set the dir
                return None
            runtimes.update(t.id for t in node.targets if isinstance(t, ast.Name))
    if not runtimes:
        return None
    found: list[tuple[int, str]] = []
    for node in _unguarded(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner, attr = node.func.value, node.func.attr
        if not (isinstance(owner, ast.Name) and owner.id in runtimes):
            continue
        has_path = bool(node.args) or any(k.arg == "path" for k in node.keywords)
        if attr == "save_best" or (attr == "save" and not has_path):
            found.append((node.lineno, f"{owner.id}.{attr}()"))
    return min(found) if found else None
