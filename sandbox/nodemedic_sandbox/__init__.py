"""NodeMedic's local mode: embedded AWS (moto), a local Slurm cluster, the demo.

Not Lambda code: nothing here is part of the layer.
"""
