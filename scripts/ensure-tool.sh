#!/usr/bin/env bash
# Makes sure a command from a Debian package is on this machine, installing the package when it
# is missing, so a fresh machine passes the tests that need it (promtool, chromium).
# Usage: scripts/ensure-tool.sh <command> <debian-package>
# Prints the command's path; exits non-zero (with apt's error) when it cannot be installed.
set -euo pipefail
cmd=$1
pkg=$2
if path=$(command -v "$cmd" 2>/dev/null); then
  echo "$path"
  exit 0
fi
sudo=""
if [ "$(id -u)" != 0 ]; then sudo="sudo -n"; fi
export DEBIAN_FRONTEND=noninteractive
# One installer at a time: tests run in parallel and dpkg holds a lock.
exec 9>"${TMPDIR:-/tmp}/sluice-ensure-tool.lock"
flock 9
if ! command -v "$cmd" >/dev/null 2>&1; then
  if ! $sudo apt-get install -y --no-install-recommends "$pkg" >/tmp/sluice-ensure-"$pkg".log 2>&1; then
    $sudo apt-get update >>/tmp/sluice-ensure-"$pkg".log 2>&1
    $sudo apt-get install -y --no-install-recommends "$pkg" >>/tmp/sluice-ensure-"$pkg".log 2>&1 || { tail -5 /tmp/sluice-ensure-"$pkg".log >&2; exit 1; }
  fi
fi
command -v "$cmd"
