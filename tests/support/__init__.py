"""Test infrastructure the tests and the benchmarks share: real mounts, loop devices and hung
FUSE mounts (hostfs), and the fault campaigns (campaign)."""
