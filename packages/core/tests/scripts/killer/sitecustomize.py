"""Put on PYTHONPATH by a test (or run by it in ``aios-run`` before its ``main``, so that the
ranks forked from it inherit the hook and start warm): with ``IDIOMS_KILL_AT=SIGNAL:STEP`` the
rank-0 worker sends SIGNAL to ``aios-run`` right after optimizer step STEP, as an operator or a
spot reclaim would: SIGTERM is forwarded to every worker (emergency checkpoint, exit 75),
SIGKILL ends the launcher and with it every worker. ``SIGNAL:save:N`` instead SIGKILLs the whole
job in the middle of the N-th named save (``rt.save(path)``, ``rt.save_best``), while its files
are being written. Decided in the worker itself (its ``RANK`` and launcher read when the hook
fires), so where the kill lands does not depend on timing."""

import os

_spec = os.environ.get("IDIOMS_KILL_AT", "")


def _launcher():
    """The pid of ``aios-run`` in its rank-0 worker; None in any other process."""
    if os.environ.get("RANK") == "0" and os.environ.get("AIOS_RUN_LAUNCHER_PID"):
        return int(os.environ["AIOS_RUN_LAUNCHER_PID"])
    return None


if _spec:
    import signal

    import aios.checkpoint.store as _ck
    import aios.runtime as _rt

    _name, _, _at = _spec.partition(":")
    _sig = getattr(signal, _name)

    if _at.startswith("save:"):
        _n = int(_at[5:])
        _count = [0]
        _write_file = _ck.CheckpointStore.write_file

        def write_file(self, staging, name, writer):
            launcher = _launcher()
            if launcher is not None and staging.target is not None and not name.startswith("."):
                _count[0] += 1
                if _count[0] == _n:  # half a file written, then the whole job dies

                    def half(f):
                        f.write(b"\0" * 64)
                        os.kill(launcher, signal.SIGKILL)
                        os.kill(os.getpid(), signal.SIGKILL)

                    return _write_file(self, staging, name, half)
            return _write_file(self, staging, name, writer)

        _ck.CheckpointStore.write_file = write_file
    else:
        _step = _rt.Runtime.step

        def _kill_and_hear(launcher):
            """SIGTERM: send it, then wait in this step until aios-run has passed it on to this
            worker, so the ranks agree on the notice at their next step however loaded the
            machine is (without this, a slow forward could let the run end first)."""
            if _sig != signal.SIGTERM:
                os.kill(launcher, _sig)
                return
            import threading

            heard = threading.Event()
            before = signal.getsignal(signal.SIGTERM)

            def handler(signum, frame):
                heard.set()
                if callable(before):
                    before(signum, frame)
                elif before != signal.SIG_IGN:  # no handler: the default action, as unhooked
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    os.kill(os.getpid(), signal.SIGTERM)

            signal.signal(signal.SIGTERM, handler)
            os.kill(launcher, _sig)
            heard.wait(120)

        def step(self, *args, **kwargs):
            taken = _step(self, *args, **kwargs)
            launcher = _launcher()
            if launcher is not None and taken and self.global_step == int(_at):
                _kill_and_hear(launcher)
            return taken

        _rt.Runtime.step = step
