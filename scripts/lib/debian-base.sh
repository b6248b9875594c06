# Sourced, not run: a Debian 12 root file system made the way Debian's own
# debian:12 container image is made: debootstrap --variant=minbase (main
# only), deb822 sources with the updates and security suites, apt set to keep
# no caches and no translations, no logs, no package lists, an empty
# machine-id. Used by scripts/build-images --local-bases (the images' bases)
# and by the fresh-machine test (tests/install/fresh_machine_test.py), so
# both start from the same machine nobody prepared.
#
#   source scripts/lib/debian-base.sh
#   debian_base_make DIR LOG      # needs root and debootstrap; on failure the
#                                 # end of LOG goes to stderr and it returns 1
#
# Mirrors: MESHLOAD_DEBIAN_MIRROR (default http://deb.debian.org/debian) and
# MESHLOAD_DEBIAN_SECURITY_MIRROR (default http://deb.debian.org/debian-security).

debian_base_make() {
  local r=$1 log=$2
  local mirror=${MESHLOAD_DEBIAN_MIRROR:-http://deb.debian.org/debian}
  local security=${MESHLOAD_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
  [ "$(id -u)" -eq 0 ] || { echo "debian-base: debootstrap needs root" >&2; return 1; }
  command -v debootstrap >/dev/null || {
    echo "debian-base: debootstrap is not installed (scripts/install-deps.sh installs it)" >&2
    return 1
  }
  if ! debootstrap --variant=minbase --components=main bookworm "$r" "$mirror" >"$log" 2>&1; then
    tail -30 "$log" >&2
    echo "debian-base: debootstrap failed (the end of its log above)" >&2
    return 1
  fi
  rm -f "$r/etc/apt/sources.list"
  cat >"$r/etc/apt/sources.list.d/debian.sources" <<SOURCES
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
  cat >"$r/etc/apt/apt.conf.d/docker-clean" <<'APT'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
APT
  echo 'Acquire::Languages "none";' >"$r/etc/apt/apt.conf.d/docker-no-languages"
  echo 'Apt::AutoRemove::SuggestsImportant "false";' >"$r/etc/apt/apt.conf.d/docker-autoremove-suggests"
  rm -rf "$r"/var/cache/apt/archives/*.deb "$r"/var/cache/apt/*.bin "$r"/var/lib/apt/lists/* \
    "$r"/var/log/* "$r"/tmp/* "$r"/root/.cache
  : >"$r/etc/machine-id"
}
