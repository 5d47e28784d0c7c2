"""Every public hook is documented with its exact signature and has a test."""

from __future__ import annotations

import ast
import importlib.util


def _hookdoc(root):
    spec = importlib.util.spec_from_file_location("hookdoc", root / "scripts" / "hookdoc.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_hook_is_documented_with_its_exact_signature(root):
    hookdoc = _hookdoc(root)
    readme = (root / "packages" / "core" / "README.md").read_text()
    specs = hookdoc.hook_specs()
    assert len(specs) >= 12
    for name, sig, doc, _ in specs:
        assert f"def {sig}: ..." in readme, (
            f"{name}: signature in the core README is stale; run scripts/hookdoc.py packages/core/README.md"
        )
        assert ":param" in doc or ":return:" in doc, (
            f"{name}: docstring lacks :param:/:return: lines"
        )
        assert "versionadded" in doc, name
    block = readme[
        readme.index("<!-- HOOKS:START") : readme.index("<!-- HOOKS:END -->")
        + len("<!-- HOOKS:END -->")
    ]
    assert block == hookdoc.render(), (
        "core README hook reference is stale; run scripts/hookdoc.py packages/core/README.md"
    )


def test_every_hook_has_a_test(root):
    hookdoc = _hookdoc(root)
    tested: set[str] = set()
    files = list((root / "tests").glob("test_*.py")) + list(
        (root / "packages").glob("*/tests/test_*.py")
    )
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_hook_aios_"):
                body_src = ast.unparse(node)
                hook = node.name[len("test_hook_") :]
                # the test must actually exercise the hook by name (through the registry or pluggy)
                if hook in body_src or hook.removeprefix("aios_") in body_src:
                    tested.add(hook)
    missing = [name for name, *_ in hookdoc.hook_specs() if name not in tested]
    assert not missing, f"hooks without a test named test_hook_<hook>: {missing}"
