"""Regenerate the Python code of localpv's ``.proto`` files (``localpv/csi/proto/``).

    pip install grpcio-tools          # a development tool: the image never needs it
    python3 -m tools.protogen          # writes <name>_pb2.py and <name>_pb2.pyi beside each .proto

Only the message code is generated (``--python_out`` and ``--pyi_out``): the services are
wired by hand in :mod:`localpv.csi.rpc`, typed, so no untyped ``_pb2_grpc`` module is needed.
The generated modules name the protobuf runtime they were made with; pyproject.toml's
``protobuf`` range must include it (``tests/csi/test_proto.py`` checks that the descriptors
match the ``.proto`` files and the wire names the kubelet uses).
"""

from __future__ import annotations

import importlib
import importlib.resources
import sys
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parents[1] / "localpv" / "csi" / "proto"


def main() -> int:
    try:
        # Imported by name: whether mypy finds stubs for grpc_tools depends on the release of
        # types-grpcio installed (some ship them, others do not), and this tool is optional.
        protoc = importlib.import_module("grpc_tools.protoc")
    except ImportError:
        print("error: grpc_tools is not installed (pip install grpcio-tools)", file=sys.stderr)
        return 1
    include = str(importlib.resources.files("grpc_tools") / "_proto")
    for proto in sorted(PROTO_DIR.glob("*.proto")):
        args = ["protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={PROTO_DIR}", f"--pyi_out={PROTO_DIR}",
                proto.name]
        if protoc.main(args) != 0:
            print(f"error: protoc failed on {proto.name}", file=sys.stderr)
            return 1
        print(f"generated {proto.stem}_pb2.py and {proto.stem}_pb2.pyi")
    return 0


if __name__ == "__main__":
    sys.exit(main())
