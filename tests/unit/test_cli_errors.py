"""Issue 12: what a user can type never ends in a traceback.

Every mistake below exits 2 with exactly one line on stderr that names the flag (or the
variable, or the configuration key), what was expected and what was found. They run the
real command through click's CliRunner (the same ``cli.main`` path as ``localpv``), so an
escaped exception shows up as ``result.exception``; a few run ``python -m localpv`` for
real to see the process's own stderr. Cases that used to hang (retrying forever) live in
``tests/agent/test_cli_errors_e2e.py``, as subprocesses with a bound.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from localpv.cli import cli

EXAMPLES = Path(__file__).parents[2] / "examples"
CONFIG = str(EXAMPLES / "config")

#: Variables the commands read; unset so that the caller's environment cannot change a case.
ENV_NAMES = ("KUBECONFIG", "MY_NODE_NAME", "MY_NAMESPACE", "POD_NAMESPACE", "JOB_CONTAINER_IMAGE", "NFS_SERVER",
             "NFS_PATH", "PROVISIONER_NAME", "ENABLE_LEADER_ELECTION", "NFS_MOUNT_DIR", "NFS_DIR_MODE",
             "KUBERNETES_SERVICE_HOST", "LOCAL_PV_BLKDEVICE", "LOCAL_PV_FILESYSTEM")


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str | None]:
    env: dict[str, str | None] = {name: None for name in ENV_NAMES}
    env.update({name: None for name in os.environ if name.startswith("LOCALPV_")})
    env.update(extra or {})
    return env


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env=clean_env(env))


def assert_one_line_error(result: Result, *names: str, code: int = 2) -> str:
    """Exit ``code``, one line on stderr naming each of ``names``, no exception, no traceback."""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError("escaped exception:\n" + "".join(traceback.format_exception(result.exception)))
    assert "Traceback" not in result.output
    assert result.exit_code == code, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    for name in names:
        assert name in lines[0], lines[0]
    return lines[0]


def run_localpv(*args: str, env: dict[str, str] | None = None, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    """The real process; ``timeout`` only bounds a regression (each case ends in well under a second)."""
    full = {k: v for k, v in os.environ.items() if k not in ENV_NAMES and not k.startswith("LOCALPV_")}
    return subprocess.run([sys.executable, "-m", "localpv", *args], capture_output=True, text=True, timeout=timeout,
                          check=False, env={**full, **(env or {})})


def assert_process_one_line_error(proc: subprocess.CompletedProcess[str], *names: str, code: int = 2) -> str:
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    for name in names:
        assert name in lines[0], lines[0]
    return lines[0]


# ------------------------------------------------------------------ fixtures


@pytest.fixture
def refused_kubeconfig(tmp_path: Path) -> str:
    """A well-formed kubeconfig for a server nobody answers at (never contacted by these cases)."""
    path = tmp_path / "refused.kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}]}))
    return str(path)


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port somebody else listens on (what the default :8080 often is)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def bad_kubeconfigs(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """Kind → (path, a word the message must contain)."""
    invalid = tmp_path / "invalid.yaml"
    invalid.write_text("clusters: [\n")
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    return {
        "invalid-yaml": (str(invalid), "YAML"),
        "directory": ("/etc", "directory"),
        "binary": ("/bin/ls", "text"),
        "missing": (str(tmp_path / "missing"), "no such file"),
        "not-a-mapping": (str(listing), "mapping"),
    }


def command_args(command: str, tmp_path: Path, kubeconfig: str, listen: str = "127.0.0.1:0") -> list[str]:
    """A full, otherwise valid command line for ``command``."""
    if command == "discover":
        return ["discover", "--dry-run", "--config", CONFIG, "--node", "n1", "--kubeconfig", kubeconfig]
    if command == "agent":
        return ["agent", "--config", CONFIG, "--node", "n1", "--kubeconfig", kubeconfig,
                "--state-dir", str(tmp_path / "state"), "--listen-address", listen]
    if command == "nfs":
        export = tmp_path / "export"
        export.mkdir(exist_ok=True)
        return ["nfs", "--nfs-server", "nfs.example", "--nfs-path", "/exports", "--provisioner-name", "example.com/nfs",
                "--mount-dir", str(export), "--kubeconfig", kubeconfig, "--listen-address", listen]
    if command == "node-cleanup":
        return ["node-cleanup", "--kubeconfig", kubeconfig, "--listen-address", listen]
    if command == "doctor":
        return ["doctor", "--config", CONFIG, "--node", "n1", "--kubeconfig", kubeconfig, "--on-host"]
    raise AssertionError(command)


# ------------------------------------------------------------------ --kubeconfig


KUBECONFIG_COMMANDS = ["discover", "agent", "nfs", "node-cleanup", "doctor"]


@pytest.mark.parametrize("kind", ["invalid-yaml", "directory", "binary", "missing", "not-a-mapping"])
@pytest.mark.parametrize("command", KUBECONFIG_COMMANDS)
def test_an_unusable_kubeconfig_is_one_line_naming_the_flag(command: str, kind: str, tmp_path: Path) -> None:
    path, word = bad_kubeconfigs(tmp_path)[kind]
    line = assert_one_line_error(invoke(*command_args(command, tmp_path, path)), "--kubeconfig", path)
    assert word in line


def test_the_kubeconfig_variable_is_named_when_it_was_the_source(tmp_path: Path) -> None:
    result = invoke("discover", "--dry-run", "--config", CONFIG, "--node", "n1", env={"KUBECONFIG": "/etc"})
    assert "directory" in assert_one_line_error(result, "KUBECONFIG", "/etc")


def test_a_binary_kubeconfig_in_the_real_process() -> None:
    proc = run_localpv("discover", "--dry-run", "--config", CONFIG, "--node", "n1", "--kubeconfig", "/bin/ls")
    assert_process_one_line_error(proc, "--kubeconfig", "/bin/ls")


# ------------------------------------------------------------------ --listen-address


LISTEN_COMMANDS = ["agent", "nfs", "node-cleanup"]


@pytest.mark.parametrize(("address", "word"), [
    ("garbage", "[host]:port"),
    (":99999", "0-65535"),
    ("127.0.0.1:-1", "[host]:port"),
    ("192.0.2.1:8080", "not an address of this host"),
    ("no-such-host.invalid:8080", "no-such-host.invalid"),
])
@pytest.mark.parametrize("command", LISTEN_COMMANDS)
def test_a_bad_listen_address_is_one_line(command: str, address: str, word: str, tmp_path: Path,
                                          refused_kubeconfig: str) -> None:
    result = invoke(*command_args(command, tmp_path, refused_kubeconfig, listen=address))
    assert word in assert_one_line_error(result, "--listen-address", address)


@pytest.mark.parametrize("path", ["metrics", "/a b", "/metrics?x=1"])
@pytest.mark.parametrize("command", ["agent", "node-cleanup"])
def test_a_metrics_path_no_request_could_match_is_refused(command: str, path: str, tmp_path: Path,
                                                          refused_kubeconfig: str) -> None:
    """Without its leading "/" the metrics were served nowhere, and the agent said nothing."""
    result = invoke(*command_args(command, tmp_path, refused_kubeconfig), "--metrics-path", path)
    assert 'starting with "/"' in assert_one_line_error(result, "--metrics-path", path)


@pytest.mark.parametrize("command", LISTEN_COMMANDS)
def test_a_port_in_use_is_reported_before_anything_starts(command: str, tmp_path: Path, refused_kubeconfig: str,
                                                         busy_port: int) -> None:
    address = f"127.0.0.1:{busy_port}"
    result = invoke(*command_args(command, tmp_path, refused_kubeconfig, listen=address))
    assert "in use" in assert_one_line_error(result, "--listen-address", address)


def test_listen_addresses_parse_as_documented() -> None:
    from localpv.httpserver import parse_listen_address

    assert parse_listen_address(":8080") == ("0.0.0.0", 8080)
    assert parse_listen_address("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_listen_address("[::1]:9090") == ("::1", 9090)
    for bad in ("", "8080", ":", "host:", ":65536", "::1:80", "[::1:80", "a b:80", ":+80", ":٣"):
        with pytest.raises(ValueError, match="expected"):
            parse_listen_address(bad)


# ------------------------------------------------------------------ --state-dir


def test_a_state_dir_that_is_a_regular_file_is_refused(tmp_path: Path, refused_kubeconfig: str) -> None:
    state = tmp_path / "state"
    state.write_text("not a directory")
    args = command_args("agent", tmp_path, refused_kubeconfig)
    args[args.index("--state-dir") + 1] = str(state)
    line = assert_one_line_error(invoke(*args), "--state-dir", str(state))
    assert "regular file" in line


def test_a_state_dir_below_a_regular_file_is_refused(tmp_path: Path, refused_kubeconfig: str) -> None:
    (tmp_path / "file").write_text("x")
    args = command_args("agent", tmp_path, refused_kubeconfig)
    args[args.index("--state-dir") + 1] = str(tmp_path / "file" / "state")
    assert_one_line_error(invoke(*args), "--state-dir", "cannot be created")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anyway; the root case is a read-only mount (e2e)")
def test_a_state_dir_without_write_permission_is_refused(tmp_path: Path, refused_kubeconfig: str) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o555)
    args = command_args("agent", tmp_path, refused_kubeconfig)
    assert "not writable" in assert_one_line_error(invoke(*args), "--state-dir")


def test_state_dir_check_creates_a_missing_directory_and_leaves_nothing_behind(tmp_path: Path) -> None:
    from localpv.cli.agent import state_dir_problem

    state = tmp_path / "a" / "b"
    assert state_dir_problem(str(state)) is None
    assert state.is_dir() and list(state.iterdir()) == []


# ------------------------------------------------------------------ --node


@pytest.mark.parametrize(("node", "word"), [
    ("", "empty"),
    ("Node_1", "DNS-1123 subdomain"),
    ("-n1", "DNS-1123 subdomain"),
    ("n" * 254, "254 characters"),
], ids=["empty", "underscore", "leading-dash", "too-long"])
@pytest.mark.parametrize("source", ["flag", "env"])
def test_an_invalid_node_name_is_refused_by_discover(node: str, word: str, source: str) -> None:
    args = ["discover", "--dry-run", "--config", CONFIG]
    result = invoke(*args, "--node", node) if source == "flag" else invoke(*args, env={"MY_NODE_NAME": node})
    line = assert_one_line_error(result, "--node" if source == "flag" else "MY_NODE_NAME")
    assert word in line


def test_an_invalid_node_name_is_refused_by_doctor() -> None:
    result = invoke("doctor", "--config", CONFIG, "--node", "Bad_Node", "--kubeconfig", "/nonexistent", "--on-host")
    assert_one_line_error(result, "--node", "Bad_Node")


def test_node_names_that_kubernetes_accepts_pass() -> None:
    from localpv.naming import node_name_problem

    for ok in ("n1", "node-1.example.com", "a", "1", "x" * 253, "ip-10-0-0-1.ec2.internal"):
        assert node_name_problem(ok) is None, ok


@pytest.mark.parametrize("namespace", ["", "Bad_NS", "a.b", "x" * 64], ids=["empty", "underscore", "dot", "too-long"])
def test_an_invalid_namespace_is_refused(namespace: str, tmp_path: Path, refused_kubeconfig: str) -> None:
    args = command_args("agent", tmp_path, refused_kubeconfig)
    assert_one_line_error(invoke(*args, "--namespace", namespace), "--namespace")


# ------------------------------------------------------------------ deep configuration values


def deep_lists(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_config_check_of_a_2000_deep_value_names_the_key_in_the_real_process(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text(f"labelsForPV: {deep_lists(2000)}\n")
    line = assert_process_one_line_error(run_localpv("config", "check", str(path)), "labelsForPV")
    assert "levels" in line


@pytest.mark.parametrize("text", [
    f"labelsForPV: {deep_lists(2000)}\n",
    "labelsForPV: " + "{a: " * 2000 + "b" + "}" * 2000 + "\n",
    "labelsForPV:\n" + "".join("  " * i + "- \n" for i in range(1, 400)),
], ids=["flow-lists", "flow-mappings", "block-lists"])
def test_load_config_raises_config_error_for_deep_values(tmp_path: Path, text: str) -> None:
    from localpv.config import ConfigError, load_config

    path = tmp_path / "deep.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert any("labelsForPV" in p and "levels" in p for p in caught.value.problems), caught.value.problems


def test_deep_values_built_with_aliases_or_cycles_are_config_errors_too(tmp_path: Path) -> None:
    from localpv.config import ConfigError, load_config

    lines = ["a0: &a0 []"] + [f"a{i}: &a{i} [[[[*a{i - 1}]]]]" for i in range(1, 600)]
    chained, cyclic = tmp_path / "chained.yaml", tmp_path / "cyclic.yaml"
    chained.write_text("\n".join(lines) + "\nlabelsForPV: *a599\n")
    cyclic.write_text("labelsForPV: &x [*x]\n")
    for path in (chained, cyclic):
        with pytest.raises(ConfigError):
            load_config(path)


def test_a_deep_value_in_a_mounted_configmap_directory_names_the_key(tmp_path: Path) -> None:
    from localpv.config import ConfigError, load_config

    (tmp_path / "labelsForPV").write_text(deep_lists(2000))
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path)
    assert caught.value.problems[0].startswith("labelsForPV")


def test_a_config_reload_thread_gets_a_config_error_not_a_dead_thread(tmp_path: Path) -> None:
    """The agent re-reads its ConfigMap in a thread that keeps the last good config on ConfigError."""
    from localpv.config import ConfigError, load_config

    path = tmp_path / "deep.yaml"
    path.write_text(f"labelsForPV: {deep_lists(2000)}\n")
    raised: list[BaseException] = []

    def reload() -> None:
        try:
            load_config(path)
        except BaseException as err:  # the test wants to see exactly what escaped
            raised.append(err)

    thread = threading.Thread(target=reload)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert len(raised) == 1 and isinstance(raised[0], ConfigError), raised


def test_ordinary_nesting_still_loads(tmp_path: Path) -> None:
    from localpv.config import load_config

    path = tmp_path / "ok.yaml"
    path.write_text("labelsForPV: {a: b}\nstorageClassMap:\n  fast:\n    hostDir: /mnt/fast\n"
                    "    mountDir: /mnt/fast\n")
    assert load_config(path).config.labels_for_pv == {"a": "b"}


# ------------------------------------------------------------------ other commands


@pytest.mark.parametrize(("url", "word"), [
    ("garbage", "http"),
    ("ftp://x", "http"),
    ("http://", "host"),
    ("http://127.0.0.1:99999", "port"),
    ("http://[::1", "URL"),
])
def test_status_refuses_an_agent_url_that_is_no_url(url: str, word: str) -> None:
    assert word in assert_one_line_error(invoke("status", "--agent-url", url), "--agent-url")


@pytest.mark.parametrize("volumes", ["0", "-1", "100000"])
def test_demo_volumes_must_be_in_range(volumes: str) -> None:
    # --simulate-mounts and a short --timeout keep a regression cheap: no mounts, no long wait.
    result = invoke("demo", "--volumes", volumes, "--simulate-mounts", "--timeout", "1")
    assert_one_line_error(result, "--volumes")


@pytest.mark.parametrize("timeout", ["-1", "0", "nan", "inf", "1e400"])
def test_demo_timeout_must_be_positive_and_finite(timeout: str) -> None:
    result = invoke("demo", "--volumes", "1", "--simulate-mounts", "--timeout", timeout)
    assert_one_line_error(result, "--timeout")


@pytest.mark.parametrize("value", ["0s", "-5s", "soon", "99999999999999999999h"])
def test_durations_are_positive_and_representable(value: str) -> None:
    result = invoke("cleanup", "--device", "/dev/nonexistent-localpv", "--timeout", value)
    assert_one_line_error(result, "--timeout")


def test_usage_errors_are_one_line() -> None:
    assert_one_line_error(invoke("cleanup", "--device", "/dev/x", "--bogus"), "--bogus")
    assert_one_line_error(invoke("agent", "--config", CONFIG), "--node")
    assert_one_line_error(invoke("no-such-command"), "no-such-command")
    assert_one_line_error(invoke("node-cleanup", "--worker-threads", "0"), "--worker-threads")
    assert_one_line_error(invoke("node-cleanup", "--csi-driver-name", "Local_Driver"), "--csi-driver-name")


def test_a_deep_config_given_to_cleanup_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text(f"labelsForPV: {deep_lists(2000)}\n")
    (tmp_path / "vol").mkdir()
    result = invoke("cleanup", "--dir", str(tmp_path / "vol"), "--config", str(path))
    assert_one_line_error(result, "labelsForPV")


def test_a_cleaner_command_with_an_open_quote_is_one_line() -> None:
    result = invoke("cleanup", "--device", "/dev/nonexistent-localpv", "--command", "'unterminated")
    assert "quotes" in assert_one_line_error(result, "--command")
