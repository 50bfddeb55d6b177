#!/bin/sh
# test_pkgconfig.sh: an installed libfusemld is usable through pkg-config: the tree installed
# into a temp prefix, a program that includes <fusemld/fm_client.h> (and one with the old
# <fm_client.h>) compiles with `pkg-config --cflags fusemld` alone, and --libs names the library.
# usage: test_pkgconfig.sh BUILD_DIR CC
set -u
BUILD=$1
CC=$2
TMP=$(mktemp -d /tmp/fm-e2e-pc-XXXXXX) || exit 1
trap 'rm -rf "$TMP"' EXIT
passed=0
failed=0
check() {
  name=$1
  shift
  if "$@"; then passed=$((passed + 1)); echo "ok   $name"; else failed=$((failed + 1)); echo "FAIL $name"; fi
}

cmake --install "$BUILD" --prefix "$TMP/prefix" >"$TMP/install.log" 2>&1
check "cmake --install" test $? -eq 0
pc=$(find "$TMP/prefix" -name fusemld.pc | head -n 1)
check "fusemld.pc installed" test -n "$pc"
export PKG_CONFIG_PATH=$(dirname "$pc")
CFLAGS=$(pkg-config --cflags fusemld)
check "pkg-config --cflags" test $? -eq 0
check "pkg-config --libs: -lfusemld" sh -c "pkg-config --libs fusemld | grep -q -- -lfusemld"

printf '#include <fusemld/fm_client.h>\nint main(void) { fm_client *c = 0; (void)c; return 0; }\n' >"$TMP/new.c"
printf '#include <fm_client.h>\nint main(void) { fm_client *c = 0; (void)c; return 0; }\n' >"$TMP/old.c"
# shellcheck disable=SC2086
$CC $CFLAGS -c "$TMP/new.c" -o "$TMP/new.o" 2>"$TMP/new.err"
check "#include <fusemld/fm_client.h> compiles" test $? -eq 0
# shellcheck disable=SC2086
$CC $CFLAGS -c "$TMP/old.c" -o "$TMP/old.o" 2>"$TMP/old.err"
check "#include <fm_client.h> still compiles" test $? -eq 0
[ "$failed" -eq 0 ] || cat "$TMP/install.log" "$TMP/new.err" "$TMP/old.err" >&2

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
