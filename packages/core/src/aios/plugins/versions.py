"""Compatible version sets of the accelerator stacks, in ONE place.

Every combination aios knows to work (or knows the vendor supports) is a :class:`VersionSet`:
the distributions it pins, by PEP 440-style specifiers, plus what a machine image ships. Cloud
setup installs from these sets, ``aios doctor`` reports against them, and every host checks
them before training starts (the TPU launcher on each host, the Neuron / CUDA workers at
start-up): a mismatch is ONE line naming the host, what is installed and what is expected.

Installed versions are read from package metadata (:mod:`importlib.metadata`), never by
importing: ``import torch_tpu`` without libtpu exits the process, ``import torch`` autoloads
TorchTPU (3-4 s), and a CLI must stay fast.

Public API (stable)::

    STACKS                                   # stack name -> tuple[VersionSet, ...]
    sets_for(stack) -> tuple[VersionSet, ...]
    installed(dist) -> str | None            # metadata only
    check(stack, host=None, versions=None) -> CheckResult
    require(stack, host=None, versions=None) -> VersionSet   # raises VersionMismatch (exit 2)
    python -m aios.plugins.versions STACK            # the per-host check: one line, exit 2 on mismatch

Stacks: ``torch_tpu`` (TorchTPU), ``torch_xla`` (PyTorch/XLA on TPU), ``neuron`` (TorchNeuron,
Trn2/Trn3), ``neuron-xla`` (torch-neuronx on torch_xla, Trn1, Neuron <= 2.29), ``cuda``.
"""

from __future__ import annotations

import re
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version

from aios.errors import ConfigError

__all__ = [
    "VersionSet",
    "CheckResult",
    "VersionMismatch",
    "STACKS",
    "sets_for",
    "installed",
    "check",
    "require",
    "satisfies",
    "parse_version",
]


class VersionMismatch(ConfigError):
    """Installed versions outside every known-good set of a stack (exit 2, one line)."""


# ------------------------------------------------------------------------------ specifiers


def parse_version(text: str) -> tuple[int, ...]:
    """The release numbers of ``text`` (``2.13.0+cpu`` -> (2, 13, 0); ``2.9.0.2.11.19912`` keeps
    all six). Pre/post/local parts are ignored: the sets pin releases."""
    head = re.split(r"[+\s]", text.strip(), maxsplit=1)[0]
    nums: list[int] = []
    for part in head.split("."):
        m = re.match(r"\d+", part)
        if not m:
            break
        nums.append(int(m.group()))
        if m.group() != part:  # 0rc1, 1.dev0: stop at the first non-numeric part
            break
    return tuple(nums)


def _cmp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = max(len(a), len(b))
    a, b = a + (0,) * (n - len(a)), b + (0,) * (n - len(b))
    return (a > b) - (a < b)


def satisfies(installed_version: str, spec: str) -> bool:
    """Whether ``installed_version`` meets ``spec`` (comma-separated ``>=``, ``<=``, ``>``, ``<``,
    ``==``, ``!=``, with ``==X.Y.*`` wildcards)."""
    v = parse_version(installed_version)
    for clause in (c.strip() for c in spec.split(",") if c.strip()):
        m = re.match(r"(>=|<=|==|!=|>|<|~=)\s*(.+)", clause)
        if not m:
            raise ValueError(f"bad version specifier {clause!r}")
        op, target = m.groups()
        if target.endswith(".*"):
            prefix = parse_version(target[:-2])
            same = v[: len(prefix)] == prefix
            if (op == "==" and not same) or (op == "!=" and same):
                return False
            continue
        t = parse_version(target)
        c = _cmp(v, t)
        ok = {
            ">=": c >= 0,
            "<=": c <= 0,
            ">": c > 0,
            "<": c < 0,
            "==": c == 0,
            "!=": c != 0,
            "~=": c >= 0 and v[: len(t) - 1] == t[:-1],
        }[op]
        if not ok:
            return False
    return True


# ------------------------------------------------------------------------------ the sets


@dataclass(frozen=True)
class VersionSet:
    """One compatible combination.

    :param stack: ``torch_tpu``, ``torch_xla``, ``neuron``, ``neuron-xla`` or ``cuda``.
    :param name: what people call it (``TorchTPU 0.2``, ``Neuron 2.33 TorchNeuron``).
    :param requires: distribution -> specifier; the first entry identifies the set (a host with
        that distribution in range is held to the others).
    :param install: the command that installs the set (pinned).
    :param image: what a machine image ships: TPU runtime version, DLAMI name, venv, SSM parameter.
    :param hardware: the devices the set supports (``v5e``, ``trn2`` ...); empty: any.
    :param note: one line shown by ``aios doctor`` (e.g. ``last release supporting Trn1``).
    """

    stack: str
    name: str
    requires: tuple[tuple[str, str], ...]
    install: str = ""
    image: Mapping[str, str] = field(default_factory=dict)
    hardware: tuple[str, ...] = ()
    note: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return self.requires[0]

    def spec_of(self, dist: str) -> str | None:
        return dict(self.requires).get(dist)


NEURON_INDEX = "https://pip.repos.neuron.amazonaws.com"
LIBTPU_INDEX = "https://storage.googleapis.com/libtpu-releases/index.html"

STACKS: dict[str, tuple[VersionSet, ...]] = {
    # TorchTPU: torch_tpu 0.2.0's own metadata (Requires-Dist torch>=2.11.0,<=2.15.0; libtpu>=0.0.50;
    # numpy>=2), wheels for cp311/cp312 x86_64 on the public registry.
    "torch_tpu": (
        VersionSet(
            "torch_tpu",
            "TorchTPU 0.2",
            (
                ("torch_tpu", "==0.2.*"),
                ("torch", ">=2.11,<=2.15"),
                ("libtpu", ">=0.0.50"),
                ("numpy", ">=2"),
            ),
            install="pip install torch==2.13.0 torch_tpu==0.2.0 'libtpu>=0.0.50'",
            image={
                "runtime_version": "v2-alpha-tpuv6e (v6e), v2-alpha-tpuv5-lite (v5e), v2-alpha-tpuv5 (v5p), "
                "tpu-ubuntu2204-base (v4)"
            },
            hardware=("v4", "v5e", "v5p", "v6e", "tpu7x"),
        ),
    ),
    # PyTorch/XLA: 2.9.0 (2025-11-17) is the last release; pinned to torch 2.9 and libtpu 0.0.21.
    "torch_xla": (
        VersionSet(
            "torch_xla",
            "PyTorch/XLA 2.9 (last release)",
            (("torch_xla", "==2.9.*"), ("torch", "==2.9.*"), ("libtpu", "==0.0.21")),
            install=f"pip install torch==2.9.0 'torch_xla[tpu]==2.9.0' -f {LIBTPU_INDEX}",
            image={
                "runtime_version": "v2-alpha-tpuv6e (v6e), v2-alpha-tpuv5-lite (v5e), v2-alpha-tpuv5 (v5p), "
                "tpu-ubuntu2204-base (v4)"
            },
            hardware=("v2", "v3", "v4", "v5e", "v5p", "v6e"),
            note="torch_xla is being replaced by TorchTPU (--backend tpu); 2.9 is its last release",
        ),
        VersionSet(
            "torch_xla",
            "PyTorch/XLA 2.8",
            (("torch_xla", "==2.8.*"), ("torch", "==2.8.*"), ("libtpu", "==0.0.17")),
            install=f"pip install torch==2.8.0 'torch_xla[tpu]==2.8.0' -f {LIBTPU_INDEX}",
            hardware=("v2", "v3", "v4", "v5e", "v5p", "v6e"),
        ),
    ),
    # TorchNeuron (native device "neuron"), Neuron 2.33, Trn2/Trn3 only.
    "neuron": (
        VersionSet(
            "neuron",
            "Neuron 2.33 TorchNeuron",
            (("torch-neuronx", "==2.14.*"), ("torch", "==2.14.*")),
            install=f"pip install --extra-index-url {NEURON_INDEX} torch==2.14.0 'torch-neuronx==2.14.*' neuronx-cc",
            image={
                "dlami": "Deep Learning AMI Neuron torch-neuronx 2.14.0 (Ubuntu 24.04)",
                "venv": "/opt/aws_neuronx_venv_torch_neuronx_2_14_0",
                "python": "/opt/aws_neuronx_venv_torch_neuronx_2_14_0/bin/python3",
                "os": "ubuntu-24.04",
                # The SSM parameter of this single-framework DLAMI was not found in the public docs
                # (checked 2026-11); aws resolves the image by name (DescribeImages, owner amazon,
                # newest), never through the multi-framework parameter, whose image has no
                # torch-neuronx venv since Neuron 2.32.
                "ami_name_filter": "Deep Learning AMI Neuron torch-neuronx 2.14.0 (Ubuntu 24.04)*",
                "ssm_parameter_base": "/aws/service/neuron/dlami/multi-framework/ubuntu-24.04/latest/image_id",
            },
            hardware=("trn2", "trn2u", "trn3"),
            note="TorchNeuron is a public beta (Neuron 2.33, 2026-10-19); Trn2/Trn3 only",
        ),
    ),
    # torch-neuronx on torch_xla: training supported through Neuron 2.29 (torch 2.9 the last);
    # Trn1 stays on it with Neuron <= 2.29 pinned. NxD Training/Core: legacy (maintenance).
    "neuron-xla": (
        VersionSet(
            "neuron-xla",
            "Neuron 2.29 torch-neuronx on XLA (last for Trn1 training)",
            (("torch-neuronx", ">=2.9,<2.10"), ("torch", "==2.9.*"), ("torch-xla", "==2.9.*")),
            install=f"pip install --extra-index-url {NEURON_INDEX} 'torch-neuronx==2.9.0.2.29.*' "
            "torch==2.9.0 torch-xla==2.9.0 'neuronx-cc==2.*'",
            image={
                "dlami": "Deep Learning AMI Neuron PyTorch 2.9 (Ubuntu 24.04), Neuron 2.29 release",
                "venv": "/opt/aws_neuronx_venv_pytorch_2_9",
                "python": "/opt/aws_neuronx_venv_pytorch_2_9/bin/python3",
                "os": "ubuntu-24.04",
                "ssm_parameter": "/aws/service/neuron/dlami/pytorch-2.9/ubuntu-24.04/latest/image_id",
                # PyTorch 2.9 Neuron DLAMIs were published through Neuron 2.31 only: aws resolves
                # the newest image of this name instead of trusting the "latest" parameter
                "ami_name_filter": "Deep Learning AMI Neuron PyTorch 2.9 (Ubuntu 24.04)*",
            },
            hardware=("trn1", "trn1n"),
            note="Neuron 2.30 ended PyTorch/XLA training; pin Neuron <= 2.29 on Trn1 (neuronx-distributed is legacy)",
        ),
    ),
    # CUDA: the torch build's CUDA version needs a driver at least this new (NVIDIA's minimum
    # driver table, Linux x86_64). ``nvidia-driver`` is read from nvidia-smi by the caller.
    "cuda": (
        VersionSet(
            "cuda",
            "torch cu130",
            (("torch", ">=2.9"), ("cuda-build", "==13.0.*"), ("nvidia-driver", ">=580")),
            install="pip install torch --index-url https://download.pytorch.org/whl/cu130",
        ),
        VersionSet(
            "cuda",
            "torch cu128",
            (("torch", ">=2.7"), ("cuda-build", "==12.8.*"), ("nvidia-driver", ">=570.26")),
            install="pip install torch --index-url https://download.pytorch.org/whl/cu128",
        ),
        VersionSet(
            "cuda",
            "torch cu126",
            (("torch", ">=2.6"), ("cuda-build", "==12.6.*"), ("nvidia-driver", ">=560.28")),
            install="pip install torch --index-url https://download.pytorch.org/whl/cu126",
        ),
    ),
}


def sets_for(stack: str) -> tuple[VersionSet, ...]:
    try:
        return STACKS[stack]
    except KeyError:
        raise ConfigError(
            f"unknown version stack '{stack}'", f"use one of: {', '.join(STACKS)}"
        ) from None


# ------------------------------------------------------------------------------ installed


def _norm(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def installed(dist: str) -> str | None:
    """The installed version of ``dist`` from its metadata (``-``/``_`` spellings both tried);
    ``cuda-build`` is the CUDA version of the installed torch wheel (its ``+cuXYZ`` local tag);
    None when absent."""
    if dist == "cuda-build":
        tv = installed("torch")
        m = re.search(r"\+cu(\d+)(\d)$", tv or "")
        return f"{m.group(1)}.{m.group(2)}" if m else None
    for name in dict.fromkeys((dist, dist.replace("-", "_"), dist.replace("_", "-"))):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


# ------------------------------------------------------------------------------ checking


@dataclass
class CheckResult:
    """The outcome of :func:`check`: the matching set, or the closest one and what differs."""

    stack: str
    host: str
    ok: bool
    matched: VersionSet | None
    closest: VersionSet | None
    found: dict[str, str | None]
    problems: list[str]

    def line(self) -> str:
        """One line: ``host: <what is wrong> (expected <set>)`` or ``host: <set> ok``."""
        if self.ok and self.matched is not None:
            have = ", ".join(
                f"{d} {self.found.get(d)}" for d, _ in self.matched.requires if self.found.get(d)
            )
            return f"{self.host}: {self.matched.name} ({have})"
        want = self.closest
        exp = (
            f"; expected {want.name}: " + ", ".join(f"{d}{s}" for d, s in want.requires)
            if want
            else ""
        )
        return f"{self.host}: {'; '.join(self.problems)}{exp}"

    def fix(self) -> str:
        return self.closest.install if self.closest and self.closest.install else ""


def _host() -> str:
    try:
        return socket.gethostname() or "localhost"
    except OSError:  # pragma: no cover
        return "localhost"


def check(
    stack: str,
    host: str | None = None,
    versions: Mapping[str, str | None] | None = None,
    lookup: Callable[[str], str | None] | None = None,
) -> CheckResult:
    """Check what is installed against ``stack``'s sets.

    ``versions`` overrides what metadata says for the given distributions (the driver version
    from nvidia-smi, a remote host's report, tests); other distributions are read with
    :func:`installed` (or ``lookup``). A set *applies* when its first distribution is installed
    within range; the host then passes when every other requirement holds. With none applying,
    the result names the first distribution of the newest set as missing or out of range.
    """
    sets = sets_for(stack)
    host = host or _host()
    given = dict(versions or {})
    get = lookup or installed
    found: dict[str, str | None] = {}

    def ver(d: str) -> str | None:
        if d not in found:
            found[d] = given[d] if d in given else get(d)
        return found[d]

    best: tuple[int, VersionSet, list[str]] | None = None
    for vs in sets:
        problems: list[str] = []
        for i, (dist, spec) in enumerate(vs.requires):
            v = ver(dist)
            if v is None:
                problems.append(f"{dist} is not installed (needs {spec})")
            elif not satisfies(v, spec):
                problems.append(
                    f"{dist} {v} is installed, {vs.name} needs {dist}{spec}"
                    if i
                    else f"{dist} {v} is not {vs.name} ({dist}{spec})"
                )
        if not problems:
            return CheckResult(stack, host, True, vs, vs, found, [])
        key_ok = ver(vs.key[0]) is not None and satisfies(ver(vs.key[0]) or "", vs.key[1])
        score = (2 if key_ok else 0) - len(problems)
        if best is None or score > best[0]:
            best = (score, vs, problems if key_ok else problems[:1])
    assert best is not None
    return CheckResult(stack, host, False, None, best[1], found, best[2])


def require(
    stack: str,
    host: str | None = None,
    versions: Mapping[str, str | None] | None = None,
    lookup: Callable[[str], str | None] | None = None,
) -> VersionSet:
    """:func:`check`, raising :class:`VersionMismatch` (one line naming the host) on a mismatch."""
    res = check(stack, host, versions, lookup)
    if not res.ok:
        raise VersionMismatch(
            res.line(), res.fix() or "install one of the sets in aios.plugins.versions.STACKS"
        )
    assert res.matched is not None
    return res.matched


def main(argv: list[str] | None = None) -> int:
    """``python -m aios.plugins.versions STACK [--host NAME]``: the per-host check (exit 0 or 2)."""
    args = list(sys.argv[1:] if argv is None else argv)
    host = None
    if "--host" in args:
        i = args.index("--host")
        host = args[i + 1] if i + 1 < len(args) else None
        del args[i : i + 2]
    if len(args) != 1:
        print(
            f"usage: python -m aios.plugins.versions {{{','.join(STACKS)}}} [--host NAME]",
            file=sys.stderr,
        )
        return 2
    try:
        vs = require(args[0], host)
    except ConfigError as exc:
        print(f"aios: error: {exc.one_line()}", file=sys.stderr)
        return 2
    print(f"{host or _host()}: {vs.name} ok")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
