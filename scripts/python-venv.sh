# Sourced by the install scripts: need_python_venv NAME makes sure /usr/bin/python3 can create a
# virtual environment, installing Debian's python3-venv as root, else failing with one line.
need_python_venv() {
  /usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null && return 0
  if [[ $(id -u) -ne 0 ]]; then
    echo "$1: error: python3-venv is missing and not root (apt-get install python3-venv)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends python3-venv
}
