"""The ConfigMap keys of dynamic volumes: one line per problem, naming key, expectation and finding."""

from __future__ import annotations

from typing import Any

import pytest

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
     "dynamicPools.fast.overcommit: expected a number of at least 1"),
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
     "dynamicPools.fast.hostDir: expected a directory apart from every static class's hostDir"),
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
