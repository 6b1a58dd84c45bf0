"""namePattern follows Go's filepath.Match, not Python's fnmatch."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localpv.namepattern import BadPatternError, NamePattern, compile_pattern


@pytest.mark.parametrize(
    ("pattern", "name", "matches"),
    [
        ("*", "anything", True),
        ("*", "", True),
        ("vol*", "vol1", True),
        ("vol*", "xvol1", False),
        ("sd?", "sdb", True),
        ("sd?", "sdbb", False),
        ("sd[a-c]", "sdb", True),
        ("sd[a-c]", "sdd", False),
        ("sd[^a-c]", "sdd", True),
        ("sd[^a-c]", "sdb", False),
        ("sd[!a]", "sd!", True),  # '!' is a literal in Go, not a negation
        ("a\\*b", "a*b", True),
        ("a\\*b", "axb", False),
        ("[b-a]", "a", False),  # inverted range: valid, never matches
        ("nvme*,sd*", "sdq", True),
        ("nvme*,sd*", "hda", False),
        ("a.b", "axb", False),
    ],
)
def test_go_glob_semantics(pattern: str, name: str, matches: bool) -> None:
    assert NamePattern(pattern).matches(name) is matches


@pytest.mark.parametrize("bad", ["[", "[a", "[]a]", "a\\", "[a-]", "[-a]"])
def test_malformed_patterns_are_errors(bad: str) -> None:
    with pytest.raises(BadPatternError):
        compile_pattern(bad)


@given(st.text(alphabet=st.characters(blacklist_characters="*?[\\,/"), min_size=1))
def test_literal_patterns_match_only_themselves(text: str) -> None:
    pattern = NamePattern(text)
    assert pattern.matches(text)
    assert not pattern.matches(text + "x")


def test_empty_parts_are_ignored_like_upstream() -> None:
    assert NamePattern("a,,b").matches("b")
    assert not NamePattern("").matches("x")
