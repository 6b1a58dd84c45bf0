"""Names and quantities must match upstream exactly (research/local-static.md §3)."""

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localpv import naming
from localpv.naming import GiB, MiB


@pytest.mark.parametrize(
    ("entry", "cls", "expected"),
    [
        ("mount1", "sc1", "local-pv-aaaafef5"),
        ("symlink2", "sc1", "local-pv-23645a36"),
        ("symlink1", "sc2", "local-pv-55d5adba"),
        ("symlink2", "sc2", "local-pv-226458a3"),
        ("mount1", "sc2", "local-pv-a7aafa3c"),
    ],
)
def test_pv_names_match_upstream_vectors(entry: str, cls: str, expected: str) -> None:
    assert naming.pv_name(entry, "test-node", cls) == expected


def test_fnv1a_known_values() -> None:
    assert naming.fnv1a_32(b"") == 0x811C9DC5
    assert naming.fnv1a_32(b"a") == 0xE40C292C
    assert naming.fnv1a_32(b"foobar") == 0xBF9CF968


def test_hex_is_not_zero_padded() -> None:
    # Find an input whose hash has a leading zero nibble; upstream prints %x.
    for i in range(10_000):
        name = naming.pv_name(f"e{i}", "n", "c")
        if len(name) < len("local-pv-") + 8:
            assert not name.removeprefix("local-pv-").startswith("0")
            return
    pytest.fail("no short hash found in 10,000 tries")


@given(st.text(max_size=40), st.text(max_size=40), st.text(max_size=40))
def test_pv_name_is_a_valid_short_dns_name(entry: str, node: str, cls: str) -> None:
    name = naming.pv_name(entry, node, cls)
    assert re.fullmatch(r"local-pv-[0-9a-f]{1,8}", name)
    assert name == naming.pv_name(entry, node, cls)


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        (10 * GiB + 5, 10 * GiB),
        (13 * GiB - 1, 12 * GiB),
        (9 * GiB + 999 * MiB, 9 * GiB + 999 * MiB),
        (10000 * MiB - 1, 9999 * MiB),
        (63 * MiB - 10, 62 * MiB),
        (12345, 12345),
        (3 * 1024 * GiB + 2 * GiB + MiB, 3 * 1024 * GiB + 2 * GiB),
    ],
)
def test_capacity_rounding_table(size: int, expected: int) -> None:
    assert naming.round_capacity(size) == expected


@given(st.integers(min_value=0, max_value=2**62))
def test_rounding_never_grows_and_loses_little(size: int) -> None:
    rounded = naming.round_capacity(size)
    assert rounded <= size
    if size >= 10 * MiB:
        assert (size - rounded) / size < 0.1


@pytest.mark.parametrize(
    ("value", "text"),
    [(0, "0"), (12345, "12345"), (1024, "1Ki"), (10 * GiB, "10Gi"), (9999 * MiB, "9999Mi"),
     (3074 * GiB, "3074Gi"), (1025, "1025")],
)
def test_binary_quantity_format(value: int, text: str) -> None:
    assert naming.format_binary_quantity(value) == text
    assert naming.parse_quantity(text) == value


@pytest.mark.parametrize(("text", "value"), [("1G", 10**9), ("1.5Gi", 3 * GiB // 2), ("100m", 1), ("1e3", 1000)])
def test_parse_quantity_decimal_forms(text: str, value: int) -> None:
    assert naming.parse_quantity(text) == value


@pytest.mark.parametrize("bad", ["", "abc", "1Qi", "--1"])
def test_parse_quantity_rejects_garbage(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid quantity"):
        naming.parse_quantity(bad)


@pytest.mark.parametrize(
    ("size", "label"),
    [(0, "0G"), (1, "500G"), (500 * GiB, "500G"), (500 * GiB + 1, "1000G"), (1000 * GiB + 1, "1500G")],
)
def test_capacity_bucket_label(size: int, label: str) -> None:
    assert naming.capacity_bucket(size) == label


def test_provisioner_names() -> None:
    assert naming.provisioner_name("n1", "u1", use_node_name_only=False) == "local-volume-provisioner-n1-u1"
    assert naming.provisioner_name("n1", "u1", use_node_name_only=True) == "local-volume-provisioner-n1"


def test_job_names() -> None:
    assert naming.cleanup_job_name("local-pv-1") == "cleanup-local-pv-1"
    assert re.fullmatch(r"mount-[0-9a-f]{1,8}", naming.job_volume_name("/mnt/a", "/mnt/a"))


_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def test_short_node_names_are_used_verbatim() -> None:
    assert naming.node_label_value("worker-1.example.com") == "worker-1.example.com"


@given(st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", fullmatch=True))
def test_node_label_value_is_always_a_valid_label(node: str) -> None:
    value = naming.node_label_value(node)
    assert len(value) <= 63
    assert _LABEL_VALUE.match(value)


def test_long_node_names_with_same_prefix_differ() -> None:
    a = naming.node_label_value("n" * 80 + "a")
    b = naming.node_label_value("n" * 80 + "b")
    assert a != b
    assert len(a) <= 63
