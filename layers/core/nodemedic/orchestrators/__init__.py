"""Adapters to the workload orchestrator (Slurm today; Kubernetes later)."""
