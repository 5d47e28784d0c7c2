"""The import contracts between the packages, read from the source (``ast``; nothing is imported).

The layers (issue 28):

* core (``aios``) imports no other first-party package;
* a backend (``aios_backend_*``) imports core and the backends it declares, never a cloud;
* a cloud plugin (``aios_cloud_*``) imports ``aios_cloud`` and core, no backend (chip facts a
  cloud needs come through core's plugin registry, not from a backend's modules);
* no package imports a distribution it does not declare in its ``pyproject.toml``
  (``dependencies`` or an extra), first-party or third-party;
* no import cycle among the modules of any package: neither among module-level imports (what
  runs when a module is imported) nor through the imports inside functions (a lazy import
  that closes a circle is still a circle: ``errors`` -> ``config`` -> ``plugins`` ->
  ``cli.main`` -> ``errors`` hid that way), nor through imports under ``TYPE_CHECKING`` (a
  type-only circle still ties its modules together).

Every import counts for the layers and the declarations (a function-level import is still a
dependency). An import edge goes to the most specific
module named (``from aios.checkpoint import store`` -> ``aios.checkpoint.store``;
``from aios.errors import AiosError`` -> ``aios.errors``), as import-linter's graph does.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ROOT / "packages"

#: distribution name (normalised) -> the top-level modules it provides, where they differ from
#: the name (the rest map ``a-b`` -> ``a_b``)
PROVIDES = {
    "pyyaml": {"yaml"},
    "nvidia-ml-py": {"pynvml"},
    "google-cloud-tpu": {"google.cloud.tpu", "google.cloud.tpu_v2", "google.cloud.tpu_v2alpha1"},
    "google-auth": {"google.auth", "google.oauth2"},
    "google-api-core": {"google.api_core"},
    "torch-xla": {"torch_xla"},
    "torch-neuronx": {"torch_neuronx"},
    "neuronx-distributed": {"neuronx_distributed"},
    "moto": {"moto"},
    "kubernetes-validate": {"kubernetes_validate"},
}

#: what a declared distribution brings by its own declared dependencies, so importing it is
#: covered by declaring the first (boto3 requires botocore; google-cloud-tpu requires
#: google-api-core and google-auth)
BRINGS = {
    "boto3": {"botocore"},
    "google-cloud-tpu": {"google-api-core", "google-auth"},
    "gcsfs": {"google-auth"},
    "torch-xla": {"torch"},
}


def _norm(dist: str) -> str:
    return re.split(r"[\s\[<>=!~;]", dist.strip(), maxsplit=1)[0].lower().replace("_", "-")


@dataclass
class Package:
    folder: str
    dist: str
    top: str  # the import name, e.g. aios_backend_xla
    src: Path
    declared: set[str] = field(default_factory=set)  # normalised distribution names
    #: top-level modules the platform provides (``[tool.aios] platform-modules``: a stack that is
    #: not installable from the public registry, e.g. the Neuron SDK)
    platform: set[str] = field(default_factory=set)

    @property
    def kind(self) -> str:
        if self.top == "aios":
            return "core"
        if self.top == "aios_cloud":
            return "cloud-base"
        return "backend" if self.top.startswith("aios_backend_") else "cloud"


def _packages() -> list[Package]:
    out = []
    for pyproject in sorted(PACKAGES.glob("*/pyproject.toml")):
        doc = tomllib.loads(pyproject.read_text())
        meta = doc["project"]
        platform = set(doc.get("tool", {}).get("aios", {}).get("platform-modules", []))
        (top,) = [p.name for p in (pyproject.parent / "src").iterdir() if p.is_dir()]
        declared = {_norm(d) for d in meta.get("dependencies", [])}
        for extra in meta.get("optional-dependencies", {}).values():
            declared |= {_norm(d) for d in extra}
        for d in list(declared):
            declared |= BRINGS.get(d, set())
        out.append(
            Package(
                pyproject.parent.name,
                _norm(meta["name"]),
                top,
                pyproject.parent / "src",
                declared,
                platform,
            )
        )
    return out


ALL = _packages()
BY_TOP = {p.top: p for p in ALL}


def _module_name(pkg: Package, path: Path) -> str:
    parts = list(path.relative_to(pkg.src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@dataclass
class Import:
    module: str  # the imported module, most specific
    line: int
    runtime: bool  # executed when the importing module is imported
    typing: bool = False  # under ``if TYPE_CHECKING:`` (never executed)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(
    tree: ast.Module, module: str, is_pkg: bool, known: set[str], tops: set[str] | None = None
) -> Iterator[Import]:
    tops = {p.top for p in ALL} if tops is None else tops

    def visit(node: ast.AST, runtime: bool, typing: bool = False) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield Import(alias.name, child.lineno, runtime, typing)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = module.split(".")
                    base = base[: len(base) - child.level + (1 if is_pkg else 0)]
                    prefix = ".".join(base + ([child.module] if child.module else []))
                else:
                    prefix = child.module or ""
                for alias in child.names:
                    sub = f"{prefix}.{alias.name}"
                    # a first-party name is a module only if such a file exists; a third-party
                    # one may be (``from google.cloud import tpu_v2``): the distribution check
                    # reads the most specific name it knows
                    first = prefix.split(".")[0] in tops
                    mod = sub if sub in known or not first else prefix
                    yield Import(mod, child.lineno, runtime, typing)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                yield from visit(child, False, typing)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    yield from visit(ast.Module(body=[stmt], type_ignores=[]), False, True)
                for stmt in child.orelse:
                    yield from visit(ast.Module(body=[stmt], type_ignores=[]), runtime, typing)
            else:
                yield from visit(child, runtime, typing)

    yield from visit(tree, True)


@dataclass
class Module:
    name: str
    path: Path
    imports: list[Import]


def _modules(pkg: Package) -> dict[str, Module]:
    files = sorted(pkg.src.rglob("*.py"))
    names = {_module_name(pkg, f): f for f in files}
    known = set(names)
    for other in ALL:  # so that `from aios import config` resolves to a module
        if other is not pkg:
            known |= {_module_name(other, f) for f in other.src.rglob("*.py")}
    out = {}
    for name, f in names.items():
        tree = ast.parse(f.read_text(), str(f))
        out[name] = Module(name, f, list(_imports(tree, name, f.name == "__init__.py", known)))
    return out


MODULES = {p.top: _modules(p) for p in ALL}
STDLIB = set(sys.stdlib_module_names) | {"__future__"}


def _where(pkg: Package, mod: Module, imp: Import) -> str:
    return f"{mod.path.relative_to(ROOT)}:{imp.line} imports {imp.module}"


def _first_party(name: str) -> Package | None:
    top = name.split(".")[0]
    return BY_TOP.get(top)


def _provider(name: str) -> str | None:
    """The distribution that provides the module ``name`` (normalised), for third-party ones."""
    for dist, mods in PROVIDES.items():
        if any(name == m or name.startswith(m + ".") for m in mods):
            return dist
    return name.split(".")[0].lower().replace("_", "-")


def _violations(pkg: Package, allowed: set[str]) -> list[str]:
    bad = []
    for mod in MODULES[pkg.top].values():
        for imp in mod.imports:
            other = _first_party(imp.module)
            if other is not None and other is not pkg and other.top not in allowed:
                bad.append(_where(pkg, mod, imp))
    return bad


@pytest.mark.parametrize("pkg", ALL, ids=lambda p: p.folder)
def test_layers(pkg: Package) -> None:
    if pkg.kind == "core":
        allowed: set[str] = set()
    elif pkg.kind == "backend":
        allowed = {"aios"} | {p.top for p in ALL if p.kind == "backend" and p.dist in pkg.declared}
    elif pkg.kind == "cloud-base":
        allowed = {"aios", "aios_cloud"}
    else:  # a cloud plugin: core, aios_cloud, and the backend whose accelerator facts it
        # plans with (TPU topologies, Trainium instance facts) when it declares that backend;
        # never another cloud plugin
        allowed = {"aios", "aios_cloud"} | {
            p.top for p in ALL if p.kind == "backend" and p.dist in pkg.declared
        }
    bad = _violations(pkg, allowed)
    assert not bad, (
        f"{pkg.folder} ({pkg.kind}) may import only {sorted(allowed) or 'no other aios package'}:\n"
        + "\n".join(bad)
    )


@pytest.mark.parametrize("pkg", ALL, ids=lambda p: p.folder)
def test_every_import_is_declared(pkg: Package) -> None:
    bad = []
    for mod in MODULES[pkg.top].values():
        for imp in mod.imports:
            top = imp.module.split(".")[0]
            if not top or top in STDLIB or top in pkg.platform:
                continue
            other = _first_party(imp.module)
            dist = other.dist if other is not None else _provider(imp.module)
            if other is pkg or dist in pkg.declared:
                continue
            bad.append(f"{_where(pkg, mod, imp)} (distribution {dist})")
    assert not bad, (
        f"{pkg.folder} imports distributions its pyproject.toml does not declare:\n"
        + "\n".join(bad)
    )


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def _assert_no_cycle(pkg: Package, counts: Callable[[Import], bool], what: str) -> None:
    mods = MODULES[pkg.top]
    graph = {
        name: {i.module for i in m.imports if counts(i) and i.module in mods and i.module != name}
        for name, m in mods.items()
    }
    cycles = _cycles(graph)
    lines = []
    for comp in cycles:
        edges = sorted(
            {
                f"    {mods[a].path.relative_to(ROOT)}:{i.line} -> {b}"
                + ("" if i.runtime else " (in a function)")
                for a in comp
                for i in mods[a].imports
                if counts(i) and (b := i.module) in comp and b != a
            }
        )
        lines.append(f"  cycle among {', '.join(comp)}:\n" + "\n".join(edges))
    assert not cycles, f"{pkg.folder} has {what} import cycles:\n" + "\n".join(lines)


@pytest.mark.parametrize("pkg", ALL, ids=lambda p: p.folder)
def test_no_module_level_import_cycle(pkg: Package) -> None:
    _assert_no_cycle(pkg, lambda i: i.runtime, "module-level")


@pytest.mark.parametrize("pkg", ALL, ids=lambda p: p.folder)
def test_no_import_cycle_through_lazy_imports(pkg: Package) -> None:
    _assert_no_cycle(pkg, lambda i: not i.typing, "lazy (function-level)")


@pytest.mark.parametrize("pkg", ALL, ids=lambda p: p.folder)
def test_no_import_cycle_type_only_ones_included(pkg: Package) -> None:
    """A circle closed only by imports under ``TYPE_CHECKING`` still ties its modules together
    (one cannot be read, moved or type-checked without the others); a Protocol declared on the
    lower side breaks it (``aios.environments.base.EnvironmentSource``)."""
    _assert_no_cycle(pkg, lambda i: True, "type-only")


def test_the_checker_sees_each_kind_of_violation(tmp_path: Path) -> None:
    """The checks above can fail: a cycle, a layer break and an undeclared import written into
    a scratch package are each found."""
    src = tmp_path / "aios_backend_demo"
    src.mkdir()
    (src / "__init__.py").write_text("")
    (src / "a.py").write_text("from aios_backend_demo import b\nimport aios_cloud\nimport nope\n")
    (src / "b.py").write_text(
        "from typing import TYPE_CHECKING\nfrom . import a\nif TYPE_CHECKING:\n"
        "    from aios_backend_demo import c\ndef f():\n    import aios_backend_demo.c\n"
    )
    (src / "c.py").write_text("from aios_backend_demo.b import x\n")
    (src / "d.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from aios_backend_demo import e\n"
    )
    (src / "e.py").write_text("import aios_backend_demo.d\n")
    pkg = Package("backend-demo", "aios-backend-demo", "aios_backend_demo", tmp_path, {"aios-core"})
    known = {
        "aios_backend_demo",
        "aios_backend_demo.a",
        "aios_backend_demo.b",
        "aios_backend_demo.c",
        "aios_backend_demo.d",
        "aios_backend_demo.e",
    }
    mods = {}
    for f in sorted(src.glob("*.py")):
        name = _module_name(pkg, f)
        tree = ast.parse(f.read_text())
        mods[name] = list(
            _imports(tree, name, f.name == "__init__.py", known, {"aios_backend_demo"})
        )
    graph = {
        n: {i.module for i in imps if i.runtime and i.module in known and i.module != n}
        for n, imps in mods.items()
    }
    # a <-> b is a cycle; b -> c only under TYPE_CHECKING or in a function: c -> b is no cycle
    # at module level, and one through the lazy import
    assert _cycles(graph) == [["aios_backend_demo.a", "aios_backend_demo.b"]]
    lazy = {
        n: {i.module for i in imps if not i.typing and i.module in known and i.module != n}
        for n, imps in mods.items()
    }
    assert _cycles(lazy) == [["aios_backend_demo.a", "aios_backend_demo.b", "aios_backend_demo.c"]]
    # d -> e only under TYPE_CHECKING, e -> d at module level: a type-only circle
    every = {
        n: {i.module for i in imps if i.module in known and i.module != n}
        for n, imps in mods.items()
    }
    assert _cycles(lazy) == _cycles(every)[:1]
    assert _cycles(every)[1:] == [["aios_backend_demo.d", "aios_backend_demo.e"]]
    a = mods["aios_backend_demo.a"]
    assert [i.module for i in a] == ["aios_backend_demo.b", "aios_cloud", "nope"]
    assert _first_party("aios_cloud") is BY_TOP["aios_cloud"]
    assert _provider("nope") not in pkg.declared
