"""The ConfigMap keys of dynamic volumes: one line per problem, naming key, expectation and finding."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localpv.config import ConfigError, config_to_data, parse_config


def problems(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    return err.value.problems


def test_a_good_configuration_with_defaults() -> None:
    loaded = parse_config({"dynamicPools": {"fast": {"hostDir": "/mnt/fast/", "overcommit": "1.5"}},
                           "dynamicClassMap": {"local-dynamic": {"pool": "fast", "mkfsOptions": "-m 0"}}})
    pool = loaded.config.dynamic_pools["fast"]
    assert (pool.host_dir, pool.mount_dir, pool.require_mount, pool.overcommit, pool.reserved) == \
        ("/mnt/fast", "/mnt/fast", True, 1.5, 0)
    cls = loaded.config.dynamic_classes["local-dynamic"]
    assert (cls.pool, cls.fs_type, cls.provisioning, cls.mkfs_options) == ("fast", "ext4", "thin", "-m 0")
    assert loaded.config.csi_driver_name == "local.csi.localpv.dev"
    data = config_to_data(loaded.config)
    assert data["dynamicPools"]["fast"]["overcommit"] == 1.5
    assert parse_config(data).config == loaded.config


@pytest.mark.parametrize(("data", "expected"), [
    ({"dynamicPools": {"fast": {"hostDir": "/var/lib/kubelet/x"}}},
     "dynamicPools.fast.hostDir: expected a directory outside /var/lib/kubelet"),
    ({"dynamicPools": {"fast": {}}}, "dynamicPools.fast.hostDir: required, got nothing"),
    ({"dynamicPools": {"Fast": {"hostDir": "/mnt/f"}}}, "dynamicPools.Fast: expected a DNS-1123 label"),
    ({"dynamicPools": {"fast": {"hostDir": "/mnt/f", "overcommit": 0.5}}},
     "dynamicPools.fast.overcommit: expected a number from 1 to 100"),
    ({"dynamicPools": {"fast": {"hostDir": "/mnt/f", "reserved": "lots"}}},
     'dynamicPools.fast.reserved: expected a quantity of bytes such as "1Gi"'),
    ({"dynamicPools": {"fast": {"hostDir": "/mnt/f"}}, "dynamicClassMap": {"d": {"pool": "slow"}}},
     'dynamicClassMap.d.pool: expected a pool of dynamicPools (fast), got "slow"'),
    ({"dynamicPools": {"fast": {"hostDir": "/mnt/f"}}, "dynamicClassMap": {"d": {"pool": "fast", "fsType": "btrfs"}}},
     'dynamicClassMap.d.fsType: expected one of ext4, xfs, got "btrfs"'),
    ({"dynamicPools": {"fast": {"hostDir": "/mnt/f"}},
      "dynamicClassMap": {"d": {"pool": "fast", "provisioning": "thik"}}},
     'dynamicClassMap.d.provisioning: expected one of thin, thick, got "thik"'),
    ({"dynamicPools": {"fast": {"hostDir": "/mnt/f"}},
      "dynamicClassMap": {"d": {"pool": "fast", "mkfsOptions": "-m 0 /dev/sda"}}},
     "dynamicClassMap.d.mkfsOptions: expected options only"),
    ({"csiDriverName": "Local_CSI"}, "csiDriverName: expected a CSI driver name"),
    ({"storageClassMap": {"s": {"hostDir": "/mnt/disks", "mountDir": "/mnt/disks"}},
      "dynamicPools": {"fast": {"hostDir": "/mnt/disks/pool"}}},
     "dynamicPools.fast.hostDir: expected a directory apart from every static class's, got /mnt/disks/pool, inside "
     "storageClassMap.s.hostDir (/mnt/disks)"),
    ({"storageClassMap": {"s": {"hostDir": "/mnt/disks", "mountDir": "/mnt/disks"}},
      "dynamicPools": {"fast": {"hostDir": "/mnt/f"}}, "dynamicClassMap": {"s": {"pool": "fast"}}},
     "dynamicClassMap.s: expected a StorageClass that storageClassMap does not also name"),
])
def test_each_problem_is_one_line_naming_the_key(data: dict[str, Any], expected: str) -> None:
    found = problems(data)
    assert any(p.startswith(expected) for p in found), found
    assert all("\n" not in p for p in found)


def test_typos_are_warnings_with_a_hint() -> None:
    loaded = parse_config({"dynamicPools": {"fast": {"hostDir": "/mnt/f", "overcomit": 2}}})
    assert any('dynamicPools.fast.overcomit: unknown key, ignored (did you mean "overcommit"?)' in w
               for w in loaded.warnings)


# ---------------------------------------------------------------- two pools on one directory (issue 23)

def _pools(*dirs: str | tuple[str, str]) -> dict[str, Any]:
    """Pools a, b, c... over the given hostDirs (or (hostDir, mountDir) pairs)."""
    pools: dict[str, Any] = {}
    for name, spec in zip("abcdef", dirs, strict=False):
        host, mount = spec if isinstance(spec, tuple) else (spec, None)
        pools[name] = {"hostDir": host, **({"mountDir": mount} if mount else {})}
    return {"dynamicPools": pools}


@pytest.mark.parametrize(("dirs", "expected"), [
    (("/mnt/fast", "/mnt/fast"), "dynamicPools.b.hostDir: expected a directory apart from every other pool's, "
                                 "got /mnt/fast, the same directory as dynamicPools.a.hostDir (/mnt/fast)"),
    (("/mnt/fast", "/mnt/fast/"), "the same directory as dynamicPools.a.hostDir"),
    (("/mnt/fast", "//mnt//fast"), "the same directory as dynamicPools.a.hostDir"),
    (("/mnt/fast", "/mnt/./fast/."), "the same directory as dynamicPools.a.hostDir"),
    (("/mnt/fast", "/mnt/fast/inner"), "got /mnt/fast/inner, inside dynamicPools.a.hostDir (/mnt/fast)"),
    (("/mnt/fast/inner", "/mnt/fast"), "got /mnt/fast, containing dynamicPools.a.hostDir (/mnt/fast/inner)"),
    (("/mnt/fast", ("/mnt/slow", "/mnt/fast")),
     "dynamicPools.b.mountDir: expected a directory apart from every other pool's, got /mnt/fast, the same "
     "directory as dynamicPools.a.mountDir (/mnt/fast)"),
])
def test_two_pools_on_one_directory_are_one_line_naming_both(dirs: tuple[str, ...], expected: str) -> None:
    found = problems(_pools(*dirs))
    assert [p for p in found if expected in p], found
    assert len(found) == 1, found


def test_a_dot_dot_spelling_of_another_pool_is_refused_as_it_is_written() -> None:
    found = problems(_pools("/mnt/fast", "/mnt/x/../fast"))
    assert found == ['dynamicPools.b.hostDir: expected a path without ".." components, got "/mnt/x/../fast"'], found


def test_pools_side_by_side_are_fine() -> None:
    pools = parse_config(_pools("/mnt/fast", "/mnt/fast2", "/mnt/slow/a", "/mnt/slow/b")).config.dynamic_pools
    assert sorted(pools) == ["a", "b", "c", "d"]


def test_a_pool_mounted_inside_a_static_class_mount_dir_is_refused() -> None:
    """In the agent's container the pool is a mount point inside the class's directory: the class would
    offer it as a volume, and wipe it on release."""
    found = problems({"storageClassMap": {"s": {"hostDir": "/mnt/disks", "mountDir": "/disks"}},
                      "dynamicPools": {"fast": {"hostDir": "/srv/pool", "mountDir": "/disks/pool"}}})
    assert found == ["dynamicPools.fast.mountDir: expected a directory apart from every static class's, got "
                     "/disks/pool, inside storageClassMap.s.mountDir (/disks) (its images would be offered as "
                     "volumes)"], found


_component = st.text(alphabet="abcxyz09-", min_size=1, max_size=6)


@given(parts=st.lists(_component, min_size=1, max_size=4), data=st.data())
def test_any_spelling_of_one_directory_is_the_same_pool(parts: list[str], data: st.DataObject) -> None:
    """However a pool's directory is spelled (doubled slashes, ``.`` components, a trailing slash), a
    second pool on it is refused naming both keys."""
    seps = data.draw(st.lists(st.sampled_from(["/", "//", "/./"]), min_size=len(parts), max_size=len(parts)))
    spelled = "".join(sep + part for sep, part in zip(seps, parts, strict=True)) + data.draw(
        st.sampled_from(["", "/", "/.", "//"]))
    plain = "/mnt/" + "/".join(parts)
    found = problems(_pools("/mnt/" + "/".join(parts), "/mnt" + spelled))
    assert found == [f"dynamicPools.b.hostDir: expected a directory apart from every other pool's, got {plain}, "
                     f"the same directory as dynamicPools.a.hostDir ({plain}): each pool would count only its own "
                     "images against one disk and take the other's for its own"], found


# ---------------------------------------------------------------- overcommit is bounded (issue 23)

@pytest.mark.parametrize("value", [100.5, 101, "1e300", 1e300, "inf", "nan", float("nan"), 0.99, "0"])
def test_overcommit_beyond_its_bounds_is_one_line(value: object) -> None:
    found = problems({"dynamicPools": {"fast": {"hostDir": "/mnt/f", "overcommit": value}}})
    assert len(found) == 1 and found[0].startswith(
        "dynamicPools.fast.overcommit: expected a number from 1 to 100 (thin images may promise that many times "
        "the pool's size"), found


@pytest.mark.parametrize(("value", "expected"), [(1, 1.0), ("1.5", 1.5), (100, 100.0), ("100", 100.0)])
def test_overcommit_within_its_bounds(value: object, expected: float) -> None:
    pools = parse_config({"dynamicPools": {"fast": {"hostDir": "/mnt/f", "overcommit": value}}}).config.dynamic_pools
    assert pools["fast"].overcommit == expected


# ---------------------------------------------------------------- mkfs options per fsType (issue 23)

@pytest.mark.parametrize(("cls", "expected"), [
    ({"mkfsOptions": "-n"}, 'dynamicClassMap.d.mkfsOptions: expected no -n (a dry run: mke2fs writes nothing'),
    ({"mkfsOptions": "-N 16"}, "dynamicClassMap.d.mkfsOptions: expected -N of at least 1024 inodes"),
    ({"fsType": "xfs", "mkfsOptions": "-N"}, "dynamicClassMap.d.mkfsOptions: expected no -N (a dry run: mkfs.xfs"),
    ({"fsType": "xfs", "mkfsOptions": "-m 0"},
     "dynamicClassMap.d.mkfsOptions: expected -m with mkfs.xfs sub-options (key=value,...), got -m 0"),
    ({"mkfsOptions": "-U 0b1c2d3e-0000-4000-8000-000000000001"},
     "dynamicClassMap.d.mkfsOptions: expected no -U (the filesystem UUID is localpv's"),
    ({"fsType": "xfs", "mkfsOptions": "-m uuid=0b1c2d3e-0000-4000-8000-000000000001"},
     "dynamicClassMap.d.mkfsOptions: expected no -m uuid= (the filesystem UUID is localpv's"),
    ({"provisioning": "thick", "mkfsOptions": "-E discard"},
     "dynamicClassMap.d.mkfsOptions: expected no -E discard in a thick class"),
    ({"mkfsOptions": "-d /var/run/secrets/kubernetes.io/serviceaccount"},
     "dynamicClassMap.d.mkfsOptions: expected no -d (mke2fs would copy that directory"),
])
def test_mkfs_options_that_make_a_bad_volume_are_one_line(cls: dict[str, Any], expected: str) -> None:
    found = problems({"dynamicPools": {"fast": {"hostDir": "/mnt/f"}},
                      "dynamicClassMap": {"d": {"pool": "fast", **cls}}})
    assert len(found) == 1 and found[0].startswith(expected), found


def test_the_same_mkfs_options_may_suit_one_filesystem_and_not_the_other() -> None:
    data = {"dynamicPools": {"fast": {"hostDir": "/mnt/f"}},
            "dynamicClassMap": {"e": {"pool": "fast", "mkfsOptions": "-n"},
                                "x": {"pool": "fast", "fsType": "xfs", "mkfsOptions": "-n size=8192"}}}
    assert problems(data) == ['dynamicClassMap.e.mkfsOptions: expected no -n (a dry run: mke2fs writes nothing, and '
                              'each claim would get an image without a filesystem), got "-n"']


@pytest.mark.parametrize("value", ["100m", "1m", "512m"])
def test_a_reserve_in_milli_bytes_is_refused_pointing_at_mi(value: str) -> None:
    """"m" is milli in a Kubernetes quantity: reserved: 100m (meant as 100 MiB) reserved 1 byte."""
    assert problems({"dynamicPools": {"fast": {"hostDir": "/mnt/f", "reserved": value}}}) == [
        f'dynamicPools.fast.reserved: expected a quantity of bytes such as "1Gi" or "500M" ("m" is milli, a '
        f'thousandth of a byte; mebibytes are "Mi"), got "{value}"']
