"""Devices: the accelerator seam and the hardware facts shared by discovery.

* :mod:`aios.devices.accelerator`: :class:`~aios.devices.accelerator.Accelerator` (one small
  definition per native torch device kind) and the CPU one.
* :mod:`aios.devices.efa`: EFA capabilities per AWS instance family (RDMA read, interfaces) and
  the fabric variables they decide, for the target instance type.
* :mod:`aios.devices.pci`: PCI ids of accelerators (backends' discovery, ``--cloud ssh``).

Import from the modules; importing this package imports nothing.
"""
