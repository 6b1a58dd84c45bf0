"""run_cleaner with real processes: streaming, exit codes, timeouts, cancel, process groups."""

from __future__ import annotations

import os
import select
import threading
from pathlib import Path

from localpv.host.cleaner import CleanerResult, run_cleaner


def run(
    script: str,
    env: dict[str, str] | None = None,
    *,
    timeout: float = 10.0,
    kill_grace: float = 5.0,
    tail_lines: int = 20,
) -> tuple[CleanerResult, list[str]]:
    """Run a bash snippet as the cleaner command; return the result and the lines seen."""
    lines: list[str] = []
    result = run_cleaner(
        ["bash", "-c", script],
        env or {},
        timeout=timeout,
        on_line=lines.append,
        kill_grace=kill_grace,
        tail_lines=tail_lines,
    )
    return result, lines


def exited_within(pid: int, timeout: float) -> bool:
    """True once ``pid`` has exited (a zombie counts: it runs no more), waiting up to ``timeout``."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def test_output_is_streamed_while_the_command_runs(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    lines: list[str] = []

    def on_line(line: str) -> None:
        lines.append(line)
        if line == "waiting for the test":  # the command blocks until we have seen this line
            fifo.write_text("go\n")

    result = run_cleaner(
        ["bash", "-c", f'echo "waiting for the test"; read -r x < "{fifo}"; echo "got $x"'],
        {},
        timeout=10,
        on_line=on_line,
    )
    assert result.succeeded, result
    assert lines == ["waiting for the test", "got go"]


def test_exit_code_and_merged_stderr() -> None:
    result, lines = run("echo out; echo err >&2; exit 7")
    assert (result.exit_code, result.succeeded, result.timed_out) == (7, False, False)
    assert sorted(lines) == ["err", "out"]
    assert result.tail == tuple(lines)


def test_env_is_merged_over_the_agent_environment() -> None:
    result, lines = run('echo "$LOCAL_PV_BLKDEVICE"; echo "$PATH"', {"LOCAL_PV_BLKDEVICE": "/dev/loop7"})
    assert result.succeeded
    assert lines == ["/dev/loop7", os.environ["PATH"]]


def test_timeout_kills_the_whole_process_group() -> None:
    # The command's child starts a grandchild, reports its pid, and everybody waits.
    result, lines = run('bash -c "sleep 1000 & echo \\$!; wait"; wait', timeout=1.0)
    assert result.timed_out and not result.succeeded
    assert result.exit_code is not None and result.exit_code < 0
    assert exited_within(int(lines[0]), 5.0), "grandchild survived the timeout"


def test_sigterm_ignoring_command_is_killed_after_the_grace() -> None:
    result, lines = run("trap '' TERM; echo $$; while :; do :; done", timeout=0.5, kill_grace=0.5)
    assert result.timed_out
    assert result.exit_code == -9
    assert result.duration < 5
    assert exited_within(int(lines[0]), 5.0)


def test_cancel_stops_the_command() -> None:
    cancel = threading.Event()
    lines: list[str] = []

    def on_line(line: str) -> None:
        lines.append(line)
        cancel.set()

    result = run_cleaner(["bash", "-c", "echo $$; exec sleep 1000"], {}, timeout=60, on_line=on_line, cancel=cancel)
    assert result.cancelled and not result.timed_out and not result.succeeded
    assert result.duration < 10
    assert exited_within(int(lines[0]), 5.0)


def test_leftover_background_processes_are_killed_when_the_command_exits() -> None:
    result, lines = run("sleep 1000 & echo $!; exit 0")
    assert result.succeeded
    assert result.duration < 5, "must not wait for a background child holding the pipe"
    assert exited_within(int(lines[0]), 5.0)


def test_command_not_found_is_a_result_not_an_exception(tmp_path: Path) -> None:
    result = run_cleaner([str(tmp_path / "no-such-cleaner.sh")], {}, timeout=5, on_line=lambda _: None)
    assert (result.exit_code, result.succeeded) == (None, False)
    assert result.error == f"cannot run {str(tmp_path / 'no-such-cleaner.sh')!r}: No such file or directory"


def test_not_executable_and_empty_command(tmp_path: Path) -> None:
    script = tmp_path / "cleaner.sh"
    script.write_text("#!/bin/sh\n")
    assert "Permission denied" in str(run_cleaner([str(script)], {}, timeout=5, on_line=print).error)
    assert run_cleaner([], {}, timeout=5, on_line=print).error == "empty cleaner command"


def test_last_partial_line_long_lines_and_bad_bytes() -> None:
    result, lines = run("printf 'a\\nb\\xff\\n'; head -c 150000 /dev/zero | tr '\\0' x; printf '\\nlast'")
    assert result.succeeded
    assert lines[:2] == ["a", "b\ufffd"]
    assert lines[-1] == "last"
    assert "".join(lines[2:-1]) == "x" * 150000
    assert all(len(line) <= 65536 for line in lines)


def test_tail_keeps_the_last_lines() -> None:
    result, _ = run("for i in $(seq 1 50); do echo line $i; done", tail_lines=3)
    assert result.tail == ("line 48", "line 49", "line 50")
