#!/usr/bin/env bash
# Set up a fresh Debian machine for sparkavg: Java 17 (Spark), the
# Fashion-MNIST dataset, a virtual environment in .venv with the package
# (its Cython kernels compiled), the Spark Connect client, the test and
# documentation tools, and iproute2 for the tests' simulated hosts.  Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
need=()
command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
[ -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || need+=(dataset-fashion-mnist)
python3 -c "import venv, ensurepip" >/dev/null 2>&1 || need+=(python3-venv)
# the simulated multi-host cluster of the tests: ip/tc (network namespaces, links), nsenter/unshare
command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 || need+=(iproute2)
command -v nsenter >/dev/null 2>&1 || need+=(util-linux)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[test,connect]"
.venv/bin/python -c "import sparkavg_ext, sparkavg; print('sparkavg', sparkavg.__version__, 'ready')"
