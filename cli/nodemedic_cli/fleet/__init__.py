"""The fleet simulator: what downtime per failure costs a training run (``nodemedic fleet``)."""
