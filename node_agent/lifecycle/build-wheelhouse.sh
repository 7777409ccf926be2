#!/usr/bin/env bash
# Build the agent's self-contained wheelhouse: the agent wheel and every dependency it needs, as
# binary wheels for each CPython and CPU architecture given (manylinux2014: glibc 2.17 or newer,
# so Amazon Linux 2/2023, Ubuntu 20.04+, the DLAMIs), in one tar.gz. install-agent.sh --wheelhouse
# installs from it with no package index: GPU nodes in private subnets need no PyPI or mirror.
#
#   build-wheelhouse.sh [--out DIR] [--pythons "3.10 3.11 3.12 3.13 3.14"] [--archs "x86_64 aarch64"]
#                       [--python python3]
#
# Writes DIR/nodemedic-agent-wheelhouse-VERSION.tar.gz (default DIR: dist/ of the checkout);
# wheelhouse.json inside lists the Pythons and architectures it serves. Needs a package index
# (PyPI or a mirror) where it runs, once; --python runs pip.
set -euo pipefail

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
die() { echo "build-wheelhouse: $*" >&2; exit 2; }

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="$HERE/../../dist" PYTHONS="3.10 3.11 3.12 3.13 3.14" ARCHS="x86_64 aarch64" PYTHON=python3
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --pythons) PYTHONS="$2"; shift 2 ;;
    --archs) ARCHS="$2"; shift 2 ;;
    --python) PYTHON="$2"; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "build-wheelhouse: unknown option $1" >&2; usage 2 ;;
  esac
done
for py in $PYTHONS; do [[ "$py" =~ ^3\.[0-9]+$ ]] || die "--pythons: $py is not a CPython version like 3.12"; done
for arch in $ARCHS; do [[ "$arch" == x86_64 || "$arch" == aarch64 ]] || die "--archs: $arch is not x86_64 or aarch64"; done

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
HOUSE="$WORK/nodemedic-agent-wheelhouse"
mkdir -p "$HOUSE" "$OUT"
echo "==> building the agent wheel"
"$PYTHON" -m pip wheel --quiet --no-deps -w "$HOUSE" "$HERE/.."
AGENT="$(ls "$HOUSE"/nodemedic_agent-*.whl)"
VERSION="$(basename "$AGENT" | cut -d- -f2)"
for py in $PYTHONS; do
  for arch in $ARCHS; do
    echo "==> its dependencies for CPython $py on $arch"
    "$PYTHON" -m pip download --quiet --disable-pip-version-check --only-binary=:all: --implementation cp \
      --python-version "$py" --platform "manylinux2014_$arch" -d "$HOUSE" "$AGENT" \
      || die "no binary wheels of the agent's dependencies for CPython $py on $arch (see pip's message above)"
  done
done
printf '{"agent": "%s", "pythons": [%s], "archs": [%s]}\n' "$VERSION" \
  "$(printf '"%s",' $PYTHONS | sed 's/,$//')" "$(printf '"%s",' $ARCHS | sed 's/,$//')" > "$HOUSE/wheelhouse.json"
TARBALL="$OUT/nodemedic-agent-wheelhouse-$VERSION.tar.gz"
tar -C "$WORK" -czf "$TARBALL" nodemedic-agent-wheelhouse
echo "==> $TARBALL ($(du -h "$TARBALL" | cut -f1): $(ls "$HOUSE" | grep -c '\.whl$') wheels; CPython $PYTHONS on $ARCHS)"
