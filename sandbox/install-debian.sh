#!/usr/bin/env bash
# Install the Debian packages that a real component of the tests or the demo comes from, when it
# is missing: install-debian.sh NAME "PROGRAM..." WITHOUT PACKAGE...
#   NAME      what it is, for the messages
#   PROGRAM   the commands (or paths) that are there once it is installed; a|b: either
#   WITHOUT   what happens here without it
# As root on Debian/Ubuntu: installs PACKAGE... if a PROGRAM is missing. Otherwise: says why not
# and exits 0; the tests that need it are then skipped (or fail under CI=true, where every tier
# must run).
set -euo pipefail
name=$1 programs=$2 without=$3
shift 3
missing=""
for program in $programs; do
  found=""
  for alternative in ${program//|/ }; do
    command -v "$alternative" >/dev/null && found=1
  done
  [ -n "$found" ] || missing="$missing $program"
done
if [ -z "$missing" ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "note: $name is not installed (no$missing) and this is not root on a Debian-like system; $without" >&2
  exit 0
fi
echo "installing $name from Debian's packages ($*)..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "$@" >/dev/null
echo "installed $name: $(dpkg-query -W -f='${Package} ${Version}' "$1")" >&2
