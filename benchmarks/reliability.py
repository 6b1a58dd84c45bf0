"""The full fault campaign (issue 7): many cycles of API faults and SIGKILLs.

    python -m benchmarks.reliability agent --cycles 60 --volumes 6 --seed 1
    python -m benchmarks.reliability nfs --cycles 60 --seed 1
    python -m benchmarks.reliability dynamic --cycles 40 --seed 1

Runs :class:`tests.support.campaign.AgentCampaign` (real `localpv agent` processes,
real tmpfs volumes, the API emulator's fault injection; besides fault cycles, seeded
cycles that re-apply PVs with the agent down or up, change the class's hostDir to an
alias, and lose the agent's state dir) or ``NfsCampaign`` (two
leader-elected `localpv nfs` processes, a directory as the export, hostile claims) and
prints what was injected and checked. Any invariant violation ends the run with a non-zero exit and the violation.
Figures are recorded in docs/reliability.md. Needs root.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from tests.support.campaign import REAPPLY_GRACE, AgentCampaign, NfsCampaign, Violation
from tests.support.dyncampaign import DynamicCampaign


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    agent = sub.add_parser("agent")
    agent.add_argument("--cycles", type=int, default=60)
    agent.add_argument("--volumes", type=int, default=6)
    agent.add_argument("--cycle-seconds", type=float, default=3.0)
    agent.add_argument("--seed", type=int, default=1)
    agent.add_argument("--grace", type=float, default=REAPPLY_GRACE,
                       help="seconds a PV re-applied by the campaign may stay on offer dirty once the agent is up")
    agent.add_argument("--force", default="", help="comma-separated kinds of the first cycles, e.g. "
                       "reapply-down,reapply-up,hostdir,state-loss (later ones are drawn from the seed)")
    dynamic = sub.add_parser("dynamic")
    dynamic.add_argument("--cycles", type=int, default=40)
    dynamic.add_argument("--tenants", type=int, default=6)
    dynamic.add_argument("--cycle-seconds", type=float, default=4.0)
    dynamic.add_argument("--seed", type=int, default=1)
    nfs = sub.add_parser("nfs")
    nfs.add_argument("--cycles", type=int, default=60)
    nfs.add_argument("--cycle-seconds", type=float, default=4.0)
    nfs.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="localpv-campaign-"))
    campaign: AgentCampaign | NfsCampaign | DynamicCampaign
    if args.what == "dynamic":
        if os.geteuid() != 0:
            sys.exit("needs root (loop devices, mounts, mount namespaces)")
        campaign = DynamicCampaign(workdir, tenants=args.tenants, cycles=args.cycles,
                                   cycle_seconds=args.cycle_seconds, seed=args.seed)
    elif args.what == "agent":
        if os.geteuid() != 0:
            sys.exit("needs root (tmpfs volumes)")
        campaign = AgentCampaign(workdir, volumes=args.volumes, cycles=args.cycles,
                                 cycle_seconds=args.cycle_seconds, seed=args.seed, grace=args.grace,
                                 forced=[k for k in args.force.split(",") if k])
    else:
        campaign = NfsCampaign(workdir, cycles=args.cycles, cycle_seconds=args.cycle_seconds, seed=args.seed)
    try:
        report = campaign.run()
    except Violation as err:
        print(f"VIOLATION after {campaign.report.cycles} cycles: {err}")
        print(f"so far: {campaign.report.summary()}")
        sys.exit(1)
    print(f"{args.what} campaign (seed {args.seed}): {report.summary()}")
    if args.what == "dynamic":
        print("invariants held: no image mounted twice (one loop device, one staging mount); none removed while")
        print("attached; never more promised than overcommit x size - reserved; every tenant read back its data")
        print("after every stage; a thick volume whole whenever staged; a second stage of a staged image refused;")
        print("every claim served or refused, and nothing left once all were deleted")
    elif args.what == "agent":
        print("invariants held: never two PVs for one volume (under either hostDir spelling); no PV offered over")
        print(f"unwiped data, checked every tick (a PV the campaign re-applied or unclaimed itself: not for over "
              f"{args.grace:g} s")
        print("once the agent was up); no data removed while bound; a live claim whose PV was unclaimed is Bound to")
        print("it again; every released volume cleaned and offered again once the faults stopped")
    else:
        print("invariants held: one PV per claim; no hostile claim got a PV; nothing outside the export changed;")
        print("every live claim Bound with its directory; no PV or volume directory left after deletion")


if __name__ == "__main__":
    main()
