# The localpv image: node agent, cleanup Jobs (JOB_CONTAINER_IMAGE), node cleanup and the
# NFS provisioner all run it; the Helm chart picks the command (agent, nfs, node-cleanup).
FROM python:3.11-slim-bookworm

# Tools the cleaner scripts call: mkfs/wipefs/blkdiscard/ionice (util-linux), mkfs.ext4
# (e2fsprogs), shred/dd (coreutils), find (findutils), findmnt (util-linux); bash runs them; pyudev
# needs libudev for block-device events.
RUN apt-get update \
 && apt-get install -y --no-install-recommends util-linux e2fsprogs coreutils findutils bash libudev1 \
 && rm -rf /var/lib/apt/lists/*

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1

COPY pyproject.toml README.md /src/
COPY localpv /src/localpv
COPY scripts /src/scripts
RUN pip install --no-cache-dir /src && rm -rf /src

# Upstream's path: configurations naming /scripts/shred.sh etc. keep working.
COPY scripts /scripts
RUN chmod 0755 /scripts/*.sh

# Unprivileged by default (node cleanup runs as is). The agent, the cleanup Jobs and the
# NFS provisioner need root; the chart and the agent's Job spec set runAsUser: 0.
RUN groupadd --system --gid 10001 localpv \
 && useradd --system --uid 10001 --gid localpv --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin localpv
USER 10001:10001

ENTRYPOINT ["localpv"]
CMD ["--help"]
