#!/usr/bin/env bash
# Build a real kube-apiserver for the Kubernetes test tier, once per machine, when possible.
# Debian 12 ships etcd-server (3.4) and the kubernetes *source* package (1.20.2), from which
# kube-apiserver builds in about 5-10 minutes on 2 cores; no prebuilt one is available from
# Debian or PyPI. The binary is cached outside the checkout, in
# ${NODEMEDIC_CACHE:-${XDG_CACHE_HOME:-~/.cache}/nodemedic}/kube-apiserver-v1.20.2.
# Not root on a Debian-like system: says why not and exits 0 (the tier is skipped, or fails
# under CI=true, where it is required).
set -euo pipefail
cache="${NODEMEDIC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodemedic}"
bin="$cache/kube-apiserver-v1.20.2"
if [ -x "$bin" ] && command -v etcd >/dev/null && command -v openssl >/dev/null; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "note: no kube-apiserver at $bin and this is not root on a Debian-like system;" \
       "the Kubernetes tests will be skipped" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
sources=/etc/apt/sources.list.d/nodemedic-kubernetes-src.sources
work="$(mktemp -d /tmp/nodemedic-kube-build.XXXXXX)"
cleanup() { rm -rf "$work"; rm -f "$sources"; apt-get update -qq >/dev/null 2>&1 || true; }
trap cleanup EXIT
echo "installing etcd-server and the Go toolchain from Debian's packages..." >&2
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends etcd-server openssl >/dev/null
if [ -x "$bin" ]; then exit 0; fi
apt-get install -y -qq --no-install-recommends golang-go jq rsync dpkg-dev \
  golang-github-modern-go-reflect2-dev >/dev/null
printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' > "$sources"
apt-get update -qq >/dev/null
echo "building kube-apiserver 1.20.2 from Debian's kubernetes source package (about 5-10 minutes)..." >&2
cd "$work"
apt-get source -qq kubernetes >/dev/null 2>&1
src="$(find "$work" -maxdepth 1 -type d -name 'kubernetes-*' | head -1)"
cd "$src"
# the vendored reflect2 1.0.1 crashes under Go >= 1.18; Debian's 1.0.2 does not
rm -rf vendor/github.com/modern-go/reflect2
cp -rL /usr/share/gocode/src/github.com/modern-go/reflect2 vendor/github.com/modern-go/reflect2
rm -f vendor/github.com/modern-go/reflect2/go.mod
mkdir -p .go/src/k8s.io && ln -sfn ../../.. .go/src/k8s.io/kubernetes
env GOPATH="$src/.go" GOCACHE="$work/gocache" CGO_ENABLED=0 HOME="$work" \
  KUBE_GIT_VERSION=v1.20.2 KUBE_GIT_TREE_STATE=clean make WHAT=cmd/kube-apiserver >"$work/build.log" 2>&1 \
  || { tail -30 "$work/build.log" >&2; exit 1; }
mkdir -p "$cache"
install -m 0755 _output/bin/kube-apiserver "$bin.tmp" && mv "$bin.tmp" "$bin"
echo "built $("$bin" --version) at $bin" >&2
