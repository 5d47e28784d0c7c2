"""Step semantics and precision: the strategies every backend builds on.

* :mod:`aios.strategies.base`: :class:`~aios.strategies.base.Strategy`, the interface every
  strategy implements.
* :mod:`aios.strategies.ddp`: ``DDPStrategy`` (one process per device, any accelerator).
* :mod:`aios.strategies.fsdp`: FSDP2, tensor parallel and HSDP on a device mesh.
* :mod:`aios.strategies.precision`: precision policies (``Precision`` and core defaults).
* :mod:`aios.strategies.native`: the factories the built-in plugin registers for these.

Import from the modules; importing this package imports nothing (and never torch).
"""
