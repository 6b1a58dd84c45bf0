"""Dynamic node-local volumes through CSI, in the node agent's process (issue 18).

Only imported when the agent's ConfigMap has a ``dynamicClassMap``: grpcio is loaded then
and never otherwise. One module per concern:

* :mod:`.config` - the ConfigMap keys (pools, dynamic classes, driver name);
* :mod:`.images`, :mod:`.loop`, :mod:`.pools`, :mod:`.mounting` - disk images, loop
  devices, pools and their room, mounts;
* :mod:`.journal` - the durable record of every image;
* :mod:`.proto` (generated from the ``.proto`` files there), :mod:`.rpc`,
  :mod:`.identity`, :mod:`.node`, :mod:`.registration` - the gRPC side the kubelet talks to;
* :mod:`.controller`, :mod:`.provisioner`, :mod:`.expansion` - claims to images and PVs;
* :mod:`.metrics`, :mod:`.app` - metrics and the wiring into the agent.
"""
