"""NFS subdirectory mode (``localpv nfs``): one directory of a mounted export per claim.

Modules, each with one job: ``pathpattern`` (templating and validation, pure), ``params``
(StorageClass parameters, pure), ``export`` (descriptor-based directory operations),
``provisioner`` (nfs-subdir semantics), ``workqueue`` (keyed queue with per-item backoff),
``controller`` (sig-storage-lib-external-provisioner semantics), ``metrics``, and ``app``
(a replica: leader election in front of the controller, and the command's process).
"""
