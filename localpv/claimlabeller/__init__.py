"""``localpv claim-labeller``: a cluster-wide, leader-elected Deployment that labels each claim
of a dynamic class with its selected node, so that every agent can watch its own claims only
(:mod:`localpv.csi.claimlabels` has the rule; docs/architecture.md the design)."""
