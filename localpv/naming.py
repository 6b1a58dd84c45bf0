"""Names, hashes and quantities that must match upstream byte for byte.

Everything here is pure. PV names are cluster-global and deterministic so that a
cleaned-and-deleted volume comes back under the same name, and so that a cluster can
swap the upstream local-static-provisioner image for ours without PV churn
(research/local-static.md §3.1, §3.5, §3.10).
"""

from __future__ import annotations

import hashlib
import re

#: Kubernetes name syntax (apimachinery's validation), one copy for the CLI and the config
#: checks: a DNS-1123 label, a DNS-1123 subdomain, and a qualified name's name part (also
#: the syntax of a label value). Use with ``fullmatch``.
DNS1123_LABEL_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1123_SUBDOMAIN_RE = re.compile(rf"{DNS1123_LABEL_RE.pattern}(\.{DNS1123_LABEL_RE.pattern})*")
QUALIFIED_NAME_RE = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")

FNV32_OFFSET = 0x811C9DC5
FNV32_PRIME = 0x01000193

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

PV_NAME_PREFIX = "local-pv-"
PROVISIONER_NAME_PREFIX = "local-volume-provisioner"
#: Our own label on every PV we create or adopt; the agent's informer selects on it.
NODE_LABEL_KEY = "localpv.dev/node"
HOSTNAME_LABEL_KEY = "kubernetes.io/hostname"
PROVISIONED_BY_ANNOTATION = "pv.kubernetes.io/provisioned-by"

_LABEL_VALUE_MAX = 63
_LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def fnv1a_32(data: bytes) -> int:
    """FNV-1a, 32 bit: the hash upstream uses for PV and Job volume names."""
    h = FNV32_OFFSET
    for byte in data:
        h ^= byte
        h = (h * FNV32_PRIME) & 0xFFFFFFFF
    return h


def pv_name(entry: str, node_name: str, class_name: str) -> str:
    """Upstream's deterministic PV name: ``local-pv-`` + unpadded hex FNV-1a of the
    entry's base name, the Node name and the class key, concatenated without separator."""
    digest = fnv1a_32((entry + node_name + class_name).encode("utf-8"))
    return f"{PV_NAME_PREFIX}{digest:x}"


def job_volume_name(host_dir: str, mount_dir: str) -> str:
    """Name of the hostPath volume in a cleanup Job (upstream ``mount-<fnv>``)."""
    return f"mount-{fnv1a_32((host_dir + mount_dir).encode('utf-8')):x}"


def cleanup_job_name(pv: str) -> str:
    """One Job per PV, so creating it twice conflicts: natural mutual exclusion."""
    return f"cleanup-{pv}"


def provisioner_name(node_name: str, node_uid: str, *, use_node_name_only: bool) -> str:
    """Value of ``pv.kubernetes.io/provisioned-by`` for PVs of this node."""
    if use_node_name_only:
        return f"{PROVISIONER_NAME_PREFIX}-{node_name}"
    return f"{PROVISIONER_NAME_PREFIX}-{node_name}-{node_uid}"


def node_label_value(node_name: str) -> str:
    """Our node label value: the node name when it is a valid label value, else a hash.

    Node names may be 253 characters long; label values only 63. A long name keeps a
    readable prefix and gets a sha256 suffix, so two long names sharing a prefix differ.
    """
    if len(node_name) <= _LABEL_VALUE_MAX and _LABEL_VALUE_RE.match(node_name):
        return node_name
    digest = hashlib.sha256(node_name.encode("utf-8")).hexdigest()[:16]
    prefix = re.sub(r"[^-A-Za-z0-9_.]", "", node_name)[:40].rstrip("-_.")
    prefix = prefix.lstrip("-_.")
    return f"{prefix}-{digest}" if prefix else f"h-{digest}"


def round_capacity(size_bytes: int) -> int:
    """Upstream's "pretty" round-down: whole GiB from 10 GiB, whole MiB from 10 MiB."""
    if size_bytes // GiB >= 10:
        return (size_bytes // GiB) * GiB
    if size_bytes // MiB >= 10:
        return (size_bytes // MiB) * MiB
    return size_bytes


_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


def format_binary_quantity(value: int) -> str:
    """Canonical BinarySI form of a byte count, as Kubernetes serialises it (10Gi, 12345)."""
    if value < 0:
        raise ValueError(f"negative quantity {value}")
    exponent = 0
    while value and value % 1024 == 0 and exponent < len(_BINARY_SUFFIXES) - 1:
        value //= 1024
        exponent += 1
    return f"{value}{_BINARY_SUFFIXES[exponent]}"


_QUANTITY_RE = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[a-zA-Z]*)$")
_QUANTITY_FACTORS = {
    "": 1, "Ki": KiB, "Mi": MiB, "Gi": GiB, "Ti": 1024 * GiB, "Pi": 1024**5, "Ei": 1024**6,
    "n": 10**-9, "u": 10**-6, "m": 10**-3, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "P": 10**15, "E": 10**18,
}


def parse_quantity(text: str) -> int:
    """Parse a Kubernetes quantity into whole units (bytes), rounding fractions up."""
    match = _QUANTITY_RE.match(text.strip())
    if not match:
        raise ValueError(f"invalid quantity {text!r}")
    number, suffix = match.groups()
    if suffix[:1] in ("e", "E") and suffix[1:].lstrip("+-").isdigit():
        factor: float = 10 ** int(suffix[1:])
    elif suffix in _QUANTITY_FACTORS:
        factor = _QUANTITY_FACTORS[suffix]
    else:
        raise ValueError(f"invalid quantity suffix in {text!r}")
    from decimal import ROUND_CEILING, Decimal, InvalidOperation

    try:
        exact = Decimal(number) * Decimal(str(factor))
    except InvalidOperation as err:
        raise ValueError(f"invalid quantity {text!r}") from err
    return int(exact.to_integral_value(rounding=ROUND_CEILING))


def capacity_bucket(size_bytes: int) -> str:
    """The ``capacity`` metric label: 500 GiB buckets, rounded up (0 → 0G, 1 B → 500G)."""
    bucket = 500 * GiB
    return f"{-(-size_bytes // bucket) * 500}G"


# --------------------------------------------------------------------------- Kubernetes names, as rules


def lock_name(provisioner_name: str) -> str:
    """The lock object's name for a provisioner name (upstream replaces ``/`` by ``-``)."""
    return provisioner_name.replace("/", "-")


SUBDOMAIN_RULE = 'a DNS-1123 subdomain: lowercase letters, digits, "-" and ".", starting and ending with a ' \
                  "letter or digit, at most 253 characters"


LABEL_RULE = 'a DNS-1123 label: lowercase letters, digits and "-", starting and ending with a letter or ' \
              "digit, at most 63 characters"


def quote(value: str) -> str:
    return '"' + value.encode("unicode_escape").decode("ascii").replace('"', '\\"') + '"'


def _subdomain_problem(value: str, what: str) -> str | None:
    if not value:
        return f"expected {what}, found an empty value"
    if len(value) > 253:
        return f"expected {what} of at most 253 characters, found {len(value)} characters"
    if not DNS1123_SUBDOMAIN_RE.fullmatch(value):
        return f"expected {what} ({SUBDOMAIN_RULE}), found {quote(value)}"
    return None


def node_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a Node (Kubernetes validates Node names as DNS-1123 subdomains)."""
    return _subdomain_problem(name, "a Node name")


def secret_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a Secret (a DNS-1123 subdomain), e.g. an image pull secret."""
    return _subdomain_problem(name, "a Secret name")


def namespace_problem(name: str) -> str | None:
    """Why ``name`` cannot name a namespace (a DNS-1123 label)."""
    if not name:
        return "expected a namespace, found an empty value"
    if len(name) > 63:
        return f"expected a namespace of at most 63 characters, found {len(name)} characters"
    if not DNS1123_LABEL_RE.fullmatch(name):
        return f"expected a namespace ({LABEL_RULE}), found {quote(name)}"
    return None


def provisioner_name_problem(name: str, *, leader_election: bool) -> str | None:
    """Why ``name`` cannot be the NFS provisioner's name, as Kubernetes would say it.

    A StorageClass's ``provisioner`` must be a qualified name once lowercased (an optional
    DNS-1123 subdomain prefix and ``/``, then at most 63 letters, digits, ``-``, ``_`` or ``.``,
    starting and ending with a letter or digit): no class could name anything else. With
    leader election the Lease is named after it (``/`` replaced by ``-``) and a Lease name
    must be a DNS-1123 subdomain: no uppercase, no ``_``. The API server refuses anything
    else with 422, and the elector would retry that forever.
    """
    expected = 'expected a qualified name such as "example.com/nfs" (what StorageClass.provisioner accepts)'
    parts = name.lower().split("/")
    if len(parts) > 2:
        return f'{expected}, found {len(parts) - 1} "/"'
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            return f'{expected}, found an empty prefix before "/"'
        if len(prefix) > 253 or not DNS1123_SUBDOMAIN_RE.fullmatch(prefix):
            return f"{expected}, whose prefix is {SUBDOMAIN_RULE}; found prefix {quote(prefix)}"
    last = parts[-1]
    if not last:
        return f"{expected}, found an empty name part"
    if len(last) > 63:
        return f"{expected}, whose name part has at most 63 characters; found {len(last)} characters"
    if not QUALIFIED_NAME_RE.fullmatch(last):
        return f'{expected}, whose name part has letters, digits, "-", "_" and ".", starting and ending with a ' \
               f"letter or digit; found {quote(name.rsplit('/', maxsplit=1)[-1])}"
    if leader_election:
        lease = lock_name(name)
        if len(lease) > 253 or not DNS1123_SUBDOMAIN_RE.fullmatch(lease):
            found = ("uppercase letters" if lease != lease.lower() else '"_"' if "_" in lease
                     else f"{len(lease)} characters" if len(lease) > 253 else quote(lease))
            return (f"expected a name that can also name the leader election Lease {quote(lease)}, which must be "
                    f"{SUBDOMAIN_RULE}; found {found} (rename it, or disable leader election with "
                    "ENABLE_LEADER_ELECTION=false)")
    return None


CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


def quote_text(text: str) -> str:
    """``"text"`` with control characters escaped, so an error line stays one readable line
    (other characters, non-ASCII letters included, are shown as they are)."""
    return '"' + CONTROL_CHARS.sub(lambda m: f"\\x{ord(m.group()):02x}", text) + '"'


LABEL_KEY_RULE = ('a label key: an optional DNS-1123 subdomain prefix (at most 253 characters) and "/", then a '
                   'name of at most 63 letters, digits, "-", "_" and ".", starting and ending with a letter or digit')


LABEL_VALUE_RULE = ('a label value: empty, or at most 63 letters, digits, "-", "_" and ".", starting and ending '
                     "with a letter or digit")


def label_key_problem(key: str) -> str | None:
    """Why ``key`` cannot be a Kubernetes label key (as the API server validates it), or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not DNS1123_SUBDOMAIN_RE.fullmatch(prefix)):
        return f"expected {LABEL_KEY_RULE}; found prefix {quote_text(prefix)}"
    if not name or len(name) > 63 or not QUALIFIED_NAME_RE.fullmatch(name):
        found = f"a name of {len(name)} characters" if len(name) > 63 else f"name {quote_text(name)}"
        return f"expected {LABEL_KEY_RULE}; found {found}"
    return None


def label_value_problem(value: str) -> str | None:
    """Why ``value`` cannot be a Kubernetes label value, or None."""
    if value and (len(value) > 63 or not QUALIFIED_NAME_RE.fullmatch(value)):
        found = f"{len(value)} characters" if len(value) > 63 else quote_text(value)
        return f"expected {LABEL_VALUE_RULE}; found {found}"
    return None
