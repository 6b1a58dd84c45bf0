"""The README's configuration reference is the generated one (``localpv config reference``)."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from localpv.cli import cli

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_config_reference_is_the_generated_text() -> None:
    match = re.search(r"<!-- BEGIN config reference -->\n(.*?)<!-- END config reference -->", README.read_text(),
                      re.S)
    assert match, "README.md lost its config reference markers"
    generated = CliRunner().invoke(cli, ["config", "reference"])
    assert generated.exit_code == 0
    assert match.group(1) == generated.output, (
        "README.md's configuration reference is stale: replace the text between the markers "
        "with the output of `localpv config reference`")
