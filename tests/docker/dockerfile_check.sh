#!/usr/bin/env bash
# What can be checked of the Dockerfiles without a Docker engine:
#   - every shared library the binaries an image copies from its build stage
#     load comes from a package the runtime stage installs, one of their
#     dependencies, or debian:12-slim's own packages (an image that builds but
#     cannot start is caught here);
#   - the image runs as a non-root numeric uid, and its entrypoint is a
#     binary the build stage builds and copies.
# Each binary an image copies must be given (matched by file name); one given
# at a path that does not exist yet (a target still being written) is noted
# and its libraries are not checked.
# usage: dockerfile_check.sh REPO_ROOT BINARY...
set -u
ROOT=$1
shift
pass=0 fail=0
check() { if [ "$2" -eq 0 ]; then pass=$((pass + 1)); echo "ok   $1"; else fail=$((fail + 1)); echo "FAIL $1"; fi; }
BASE="libc6 libgcc-s1 libstdc++6 zlib1g"  # in debian:12-slim already

for df in "$ROOT"/docker/Dockerfile.*; do
  name=$(basename "$df")
  runtime=$(awk '/^FROM /{stage++} stage==2' "$df")
  pkgs=$(grep -o 'install -y --no-install-recommends [^&\\]*' <<<"$runtime" | sed 's/install -y --no-install-recommends //')
  provided=" $BASE $pkgs $(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
      --no-replaces --no-enhances $pkgs 2>/dev/null | grep -v '^ ' | tr '\n' ' ') "
  missing="" checked=""
  # The sources of `COPY --from=build SRC... DEST`, by file name.
  for want in $(grep -E '^COPY --from=build ' "$df" | awk '{for (i = 3; i < NF; i++) print $i}' | xargs -n1 basename); do
    bin=""
    for b in "$@"; do [ "$(basename "$b")" = "$want" ] && bin=$b; done
    if [ -z "$bin" ]; then
      missing="$missing $want(no such binary given to this script)"
      continue
    fi
    if [ ! -e "$bin" ]; then
      echo "note $name: $bin does not exist (not built): its shared libraries are not checked"
      continue
    fi
    checked="$checked $want"
    for lib in $(ldd "$bin" | awk '$3 ~ /^\// {print $3}'); do
      real=$(readlink -f "$lib")
      pkg=$(dpkg -S "$real" 2>/dev/null || dpkg -S "${real#/usr}" 2>/dev/null || dpkg -S "/usr$real" 2>/dev/null)
      pkg=${pkg%%:*}
      [[ "$provided" == *" $pkg "* ]] || missing="$missing $pkg($lib)"
    done
  done
  if [ -n "$checked" ] || [ -n "$missing" ]; then
    [ -z "$missing" ]
    check "$name: every shared library of$checked is in the runtime image" $?
    [ -n "$missing" ] && echo "     missing:$missing"
  fi
  user=$(grep -E '^USER ' <<<"$runtime" | tail -1 | awk '{print $2}')
  [[ "$user" =~ ^[1-9][0-9]*(:[0-9]+)?$ ]]
  check "$name: runs as a non-root numeric uid ($user)" $?
  entry=$(grep -E '^ENTRYPOINT' "$df" | grep -o '/usr/local/bin/[a-z-]*' | xargs basename)
  grep -q -- "--target.*$entry" "$df" && grep -q "COPY --from=build.*$entry" "$df"
  check "$name: the entrypoint ($entry) is built and copied" $?
done
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
