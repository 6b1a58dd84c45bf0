"""The reliability suites that run an agent in-process use the agent tests' node (tests/support/agentenv.py)."""

from tests.support.agentenv import agent_env  # noqa: F401
