"""The OpenAI-compatible gateway in front of the policy, and the user's agents run against it (docs/gateway.md)."""
