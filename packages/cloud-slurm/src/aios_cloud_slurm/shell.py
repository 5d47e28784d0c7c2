"""Where Slurm commands run: this machine (the local ``sbatch``) or a login node over ssh."""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import dataclass, field

from aios_cloud.provider.errors import CloudError


@dataclass
class Shell:
    login: str | None = None  # user@host; None: local
    ssh_key: str | None = None
    ssh_port: int = 22
    ssh_options: list[str] = field(default_factory=list)
    login_env: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"on {self.login}" if self.login else "on this machine"

    def argv(self, script: str) -> list[str]:
        if not self.login:
            return ["bash", "-c", script]
        argv = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=15", "-p", str(self.ssh_port)]
        if self.ssh_key:
            argv += ["-i", os.path.expanduser(self.ssh_key), "-o", "IdentitiesOnly=yes"]
        for opt in self.ssh_options:
            argv += ["-o", opt]
        if self.login_env:
            script = (
                "".join(f"export {k}={shlex.quote(v)}; " for k, v in sorted(self.login_env.items()))
                + script
            )
        return [*argv, self.login, "bash -c " + shlex.quote(script)]

    def run(
        self,
        script: str,
        input: bytes | None = None,
        timeout: float = 120,
        stdin_path: str | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        try:
            if stdin_path:
                with open(stdin_path, "rb") as f:
                    return subprocess.run(
                        self.argv(script), stdin=f, capture_output=True, timeout=timeout
                    )
            return subprocess.run(
                self.argv(script), input=input, capture_output=True, timeout=timeout
            )
        except FileNotFoundError as exc:
            raise CloudError(
                f"cannot run {exc.filename}",
                "install OpenSSH client (ssh)" if self.login else "install bash",
            ) from None
        except subprocess.TimeoutExpired:
            raise CloudError(
                f"a Slurm command {self.where} did not answer within {timeout:.0f}s",
                "check the login node / slurmctld",
            ) from None

    def out(self, script: str, what: str, timeout: float = 120) -> str:
        r = self.run(script, timeout=timeout)
        if r.returncode != 0:
            err = (r.stderr or r.stdout).decode(errors="replace").strip().splitlines()
            if self.login and r.returncode == 255:
                raise CloudError(
                    f"cannot reach the Slurm login node {self.login}: {err[-1] if err else 'ssh failed'}",
                    "check slurm.login, slurm.ssh_key and that `ssh LOGIN` works",
                )
            raise CloudError(
                f"{what} failed {self.where}: {err[-1] if err else f'exit {r.returncode}'}",
                "see the Slurm message above",
            )
        return r.stdout.decode(errors="replace")
