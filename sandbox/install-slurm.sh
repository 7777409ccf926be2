#!/usr/bin/env bash
# Install Debian's Slurm packages for the local cluster (tests and demo), when possible.
# As root on Debian/Ubuntu: installs slurmctld, slurmd and slurm-client if missing.
# Otherwise: says why not and exits 0; the demo then uses the simulated scheduler and the
# real-Slurm tests are skipped (or fail under CI=true, where Slurm is required).
set -euo pipefail
if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v scontrol >/dev/null; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "note: Slurm is not installed and this is not root on a Debian-like system;" \
       "the local mode will use its simulated scheduler" >&2
  exit 0
fi
echo "installing Slurm from Debian's packages (slurmctld slurmd slurm-client)..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
echo "installed $(slurmd -V)" >&2
