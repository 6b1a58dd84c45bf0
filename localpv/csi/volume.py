"""What a dynamic volume's PV says about it, shared by the controller and the node service.

The PV's ``spec.csi.volumeAttributes`` (the CSI volume context the kubelet passes to every
Node call) carry what the node service needs to find and verify the image without asking
anything else: its pool, its filesystem's UUID (the image's identity) - or, for a
``volumeMode: Block`` volume, the UUID its image file is marked with (:mod:`localpv.csi.images`)
- and the node it was made on.
"""

from __future__ import annotations

#: volumeAttributes keys.
POOL = "localpv.dev/pool"
FS_UUID = "localpv.dev/fsUUID"
#: A Block volume's identity: the UUID in its image file's ``user.localpv.block`` attribute.
IMAGE_UUID = "localpv.dev/imageUUID"
NODE = "localpv.dev/node"
PROVISIONING = "localpv.dev/provisioning"

#: The topology segment the node plugin reports (the kubelet puts it on the Node as a label).
TOPOLOGY_KEY = "topology.localpv.dev/node"
