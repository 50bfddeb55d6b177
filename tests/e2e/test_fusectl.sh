#!/bin/sh
# test_fusectl.sh: fusectl against a real fusemld on a temp socket and temp database.
# usage: test_fusectl.sh PATH/TO/fusemld PATH/TO/fusectl EXAMPLES_DIR
set -u
FUSEMLD=$1
FUSECTL=$2
EXAMPLES=$3

TMP=$(mktemp -d /tmp/fm-e2e-ctl-XXXXXX) || exit 1
SOCK=$TMP/fusemld.sock
DB=$TMP/kernels.db
LOG=$TMP/daemon.log
PID=
passed=0
failed=0

# The daemon dies with the test, pass or fail.
cleanup() {
  if [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null; then
    kill -9 "$PID" 2>/dev/null
    wait "$PID" 2>/dev/null
  fi
  if [ "$failed" -ne 0 ] && [ -f "$LOG" ]; then
    echo "---- daemon log ----" >&2
    cat "$LOG" >&2
  fi
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

ok() { passed=$((passed + 1)); echo "ok   $1"; }
fail() { failed=$((failed + 1)); echo "FAIL $1"; }
# check NAME COMMAND...: passes when the command succeeds
check() {
  name=$1
  shift
  if "$@"; then ok "$name"; else fail "$name"; fi
}
# json EXPR: evaluates a python expression over the JSON on stdin (bound to j); exit 0 if true
json() { python3 -c "import json,sys; j=json.load(sys.stdin); sys.exit(0 if ($1) else 1)"; }
field() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }

export XDG_CONFIG_HOME=$TMP    # no user config leaks in
ctl() { "$FUSECTL" --socket "$SOCK" "$@"; }

start_daemon() {
  "$FUSEMLD" --foreground --socket "$SOCK" --db "$DB" --jobs 2 --log-level debug "$@" 2>>"$LOG" &
  PID=$!
  i=0
  while [ $i -lt 200 ]; do
    ctl ping >/dev/null 2>&1 && return 0
    kill -0 "$PID" 2>/dev/null || return 1
    sleep 0.05
    i=$((i + 1))
  done
  return 1
}

if ! start_daemon; then
  fail "daemon starts"
  echo "$passed passed, $failed failed"
  exit 1
fi

check "ping" sh -c "\"$FUSECTL\" --socket \"$SOCK\" ping | grep -q pong"

out=$(ctl --json compile "$EXAMPLES/gelu_bias_bf16.json")
check "compile: origin compiled" test "$(echo "$out" | field '["origin"]')" = compiled
KEY=$(echo "$out" | field '["key"]')
out=$(ctl --json compile "$EXAMPLES/gelu_bias_bf16.json")
check "compile again: origin hit" test "$(echo "$out" | field '["origin"]')" = hit
check "same key" test "$(echo "$out" | field '["key"]')" = "$KEY"

stats=$(ctl --json stats)
check "stats: hits=1 misses=1 compiles=1" sh -c "echo '$stats' | python3 -c 'import json,sys; s=json.load(sys.stdin)[\"stats\"]; sys.exit(0 if (s[\"hits\"], s[\"misses\"], s[\"compiles\"]) == (1, 1, 1) else 1)'"
# compile-only without a GPU (CI); "gpu" on the device machine
check "stats: mode reported" sh -c "echo '$stats' | python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)[\"mode\"] in (\"compile-only\", \"gpu\") else 1)'"

# The human form: hit rate, size against the cap, database, pid (the one compile and one hit above).
ctl stats >"$TMP/stats"
check "stats: hit rate" grep -q "^hit rate  *50.0% (this session: 50.0%)" "$TMP/stats"
check "stats: size of the cap" grep -q "^size  *.* of 2.0 GiB (" "$TMP/stats"
check "stats: database" grep -q "^database  *$DB\$" "$TMP/stats"
check "stats: pid" grep -q "^pid  *$PID\$" "$TMP/stats"
check "stats: uptime" grep -q "^uptime  *[0-9]" "$TMP/stats"

check "ls: one entry" sh -c "\"$FUSECTL\" --socket \"$SOCK\" --json ls | python3 -c 'import json,sys; sys.exit(0 if len(json.load(sys.stdin)[\"entries\"]) == 1 else 1)'"
PREFIX=$(echo "$KEY" | cut -c1-8)
check "show by prefix" sh -c "\"$FUSECTL\" --socket \"$SOCK\" show $PREFIX | grep -q $KEY"
check "show --source" sh -c "\"$FUSECTL\" --socket \"$SOCK\" show --source $PREFIX | grep -q fm_pointwise"
check "show: canonical fragment" sh -c "\"$FUSECTL\" --socket \"$SOCK\" --json show $PREFIX | python3 -c 'import json,sys; e=json.load(sys.stdin)[\"entry\"]; sys.exit(0 if e[\"fragment\"][\"ops\"][1][\"op\"] == \"gelu\" else 1)'"
check "show --source --json: key and source" sh -c "\"$FUSECTL\" --socket \"$SOCK\" --json show --source $PREFIX | python3 -c 'import json,sys; j=json.load(sys.stdin); sys.exit(0 if j[\"key\"] == \"$KEY\" and \"fm_pointwise\" in j[\"source\"] else 1)'"
# --json leaves out the wire fields.
check "--json: no ok, no id (compile)" sh -c "\"$FUSECTL\" --socket \"$SOCK\" --json compile \"$EXAMPLES/gelu_bias_bf16.json\" | python3 -c 'import json,sys; j=json.load(sys.stdin); sys.exit(0 if \"ok\" not in j and \"id\" not in j and j[\"origin\"] == \"hit\" else 1)'"
check "--json: no ok, no id (stats)" sh -c "\"$FUSECTL\" --socket \"$SOCK\" --json stats | python3 -c 'import json,sys; j=json.load(sys.stdin); sys.exit(0 if \"ok\" not in j and \"id\" not in j and \"entries\" in j else 1)'"
# --json on failure: an error object on stdout (and the message on stderr as ever).
ctl --json show ffff0000 >"$TMP/out" 2>"$TMP/err"
check "--json failure: exit 1" test $? -eq 1
check "--json failure: error object" sh -c "python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); sys.exit(0 if j[\"error\"] == \"not_found\" and \"ffff0000\" in j[\"message\"] else 1)' '$TMP/out'"
check "--json failure: stderr still says it" grep -q not_found "$TMP/err"
"$FUSECTL" --socket "$TMP/nobody.sock" ping --json >"$TMP/out" 2>/dev/null
check "--json unreachable: exit 3, error object" sh -c "test $? -eq 3 && python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))[\"error\"] == \"unreachable\" else 1)' '$TMP/out'"
ctl --json frobnicate >"$TMP/out" 2>/dev/null
check "--json usage error: error object" sh -c "python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))[\"error\"] == \"usage\" else 1)' '$TMP/out'"
ctl --json compile "$TMP/missing.json" >"$TMP/out" 2>/dev/null
check "--json bad input: exit 4, error object" sh -c "test $? -eq 4 && python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))[\"error\"] == \"bad_input\" else 1)' '$TMP/out'"
check "evict" ctl evict "$KEY"
check "ls: empty" sh -c "\"$FUSECTL\" --socket \"$SOCK\" --json ls | python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)[\"entries\"] == [] else 1)'"

n=$(grep -v '^[[:space:]]*#' "$EXAMPLES/warm.manifest" | grep -c .)
check "warm the manifest" sh -c "\"$FUSECTL\" --socket \"$SOCK\" warm \"$EXAMPLES/warm.manifest\" >/dev/null"
check "ls: every warmed kernel" sh -c "\"$FUSECTL\" --socket \"$SOCK\" --json ls | python3 -c 'import json,sys; sys.exit(0 if len(json.load(sys.stdin)[\"entries\"]) == $n else 1)'"

# A column fragment (vocab 5: a bias gradient, grad.sum(0)), compiled above by warm, served
# with the launch metadata of its kind.
out=$(ctl --json compile "$EXAMPLES/bias_grad_bf16.json")
check "columns: origin hit" test "$(echo "$out" | field '["origin"]')" = hit
check "columns: kind" test "$(echo "$out" | field '["kind"]')" = columns
check "columns: grid rule" test "$(echo "$out" | field '["meta"]["grid"]["rule"]')" = columns
check "columns: symbolic M" test "$(echo "$out" | field '["meta"]["outer"]')" = -1

printf '{"vocab": 1, "inputs": [], "ops": [{"op": "frobnicate", "out": 1, "args": []}], "outputs": []}\n' >"$TMP/bad.json"
ctl compile "$TMP/bad.json" >/dev/null 2>"$TMP/err"
rc=$?
check "bad fragment: exit 1" test $rc -eq 1
check "bad fragment: slug" grep -q unknown_op "$TMP/err"
ctl --json compile "$TMP/bad.json" >"$TMP/out" 2>/dev/null
check "bad fragment --json: the daemon's code" sh -c "python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))[\"error\"] == \"unknown_op\" else 1)' '$TMP/out'"

# stats --zero (the daemon's own user here): every counter back to 0, the entries kept.
check "stats --zero" ctl stats --zero
check "stats --zero: counters 0" sh -c "\"$FUSECTL\" --socket \"$SOCK\" --json stats | python3 -c 'import json,sys; j=json.load(sys.stdin); sys.exit(0 if j[\"stats\"][\"hits\"] == j[\"stats\"][\"compiles\"] == j[\"session\"][\"misses\"] == 0 and j[\"entries\"] > 0 else 1)'"
check "stats --zero: hit rate -" sh -c "\"$FUSECTL\" --socket \"$SOCK\" stats | grep -q '^hit rate  *- '"

"$FUSECTL" --socket "$TMP/nobody.sock" ping >/dev/null 2>&1
check "unreachable socket: exit 3" test $? -eq 3

# Help: the whole of it, and each command's (both spellings say the same).
ctl help >"$TMP/help" 2>&1
check "help: exit 0" test $? -eq 0
for c in ping stats ls show evict compile warm export import shutdown help; do
  check "help: lists $c" grep -q "^  $c" "$TMP/help"
done
ctl show --help >"$TMP/help_show" 2>&1
check "show --help: exit 0" test $? -eq 0
check "show --help: its option" grep -q -- "--source" "$TMP/help_show"
ctl help show >"$TMP/help_show2" 2>&1
check "help show = show --help" cmp -s "$TMP/help_show" "$TMP/help_show2"
ctl warm -h >/dev/null 2>&1
check "warm -h: exit 0 (no manifest needed)" test $? -eq 0
# An unknown flag: one line naming it and pointing at --help, not the whole help.
ctl show --frob abcd >/dev/null 2>"$TMP/err"
check "unknown flag: exit 2" test $? -eq 2
check "unknown flag: one line" test "$(wc -l <"$TMP/err")" -eq 1
check "unknown flag: names it and --help" grep -q -- "'--frob'.*fusectl show --help" "$TMP/err"
"$FUSECTL" --frob ping >/dev/null 2>"$TMP/err"
check "unknown global flag: exit 2, one line" test $? -eq 2 -a "$(wc -l <"$TMP/err")" -eq 1
ctl ls --limit >/dev/null 2>"$TMP/err"
check "missing argument: one line naming it" sh -c "test \$(wc -l <'$TMP/err') -eq 1 && grep -q -- \"'--limit'\" '$TMP/err'"
"$FUSEMLD" --frob >/dev/null 2>"$TMP/err"
check "fusemld unknown flag: exit 2" test $? -eq 2
check "fusemld unknown flag: one line naming it" sh -c "test \$(wc -l <'$TMP/err') -eq 1 && grep -q -- \"'--frob'.*fusemld --help\" '$TMP/err'"

# warm keeps several compiles in flight (by default as many as the daemon has workers: 2
# here), so that a manifest of slow fragments uses every worker. Counted, not timed: the most
# compiles the daemon reports in flight while warm runs.
# The exponents are 1 + EXPONENT/1000: general pows (slow to compile) whose chain stays well
# conditioned, so that on a GPU host, where every kernel is verified against the reference
# before it is served, the chain's fp32 rounding is not raised to the 16th power of 2.x.
mkfrags() {  # mkfrags DIR EXPONENT...: one fragment of 16 chained general pows per exponent
  dir=$1
  shift
  mkdir -p "$dir"
  for e in "$@"; do
    python3 -c "
import json, sys
t = lambda i: {'id': i, 'dtype': 'f32', 'shape': [-1, 256]}
ops = [{'op': 'const', 'out': 1, 'args': [], 'value': 1 + float(sys.argv[1]) / 1000}]
v = 0
for i in range(16):
    ops.append({'op': 'pow', 'out': i + 2, 'args': [v, 1]}); v = i + 2
print(json.dumps({'vocab': 1, 'inputs': [t(0)], 'ops': ops, 'outputs': [t(v)]}))" "$e" >"$dir/pow$e.json"
    echo "pow$e.json" >>"$dir/manifest"
  done
}
# warm_peak DIR [ARGS]: runs warm on DIR/manifest; prints "EXIT PEAK-INFLIGHT SECONDS"
warm_peak() {
  dir=$1
  shift
  t0=$(date +%s.%N)
  ctl --json warm "$dir/manifest" "$@" >"$dir/out" 2>"$dir/err" &
  wp=$!
  peak=0
  while kill -0 $wp 2>/dev/null; do
    cur=$(ctl stats 2>/dev/null | awk '$1 == "inflight" {print $2}')
    [ -n "$cur" ] && [ "$cur" -gt "$peak" ] && peak=$cur
    sleep 0.05
  done
  wait $wp
  rc=$?
  echo "$rc $peak $(python3 -c "import sys; print('%.1f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$t0" "$(date +%s.%N)")"
}
mkfrags "$TMP/slow4" 2.125 2.375 2.625 2.875
set -- $(warm_peak "$TMP/slow4")
check "warm: exit 0" test "$1" -eq 0
check "warm: 2 compiles in flight at once (the daemon's 2 workers)" test "$2" -eq 2
check "warm: 4 compiled, results in manifest order" python3 -c "
import json, sys
j = json.load(open(sys.argv[1]))
sys.exit(0 if j['compiled'] == 4 and [r['path'].rsplit('/', 1)[1] for r in j['results']] == ['pow2.125.json', 'pow2.375.json', 'pow2.625.json', 'pow2.875.json'] else 1)" "$TMP/slow4/out"
echo "     4 slow fragments, default jobs: $3 s"
mkfrags "$TMP/slow1" 3.125 3.375
set -- $(warm_peak "$TMP/slow1" --jobs 1)
check "warm --jobs 1: one at a time" test "$1" -eq 0 -a "$2" -eq 1
echo "     2 slow fragments, --jobs 1: $3 s"
ctl warm "$TMP/slow1/manifest" --jobs 0 >/dev/null 2>&1
check "warm --jobs 0: usage error" test $? -eq 2
# Leave the store as it was for the checks below.
for f in "$TMP/slow4/out" "$TMP/slow1/out"; do
  for k in $(python3 -c 'import json,sys; print(" ".join(r["key"] for r in json.load(open(sys.argv[1]))["results"] if "key" in r))' "$f"); do
    ctl evict "$k" >/dev/null
  done
done

# fusemld reads FUSEML_SOCKET as the clients do (no --socket): one variable for both. Its
# XDG_RUNTIME_DIR points at a folder of ours, so a daemon that ignored the variable could not
# take anyone's real socket.
mkdir -p "$TMP/envrun" && chmod 700 "$TMP/envrun"
FUSEML_SOCKET="$TMP/env.sock" XDG_RUNTIME_DIR="$TMP/envrun" "$FUSEMLD" --foreground --db "$TMP/env.db" 2>>"$LOG" &
PID_ENV=$!
i=0
while [ ! -S "$TMP/env.sock" ] && [ ! -S "$TMP/envrun/fusemld.sock" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
check "FUSEML_SOCKET: fusemld listens there" test -S "$TMP/env.sock"
check "FUSEML_SOCKET: a client with only the variable reaches it" env FUSEML_SOCKET="$TMP/env.sock" "$FUSECTL" ping
check "FUSEML_SOCKET: the per-user default unused" test ! -e "$TMP/envrun/fusemld.sock"
kill -TERM $PID_ENV
wait $PID_ENV
# --socket still wins over it.
FUSEML_SOCKET="$TMP/env.sock" "$FUSEMLD" --foreground --socket "$TMP/flag.sock" --db "$TMP/env.db" 2>>"$LOG" &
PID_ENV=$!
i=0
while [ ! -S "$TMP/flag.sock" ] && [ ! -S "$TMP/env.sock" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
check "--socket over FUSEML_SOCKET" sh -c "test -S '$TMP/flag.sock' && test ! -e '$TMP/env.sock'"
kill -TERM $PID_ENV
wait $PID_ENV

# A second daemon on the same socket refuses to start and says why.
"$FUSEMLD" --foreground --socket "$SOCK" --db "$TMP/other.db" 2>"$TMP/second" &
p2=$!
wait $p2
check "second daemon refused" test $? -ne 0
check "second daemon: reason" grep -q "already serving" "$TMP/second"

# A bad config line is a startup error naming file:line.
printf 'jobs = 2\n# fine\nfrobs = 3\n' >"$TMP/bad.conf"
"$FUSEMLD" --foreground --config "$TMP/bad.conf" --socket "$TMP/x.sock" --db "$TMP/x.db" 2>"$TMP/conf_err"
check "bad config: refused" test $? -ne 0
check "bad config: file:line" grep -q "bad.conf:3" "$TMP/conf_err"

# SIGTERM: exit 0 and the socket file is gone.
kill -TERM "$PID"
wait "$PID"
check "SIGTERM: exit 0" test $? -eq 0
PID=
check "SIGTERM: socket removed" test ! -e "$SOCK"

# Without --foreground: returns once serving; the entries are still there.
"$FUSEMLD" --socket "$SOCK" --db "$DB" --log-file "$TMP/bg.log"
check "background start: exit 0" test $? -eq 0
check "background: serving at once" ctl ping
PID=$(sed -n 's/.*fusemld\[\([0-9]*\)\].*serving.*/\1/p' "$TMP/bg.log" | head -n 1)
check "background: entries persisted" sh -c "\"$FUSECTL\" --socket \"$SOCK\" --json ls | python3 -c 'import json,sys; sys.exit(0 if len(json.load(sys.stdin)[\"entries\"]) == $n else 1)'"
if [ -n "$PID" ]; then
  # SIGHUP reopens the log file (after logrotate moved it away).
  mv "$TMP/bg.log" "$TMP/bg.log.1"
  kill -HUP "$PID"
  i=0
  while [ ! -s "$TMP/bg.log" ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
  check "SIGHUP: log reopened" grep -q "log reopened" "$TMP/bg.log"
  kill -TERM "$PID"
  i=0
  while kill -0 "$PID" 2>/dev/null && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
  check "background: stops on SIGTERM" sh -c "! kill -0 $PID 2>/dev/null"
  PID=
else
  fail "background: pid in the log"
fi

# In the background without --log-file it logs beside its database.
mkdir -p "$TMP/bgdef"
"$FUSEMLD" --socket "$TMP/bgdef/s" --db "$TMP/bgdef/kernels.db"
check "background default log: start" test $? -eq 0
check "background default log: written beside the db" grep -q "serving" "$TMP/bgdef/fusemld.log"
PID2=$(sed -n 's/.*fusemld\[\([0-9]*\)\].*serving.*/\1/p' "$TMP/bgdef/fusemld.log" | head -n 1)
[ -n "$PID2" ] && kill -TERM "$PID2"
i=0
while [ -n "$PID2" ] && kill -0 "$PID2" 2>/dev/null && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
