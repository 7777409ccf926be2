"""The agent's checks. Each reports healthy / degraded / failed / error with evidence."""
