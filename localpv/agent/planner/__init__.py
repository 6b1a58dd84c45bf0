"""The node agent's decisions, as one pure function: inputs in, a plan out.

``plan(world)`` looks at everything the agent knows - configuration, this node, the
StorageClasses, a snapshot of every discovery directory, the label-filtered PV cache,
the cleanup journal and the state of running cleanups - and returns what to do: PVs to
create, cleanups to start, PVs to delete, journal changes, events, and the reasons for
every entry it skipped. It never touches the OS or the API, so every rule below is
tested directly with plain data.

The rules, in order of precedence for each volume path:

1. A path whose journal entry is not ``clean`` and that has no PV is never offered: it is
   cleaned first (its PV vanished while it may hold data, or it is being cleaned now).
2. A PV object for a recorded volume that is not the object the volume was offered as
   (another uid: deleted and applied again by hand or by a GitOps tool) is not trusted:
   while the volume is not known clean, an unclaimed such PV is deleted (retracted), the
   volume cleaned, and a fresh PV created; a claimed one is tracked as used.
   Our own PV (the recorded uid) is not left on offer either while its volume is not
   known clean (journal ``used`` or ``cleaning``: its ``claimRef`` was removed by hand):
   see :func:`_unclaimed_while_dirty` for what is done, by state and reclaim policy.
3. A volume is what it is, not how it is spelled or numbered: its stable identity
   (filesystem UUID, WWN...), or for a volume without one its device and inode numbers
   within one boot. An entry that is a recorded volume under another path is that volume:
   it is not offered while that record is not clean, and a record follows its volume to
   another path only where nobody else has that path. A path that shows another volume than
   its record is held: not cleaned, offered, nor its PV deleted.
4. Released + Delete PVs are cleaned; only a succeeded cleanup (journal ``clean``) lets
   the PV be deleted, after which discovery offers the volume again under the same name.
5. Discovery creates one PV per eligible entry, never two for one path (across classes)
   or for one volume, never over a name that belongs to another node's PV (a hash
   collision). While the journal is recovering (it did not exist at start: first start
   or lost state dir), a volume without any record is cleaned before its first offer.

One module per rule: :mod:`.usage` (2), :mod:`.identities` and :mod:`.volatile` (3), :mod:`.release` (1 and 4),
:mod:`.discovery` (5); :mod:`.common` holds what they share.
"""

from __future__ import annotations

from localpv.agent.model import Plan, World
from localpv.agent.planner.common import _scanned_volumes
from localpv.agent.planner.discovery import _plan_discovery
from localpv.agent.planner.identities import _follow_identities, _learn_identities
from localpv.agent.planner.release import _plan_deletions, _plan_orphans
from localpv.agent.planner.usage import _track_usage
from localpv.agent.planner.volatile import _follow_volumes
from localpv.kube.objects import Obj, pv_host_path

__all__ = ["plan"]


def plan(world: World) -> Plan:
    """Decide everything for one pass. Pure."""
    out = Plan()
    journal = dict(world.journal)
    by_path: dict[str, Obj] = {}
    for pv in world.pvs:
        path = pv_host_path(pv)
        if path is not None:
            by_path.setdefault(path, pv)
    volumes = _scanned_volumes(world)
    _track_usage(world, journal, out)
    _learn_identities(world, journal, volumes, out)
    _follow_volumes(world, journal, by_path, volumes, out)
    _follow_identities(world, journal, by_path, volumes, out)
    _plan_deletions(world, journal, out)
    _plan_orphans(world, journal, by_path, out)
    _plan_discovery(world, journal, by_path, volumes, out)
    return out
