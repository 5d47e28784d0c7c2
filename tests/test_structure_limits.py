"""The house's limits, kept: no module over 800 lines and no function over 120 lines in any
package's ``src``, except those listed below with the reason each remains. A listed one that
has come under its limit must leave the list (the list only shrinks). And no import of the
project's own modules inside a function (it hides a module's dependencies; issue 33): a
dependency is imported at module level or handed in, and a plugin names what it must not load
at its entry as an :class:`aios.types.Lazy` target. The few that stay are declared in
:data:`FUNCTION_LOCAL_IMPORTS`, each with its reason; the set found must equal its keys, so the
list only shrinks. (Deferred imports of heavy third-party libraries are not counted.)"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULE_LINES = 800
FUNCTION_LINES = 120

#: modules over the limit, and why they remain (path relative to the repository root)
LARGE_MODULES: dict[str, str] = {
    "packages/cloud-gcp/src/aios_cloud_gcp/testing/__init__.py": "the Cloud TPU API stand-in: one class "
    "per service, each rule beside its documentation link",
    "packages/cloud-aws/src/aios_cloud_aws/testing/ec2proxy.py": "the EC2 rules moto lacks, in "
    "front of moto: one request handler per API action",
}

#: functions over the limit ("path:name"), and why they remain
LONG_FUNCTIONS: dict[str, str] = {}

#: why a plugin hook or component keeps its import inside the function (its entry module is
#: loaded by every ``aios`` command, ``aios --help`` included)
CONFIG_SECTIONS = (
    "aios_config_sections hands over pydantic models: imported at the plugin's entry they would "
    "load pydantic at `aios --help`"
)
ENV_INFO = "aios_env_info: the stack's version probes load for `aios env` only"
WATCHERS = (
    "aios_preemption_watchers: the watcher's module (a metadata-server HTTP client) loads at a "
    "run's setup, not with the plugin's entry at `aios --help`"
)
CHECKER = (
    "the checker (aios.check and its rules) loads when a script is checked: not at `aios check "
    "--help`, not with a plugin's entry, not in every launcher or rank"
)
LAZY_REEXPORT = (
    "the package's module __getattr__ (PEP 562): its re-exported names load on first use, so "
    "importing the package stays cheap (no pydantic, no torch)"
)

#: the imports of first-party modules (``aios``, ``aios_*``, relative ones) that stay inside
#: functions, as ``"path:function"`` (``Class.method``, ``outer.inner``), each with its reason
FUNCTION_LOCAL_IMPORTS: dict[str, str] = {
    "packages/backend-cuda/src/aios_backend_cuda/plugin.py:aios_config_sections": CONFIG_SECTIONS,
    "packages/backend-neuron/src/aios_backend_neuron/launch.py:script_notes": CHECKER,
    "packages/backend-neuron/src/aios_backend_neuron/plugin.py:aios_check_rules": CHECKER,
    "packages/backend-neuron/src/aios_backend_neuron/plugin.py:aios_config_sections": CONFIG_SECTIONS,
    "packages/backend-neuron/src/aios_backend_neuron/plugin.py:aios_env_info": ENV_INFO,
    "packages/backend-xla/src/aios_backend_xla/plugin.py:aios_config_sections": CONFIG_SECTIONS,
    "packages/backend-xla/src/aios_backend_xla/plugin.py:aios_env_info": ENV_INFO,
    "packages/cloud-aws/src/aios_cloud_aws/plugin.py:aios_config_sections": CONFIG_SECTIONS,
    "packages/cloud-aws/src/aios_cloud_aws/plugin.py:aios_doctor_checks": (
        "aios_doctor_checks: the boto3 session and the aws section's model load for `aios doctor` "
        "only, not with the plugin's entry at `aios --help`"
    ),
    "packages/cloud-aws/src/aios_cloud_aws/plugin.py:aios_preemption_watchers": WATCHERS,
    "packages/cloud-gcp/src/aios_cloud_gcp/plugin.py:aios_config_sections": CONFIG_SECTIONS,
    "packages/cloud-gcp/src/aios_cloud_gcp/plugin.py:aios_preemption_watchers": WATCHERS,
    "packages/cloud-k8s/src/aios_cloud_k8s/plugin.py:aios_config_sections": CONFIG_SECTIONS,
    "packages/cloud-slurm/src/aios_cloud_slurm/plugin.py:aios_config_sections": CONFIG_SECTIONS,
    "packages/cloud/src/aios_cloud/__init__.py:__getattr__": LAZY_REEXPORT,
    "packages/cloud/src/aios_cloud/plugin.py:aios_report_target": (
        "aios_report_target: the control plane (state store, ssh, registry) loads when "
        "`aios report` asks for a cluster, not with the plugin's entry at `aios --help`"
    ),
    "packages/core/src/aios/__init__.py:__getattr__": LAZY_REEXPORT,
    "packages/core/src/aios/cli/check.py:check": CHECKER,
    "packages/core/src/aios/launcher/outcome.py:hint_from_stderr": CHECKER,
    "packages/core/src/aios/plugins/builtin.py:aios_check_rules": CHECKER,
}


def _sources() -> list[Path]:
    return sorted(p for p in ROOT.glob("packages/*/src/**/*.py") if "__pycache__" not in p.parts)


def _measure() -> tuple[dict[str, int], dict[str, int]]:
    modules: dict[str, int] = {}
    functions: dict[str, int] = {}
    for path in _sources():
        text = path.read_text()
        rel = str(path.relative_to(ROOT))
        modules[rel] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno is not None
                key = f"{rel}:{node.name}"
                functions[key] = max(functions.get(key, 0), node.end_lineno - node.lineno + 1)
    return modules, functions


MODULES, FUNCTIONS = _measure()


def _first_party(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.ImportFrom):
        if node.level:
            return True
        names = [node.module or ""]
    else:
        names = [alias.name for alias in node.names]
    return any(n.split(".")[0] == "aios" or n.startswith("aios_") for n in names)


def _local_imports(tree: ast.AST, where: str = "", in_function: bool = False) -> set[str]:
    """The functions (``Outer.inner`` names) of ``tree`` that import a first-party module."""
    found: set[str] = set()
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            if in_function and _first_party(child):
                found.add(where)
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            inner = f"{where}.{child.name}" if where else child.name
            is_function = not isinstance(child, ast.ClassDef)
            found |= _local_imports(child, inner, in_function or is_function)
        else:
            found |= _local_imports(child, where, in_function)
    return found


def _function_local_imports() -> set[str]:
    found: set[str] = set()
    for path in _sources():
        rel = path.relative_to(ROOT)
        found |= {f"{rel}:{name}" for name in _local_imports(ast.parse(path.read_text()))}
    return found


LOCAL_IMPORTS = _function_local_imports()


def test_no_module_over_the_limit_unless_listed() -> None:
    over = {m: n for m, n in MODULES.items() if n > MODULE_LINES and m not in LARGE_MODULES}
    assert not over, f"modules over {MODULE_LINES} lines (split them): {over}"


def test_no_function_over_the_limit_unless_listed() -> None:
    over = {f: n for f, n in FUNCTIONS.items() if n > FUNCTION_LINES and f not in LONG_FUNCTIONS}
    assert not over, f"functions over {FUNCTION_LINES} lines (split them): {over}"


def test_the_lists_only_hold_what_is_still_over() -> None:
    stale = [m for m in LARGE_MODULES if MODULES.get(m, 0) <= MODULE_LINES]
    stale += [f for f in LONG_FUNCTIONS if FUNCTIONS.get(f, 0) <= FUNCTION_LINES]
    assert not stale, f"under the limit now (remove from the list): {stale}"
    assert all(reason.strip() for reason in (*LARGE_MODULES.values(), *LONG_FUNCTIONS.values()))


def test_no_function_imports_a_first_party_module_unless_declared() -> None:
    new = sorted(LOCAL_IMPORTS - set(FUNCTION_LOCAL_IMPORTS))
    assert not new, (
        "imports of aios modules inside functions (import at module level, hand the dependency "
        "in, or name it as an aios.types.Lazy target in a plugin's spec): " + ", ".join(new)
    )


def test_the_declared_function_local_imports_are_exact() -> None:
    """A declared one that no longer imports inside its function leaves the list (it only
    shrinks), and each says why it stays."""
    gone = sorted(set(FUNCTION_LOCAL_IMPORTS) - LOCAL_IMPORTS)
    assert not gone, f"no longer importing inside the function (remove from the list): {gone}"
    assert all(reason.strip() for reason in FUNCTION_LOCAL_IMPORTS.values())
