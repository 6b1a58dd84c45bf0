"""docs/compatibility.md's table of Kubernetes releases says what CI does (issue 26): the
release .ci/e2e runs, the schemas the chart is validated against, the emulator's version, and
the range the chart accepts; and every API version localpv calls exists in each validated
release."""

from __future__ import annotations

import re

import kubernetes_validate
import pytest
import yaml

from localpv.kube import resources
from localpv_emulator.apiserver import KUBE_VERSION
from tests.helm.chart import CHART, REPO, SCHEMA_VERSIONS

DOC = REPO / "docs" / "compatibility.md"


def table(heading: str) -> list[list[str]]:
    """The rows (cells stripped) of the first table after ``heading``, without its header."""
    section = DOC.read_text().split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("|")]
    return [row for row in rows[1:] if not set("".join(row)) <= set("-")]


def releases(status: str) -> list[str]:
    return [version for version, row_status, _ in table("Which releases") if row_status == status]


def test_the_release_tested_for_real_is_the_one_ci_runs() -> None:
    [tested] = releases("tested for real")
    assert f"Kubernetes {tested} built" in (REPO / ".ci" / "e2e").read_text()


def test_the_validated_releases_are_the_schemas_ci_validates_against() -> None:
    assert releases("validated") == list(SCHEMA_VERSIONS)


def test_the_emulated_release_is_the_emulators() -> None:
    assert releases("emulated") == [".".join(KUBE_VERSION.split(".")[:2])]


def test_the_expected_range_runs_from_the_charts_minimum_to_the_newest_validated() -> None:
    [expected] = releases("expected")
    low, high = re.fullmatch(r"(\d+\.\d+) to (\d+\.\d+)", expected).groups()  # type: ignore[union-attr]
    kube_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    assert kube_version == f">={low}.0-0"
    assert high == SCHEMA_VERSIONS[-1]


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_every_api_version_localpv_calls_is_served_by_each_validated_release(version: str) -> None:
    used = [r for r in vars(resources).values() if isinstance(r, resources.Resource)]
    assert len(used) > 5
    missing = []
    for resource in used:
        obj = {"apiVersion": resource.api_version, "kind": resource.kind, "metadata": {"name": "x"}}
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            missing.append(f"{resource.api_version} {resource.kind}")
        except kubernetes_validate.ValidationError:
            pass  # the schema is there; a bare object lacks its required fields
    assert not missing, f"Kubernetes {version} does not serve {missing}"


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_each_validated_release_serves_capacity_tracking_at_one_of_the_versions_localpv_asks_for(
        version: str) -> None:
    """CSIStorageCapacity is asked for at v1, v1beta1, v1alpha1 (discovery picks): each validated
    release has a schema for at least one of them."""
    served = []
    for resource in resources.CSI_STORAGE_CAPACITIES:
        obj = {"apiVersion": resource.api_version, "kind": resource.kind, "metadata": {"name": "x"}}
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            continue
        except kubernetes_validate.ValidationError:
            pass
        served.append(resource.version)
    assert "v1" in served, f"Kubernetes {version} serves CSIStorageCapacity at {served}"


def test_each_behaviour_change_names_its_release_and_source() -> None:
    rows = table("Behaviour changes since 1.20")
    assert len(rows) >= 10
    for change, since, source, touches, handling in rows:
        assert re.match(r"1\.\d+\b", since), f"{change}: no release in {since!r}"
        assert re.search(r"KEP-\d+|migration guide", source), f"{change}: no source in {source!r}"
        assert touches and handling, change


def test_the_doc_is_linked_from_the_readmes() -> None:
    for readme in (REPO / "README.md", CHART / "README.md"):
        assert "compatibility.md" in readme.read_text(), readme


def test_a_missing_schema_is_what_the_check_above_looks_for() -> None:
    """The check fails for an API version a release no longer serves."""
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate({"apiVersion": "storage.k8s.io/v1beta1", "kind": "CSIStorageCapacity",
                                      "metadata": {"name": "x"}}, SCHEMA_VERSIONS[0], strict=True)
