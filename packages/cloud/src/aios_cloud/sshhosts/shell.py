"""The shell the ssh cloud runs on the hosts: ssh argv for dry runs, the cleanup of ``aios
down``/``stop``, aios's own environment and the torch wheel it installs, the host checks."""

from __future__ import annotations

import shlex

from aios.plugins.versions import sets_for

from aios_cloud.fleet import HEAD_KEY_COMMENT
from aios_cloud.provider.data import ClusterHost
from aios_cloud.sshhosts.hosts import ACCELERATORS, STACK


def venv_setup(requirements: list[str]) -> list[str]:
    """Create aios's own environment on a host and install there the ``requirements`` it lacks
    (see :meth:`SshHostsProvider.setup_commands`)."""
    venv = VENV_DIR
    # the host interpreter's own site directories stay visible (a .pth after the venv's
    # own: what is installed into the venv wins), also when python3 is itself a venv or a
    # conda env, where --system-site-packages alone would not see its packages
    host_paths = (
        "import sys; print(chr(10).join(p for p in sys.path "
        "if p.endswith(('site-packages', 'dist-packages'))))"
    )
    venv_purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    lines = [
        f"if [ ! -x {VENV_PYTHON} ]; then "
        f"if command -v uv >/dev/null 2>&1; then uv venv -q --system-site-packages "
        f"--python python3 {venv}; else python3 -m venv --system-site-packages {venv}; fi "
        f"|| {{ echo \"[aios] $(hostname): cannot create aios's environment {venv} with "
        'python3 -m venv (Debian/Ubuntu: apt install python3-venv), or pass --python"; '
        f"exit 2; }}; : > {venv}/{VENV_MARKER}; python3 -c {shlex.quote(host_paths)} > "
        f'"$({VENV_PYTHON} -c {shlex.quote(venv_purelib)})/_aios_host.pth"; fi',
    ]
    if requirements:
        reqs = " ".join(shlex.quote(r) for r in requirements)
        find = (
            "import importlib.metadata as m, re, sys\n"
            "for r in sys.argv[1:]:\n"
            "    n = re.split(r'[<>=!~ ;\\[]', r, maxsplit=1)[0]\n"
            "    try: m.version(n)\n"
            "    except m.PackageNotFoundError: print(r)\n"
        )
        lines += [
            f"missing=$({VENV_PYTHON} -c {shlex.quote(find)} {reqs})",
            f'if [ -n "$missing" ]; then echo "[aios] installing $(echo $missing) into {venv}"; '
            f"if command -v uv >/dev/null 2>&1; then uv pip install -q --python {VENV_PYTHON} "
            f"$missing; else {VENV_PYTHON} -m pip install --quiet $missing; fi; fi",
        ]
    return lines


def host_check_lines(accelerator: str, python_cmd: str) -> list[str]:
    """The version-set check and the device discovery on a host (see
    :meth:`SshHostsProvider.host_checks`)."""
    backend = ACCELERATORS.get(accelerator, ("cpu", ""))[0]
    py = shlex.quote(python_cmd)
    site = 'PYTHONPATH=".aios-site${PYTHONPATH:+:$PYTHONPATH}"'
    stack = STACK.get(backend)
    if stack:
        versions = f'{site} {py} -m aios.plugins.versions {stack} --host "$(hostname)"'
    else:
        fix = (
            "setup, which installs it there, was skipped (--no-setup or --setup-script): "
            "launch without those, or pass --python with an interpreter that has it"
            if python_cmd == VENV_PYTHON
            else "install it there, or pass --python with an interpreter that has it"
        )
        versions = (
            f'{py} -c "import importlib.metadata as m; m.version(\\"torch\\")" 2>/dev/null || '
            f'{{ echo "[aios] $(hostname): torch is not installed for {python_cmd}; '
            f'{fix}"; exit 2; }}'
        )
    judge = (
        "import json, socket, sys; r = json.load(sys.stdin)[0]; h = socket.gethostname(); "
        'a, b, k, c, why = r["available"], r["backend"], r["kind"], r["count"], r["reason"]; '
        'print("[aios] %s: %s x %s (%s)" % (h, c, k, b) if a else '
        '"[aios] %s: aios finds no usable %s device (%s)" % (h, b, why)); '
        "sys.exit(0 if a else 2)"
    )
    devices = (
        f"{site} {py} -m aios.cli.main devices --backend {backend} --json | "
        f"{py} -c {shlex.quote(judge)}"
    )
    return [versions, devices]


def dry_ssh(host: ClusterHost, key: str | None, command: str) -> list[str]:
    """A plain ``ssh`` argv that runs ``command`` on ``host`` (for dry runs: touches nothing)."""
    argv = ["ssh"]
    if key:
        argv += ["-i", key]
    if host.port:  # only when the user gave it: otherwise ssh_config decides
        argv += ["-p", str(host.port)]
    return [*argv, "-o", "BatchMode=yes", ssh_dest(host), command]


def ssh_dest(h: ClusterHost) -> str:
    """``user@host`` when the user gave the user, else the host (or ``~/.ssh/config`` alias)
    alone: ssh_config decides, as the command line would override it (ssh_config(5))."""
    return f"{h.ssh_user}@{h.ip}" if h.ssh_user else h.ip


def cleanup_command(name: str, remove: bool) -> str:
    """End the process groups of cluster ``name``'s jobs and its agent on a host; with
    ``remove`` delete aios's own files there (the synced files the host's manifest lists, the
    sync's store, the head's key line in authorized_keys), keeping and naming whatever else the
    job wrote."""
    root = f'"$HOME/aios/{name}"'
    lines = [
        f"R={root}",
        'for p in "$R"/jobs/*/pid "$R"/agent.pid; do [ -f "$p" ] || continue; '
        'g=$(cat "$p"); kill -TERM -- -"$g" 2>/dev/null || kill -TERM "$g" 2>/dev/null; done',
        'for p in "$R"/jobs/*/pid "$R"/agent.pid; do [ -f "$p" ] || continue; g=$(cat "$p"); '
        'for i in $(seq 50); do kill -0 "$g" 2>/dev/null || break; sleep 0.1; done; '
        'kill -KILL -- -"$g" 2>/dev/null || kill -KILL "$g" 2>/dev/null; done',
    ]
    if remove:
        lines += [
            'rm -rf "$R"/jobs "$R"/setup.sha "$R"/agent.json "$R"/agent.pid "$R"/agent.log '
            '"$R"/agent.state "$R"/code.new "$R"/code/.aios-site',
            # aios's environment only when aios made it (its marker): never one it did not write
            f'if [ -f "$R/code/{VENV_DIR}/{VENV_MARKER}" ]; then rm -rf "$R/code/{VENV_DIR}"; fi',
        ]
        # the files the last sync wrote, as the host's own manifest lists them (aios's code sync
        # through the head host); then that sync's store, and the head's key to the other hosts:
        # its public half leaves every host's authorized_keys (only the line aios added)
        lines += [
            '[ -f "$R/fleet/manifest.json" ] && python3 -c \'import json, sys\n'
            'for p, _s, _m in json.load(open(sys.argv[1])): print(p)\' "$R/fleet/manifest.json" '
            '| while IFS= read -r f; do case "$f" in ""|/*|*..*) continue;; esac; '
            'rm -f -- "$R/code/$f"; done',
            # (cluster names are [-a-z0-9]: no pattern characters)
            f'K=$(grep -x ".* {HEAD_KEY_COMMENT} {name}" "$HOME/.ssh/authorized_keys" '
            '2>/dev/null || true); if [ -n "$K" ]; then A="$HOME/.ssh/authorized_keys"; '
            'grep -vxF "$K" "$A" > "$A.aios-down" || true; chmod 600 "$A.aios-down"; '
            'mv "$A.aios-down" "$A"; fi',
            'rm -rf "$R/fleet"',
        ]
        lines += [
            '[ -d "$R/code" ] && find "$R/code" -depth -type d -empty -delete',
            'if [ -d "$R/code" ]; then n=$(find "$R/code" -type f | wc -l); '
            'echo "kept $n files the job wrote in $R/code: $(cd "$R/code" && find . -maxdepth 1 '
            '-mindepth 1 | head -n 5 | tr "\\n" " ")"; '
            'else rmdir "$R" 2>/dev/null; rmdir "$HOME/aios" 2>/dev/null; fi',
        ]
    lines.append("true")
    return "; ".join(lines)


#: aios's own interpreter on a user's host: a virtual environment in the cluster's code
#: directory (where setup, checks and jobs run), removed by `aios down` when aios made it
VENV_DIR = ".aios-venv"


VENV_PYTHON = f"{VENV_DIR}/bin/python"


#: the file aios writes into the environment it made (`aios down` removes only such a one)
VENV_MARKER = ".made-by-aios"


#: the torch aios installs into its own environment on a CPU host that has none: the build the
#: project tests and the root README installs (the host's pip configuration picks where from)
CPU_TORCH = "torch==2.13.0"


def torch_wanted(backend: str) -> str:
    """A shell expression that prints the pip arguments of the torch ``backend`` needs: the
    CPU pin, the accelerator stacks' first known-good set (:data:`aios.plugins.versions.STACKS`), for
    CUDA the newest set whose minimum driver the host's ``nvidia-smi`` meets (nothing when
    none: the setup then stops with the line to pass)."""
    if backend not in STACK:
        return f"echo {shlex.quote(CPU_TORCH)}"
    sets = sets_for(STACK[backend])
    if backend != "cuda":
        return f"echo {shlex.quote(_pip_args(sets[0].install))}"
    table = [(dict(v.requires)["nvidia-driver"].lstrip(">="), _pip_args(v.install)) for v in sets]
    pick = (
        "import subprocess\n"
        "try:\n"
        "    d = subprocess.run(['nvidia-smi', '--query-gpu=driver_version', "
        "'--format=csv,noheader'], capture_output=True, text=True).stdout.split()[0]\n"
        "except (OSError, IndexError):\n"
        "    d = ''\n"
        "v = tuple(int(x) for x in d.split('.') if x.isdigit())\n"
        f"for need, args in {table!r}:\n"
        "    if v and v >= tuple(int(x) for x in need.split('.')):\n"
        "        print(args)\n"
        "        break\n"
    )
    return f"python3 -c {shlex.quote(pick)}"


def _pip_args(install: str) -> str:
    """``pip install A 'B>=1' --index-url U`` -> ``A B>=1 --index-url U`` (split by the shell
    unquoted, with globbing off)."""
    words = shlex.split(install)
    return " ".join(words[2:] if words[:2] == ["pip", "install"] else words)


def torch_setup(backend: str) -> str:
    """The setup line that gives aios's own environment the torch of ``backend`` when neither
    it nor the host's python3 has one: installed with the environment's pip (the host's pip
    configuration applies: index, find-links, constraints; uv's where only uv is there), said
    in one line with the time it took; when that fails, one line with the ``--requirements``
    to pass instead, exit 2. A torch there already (the host's, or the user's
    ``--requirements``) is used as it is."""
    venv = VENV_DIR
    has = f"{VENV_PYTHON} -c \"import importlib.metadata as m; m.version('torch')\" 2>/dev/null"
    log = f"{venv}/torch-install.log"
    install = (
        "set -f; "
        f"if {VENV_PYTHON} -m pip --version >/dev/null 2>&1; then "
        f"{VENV_PYTHON} -m pip install --quiet $want; "
        f"elif command -v uv >/dev/null 2>&1; then uv pip install -q --python {VENV_PYTHON} $want; "
        f"else python3 -m pip --python {VENV_PYTHON} install --quiet $want; fi"
    )
    return (
        f"if ! {has}; then want=$({torch_wanted(backend)}); t0=$(date +%s); "
        f'if [ -n "$want" ] && ( {install} ) > {log} 2>&1 && {has}; then '
        f'echo "[aios] $(hostname): python3 has no torch: installed $want ({backend}) into '
        f'{venv} in $(( $(date +%s) - t0 ))s"; else '
        f'why=$(grep -v "^ *$" {log} 2>/dev/null | tail -n 1 | cut -c1-200 || true); '
        f'echo "[aios] $(hostname): python3 has no torch and installing '
        f"${{want:-a {backend} torch}} into {venv} failed (${{why:-no torch build fits the "
        f"host}}): name a torch these hosts can install in a file and pass it, e.g. "
        f"echo '${{want:-torch}}' > requirements.txt and --requirements requirements.txt "
        f'(or --python with an interpreter that has torch)"; exit 2; fi; fi'
    )


def probe_python(python: str) -> str:
    return "python3" if python == VENV_PYTHON else python


def first_line(lines: list[str]) -> str:
    for line in lines:
        if line.strip() and not line.startswith("Warning: Permanently added"):
            return line.strip()[:200]
    return ""
