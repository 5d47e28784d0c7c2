"""A batch scheduler behind the cloud commands (Slurm, Kubernetes):
:class:`SchedulerProvider`."""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING, ClassVar

from aios_cloud.request import LaunchRequest
from aios_cloud.store import Store

if TYPE_CHECKING:
    from aios_cloud.store import ClusterRecord, JobRecord
from aios_cloud.provider.base import Echo, Provider
from aios_cloud.provider.data import ClusterInfo
from aios_cloud.provider.errors import CloudError


class SchedulerProvider(Provider):
    """A batch scheduler behind the cloud commands (Slurm, Kubernetes): ``aios launch`` submits
    one job (there are no hosts to provision or SSH into), ``aios logs`` reads the job's output
    through the scheduler, ``aios cancel``/``stop``/``down`` cancel it. What the two share:

    * :meth:`launch_job` gets the checked :class:`~aios_cloud.request.LaunchRequest` (never the
      CLI's options) and returns the exit code of ``aios launch``;
    * :meth:`job_logs` prints a job's output (``follow``: until it ends);
    * :meth:`cancel` ends the cluster's job; :meth:`stop` and :meth:`delete` cancel it (a
      scheduler's job cannot be stopped and resumed in place: :meth:`start` refuses);
    * :meth:`list` gives the jobs aios submitted (records of this cloud in the store).
    """

    scheduler: ClassVar[bool] = True

    @abstractmethod
    def launch_job(self, request: LaunchRequest, store: Store | None, log: Echo) -> int:
        """Submit the job ``request`` describes (``request.dry_run``: print the plan, submit
        nothing; ``store`` is ``None`` then) and, unless ``request.detach``, follow it to the
        end. Returns the exit code for ``aios launch``."""

    @abstractmethod
    def job_logs(
        self, rec: ClusterRecord, job: JobRecord, follow: bool, dry_run: bool, echo: Echo
    ) -> int:
        """Print ``job``'s output (``follow``: until it ends; ``dry_run``: the command that
        would). Returns the exit code for ``aios logs``."""

    @abstractmethod
    def cancel(self, name: str) -> None:
        """Cancel the job of cluster ``name`` (nothing to do when it has ended or is unknown)."""

    def stop(self, name: str, zone: str | None) -> None:
        self.cancel(name)

    def delete(self, name: str, zone: str | None) -> None:
        self.cancel(name)

    def start(self, name: str, zone: str | None) -> ClusterInfo:
        raise CloudError(
            f"a {self.name} job cannot be restarted in place",
            f"launch it again with `aios launch --cloud {self.name} --name {name} ...`",
        )

    def list(self, zone: str | None = None) -> list[ClusterInfo]:
        """The jobs aios submitted to this scheduler (from the store), as the scheduler sees
        them now."""

        out = []
        for rec in Store().clusters():
            if rec.cloud == self.name:
                info = self.describe(rec.name, rec.zone)
                if info is not None:
                    out.append(info)
        return out
