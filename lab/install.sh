#!/usr/bin/env bash
# What the fault lab needs beyond `make install`: torch (CPU) and friends in the venv, and Debian's faketime
# (per-host clock skew) and util-linux (unshare). Run by `make lab`; idempotent.
set -euo pipefail
PY=${PY:-.venv/bin/python}

# One pip command for the project and both extras: torch==2.13.0 and the libraries that depend on it are
# resolved together (accelerate, transformers and lightning then take 2.13.0, never a newer CUDA build),
# and faust-streaming's click < 8.4 bounds huggingface_hub.
"$PY" -m pip install -q -e '.[test,lab]' --config-settings editable_mode=compat 2>/dev/null \
  || "$PY" -m pip install -q -e '.[test,lab]'

need=()
[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || need+=(faketime)
command -v unshare >/dev/null || need+=(util-linux)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    # another apt run may hold the lock for a while: wait for it rather than fail
    apt-get -o DPkg::Lock::Timeout=900 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -qq "${need[@]}"
  else
    echo "lab: needs ${need[*]} (Debian packages) and root for unshare --uts --mount; run as root" >&2
    exit 1
  fi
fi
if [ "$(id -u)" != 0 ]; then
  echo "lab: the simulated hosts use unshare --uts --mount, which needs root" >&2
  exit 1
fi
