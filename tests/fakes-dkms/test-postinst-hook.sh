#!/bin/sh
# SPDX-License-Identifier: MIT
# Tests units/zz-gpu-node-agent (the kernel postinst hook) with a stand-in agent: it calls
# `--prepare-kernel KVER`, fails loudly when the agent fails (missing headers), honours the opt-outs,
# and does nothing once the agent is uninstalled.
set -u
hook=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

fail() {
        echo "FAIL: $*" >&2
        failures=$((failures + 1))
}

cat >"$tmp/agent" <<'AGENT'
#!/bin/sh
echo "$*" >>"$STUB_CALLS"
if [ -n "${STUB_FAIL:-}" ]; then
        echo "Kernel headers for $2 are not installed; install them with: apt-get install linux-headers-$2" >&2
        exit 1
fi
exit 0
AGENT
chmod +x "$tmp/agent"
export STUB_CALLS="$tmp/calls" GPU_NODE_AGENT="$tmp/agent" GPU_NODE_AGENT_OPTOUT_FILE="$tmp/no-prepare-kernel"

# Success: the agent is called with the release, the hook exits 0.
sh "$hook" 6.1.0-57-amd64 /boot/vmlinuz-6.1.0-57-amd64 2>"$tmp/err" || fail "hook failed although the agent succeeded"
[ "$(cat "$tmp/calls")" = "--prepare-kernel 6.1.0-57-amd64" ] || fail "agent called as '$(cat "$tmp/calls")'"

# Headers missing: non-zero, the agent's sentence and ours on stderr.
rm -f "$tmp/calls"
if STUB_FAIL=1 sh "$hook" 6.1.0-58-amd64 2>"$tmp/err"; then
        fail "hook succeeded although the agent failed"
fi
grep -q "apt-get install linux-headers-6.1.0-58-amd64" "$tmp/err" || fail "no headers package named: $(cat "$tmp/err")"
grep -q "FAILED to prepare the NVIDIA kernel module for kernel 6.1.0-58-amd64" "$tmp/err" ||
        fail "no failure line: $(cat "$tmp/err")"

# Opt-outs: environment and file; the agent is not called.
rm -f "$tmp/calls"
GPU_NODE_AGENT_PREPARE_KERNEL=0 STUB_FAIL=1 sh "$hook" 6.1.0-58-amd64 2>"$tmp/err" || fail "env opt-out failed"
grep -q "opted out" "$tmp/err" || fail "env opt-out not reported"
touch "$tmp/no-prepare-kernel"
STUB_FAIL=1 sh "$hook" 6.1.0-58-amd64 2>/dev/null || fail "file opt-out failed"
rm -f "$tmp/no-prepare-kernel"
[ ! -e "$tmp/calls" ] || fail "agent called despite the opt-out"

# Agent uninstalled (hook left behind as a conffile): exit 0 silently.
GPU_NODE_AGENT="$tmp/nonexistent" STUB_FAIL=1 sh "$hook" 6.1.0-58-amd64 || fail "hook failed without an agent"

# No release given: a usage error.
if sh "$hook" 2>"$tmp/err"; then fail "hook accepted no arguments"; fi
grep -q "without a kernel release" "$tmp/err" || fail "no usage error"

[ "$failures" = 0 ] || exit 1
echo "kernel postinst hook: all checks passed"
