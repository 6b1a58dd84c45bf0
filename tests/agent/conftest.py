"""An agent running against the API emulator, with real discovery directories (tests/support/agentenv.py)."""

from tests.support.agentenv import FAST_RETRY, NODE, AgentEnv, agent_env

__all__ = ["FAST_RETRY", "NODE", "AgentEnv", "agent_env"]
