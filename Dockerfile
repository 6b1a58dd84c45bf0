# The localpv image: node agent, cleanup Jobs (JOB_CONTAINER_IMAGE), node cleanup and the
# NFS provisioner all run it; the Helm chart picks the command (agent, nfs, node-cleanup).
#
# Two stages on the same base: the builder makes a virtual environment in /opt/localpv from
# the hash-pinned requirements.lock and the project's wheel; the final stage gets that
# environment, the tools the cleaner scripts call and /scripts, and no pip, setuptools,
# wheel, ensurepip or compiler. The venv's python is a symlink to the base's, so both
# stages must be the same image: BASE_IMAGE is given once, here.
#
# BASE_IMAGE is python:3.11-slim-bookworm pinned by the digest of its multi-platform image
# index (Python 3.11.16, Debian bookworm snapshot of 2026-08-24, as recorded in
# docker-library/repo-info, repos/python/remote/3.11-slim-bookworm.md). To refresh it:
#   docker buildx imagetools inspect docker.io/library/python:3.11-slim-bookworm
# (or `crane digest` / `skopeo inspect --raw ... | sha256sum`) and put the index's digest below.
# A local build without a registry swaps in a stand-in of the same name:
#   buildah bud --build-arg BASE_IMAGE=python:3.11-slim-bookworm ...
# The stand-in may keep python at /usr/bin rather than /usr/local/bin; nothing below names
# either path.
ARG BASE_IMAGE=docker.io/library/python:3.11-slim-bookworm@sha256:0bee7276f83efd4a1ee05bbbf4281d95ed28e079220a9457f25a93e3f1e3c31b

FROM ${BASE_IMAGE} AS builder

ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1

# Build tools (setuptools, wheel) from their own lock, in a throwaway environment: the wheel is
# built with exactly these, never with whatever an isolated build would download.
COPY requirements-build.lock requirements.lock /src/
RUN python3 -m venv /opt/build \
 && /opt/build/bin/pip install --require-hashes --no-deps --only-binary :all: -r /src/requirements-build.lock

COPY pyproject.toml README.md /src/
COPY localpv /src/localpv
COPY scripts /src/scripts
RUN /opt/build/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /wheels /src

# The runtime environment never holds pip: the build environment's pip installs into it.
# Every dependency is a wheel whose hash is in requirements.lock; the project adds none.
RUN python3 -m venv --without-pip /opt/localpv \
 && /opt/build/bin/pip --python /opt/localpv/bin/python install \
      --require-hashes --no-deps --only-binary :all: -r /src/requirements.lock \
 && /opt/build/bin/pip --python /opt/localpv/bin/python install --no-deps --no-index /wheels/localpv-*.whl \
 && /opt/build/bin/pip --python /opt/localpv/bin/python check

# kubernetes (37) ships an asyncio client, kubernetes/aio (~68 MB with its bytecode), beside
# the synchronous one; nothing outside it imports it, and localpv uses only the synchronous
# client (tests/packaging/test_dockerfile.py checks), so the image goes without it.
# Its own dependencies (aiohttp and what only aiohttp needs, ~13 MB) go with it.
RUN site=$(/opt/localpv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))') \
 && rm -rf "$site/kubernetes/aio" \
 && /opt/build/bin/pip --python /opt/localpv/bin/python uninstall -y \
      aiohttp aiohttp-retry aiohappyeyeballs aiosignal attrs frozenlist multidict propcache yarl \
 && /opt/localpv/bin/python -c 'import kubernetes, kubernetes.client, kubernetes.config, localpv.cli'

FROM ${BASE_IMAGE}

# Tools the cleaner scripts call: mkfs/wipefs/blkdiscard/ionice/findmnt (util-linux), mkfs.ext4
# (e2fsprogs), shred/dd/readlink/dirname (coreutils), find (findutils); bash runs them; dynamic
# volumes also use mount (util-linux), e2fsck/resize2fs (e2fsprogs), mkfs.xfs/xfs_growfs (xfsprogs); pyudev
# needs libudev for block-device events. Then pip goes: Debian's packages where the base has
# them, the copies in every site directory, the ensurepip module and its bundled wheels.
RUN set -eu; \
    apt-get update; \
    apt-get install -y --no-install-recommends util-linux e2fsprogs xfsprogs coreutils findutils bash libudev1; \
    pipdebs=""; \
    for p in python3-pip python3-pip-whl python3-setuptools python3-setuptools-whl python3-wheel python3-venv; do \
      if dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q 'ok installed'; then pipdebs="$pipdebs $p"; fi; \
    done; \
    if [ -n "$pipdebs" ]; then apt-get purge -y $pipdebs; fi; \
    # xfs_scrub is the one xfsprogs program that needs ICU (libicu72, 36 MB); localpv runs
    # mkfs.xfs, xfs_growfs and xfs_repair, so both go (dpkg's record says so).
    rm -f /usr/sbin/xfs_scrub /usr/sbin/xfs_scrub_all; \
    if dpkg-query -W -f '${Status}' libicu72 2>/dev/null | grep -q 'ok installed'; then \
      dpkg --remove --force-depends libicu72; \
    fi; \
    for t in mkfs.xfs xfs_growfs xfs_repair; do "$t" -V >/dev/null; done; \
    rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/apt/archives/*.deb; \
    for d in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))'); do \
      rm -rf "$d"/pip "$d"/pip-* "$d"/setuptools "$d"/setuptools-* "$d"/pkg_resources "$d"/_distutils_hack \
             "$d"/distutils-precedence.pth "$d"/wheel "$d"/wheel-*; \
    done; \
    ensurepip=$(python3 -c 'import ensurepip, os; print(os.path.dirname(ensurepip.__file__))' 2>/dev/null || true); \
    rm -rf ${ensurepip:+"$ensurepip"} /usr/share/python-wheels; \
    rm -f /usr/local/bin/pip /usr/local/bin/pip3 /usr/local/bin/pip3.* /usr/local/bin/wheel \
          /usr/bin/pip /usr/bin/pip3 /usr/bin/pip3.*; \
    for m in pip setuptools wheel ensurepip; do \
      if python3 -c "import $m" 2>/dev/null; then echo "$m is still importable" >&2; exit 1; fi; \
    done

COPY --from=builder /opt/localpv /opt/localpv
ENV PATH=/opt/localpv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1

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
