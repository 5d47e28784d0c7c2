"""aios on Slurm: ``aios launch --cloud slurm`` (sbatch scripts generated from the launch plan)."""

from aios_cloud_slurm.__about__ import __version__

__all__ = ["__version__"]
