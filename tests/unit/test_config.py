"""Configuration: upstream's ConfigMap format, strict and explanatory."""

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localpv.config import (
    CLASS_KEYS,
    TOP_LEVEL_KEYS,
    ClassConfig,
    ConfigError,
    ProvisionerConfig,
    RuntimeEnv,
    config_to_data,
    format_go_duration,
    load_config,
    parse_config,
    parse_go_duration,
    reference_markdown,
)

EXAMPLES = Path(__file__).parents[2] / "examples"


def write_configmap_dir(root: Path, data: dict[str, str]) -> Path:
    """Lay out a directory exactly as the kubelet mounts a ConfigMap volume."""
    stamp = root / "..2026_11_21_10_00_00.123"
    stamp.mkdir(parents=True)
    for key, value in data.items():
        (stamp / key).write_text(value)
    (root / "..data").symlink_to(stamp.name)
    for key in data:
        (root / key).symlink_to(f"..data/{key}")
    return root


def test_mounted_configmap_directory_is_read(tmp_path: Path) -> None:
    root = write_configmap_dir(
        tmp_path / "cfg",
        {
            "storageClassMap": "fast:\n   hostDir: /mnt/fast\n   mountDir: /mnt/fast\n   volumeMode: Block\n",
            "useJobForCleaning": "yes",
            "minResyncPeriod": "1h30m",
        },
    )
    cfg = load_config(root).config
    assert cfg.use_job_for_cleaning is True
    assert cfg.min_resync_period == 5400
    fast = cfg.classes["fast"]
    assert (fast.host_dir, fast.mount_dir, fast.volume_mode) == ("/mnt/fast", "/mnt/fast", "Block")


def test_class_defaults_match_upstream() -> None:
    cfg = parse_config({"storageClassMap": {"sc": {"hostDir": "/a", "mountDir": "/b"}}}).config
    cls = cfg.classes["sc"]
    assert cls.block_cleaner_command == ("/scripts/quick_reset.sh",)
    assert cls.volume_mode == "Filesystem"
    assert cls.access_mode == "ReadWriteOnce"
    assert cls.name_pattern.matches("anything")
    assert cls.fs_type is None
    assert cfg.min_resync_period == 300
    assert cfg.use_node_name_only is False


def test_empty_config_discovers_nothing() -> None:
    assert parse_config({}).config.classes == {}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"storageClassMap": {"fast-disks": {"hostDir": "/a", "mountDir": "/a", "volumeMode": "block"}}},
         'storageClassMap.fast-disks.volumeMode: expected "Filesystem" or "Block", got "block"'),
        ({"storageClassMap": {"sc": {"hostDir": "/a"}}}, "storageClassMap.sc.mountDir: required, got nothing"),
        ({"storageClassMap": {"sc": {"hostDir": "a", "mountDir": "/a"}}},
         'storageClassMap.sc.hostDir: expected an absolute path, got "a"'),
        ({"storageClassMap": {"sc": {"hostDir": "/a", "mountDir": "/a", "blockCleanerCommand": []}}},
         "storageClassMap.sc.blockCleanerCommand: expected a command (a non-empty list), got an empty list"),
        ({"storageClassMap": {"sc": {"hostDir": "/a", "mountDir": "/a", "namePattern": "sd[a"}}},
         "storageClassMap.sc.namePattern: invalid glob"),
        ({"storageClassMap": {"sc": {"hostDir": "/a", "mountDir": "/a", "accessMode": "RWO"}}},
         'storageClassMap.sc.accessMode: expected one of ReadWriteOnce, ReadOnlyMany, ReadWriteMany, '
         'ReadWriteOncePod, got "RWO"'),
        ({"storageClassMap": {"sc": "oops"}}, 'storageClassMap.sc: expected a mapping with hostDir and mountDir'),
        ({"storageClassMap": ["a"]}, "storageClassMap: expected a mapping of storage class name"),
        ({"useJobForCleaning": "maybe"}, 'useJobForCleaning: expected a boolean (true/false, yes/no), got "maybe"'),
        ({"minResyncPeriod": "5 minutes"}, 'minResyncPeriod: invalid duration "5 minutes"'),
        ({"minResyncPeriod": "0s"}, 'minResyncPeriod: expected a positive duration, got "0s"'),
        ({"labelsForPV": ["a"]}, "labelsForPV: expected a mapping of strings, got a list of 1 items"),
        ({"nodeLabelsForPV": "zone"}, 'nodeLabelsForPV: expected a list of strings, got "zone"'),
        ({"cleanupWorkers": 0}, "cleanupWorkers: expected a positive integer, got number 0"),
        ({"jobTolerations": [{"operator": "Like"}]},
         'jobTolerations[0].operator: expected "Exists" or "Equal", got "Like"'),
        ({"storageClassMap": {"sc": {"hostDir": "/a", "mountDir": "/a",
                                     "selector": [{"matchExpressions": [{"key": "k", "operator": "In"}]}]}}},
         "storageClassMap.sc.selector[0].matchExpressions[0].values: operator In needs at least one value"),
    ],
)
def test_errors_name_the_key_class_expectation_and_value(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert any(p.startswith(message) for p in err.value.problems), err.value.problems


def test_all_problems_are_reported_at_once() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"useAlphaAPI": 3, "storageClassMap": {"a": {"hostDir": "/x"}, "b": {"mountDir": "/y"}}})
    assert len(err.value.problems) == 3


def test_unknown_keys_warn_with_a_suggestion() -> None:
    loaded = parse_config(
        {"useJobForCleanin": True, "storageClassMap": {"sc": {"hostDir": "/a", "mountDir": "/a", "hostdir": "/b"}}}
    )
    assert 'useJobForCleanin: unknown key, ignored (did you mean "useJobForCleaning"?)' in loaded.warnings
    assert 'storageClassMap.sc.hostdir: unknown key, ignored (did you mean "hostDir"?)' in loaded.warnings


def test_typo_warnings_travel_with_errors() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"storageClassMap": {"sc": {"hostDir": "/a", "mountdir": "/a"}}})
    assert any("mountdir" in w for w in err.value.warnings)


@pytest.mark.parametrize(("text", "value"), [("yes", True), ("on", True), ("no", False), ("off", False),
                                             ("true", True), ("False", False)])
def test_yaml11_booleans_are_accepted(tmp_path: Path, text: str, value: bool) -> None:
    (tmp_path / "setPVOwnerRef").write_text(text)
    assert load_config(tmp_path).config.set_pv_owner_ref is value


def test_quoted_yaml_booleans_in_a_file_are_accepted(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text('useNodeNameOnly: "true"\n')
    assert load_config(f).config.use_node_name_only is True


def test_each_load_builds_fresh_objects(tmp_path: Path) -> None:
    f = tmp_path / "storageClassMap"
    f.write_text("a:\n  hostDir: /a\n  mountDir: /a\nb:\n  hostDir: /b\n  mountDir: /b\n")
    first = load_config(tmp_path).config
    f.write_text("a:\n  hostDir: /a\n  mountDir: /a\n")
    second = load_config(tmp_path).config
    assert set(first.classes) == {"a", "b"}
    assert set(second.classes) == {"a"}
    assert first != second


def test_configs_compare_by_value() -> None:
    data = {"storageClassMap": {"a": {"hostDir": "/a", "mountDir": "/a", "namePattern": "x*"}}}
    assert parse_config(data).config == parse_config(data).config


def test_configmap_manifest_file_is_accepted() -> None:
    cfg = load_config(EXAMPLES / "configmap-jobs.yaml").config
    assert cfg.use_job_for_cleaning is True
    assert cfg.set_pv_owner_ref is True
    assert cfg.labels_for_pv == {"tier": "fast"}
    assert cfg.job_tolerations[0]["key"] == "dedicated"
    assert cfg.classes["nvme"].block_cleaner_command == ("/scripts/blkdiscard.sh",)


def test_shipped_example_directory_is_valid() -> None:
    loaded = load_config(EXAMPLES / "config")
    assert loaded.warnings == ()
    assert set(loaded.config.classes) == {"local-storage", "fast-disks"}


def test_invalid_yaml_names_the_key_and_line(tmp_path: Path) -> None:
    (tmp_path / "storageClassMap").write_text("a:\n  hostDir: [\n")
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path)
    assert err.value.problems[0].startswith("storageClassMap: not valid YAML (line")


def test_a_key_that_is_not_valid_yaml_does_not_hide_the_problems_of_the_others(tmp_path: Path) -> None:
    """`config check` reports every problem at once: one unreadable key is no reason to stay
    silent about the rest (issue 19)."""
    (tmp_path / "storageClassMap").write_text("a:\n  hostDir: [\n")
    (tmp_path / "useAlphaAPI").write_text("maybe\n")
    (tmp_path / "minResyncPeriod").write_text("five minutes\n")
    (tmp_path / "mountdir").write_text("/x\n")
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path)
    problems = err.value.problems
    assert problems[0].startswith("storageClassMap: not valid YAML (line")
    assert any(p.startswith("useAlphaAPI: expected a boolean") for p in problems), problems
    assert any(p.startswith("minResyncPeriod:") for p in problems), problems
    assert len(problems) == 3, "nothing is said about the unreadable key beyond that it is unreadable"
    assert any("mountdir" in w for w in err.value.warnings)


def test_shared_host_dir_warns() -> None:
    loaded = parse_config({"storageClassMap": {"a": {"hostDir": "/d", "mountDir": "/d"},
                                               "b": {"hostDir": "/d", "mountDir": "/d"}}})
    assert any("same directory as class a" in w for w in loaded.warnings)


def test_selector_terms_are_kept() -> None:
    term = {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]}]}
    cfg = parse_config({"storageClassMap": {"a": {"hostDir": "/d", "mountDir": "/d", "selector": [term]}}}).config
    assert cfg.classes["a"].selector == (term,)


@pytest.mark.parametrize(("text", "seconds"), [("5m0s", 300), ("1h30m", 5400), ("250ms", 0.25), ("90s", 90),
                                                ("1.5h", 5400), ("0", 0)])
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(("seconds", "text"), [(300, "5m0s"), (0.5, "500ms"), (90.25, "1m30.25s"), (0, "0s"),
                                                (3600, "1h0m0s"), (1.5, "1.5s"), (1.5e-6, "1.5µs"), (2e-9, "2ns")])
def test_go_durations_are_printed_as_go_prints_them(seconds: float, text: str) -> None:
    """Go's Duration.String; half a second printed "0s" before."""
    assert format_go_duration(seconds) == text
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["", "5", "5x", "m5", "5m 0s"])
def test_bad_go_durations(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_go_duration(bad)


def test_effective_config_round_trips() -> None:
    data = {"storageClassMap": {"a": {"hostDir": "/a", "mountDir": "/m", "volumeMode": "Block",
                                      "namePattern": "sd*"}}, "useJobForCleaning": True}
    first = parse_config(data).config
    assert parse_config(config_to_data(first)).config == first


def test_container_path_maps_only_direct_children() -> None:
    cls = ClassConfig(name="a", host_dir="/mnt/disks", mount_dir="/discovery")
    assert cls.container_path("/mnt/disks/vol1") == "/discovery/vol1"
    assert cls.container_path("/mnt/disks/sub/vol1") is None
    assert cls.container_path("/mnt/other/vol1") is None
    assert cls.container_path("/mnt/disks/..") is None


def test_runtime_env_defaults_like_upstream() -> None:
    env = RuntimeEnv.from_environ({"MY_NODE_NAME": "n1"})
    assert (env.node_name, env.namespace, env.job_image, env.kubeconfig) == ("n1", "default", None, None)


def test_reference_lists_every_key() -> None:
    text = reference_markdown()
    for key in ("storageClassMap", "useJobForCleaning", "hostDir", "blockCleanerCommand", "cleanupWorkers"):
        assert f"`{key}`" in text


_huge = st.sampled_from(["x" * 100_000, "/" + "d/" * 20_000, 10**100, -(10**50), 1e308])
_scalar = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20), _huge)
_value = st.recursive(_scalar, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner,
                                                                                          max_size=3), max_leaves=8)
_keys = st.sampled_from([*TOP_LEVEL_KEYS, "bogus"])
_class_entry = st.dictionaries(st.sampled_from([*CLASS_KEYS, "hostdir"]), _value, max_size=5)
_data = st.dictionaries(_keys, _value, max_size=4) | st.fixed_dictionaries(
    {"storageClassMap": st.dictionaries(st.text(min_size=1, max_size=10), _class_entry, max_size=3)})


@settings(max_examples=400, deadline=None)  # timing varies with the machine's load; the property is what counts
@given(_data)
def test_arbitrary_input_gives_a_config_or_a_clear_error(data: dict[str, object]) -> None:
    try:
        result = parse_config(data)
    except ConfigError as err:
        assert err.problems
        assert all(": " in p for p in err.problems)
    else:
        assert isinstance(result.config, ProvisionerConfig)


# ---------------------------------------------------------------- discovery directories (issue 11, finding 4)


def _class_error(host_dir: str, mount_dir: str = "/mnt/disks", **extra: object) -> list[str]:
    """The problems parse_config reports for one class (empty when it is accepted)."""
    try:
        parse_config({"storageClassMap": {"sc": {"hostDir": host_dir, "mountDir": mount_dir, **extra}}})
    except ConfigError as err:
        return err.problems
    return []


@pytest.mark.parametrize(
    ("host_dir", "mount_dir", "message"),
    [
        # The finding itself: both spell "/" and passed, because "/" was checked before normalising.
        ("/.", "/mnt/disks", 'storageClassMap.sc.hostDir: expected a dedicated discovery directory, not "/", '
                             'got "/." (which is "/")'),
        ("/mnt/disks", "/tmp/..", 'storageClassMap.sc.mountDir: expected a path without ".." components, '
                                  'got "/tmp/.."'),
        ("//", "/mnt/disks", 'storageClassMap.sc.hostDir: expected a dedicated discovery directory, not "/", '
                             'got "//" (which is "/")'),
        ("/././/", "/mnt/disks", 'storageClassMap.sc.hostDir: expected a dedicated discovery directory, not "/"'),
        ("//proc", "/mnt/disks", 'storageClassMap.sc.hostDir: expected a directory outside /proc (a system '
                                 'directory), got "//proc" (which is "/proc")'),
        ("/mnt/disks", "/./sys/", 'storageClassMap.sc.mountDir: expected a directory outside /sys'),
        ("/mnt/../etc", "/mnt/disks", 'storageClassMap.sc.hostDir: expected a path without ".." components'),
        ("/mnt/disks/..", "/mnt/disks", 'storageClassMap.sc.hostDir: expected a path without ".." components'),
        ("/mnt/a\0b", "/mnt/disks", 'storageClassMap.sc.hostDir: expected a path without control characters, '
                                    'got "/mnt/a\\x00b"'),
        ("/mnt/a\nb", "/mnt/disks", 'storageClassMap.sc.hostDir: expected a path without control characters'),
        ("mnt/disks", "/mnt/disks", 'storageClassMap.sc.hostDir: expected an absolute path, got "mnt/disks"'),
        ("./mnt", "/mnt/disks", 'storageClassMap.sc.hostDir: expected an absolute path'),
    ],
)
def test_discovery_dirs_are_normalised_before_any_check(host_dir: str, mount_dir: str, message: str) -> None:
    problems = _class_error(host_dir, mount_dir)
    assert any(p.startswith(message) for p in problems), problems


SYSTEM_DIRS = [
    "/proc", "/proc/1/root", "/sys", "/sys/fs/cgroup", "/etc", "/etc/kubernetes", "/usr", "/usr/local/disks",
    "/bin", "/sbin", "/lib", "/lib64", "/boot", "/boot/efi", "/run", "/run/user", "/var/run/disks",
    "/var/lib/kubelet", "/var/lib/kubelet/pods", "/var/lib/containerd", "/var/lib/docker/volumes",
    "/var/lib/containers", "/var/lib/etcd",
    # Never the directory itself, whose entries are system mounts (/dev/shm, /var/log, /home/<user>).
    "/dev", "/var", "/var/lib", "/home", "/root",
]


@pytest.mark.parametrize("key", ["hostDir", "mountDir"])
@pytest.mark.parametrize("path", SYSTEM_DIRS)
def test_system_directories_are_refused(key: str, path: str) -> None:
    dirs = {"hostDir": "/mnt/disks", "mountDir": "/mnt/disks", key: path}
    problems = _class_error(dirs["hostDir"], dirs["mountDir"])
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"storageClassMap.sc.{key}: expected "), problems
    assert problems[0].endswith(f'got "{path}"'), problems


@pytest.mark.parametrize("mode", ["Filesystem", "Block"])
@pytest.mark.parametrize("path", [
    "/mnt", "/mnt/disks", "/mnt/fast-disks", "/srv", "/srv/disks", "/var/lib/localpv-disks", "/data",
    "/tmp/localpv-e2e", "/home/disks", "/opt/local-disks", "/media/disks",
    # Only whole path components count: these merely share a prefix with a system directory.
    "/var/lib/kubelet-disks", "/procfs-disks", "/devices", "/etc2", "/runner/disks", "/varlib",
    # A dedicated directory inside /dev (by-id links, udev-made links), not /dev itself.
    "/dev/disk/by-id", "/dev/disk/kubernetes",
])
def test_dedicated_directories_are_accepted(path: str, mode: str) -> None:
    assert _class_error(path, path, volumeMode=mode, namePattern="nvme-*") == []


def test_the_normalised_paths_are_what_the_config_holds() -> None:
    cfg = parse_config({"storageClassMap": {"sc": {"hostDir": "//mnt//disks/./", "mountDir": "/disc/"}}}).config
    cls = cfg.classes["sc"]
    assert (cls.host_dir, cls.mount_dir) == ("/mnt/disks", "/disc")
    assert config_to_data(cfg)["storageClassMap"]["sc"]["hostDir"] == "/mnt/disks"
    assert cls.container_path("/mnt/disks/vol1") == "/disc/vol1"


def test_a_device_directory_without_a_name_pattern_warns() -> None:
    """/dev/disk/by-id lists every disk of the node, the system disk too."""
    loaded = parse_config({"storageClassMap": {"sc": {"hostDir": "/dev/disk/by-id", "mountDir": "/dev/disk/by-id",
                                                      "volumeMode": "Block"}}})
    assert any(w.startswith("storageClassMap.sc.hostDir: ") and "namePattern" in w for w in loaded.warnings), \
        loaded.warnings
    picked = parse_config({"storageClassMap": {"sc": {"hostDir": "/dev/disk/by-id", "mountDir": "/dev/disk/by-id",
                                                      "namePattern": "nvme-Amazon_EC2_NVMe_Instance_Storage_*"}}})
    assert picked.warnings == ()


def test_config_check_refuses_a_root_discovery_dir(tmp_path: Path) -> None:
    """`localpv config check` exits 2 naming the key, not 0 (the finding's reproduction)."""
    from click.testing import CliRunner

    from localpv.cli import cli

    (tmp_path / "storageClassMap").write_text("sc:\n  hostDir: /.\n  mountDir: /tmp/..\n")
    result = CliRunner().invoke(cli, ["config", "check", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "storageClassMap.sc.hostDir: expected a dedicated discovery directory" in result.output
    assert "storageClassMap.sc.mountDir: expected a path without" in result.output


def test_a_host_dir_inside_another_class_host_dir_warns() -> None:
    loaded = parse_config({"storageClassMap": {"outer": {"hostDir": "/mnt/disks", "mountDir": "/mnt/disks"},
                                               "inner": {"hostDir": "/mnt/disks/fast/", "mountDir": "/fast"},
                                               "sibling": {"hostDir": "/mnt/disks-fast", "mountDir": "/x"}}})
    assert loaded.warnings == ("storageClassMap.inner.hostDir: inside the hostDir of class outer (/mnt/disks); "
                               "class outer offers /mnt/disks/fast as one volume once it is a mount point",)


def test_spellings_of_one_host_dir_are_one_directory() -> None:
    loaded = parse_config({"storageClassMap": {"a": {"hostDir": "/mnt/disks", "mountDir": "/a"},
                                               "b": {"hostDir": "/mnt//disks/", "mountDir": "/b"}}})
    assert any(w.startswith("storageClassMap.b.hostDir: same directory as class a") for w in loaded.warnings)
