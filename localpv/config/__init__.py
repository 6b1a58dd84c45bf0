"""The provisioner configuration: upstream's ConfigMap format, read strictly.

A ConfigMap is mounted as a directory with one file per key (plus Kubernetes'
``..data`` symlink and timestamped dot-directories, which are skipped). Each value is
YAML 1.1, so ``yes``/``on`` are booleans exactly as upstream's ``sigs.k8s.io/yaml``
reads them. A single YAML file works too: either a plain mapping of keys, or a whole
ConfigMap manifest (its ``data`` is used).

Design choices:

* Every load builds fresh, immutable objects; a reload can never keep a removed class
  alive (upstream's reload re-used its maps: research §1.9).
* All problems are collected and reported together, each naming the key path, what was
  expected and what was found. Unknown keys are warnings (typos are the common failure),
  with a "did you mean" hint.
* The keys are declared in one table (:data:`TOP_LEVEL_KEYS`, :data:`CLASS_KEYS`) that
  also generates the configuration reference, so documentation cannot drift.

One module per concern: the model (:mod:`.model`), reading one value (:mod:`.values`),
Kubernetes-shaped values (:mod:`.selectors`), path safety (:mod:`.paths`), the key tables and
:func:`parse_config` (:mod:`.schema`), dynamic volumes' keys (:mod:`.dynamic`), the hardened
YAML loader (:mod:`.yamlload`), where a configuration comes from (:mod:`.sources`), and the
effective configuration and reference (:mod:`.reference`), and one node's configuration once
its ``nodes`` overrides are applied (:mod:`.overrides`, :mod:`.effective`). The Kubernetes name rules are in
:mod:`localpv.naming`, shared with the command line. This package's face is below.
"""

from localpv.config.effective import NodeConfig, for_node, is_uniform
from localpv.config.model import (
    ACCESS_MODES,
    DEFAULT_BLOCK_CLEANER,
    DEFAULT_CONFIG_DIR,
    VOLUME_MODES,
    ClassConfig,
    ConfigError,
    LoadedConfig,
    ProvisionerConfig,
    RuntimeEnv,
    replace,
)
from localpv.config.paths import SYSTEM_DIRS, SYSTEM_TREES, normalise_dir, system_directory_refusal
from localpv.config.reference import config_to_data, reference_markdown
from localpv.config.schema import CLASS_KEYS, TOP_LEVEL_KEYS, parse_config
from localpv.config.sources import MAX_CONFIG_BYTES, load_config, read_config_data, read_config_stream
from localpv.config.values import KeySpec, format_go_duration, parse_go_duration
from localpv.config.yamlload import safe_load_limited

__all__ = [
    "ACCESS_MODES", "CLASS_KEYS", "DEFAULT_BLOCK_CLEANER", "DEFAULT_CONFIG_DIR", "MAX_CONFIG_BYTES", "SYSTEM_DIRS",
    "SYSTEM_TREES", "TOP_LEVEL_KEYS", "VOLUME_MODES", "ClassConfig", "ConfigError", "KeySpec", "LoadedConfig",
    "NodeConfig", "ProvisionerConfig", "RuntimeEnv", "config_to_data", "for_node", "format_go_duration", "is_uniform",
    "load_config", "normalise_dir", "parse_config", "parse_go_duration", "read_config_data", "read_config_stream",
    "reference_markdown", "replace", "safe_load_limited", "system_directory_refusal",
]
