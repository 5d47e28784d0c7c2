"""aios on Kubernetes: ``aios launch --cloud k8s`` (JobSets for GKE TPU slices, JobSets/indexed Jobs for EKS)."""

from aios_cloud_k8s.__about__ import __version__

__all__ = ["__version__"]
