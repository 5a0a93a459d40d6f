# shellcheck shell=bash
# hack/lib/net.sh - the host network guard: pods reach each other and the host only
# (an iptables FORWARD drop per pod subnet; ip_forward restored on stop).
# Sourced by hack/lib.sh (its variables and log/die helpers are in scope).

net_guard_on() { # keep pod traffic on this machine even when the bridge plugin turns on forwarding
	[[ -f "$P/run/ip_forward.orig" ]] || cat /proc/sys/net/ipv4/ip_forward >"$P/run/ip_forward.orig"
	iptables -C "${GUARD_RULE[@]}" 2>/dev/null || iptables -I "${GUARD_RULE[@]}" ||
		log "warning: could not add the iptables FORWARD guard"
	iptables -C "${SHIM_GUARD_RULE[@]}" 2>/dev/null || iptables -I "${SHIM_GUARD_RULE[@]}" ||
		log "warning: could not add the iptables FORWARD guard for the shim-owned subnet"
}

net_guard_off() {
	if command -v iptables >/dev/null; then
		while iptables -C "${GUARD_RULE[@]}" 2>/dev/null; do iptables -D "${GUARD_RULE[@]}"; done
		while iptables -C "${SHIM_GUARD_RULE[@]}" 2>/dev/null; do iptables -D "${SHIM_GUARD_RULE[@]}"; done
	fi
	if [[ -f "$P/run/ip_forward.orig" ]]; then
		# Another bench on this machine (another prefix, its own guard rule) may still
		# route its pods: ip_forward stays as it is then.
		if command -v iptables >/dev/null && iptables -S FORWARD 2>/dev/null | grep -- '--comment rsandbox-bench' >/dev/null; then
			log "another rsandbox bench runs (its FORWARD guard is in place): net.ipv4.ip_forward left as it is"
		else
			cat "$P/run/ip_forward.orig" >/proc/sys/net/ipv4/ip_forward 2>/dev/null || true
		fi
		rm -f "$P/run/ip_forward.orig"
	fi
}
