# Sourced by scripts/torch-check and scripts/bench-peers: a cached virtual
# environment made from a pinned requirements file, with the meshload wheel
# built from client/python installed into it.
#
#   source scripts/python-env.sh
#   python_env VENV REQUIREMENTS      # (re)made when REQUIREMENTS changed
#   install_meshload_wheel VENV       # builds the wheel offline (the wheelhouse) and installs it,
#                                     # unless the sources it builds from are those of the installed one

python_env() {
  local venv=$1 requirements=$2 root base want
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  want=$(sha256sum "$requirements" | cut -d' ' -f1)
  if [ "$(cat "$venv/.requirements.sha256" 2>/dev/null)" = "$want" ]; then
    return 0
  fi
  [ -x "$root/.venv/bin/python" ] || { echo "no $root/.venv: run scripts/install-deps.sh" >&2; return 1; }
  base=$("$root/.venv/bin/python" -c 'import sys; print(sys._base_executable)')
  echo "making $venv from ${requirements#"$root"/}"
  rm -rf "$venv"
  "$base" -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$requirements"
  echo "$want" >"$venv/.requirements.sha256"
}

install_meshload_wheel() {
  local venv=$1 root wheelhouse work want
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  # The wheel compiles client/, common/ and protocol/ (minutes on 2 cores):
  # built again only when one of the files it builds from changed.
  want=$(cd "$root" && find client common protocol cmake CMakeLists.txt -type f -print0 | sort -z |
    xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
  if [ "$(cat "$venv/.meshload-wheel.sha256" 2>/dev/null)" = "$want" ] &&
      "$venv/bin/python" -c 'import meshload' 2>/dev/null; then
    return 0
  fi
  wheelhouse=${MESHLOAD_WHEELHOUSE:-$HOME/.cache/meshload/wheelhouse}
  work=$(mktemp -d)
  if ! "$venv/bin/pip" wheel -q --disable-pip-version-check --no-index --find-links "$wheelhouse" \
      -w "$work/dist" "$root/client/python" >"$work/wheel.log" 2>&1; then
    tail -30 "$work/wheel.log"
    rm -rf "$work"
    return 1
  fi
  "$venv/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps "$work"/dist/meshload-*.whl
  rm -rf "$work"
  echo "$want" >"$venv/.meshload-wheel.sha256"
}
