#!/usr/bin/env bash
# Makes a glslangValidator that compiles GL_NV_cooperative_matrix2 (glslang >= 15.1) available and
# prints its path. The distribution's when it is new enough (Debian 13); otherwise Debian 13's own
# source package, fetched from Debian's archive through a private apt configuration (the machine's
# sources stay untouched) and built once into a cache outside any build tree:
#   ${KVTIER_TOOLS_CACHE:-$HOME/.cache/kvtier}/glslang-<version>/bin/glslangValidator
# 123 s on a 2-core VM (download included), 12 MB installed; later runs find it at once.
# Prints nothing (exit 0) when no such compiler can be had: CMake then leaves coopmat2 out.
set -euo pipefail

# The whole script is one function, read before any of it runs (a script edited while it builds
# would otherwise go on from the wrong offset).
main() {

version_ok() {  # glslangValidator --version's "Glslang Version: 11:15.1.0" -> >= 15.1?
  local v
  v=$("$1" --version 2>/dev/null | sed -n 's/^Glslang Version: [0-9]*:\([0-9]*\)\.\([0-9]*\).*/\1 \2/p')
  [[ -n "$v" ]] || return 1
  set -- $v
  (( $1 > 15 || ($1 == 15 && $2 >= 1) ))
}

if command -v glslangValidator >/dev/null && version_ok "$(command -v glslangValidator)"; then
  command -v glslangValidator
  exit 0
fi

cache=${KVTIER_TOOLS_CACHE:-$HOME/.cache/kvtier}
for built in "$cache"/glslang-*/bin/glslangValidator; do
  if [[ -x "$built" ]] && version_ok "$built"; then
    echo "$built"
    exit 0
  fi
done

log() { echo "glslang.sh: $*" >&2; }
mkdir -p "$cache"
# A fetch or build that failed is not retried for a day (every `make` calls this script; offline,
# apt would wait out its timeouts each time). KVTIER_GLSLANG_RETRY=1 retries now.
failed="$cache/glslang-failed"
if [[ -z "${KVTIER_GLSLANG_RETRY:-}" && -n "$(find "$failed" -mmin -1440 2>/dev/null)" ]]; then
  exit 0
fi
give_up() {
  log "$1; the coopmat2 kernels are left out (retried after a day, or with KVTIER_GLSLANG_RETRY=1)"
  touch "$failed"
  exit 0
}
work=$(mktemp -d "$cache/glslang-build.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Debian 13's source index, in a private apt state: only deb-src lines for trixie.
mkdir -p "$work/apt/lists/partial" "$work/apt/cache/archives/partial"
echo "deb-src http://deb.debian.org/debian trixie main" > "$work/apt/sources.list"
apt_opts=(-o Dir::Etc::SourceList="$work/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
          -o Dir::State::Lists="$work/apt/lists" -o Dir::Cache="$work/apt/cache"
          -o APT::Sandbox::User=root -qq)
log "fetching Debian 13's glslang source (the machine's apt sources are not changed)"
if ! apt-get "${apt_opts[@]}" update >&2 ||
   ! (cd "$work" && apt-get "${apt_opts[@]}" source --download-only glslang >&2); then
  give_up "could not fetch the source"
fi
# Upstream as released: with Debian's patches applied, Debian 12's CMake (3.25) rejects the SPIRV
# target's link rules (plain and keyword target_link_libraries mixed).
(cd "$work" && dpkg-source -x --no-check --skip-patches ./glslang_*.dsc src >&2)
log "building it (about 2 minutes on 2 cores)"
if ! cmake -S "$work/src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DENABLE_OPT=OFF \
       -DGLSLANG_TESTS=OFF -DCMAKE_INSTALL_RPATH='$ORIGIN/../lib' -DCMAKE_INSTALL_LIBDIR=lib \
       -DCMAKE_INSTALL_PREFIX="$work/install" >&2 ||
   ! cmake --build "$work/build" -j "$(nproc)" --target install >&2; then
  give_up "the build failed"
fi
v=$("$work/install/bin/glslangValidator" --version | sed -n 's/^Glslang Version: [0-9]*:\([0-9.]*\).*/\1/p')
if ! version_ok "$work/install/bin/glslangValidator"; then
  give_up "built glslang $v is older than 15.1"
fi
rm -rf "$cache/glslang-$v"
mv "$work/install" "$cache/glslang-$v"
rm -f "$failed"
log "glslang $v is in $cache/glslang-$v"
echo "$cache/glslang-$v/bin/glslangValidator"
}

main "$@"
