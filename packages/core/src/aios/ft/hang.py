"""Hang detection for replica groups: a group that stopped stepping while another goes on.

A hung group (a rank stuck in the script, in a data read, in a collective of its own group)
still heartbeats to the lighthouse through its manager's thread, and torchft's lighthouse forms
no quorum without it (a quorum needs more than half of the healthy groups): every other group
waits in its quorum request, the run makes no progress and no process fails. Each rank of a
group writes, at each quorum request, the committed step it asks from (:class:`Beat`, one
``pwrite`` a step, in a file of the run's state folder). aios-run (:class:`HangWatch`, with the
clock it is given) judges a group hung when one of its ranks stayed behind another live group's
request for :func:`limit` seconds (twice ``ft.timeout``); it stops the group and restarts it as a
lost one, which heals from a live group. Over several hosts each host's aios-run shares its
groups' latest requests through the run's store (:func:`aios.ft.beat_key`, each
:data:`SHARE_EVERY_S`) and judges its own groups against every other host's too: a host with one
group has no other group of its own to compare with. The watch compares states, not the moments it saw them
change, so two requests that fall between the same two looks are told apart.

The live groups' quorum timeout (:func:`quorum_timeout`) outlasts the limit by ``ft.timeout``
plus the lighthouse's heartbeat timeout: time for aios-run to stop the hung group and for the
lighthouse to drop it, before a live group gives up.

Not judged: a group before its first request (start-up, imports and ``rt.resume()``), a
restarted group until it has healed (the live groups hold the run's state: a live group busy
while a restarted one waits is never stopped for it), and groups that are quiet together (an
evaluation every group runs). A checkpoint is written by one group only: a synchronous save
longer than the limit is judged a hang (raise ``ft.timeout`` or set ``checkpoint.async_save``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aios.config.settings import FtSettings


#: how often (seconds at most) a host's aios-run shares its groups' steps with the other hosts
#: and reads theirs (over several hosts)
SHARE_EVERY_S = 1.0


def limit(ft: FtSettings) -> float:
    """Seconds behind another group after which a group is hung (see the module)."""
    return 2.0 * float(ft.timeout)


def quorum_timeout(ft: FtSettings) -> float:
    """Seconds a live group waits for a step's quorum: past :func:`limit`, so that a hung
    group is stopped and leaves the lighthouse before the live groups give up (see the
    module)."""
    return limit(ft) + float(ft.timeout) + ft.heartbeat_timeout_ms / 1000.0


def beat_path(state_dir: str, group: int, rank: int) -> str:
    return os.path.join(state_dir, f"group{group}.r{rank}.beat")


class Beat:
    """A rank's side: the committed step of its last quorum request, rewritten in place."""

    def __init__(self, state_dir: str, group: int, rank: int) -> None:
        self._fd = os.open(beat_path(state_dir, group, rank), os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(self._fd, 0)

    def tick(self, step: int) -> None:
        """A quorum request from committed step ``step``."""
        os.pwrite(self._fd, b"%20d" % step, 0)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class HangWatch:
    """aios-run's side: which groups are hung now (see the module)."""

    def __init__(
        self,
        state_dir: str,
        per_group: int,
        limit_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.state_dir = state_dir
        self.per_group = per_group
        self.limit_s = limit_s
        self.clock = clock
        #: group -> the clock when it was first seen behind (cleared when it catches up)
        self.behind: dict[int, float] = {}

    def steps(self, group: int) -> list[int]:
        """The steps of the group's ranks that asked at least once (a rank that never asked is
        starting: not judged)."""
        steps = []
        for rank in range(self.per_group):
            try:
                with open(beat_path(self.state_dir, group, rank), "rb") as f:
                    text = f.read().strip()
            except OSError:
                continue
            if text.isdigit():
                steps.append(int(text))
        return steps

    def forget(self, group: int) -> None:
        """A group restarted: its old steps go; it is judged again once it asks (healed)."""
        self.behind.pop(group, None)
        for rank in range(self.per_group):
            try:
                os.unlink(beat_path(self.state_dir, group, rank))
            except OSError:
                pass

    def look(self, live: Iterable[int], elsewhere: Mapping[int, int] | None = None) -> list[int]:
        """Read the live groups' steps; the groups hung now. ``elsewhere``: the latest step
        each live group of another host asked from (over several hosts, through the run's
        store): a group of this host is judged against those too."""
        now = self.clock()
        steps = {g: s for g in live if (s := self.steps(g))}
        away = max((elsewhere or {}).values(), default=-1)
        hung = []
        for g, own in steps.items():
            ahead = max((max(s) for o, s in steps.items() if o != g), default=away)
            ahead = max(ahead, away)
            if min(own) >= ahead:
                self.behind.pop(g, None)
                continue
            since = self.behind.setdefault(g, now)
            if now - since > self.limit_s:
                hung.append(g)
        for g in set(self.behind) - set(steps):  # ended or not asking (restarted): not judged
            del self.behind[g]
        return hung
