"""The generated code matches the ``.proto`` files, and those match the wire format the
kubelet speaks: package names, method paths and the field numbers of the CSI spec."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from localpv.csi.proto import csi_pb2, pluginregistration_pb2

PROTO_DIR = Path(__file__).resolve().parents[2] / "localpv" / "csi" / "proto"


def _numbers(message: type) -> dict[str, int]:
    return {f.name: f.number for f in message.DESCRIPTOR.fields}  # type: ignore[attr-defined]


def test_node_messages_have_the_field_numbers_of_the_csi_spec() -> None:
    assert csi_pb2.DESCRIPTOR.package == "csi.v1"
    assert _numbers(csi_pb2.NodeStageVolumeRequest) == {
        "volume_id": 1, "publish_context": 2, "staging_target_path": 3, "volume_capability": 4, "secrets": 5,
        "volume_context": 6}
    assert _numbers(csi_pb2.NodePublishVolumeRequest) == {
        "volume_id": 1, "publish_context": 2, "staging_target_path": 3, "target_path": 4, "volume_capability": 5,
        "readonly": 6, "secrets": 7, "volume_context": 8}
    assert _numbers(csi_pb2.NodeExpandVolumeRequest) == {
        "volume_id": 1, "volume_path": 2, "capacity_range": 3, "staging_target_path": 4, "volume_capability": 5,
        "secrets": 6}
    assert _numbers(csi_pb2.VolumeUsage) == {"available": 1, "total": 2, "used": 3, "unit": 4}
    assert _numbers(csi_pb2.NodeGetInfoResponse) == {"node_id": 1, "max_volumes_per_node": 2,
                                                     "accessible_topology": 3}
    assert _numbers(csi_pb2.VolumeCapability) == {"block": 1, "mount": 2, "access_mode": 3}
    assert csi_pb2.NodeServiceCapability.RPC.EXPAND_VOLUME == 3
    assert csi_pb2.NodeServiceCapability.RPC.VOLUME_CONDITION == 4
    methods = {m.name for m in csi_pb2.DESCRIPTOR.services_by_name["Node"].methods}
    assert methods == {"NodeStageVolume", "NodeUnstageVolume", "NodePublishVolume", "NodeUnpublishVolume",
                       "NodeGetVolumeStats", "NodeExpandVolume", "NodeGetCapabilities", "NodeGetInfo"}


def test_registration_api_is_the_kubelets() -> None:
    # The kubelet dials /pluginregistration.Registration/GetInfo: the package has no version.
    assert pluginregistration_pb2.DESCRIPTOR.package == "pluginregistration"
    assert _numbers(pluginregistration_pb2.PluginInfo) == {"type": 1, "name": 2, "endpoint": 3,
                                                            "supported_versions": 4}
    assert _numbers(pluginregistration_pb2.RegistrationStatus) == {"plugin_registered": 1, "error": 2}


def _drop_json_names(message: descriptor_pb2.DescriptorProto | descriptor_pb2.FileDescriptorProto) -> None:
    for field in getattr(message, "field", []):
        field.ClearField("json_name")
    for nested in getattr(message, "nested_type", None) or getattr(message, "message_type", []):
        _drop_json_names(nested)


@pytest.mark.skipif(importlib.util.find_spec("grpc_tools") is None, reason="grpcio-tools is not installed")
@pytest.mark.parametrize("module", [csi_pb2, pluginregistration_pb2], ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_generated_code_is_up_to_date(module: object, tmp_path: Path) -> None:
    """Regenerating from the .proto gives the same descriptor (run python3 -m tools.protogen if not)."""
    name = module.__name__.rsplit(".", 1)[-1].removesuffix("_pb2")  # type: ignore[attr-defined]
    out = tmp_path / "set.pb"
    code = ("import importlib.resources, sys; from grpc_tools import protoc; "
            "inc = str(importlib.resources.files('grpc_tools') / '_proto'); "
            f"sys.exit(protoc.main(['protoc', '-I{PROTO_DIR}', '-I' + inc, '--descriptor_set_out={out}', "
            f"'{name}.proto']))")
    subprocess.run([sys.executable, "-c", code], check=True)
    fresh = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    _drop_json_names(fresh)  # protoc adds them to descriptor sets; generated code leaves them out
    committed = descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)  # type: ignore[attr-defined]
    assert fresh == committed, "stale generated code: run python3 -m tools.protogen"
