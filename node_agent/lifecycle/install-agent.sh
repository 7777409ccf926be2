#!/usr/bin/env bash
# Install and start the NodeMedic agent on a GPU node (run as root from the node's lifecycle /
# user-data script, as HyperPod lifecycle scripts do).
#
#   install-agent.sh --cluster NAME --bus BUS [--acknowledgements-table TABLE] [--region R]
#                    [--wheelhouse PATH_OR_S3_URL | --wheel PATH_OR_S3_URL] [--s3-endpoint-url URL]
#                    [--gpus 8] [--efa 32] [--shared-mount /fsx] [--slurm-node NAME] [--instance-id ID]
#                    [--root DIR] [--no-systemd] [--no-burn-in] [--python python3]
#                    [--relay-queue URL]
#
# --wheelhouse: the tar.gz build-wheelhouse.sh makes; installs with no package index. --wheel: the
# agent wheel alone; pip fetches its dependencies from PyPI (or the node's pip mirror). Neither:
# the wheel is built from this checkout. An s3:// URL is fetched with the AWS CLI and the instance
# role (s3:GetObject); --s3-endpoint-url: through an S3 interface VPC endpoint's URL.
# Installs into /opt/nodemedic/agent (a venv), writes /etc/nodemedic/agent.toml unless it exists,
# links /opt/nodemedic/bin/deep-health-check and gpu-reset (the pipeline's DeepHealthCheckCommand
# and GpuResetCommand), installs
# and starts the systemd unit, holds each later slurmd start for its burn-in (a slurmd drop-in;
# --no-burn-in: not), then prints a first health report. --relay-queue (the stack output
# RelayQueueUrl, on the Slurm controller of a stack whose SlurmChannel is relay; needs
# --acknowledgements-table): also [relay] in the config and nodemedic-relay.service.
set -euo pipefail

usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
die() { echo "install-agent: $*" >&2; exit 2; }

CLUSTER="" BUS="" ACK_TABLE="" REGION="" WHEEL="" WHEELHOUSE="" S3_ENDPOINT="" GPUS=8 EFA=0 SHARED=() SLURM_NODE="" INSTANCE_ID="" ROOT="" SYSTEMD=1 BURN_IN=1 PYTHON=python3 RELAY_QUEUE=""
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --cluster) CLUSTER="$2"; shift 2 ;;
    --bus) BUS="$2"; shift 2 ;;
    --acknowledgements-table) ACK_TABLE="$2"; shift 2 ;;
    --region) REGION="$2"; shift 2 ;;
    --wheel) WHEEL="$2"; shift 2 ;;
    --wheelhouse) WHEELHOUSE="$2"; shift 2 ;;
    --s3-endpoint-url) S3_ENDPOINT="$2"; shift 2 ;;
    --gpus) GPUS="$2"; shift 2 ;;
    --efa) EFA="$2"; shift 2 ;;
    --shared-mount) SHARED+=("$2"); shift 2 ;;
    --slurm-node) SLURM_NODE="$2"; shift 2 ;;
    --instance-id) INSTANCE_ID="$2"; shift 2 ;;
    --root) ROOT="$2"; shift 2 ;;
    --no-systemd) SYSTEMD=0; shift ;;
    --no-burn-in) BURN_IN=0; shift ;;
    --python) PYTHON="$2"; shift 2 ;;
    --relay-queue) RELAY_QUEUE="$2"; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "install-agent: unknown option $1" >&2; usage 2 ;;
  esac
done
[[ -n "$CLUSTER" ]] || die "--cluster is required"
[[ -n "$BUS" ]] || die "--bus is required (the stack output EventBusName)"
[[ -z "$WHEEL" || -z "$WHEELHOUSE" ]] || die "--wheel and --wheelhouse: give one"
[[ -z "$RELAY_QUEUE" || -n "$ACK_TABLE" ]] || die "--relay-queue needs --acknowledgements-table (the relay's requests are recorded there)"
command -v "$PYTHON" >/dev/null || die "no $PYTHON on PATH: the agent needs Python 3.10 or newer (--python PATH)"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || die "$PYTHON is $("$PYTHON" -V 2>&1): the agent \
needs Python 3.10 or newer. Amazon Linux 2023: dnf install -y python3.11, then --python python3.11; Ubuntu 20.04: \
apt-get install -y python3.10-venv from the deadsnakes PPA, or use the DLAMI's conda Python"
"$PYTHON" -c 'import venv, ensurepip' 2>/dev/null || die "$PYTHON cannot create a virtual environment: install \
its venv module (Debian/Ubuntu: apt-get install -y python3-venv, or python3.X-venv for that version)"

PREFIX="$ROOT/opt/nodemedic"
ETC="$ROOT/etc/nodemedic"
SPOOL="$ROOT/var/spool/nodemedic-agent"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
fetch() {  # a local path as it is, an s3:// object copied into $WORK
  if [[ "$1" == s3://* ]]; then
    command -v aws >/dev/null || die "$1 needs the AWS CLI (aws) on PATH to fetch it; or copy it to the node and give its path"
    local aws=(aws)
    [[ -z "$REGION" ]] || aws+=(--region "$REGION")
    [[ -z "$S3_ENDPOINT" ]] || aws+=(--endpoint-url "$S3_ENDPOINT")
    "${aws[@]}" s3 cp --quiet "$1" "$WORK/" >&2 || die "cannot copy $1 (the instance role needs s3:GetObject on it)"
    echo "$WORK/$(basename "$1")"
  else
    [[ -f "$1" ]] || die "no such file: $1"
    echo "$1"
  fi
}
PIP_ARGS=(--quiet --upgrade --disable-pip-version-check)
if [[ -n "$WHEELHOUSE" ]]; then  # everything from the wheelhouse, no package index
  ARCHIVE="$(fetch "$WHEELHOUSE")"
  tar -xzf "$ARCHIVE" -C "$WORK" || die "$WHEELHOUSE is not a wheelhouse tar.gz (build-wheelhouse.sh)"
  HOUSE="$WORK/nodemedic-agent-wheelhouse"
  [[ -f "$HOUSE/wheelhouse.json" ]] || die "$WHEELHOUSE has no nodemedic-agent-wheelhouse/wheelhouse.json (build-wheelhouse.sh)"
  # before anything is installed: does it hold wheels for this node's Python and CPU?
  "$PYTHON" - "$HOUSE/wheelhouse.json" <<'PY' || die "$WHEELHOUSE does not serve this node (above)"
import json, platform, sys
house = json.load(open(sys.argv[1]))
python, arch = f"{sys.version_info[0]}.{sys.version_info[1]}", platform.machine()
if python not in house["pythons"] or arch not in house["archs"]:
    sys.exit(f"install-agent: the wheelhouse holds CPython {', '.join(house['pythons'])} on {', '.join(house['archs'])}; "
             f"{sys.executable} is CPython {python} on {arch}. Rebuild it with "
             f"build-wheelhouse.sh --pythons {python} --archs {arch}, or pass --python with one it holds")
PY
  WHEEL="$(ls "$HOUSE"/nodemedic_agent-*.whl)"
  PIP_ARGS+=(--no-index --find-links "$HOUSE")
elif [[ -z "$WHEEL" ]]; then  # from a checkout: build the wheel next to this script
  echo "==> building the agent wheel from $HERE/.."
  "$PYTHON" -m pip wheel --quiet --no-deps -w "$WORK" "$HERE/.."
  WHEEL="$(ls "$WORK"/nodemedic_agent-*.whl)"
else
  WHEEL="$(fetch "$WHEEL")"
fi

echo "==> installing $(basename "$WHEEL") into $PREFIX/agent${WHEELHOUSE:+ (from the wheelhouse, no package index)}"
"$PYTHON" -m venv "$PREFIX/agent"
"$PREFIX/agent/bin/pip" install "${PIP_ARGS[@]}" "$WHEEL"

mkdir -p "$ETC" "$SPOOL" "$PREFIX/bin"
if [[ ! -f "$ETC/agent.toml" ]]; then
  echo "==> writing $ETC/agent.toml"
  {
    echo "cluster = \"$CLUSTER\""
    echo "event_bus = \"$BUS\""
    [[ -n "$REGION" ]] && echo "region = \"$REGION\""
    echo; echo "[node]"
    [[ -n "$INSTANCE_ID" ]] && echo "instance_id = \"$INSTANCE_ID\""
    [[ -n "$SLURM_NODE" ]] && echo "slurm_node = \"$SLURM_NODE\""
    echo; echo "[expected]"; echo "gpus = $GPUS"; echo "efa_devices = $EFA"
    echo; echo "[storage]"; echo "paths = [\"/\"]"
    printf 'shared_mounts = [%s]\n' "$( ((${#SHARED[@]})) && printf '"%s",' "${SHARED[@]}" | sed 's/,$//')"
    echo; echo "[publish]"; echo "spool_dir = \"$SPOOL\""
    [[ -n "$ACK_TABLE" ]] && echo "acknowledgements_table = \"$ACK_TABLE\""
    if [[ -n "$RELAY_QUEUE" ]]; then echo; echo "[relay]"; echo "queue_url = \"$RELAY_QUEUE\""; echo "table = \"$ACK_TABLE\""; fi
  } > "$ETC/agent.toml"
else
  echo "==> keeping the existing $ETC/agent.toml"
fi
"$PREFIX/agent/bin/nodemedic-agent" --config "$ETC/agent.toml" validate

cat > "$PREFIX/bin/deep-health-check" <<SH
#!/bin/sh
# DeepHealthCheckCommand of the NodeMedic stack: prints {"healthy": ..., "checks": [...]}
exec "$PREFIX/agent/bin/nodemedic-agent" --config "$ETC/agent.toml" health-check "\$@"
SH
chmod 755 "$PREFIX/bin/deep-health-check"
cat > "$PREFIX/bin/gpu-reset" <<SH
#!/bin/sh
# GpuResetCommand of the NodeMedic stack: releases, resets and checks the GPUs, then puts back what it stopped
exec "$PREFIX/agent/bin/nodemedic-agent" --config "$ETC/agent.toml" gpu-reset "\$@"
SH
chmod 755 "$PREFIX/bin/gpu-reset"

if [[ "$SYSTEMD" == 1 ]]; then
  echo "==> starting nodemedic-agent.service"
  install -m 644 "$HERE/../systemd/nodemedic-agent.service" "$ROOT/etc/systemd/system/nodemedic-agent.service"
  systemctl daemon-reload
  systemctl enable --now nodemedic-agent.service
  if [[ -n "$RELAY_QUEUE" ]]; then
    echo "==> starting nodemedic-relay.service (the pipeline's Slurm documents on this controller)"
    install -m 644 "$HERE/../systemd/nodemedic-relay.service" "$ROOT/etc/systemd/system/nodemedic-relay.service"
    systemctl daemon-reload
    systemctl enable --now nodemedic-relay.service
  fi
  if [[ "$BURN_IN" == 1 ]] && systemctl cat slurmd.service >/dev/null 2>&1; then
    # from the next slurmd start on (a boot, a replacement), the node joins drained until the
    # pipeline's full deep health check passes; a running node is not touched now
    echo "==> slurmd: each join is held for its burn-in (slurmd.service.d/nodemedic-burn-in.conf)"
    install -D -m 644 "$HERE/../systemd/slurmd-burn-in.conf" \
      "$ROOT/etc/systemd/system/slurmd.service.d/nodemedic-burn-in.conf"
    systemctl daemon-reload
  fi
fi
echo "==> first health report (nothing is sent)"
"$PREFIX/agent/bin/nodemedic-agent" --config "$ETC/agent.toml" check --once --dry-run || true
