"""Safety rails: the policy, and the gate that applies it."""
