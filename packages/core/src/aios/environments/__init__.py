"""Cluster environments: where this process sits in a job (nodes, node rank, master).

* :mod:`aios.environments.base`: :class:`~aios.environments.base.ClusterEnvironment`, the local
  and torchelastic environments, and ``detect``.
* :mod:`aios.environments.slurm`: a Slurm job step (``srun aios-run train.py``).
* :mod:`aios.environments.k8s`: a pod of an indexed Job or a JobSet.

Import from the modules; importing this package imports nothing.
"""
