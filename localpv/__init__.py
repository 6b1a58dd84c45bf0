"""localpv: a node-local and NFS-subdirectory storage provisioner for Kubernetes.

The package is laid out so that importing it stays cheap: the `kubernetes` client
(about 47 MB RSS and 0.3 s) is imported only by the modules that talk to the API.
"""

__version__ = "0.1.0"
