"""Pure domain logic: no boto3, no Slurm."""
