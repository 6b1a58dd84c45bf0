"""The `localpv status` client (and `localpv doctor`'s): reads the agent's view of its volumes.

The agent serves its view at ``/status`` (JSON); this renders it as a table: each
volume's path, PV, phase, claim, journal state, health (the abnormal conditions of a volume
in use), cleanup state with attempts, elapsed time and the cleaner's last output line
(``shred -v`` prints its progress); then the volumes held because their path shows another
disk than the recorded one, each recorded volume's identity, and every skipped discovery
entry with its reason.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any


class StatusUnavailable(Exception):
    """The agent's status endpoint could not be read."""


def fetch_status(url: str, timeout: float = 5.0) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/status", timeout=timeout) as resp:
            doc = json.load(resp)
    except (OSError, ValueError) as err:
        raise StatusUnavailable(f"cannot read {url}/status: {err}") from err
    if not isinstance(doc, dict):
        raise StatusUnavailable(f"{url}/status: unexpected answer")
    return doc


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def render_status(doc: dict[str, Any]) -> str:
    lines = [f"node {doc.get('node')}: {'ready' if doc.get('ready') else 'NOT READY'} ({doc.get('readiness', '')})"]
    if "healthy" in doc:  # what /healthz answers; the kubelet restarts the agent while it is false
        lines.append(f"health: {'ok' if doc['healthy'] else 'FAILING'} ({doc.get('health', '')})")
    if doc.get("journal_recovering"):
        lines.append("journal: recovering (it did not exist at start): volumes without a PV are cleaned before "
                     "they are offered")
    rows: list[tuple[str, ...]] = [("PATH", "PV", "PHASE", "CLAIM", "JOURNAL", "HEALTH", "CLEANUP", "ELAPSED",
                                    "DETAIL")]
    for v in doc.get("volumes") or []:
        cleanup = v.get("cleanup") or ""
        if cleanup and int(v.get("attempts") or 0) > 1:
            cleanup += f" (attempt {v['attempts']})"
        elapsed = f"{float(v.get('elapsed') or 0):.0f}s" if cleanup else ""
        detail = v.get("progress") or v.get("message") or ""
        health = ",".join(v.get("health") or []) or ("ok" if v.get("phase") in ("Bound", "Available") else "")
        rows.append((v["path"], v.get("pv") or "", v.get("phase") or "", v.get("claim") or "",
                     v.get("journal") or "", health, cleanup, elapsed, detail[:80]))
    lines += _table(rows) if len(rows) > 1 else ["(no volumes)"]
    held = [v for v in doc.get("volumes") or [] if v.get("held")]
    if held:
        lines += ["", "Held (not cleaned, offered, nor its PV deleted, until the right disk is at the path):"]
        lines += [f"  {v['path']}: {v['held']}" for v in held]
    known = [v for v in doc.get("volumes") or [] if v.get("identity")]
    if known:
        lines += ["", "Identities (what each recorded volume is, whatever its device name):"]
        lines += [f"  {v['path']}: {v['identity']}" for v in known]
    lines += _render_dynamic(doc.get("dynamic") or {})
    errors = doc.get("class_errors") or {}
    skipped = doc.get("skipped") or []
    if errors or skipped:
        lines += ["", "Not offered:"]
        lines += [f"  [{cls}] {why}" for cls, why in sorted(errors.items())]
        lines += [f"  {s['path']} [{s['class']}] {s['reason']}" for s in skipped]
    return "\n".join(lines) + "\n"


def _mib(value: object) -> str:
    return f"{int(str(value or 0)) >> 20}Mi"


def _render_dynamic(dynamic: dict[str, Any]) -> list[str]:
    """Dynamic volumes: each image recorded (what it is, where it is staged, its health) and
    each pool (its room, what is promised, what thin images may still write)."""
    if not dynamic:
        return []
    lines = ["", "Dynamic volumes:"]
    rows: list[tuple[str, ...]] = [("VOLUME", "POOL", "SIZE", "TYPE", "IMAGE", "PHASE", "CLAIM", "HEALTH", "STAGED")]
    for i in dynamic.get("images") or []:
        health = ",".join(i.get("health") or []) or ("ok" if i.get("phase") in ("Bound", "Available") else "")
        rows.append((i["volume"], i.get("pool") or "", _mib(i.get("size")), i.get("provisioning") or "",
                     i.get("state") or "", i.get("phase") or "", i.get("claim") or "", health, i.get("staged") or ""))
    lines += _table(rows) if len(rows) > 1 else ["  (no images)"]
    pools: list[tuple[str, ...]] = [("POOL", "STATE", "SIZE", "FREE", "PROMISED", "UNWRITTEN", "IMAGES")]
    for p in dynamic.get("pools") or []:
        pools.append((p["pool"], p.get("state") or "", _mib(p.get("capacity")), _mib(p.get("free")),
                      _mib(p.get("promised")), _mib(p.get("unwritten")), str(p.get("images") or 0)))
    lines += ["", *_table(pools)]
    lines += [f"  at risk: {p['risk']}" for p in dynamic.get("pools") or [] if p.get("risk")]
    published = dynamic.get("capacity") or []
    if published:  # what this node's CSIStorageCapacity objects tell the scheduler
        lines += ["", *_table([("STORAGECLASS", "PUBLISHED CAPACITY"),
                               *((c["storageclass"], _mib(c.get("capacity"))) for c in published)])]
    return lines
