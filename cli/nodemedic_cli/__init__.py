"""The ``nodemedic`` operator CLI (not Lambda code)."""
