"""Which nodes a volume lives on, and when those nodes are lost. Pure rules."""

from __future__ import annotations

from localpv.kube.objects import Obj
from localpv.naming import HOSTNAME_LABEL_KEY


def pv_node_names(pv: Obj | None) -> frozenset[str]:
    """The nodes a PV's required affinity can place it on, as far as hostnames say.

    Per node-selector term, the values of all ``kubernetes.io/hostname In`` expressions are
    intersected (a node must satisfy every expression of the term); terms are alternatives,
    so their results are united. Expressions on other keys or operators name no node.
    """
    affinity = ((pv or {}).get("spec") or {}).get("nodeAffinity") or {}
    terms = (affinity.get("required") or {}).get("nodeSelectorTerms") or []
    names: set[str] = set()
    for term in terms:
        names |= _term_hostnames(term or {})
    return frozenset(names)


def _term_hostnames(term: Obj) -> set[str]:
    value_sets = [
        set(expr.get("values") or [])
        for expr in term.get("matchExpressions") or []
        if expr.get("key") == HOSTNAME_LABEL_KEY and expr.get("operator") == "In"
    ]
    return set.intersection(*value_sets) if value_sets else set()
