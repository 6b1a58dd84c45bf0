"""A Kubernetes API-server emulator for localpv's tests, benchmarks and ``localpv demo``.

Real HTTP through the real ``kubernetes`` client, strict where it is cheap (resourceVersion,
409/410, selectors, status, finalizers, GC by owner uid, unknown fields dropped), with fault
injection (dropped watches, 410s, 5xx, latency, lost answers) and a PV binder. It is test
infrastructure, kept outside the ``localpv`` runtime package: only ``localpv.demo`` and the
tests and benchmarks import it (an import-linter contract in pyproject.toml says so), and the
production image does not carry it.
"""
