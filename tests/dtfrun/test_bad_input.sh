# Bad command lines: exit status 2, exactly one line on stderr, nothing on stdout, and
# nothing started. Also --help.
source "$(dirname "$0")/lib.sh"

touch "$work/not_executable"
sentinel="$work/started"

bad() {  # bad <expected message part> <dtfrun arguments...>
  local want=$1
  shift
  "$dtfrun" "$@" >"$work/bad.out" 2>"$work/bad.err"
  local rc=$?
  [[ $rc -eq 2 ]] || fail "dtfrun $*: exit status $rc, expected 2"
  [[ ! -s "$work/bad.out" ]] || fail "dtfrun $*: wrote to stdout"
  [[ $(wc -l <"$work/bad.err") -eq 1 ]] || fail "dtfrun $*: expected one line on stderr"
  grep -q '^dtfrun: ' "$work/bad.err" || fail "dtfrun $*: message lacks the 'dtfrun: ' prefix"
  grep -qF -- "$want" "$work/bad.err" || fail "dtfrun $*: message lacks '$want'"
  [[ ! -e "$sentinel" ]] || fail "dtfrun $*: started a task"
}

bad "unknown flag '--bogus'" --bogus -- touch "$sentinel"
bad "unknown flag '--Workers'" --Workers 2 -- touch "$sentinel"
bad "missing '--'" touch "$sentinel"
bad "missing '--'" --ps 1
bad "missing the command" --ps 1 --
bad "--workers 0" --workers 0 -- touch "$sentinel"
bad "--ps needs a whole number" --ps abc -- touch "$sentinel"
bad "--ps needs a whole number" --ps 1x -- touch "$sentinel"
bad "--workers needs a whole number" --workers -1 -- touch "$sentinel"
bad "--workers needs a whole number" --workers=99999999999999999999 -- touch "$sentinel"
bad "--grace_ms needs a whole number" --grace_ms 1.5 -- touch "$sentinel"
bad "--timeout_s needs a whole number" --timeout_s '' -- touch "$sentinel"
bad "--ps needs a value" --ps
bad "--chief takes no value" --chief=yes -- touch "$sentinel"
bad "unexpected argument 'touch'" touch -- touch "$sentinel"
bad "cannot execute '/nonexistent/program'" -- /nonexistent/program
bad "cannot execute '${tok}_command'" -- "${tok}_command"
bad "cannot execute '$work/not_executable'" -- "$work/not_executable"
bad "cannot execute '$work'" -- "$work"
bad "--max-restarts needs a whole number" --max-restarts x -- touch "$sentinel"
bad "--max-restarts needs N or role=N" --max-restarts gpu=1 -- touch "$sentinel"
bad "--max-restarts needs N or role=N" --max-restarts ps=1,,worker=2 -- touch "$sentinel"
bad "--max-restarts worker needs a whole number" --max_restarts ps=1,worker= -- touch "$sentinel"
bad "--max-restarts names 'ps' twice" --max-restarts ps=1,ps=2 -- touch "$sentinel"
bad "--restart-delay-ms needs a whole number" --restart-delay-ms -5 -- touch "$sentinel"
bad "cannot resolve --host" --host no-such-host.invalid -- touch "$sentinel"

"$dtfrun" --help >"$work/help.out" 2>"$work/help.err"
expect_rc 0 $? "--help"
grep -q '^usage: dtfrun ' "$work/help.out" || fail "--help prints no usage"
[[ ! -s "$work/help.err" ]] || fail "--help wrote to stderr"

# The same command, well formed, does start (so the cases above failed for their reason).
"$dtfrun" --workers 1 -- touch "$sentinel" >"$work/good.out" 2>"$work/good.err"
expect_rc 0 $? "well-formed command"
[[ -e "$sentinel" ]] || fail "the well-formed command did not run"
echo PASS
