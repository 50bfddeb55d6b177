#!/bin/sh
# test_install.sh: `cmake --install` into a DESTDIR installs the systemd units with this
# build's paths filled in, the remote tier's drop-in, the example config, and the documents the
# units' Documentation= names, so that every path a unit names exists in the installed tree.
# usage: test_install.sh BUILD_DIR
set -u
BUILD=$1
TMP=$(mktemp -d /tmp/fm-e2e-install-XXXXXX) || exit 1
trap 'rm -rf "$TMP"' EXIT
passed=0
failed=0
check() {
  name=$1
  shift
  if "$@"; then passed=$((passed + 1)); echo "ok   $name"; else failed=$((failed + 1)); echo "FAIL $name"; fi
}

DESTDIR="$TMP/root" cmake --install "$BUILD" >"$TMP/install.log" 2>&1
check "cmake --install" test $? -eq 0
prefix=$(sed -n 's/^CMAKE_INSTALL_PREFIX:PATH=//p' "$BUILD/CMakeCache.txt")
units=$(sed -n 's/^FM_SYSTEMD_UNIT_DIR:STRING=//p' "$BUILD/CMakeCache.txt")
case "$units" in /*) ;; *) units="$prefix/$units" ;; esac
root="$TMP/root"
service="$root$units/fusemld.service"
for f in "$service" "$root$units/fusemld.socket" "$root$prefix/share/fusemld/fusemld-remote.conf" \
         "$root$prefix/share/fusemld/fusemld.conf.example"; do
  check "installed: ${f#"$root"}" test -f "$f"
done
check "no @VARIABLE@ left in the service" sh -c "! grep -n '@FM_[A-Z]*@' '$service'"
# Every file the service names (ExecStart's program, each Documentation= file://) is installed.
exe=$(sed -n 's/^ExecStart=\([^ ]*\).*/\1/p' "$service")
check "ExecStart= $exe installed" sh -c "test -n '$exe' && test -x '$root$exe'"
docs=$(sed -n 's/^Documentation=//p' "$service" | tr ' ' '\n' | sed -n 's|^file://||p')
check "Documentation= names files" test -n "$docs"
for doc in $docs; do
  check "Documentation= $doc installed" test -f "$root$doc"
done
# The drop-in lifts exactly the unit's three network settings.
dropin="$root$prefix/share/fusemld/fusemld-remote.conf"
for key in PrivateNetwork RestrictAddressFamilies IPAddressDeny; do
  check "$key in the unit and the drop-in" sh -c "grep -q '^$key=' '$service' && grep -q '^$key=' '$dropin'"
done
[ "$failed" -eq 0 ] || cat "$TMP/install.log" >&2

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
