"""The ``localpv`` command line: one thin module per command, each parsing and checking what a
user can type and handing over to the code that does the work.

Every command imports what it needs inside its body: ``localpv --help`` must stay fast
and must not pay for the ``kubernetes`` client (about 47 MB and 0.3 s).
Options read environment variables too: each option names its variable explicitly
(upstream's names where one exists, e.g. ``MY_NODE_NAME``), else ``LOCALPV_<OPTION>``.
"""

from localpv.cli import agent, claimlabeller, cleanup, config, demo, discover, doctor, nfs, nodecleanup, status
from localpv.cli.root import cli, main

__all__ = ["agent", "claimlabeller", "cleanup", "cli", "config", "demo", "discover", "doctor", "main", "nfs",
           "nodecleanup", "status"]
