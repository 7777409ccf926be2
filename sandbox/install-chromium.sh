#!/usr/bin/env bash
# Install Debian's headless Chromium, which the report test renders the HTML report with.
# As root on Debian/Ubuntu: installs chromium if missing. Otherwise: says why not and exits 0;
# the rendering test is then skipped (or fails under CI=true, where Chromium is required).
set -euo pipefail
if command -v chromium >/dev/null || command -v chromium-browser >/dev/null; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "note: Chromium is not installed and this is not root on a Debian-like system;" \
       "the HTML report's rendering test will be skipped" >&2
  exit 0
fi
echo "installing Chromium from Debian's packages (for the HTML report's rendering test)..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
echo "installed $(chromium --version)" >&2
