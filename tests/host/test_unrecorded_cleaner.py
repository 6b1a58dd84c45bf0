"""A cleaner the agent started but had not recorded yet when it was SIGKILLed is still
found and killed by the restarted agent (its environment carries the records' marker)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from localpv.host.cleaner import ProcessRecords, _start_time


def test_an_unrecorded_cleaner_is_found_by_its_marker_and_killed(tmp_path: Path) -> None:
    records = ProcessRecords(tmp_path / "cleaners")
    proc = subprocess.Popen(["sleep", "60"], env={**os.environ, **records.marker()}, start_new_session=True)
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)  # not ours: left alone
    try:
        assert os.listdir(tmp_path / "cleaners") == [], "never recorded (the agent died first)"
        killed = records.kill_leftovers(timeout=5)
        assert proc.pid in killed and other.pid not in killed
        assert proc.wait(5) == -9
        assert _start_time(other.pid) is not None
    finally:
        for p in (proc, other):
            if p.poll() is None:
                p.kill()
            p.wait(5)


def test_another_records_directory_does_not_claim_the_cleaner(tmp_path: Path) -> None:
    mine, theirs = ProcessRecords(tmp_path / "a"), ProcessRecords(tmp_path / "b")
    proc = subprocess.Popen(["sleep", "60"], env={**os.environ, **theirs.marker()}, start_new_session=True)
    try:
        assert proc.pid not in mine.kill_leftovers(timeout=1)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait(5)
