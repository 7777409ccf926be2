#!/usr/bin/env bash
# Install Debian's AWS CLI, which the agent installer runs to fetch its wheelhouse from S3
# (install-agent.sh --wheelhouse s3://...); a test runs it against the embedded S3.
# As root on Debian/Ubuntu: installs awscli if `aws` is missing. Otherwise: says why not and exits
# 0; the S3 fetch test is then skipped (or fails under CI=true, where the AWS CLI is required).
set -euo pipefail
if command -v aws >/dev/null; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "note: the AWS CLI is not installed and this is not root on a Debian-like system;" \
       "the installer's S3 fetch test will be skipped" >&2
  exit 0
fi
echo "installing the AWS CLI from Debian's packages (for the installer's S3 fetch test)..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends awscli >/dev/null
echo "installed $(aws --version 2>&1)" >&2
