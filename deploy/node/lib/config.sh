# shellcheck shell=bash
# deploy/node/lib/config.sh - the rsandbox runtime in containerd's configuration, as a drop-in.
#
# containerd (2.x) reads one config.toml and every file its `imports` name (globs expanded,
# relative paths against the importing file), merging each over the last: plugin tables merge
# key by key, so a drop-in that only defines runtimes.rsandbox adds the handler and changes
# nothing else (cmd/containerd/server/config: LoadConfig, mergeConfig). containerd >= 2.2's
# default config.toml imports /etc/containerd/conf.d/*.toml, but only a config.toml that says so
# does: a hand-written or older one, or none at all (containerd then runs on its built-in
# defaults), reads no drop-in. So after writing the drop-in the installer asks containerd's own
# loader (`containerd --config C config dump`) whether it is read, and only where it is not adds
# one `imports` entry naming this one file (not the conf.d glob: files already lying there that
# this node never read must not start being read) and remembers that for the uninstall.
#
# The drop-in proves itself read: it imports its own path. containerd skips a file it has
# already loaded, so this changes nothing, but the merged `imports` list of `config dump` then
# holds the drop-in's path exactly when containerd loaded it, whatever glob or entry led there.
#
# A drop-in may not be of a newer config version than config.toml (containerd 2.3.0 to 2.3.4
# refuse to start, a refusal reverted after 2.3.4; 2.1/2.2 skip migrating config.toml's old
# plugin names: src/cli/check/containerd/config_version.rs), so it is written in
# config.toml's version: 3 (containerd 2.x) or 2 (a containerd 1.7-era file, migrated by
# containerd at load; the runtime then sits under the old CRI plugin name).
# No `options` table for the runtime: it breaks StartContainer on containerd 2.1.9.

RSANDBOX_RUNTIME_TYPE=io.containerd.rsandbox.v1
MARK="# rsandbox-node:"

# containerd_arg LONG SHORT: the value of the running containerd's option --LONG/-SHORT
# (relative to its working directory when it is a relative path), empty when not given
containerd_arg() {
	local long=$1 short=$2 pid args=() i a cwd
	pid=$(containerd_main_pid)
	[[ -n "$pid" && -r /proc/$pid/cmdline ]] || return 0
	mapfile -d '' args <"/proc/$pid/cmdline"
	for ((i = 1; i < ${#args[@]}; i++)); do
		a=${args[i]}
		case "$a" in
		"--$long="* | "-$short="*) a=${a#*=} ;;
		"--$long" | "-$short") a=${args[i + 1]:-} ;;
		*) continue ;;
		esac
		if [[ -n "$a" && "$a" != /* ]]; then
			cwd=$(readlink "/proc/$pid/cwd") || cwd=/
			a=${cwd%/}/$a
		fi
		echo "$a"
		return 0
	done
}

# containerd_config_path: the config file the unit's containerd reads: its --config/-c
# argument, else the node shape's (lib/distro.sh), else containerd's default
containerd_config_path() {
	local a
	[[ -n "${CONTAINERD_CONFIG:-}" ]] && {
		echo "$CONTAINERD_CONFIG"
		return
	}
	a=$(containerd_arg config c)
	echo "${a:-${DISTRO_CONFIG:-/etc/containerd/config.toml}}"
}

# containerd_binary: the running containerd's executable (host path), else `containerd`
containerd_binary() {
	local pid exe
	[[ -n "${CONTAINERD_BIN:-}" ]] && {
		echo "$CONTAINERD_BIN"
		return
	}
	pid=$(containerd_main_pid)
	if [[ -n "$pid" ]] && exe=$(readlink "/proc/$pid/exe") && [[ "$exe" != *" (deleted)" ]]; then
		echo "$exe"
		return
	fi
	echo containerd
}

containerd_version() { # x.y.z of the containerd binary
	host_run "$(containerd_binary)" --version 2>/dev/null | grep -oE '[0-9]+\.[0-9]+\.[0-9]+' | head -n1
}

# config_dump OUT: the merged configuration as containerd loads it (plugin names migrated to
# version 3). Fails on a config containerd cannot parse.
config_dump() {
	host_run "$(containerd_binary)" --config "$CONFIG" config dump >"$1" 2>"$1.err" || {
		log "containerd config dump: $(tail -n 3 "$1.err")"
		return 1
	}
}

# top_level_key FILE KEY: the value text of KEY in FILE's top-level table (before the first
# table header); empty when absent
top_level_key() {
	awk -v k="$2" '
	/^[ \t]*\[/ { exit }
	{ line = $0; sub(/^[ \t]+/, "", line) }
	index(line, k) == 1 && substr(line, length(k) + 1) ~ /^[ \t]*=/ {
		sub(/^[^=]*=[ \t]*/, "", line); sub(/[ \t]*(#.*)?$/, "", line); print line; exit
	}' "$1"
}

root_config_version() { # the version of $CONFIG (3 when there is no file: we create one)
	local v
	[[ -e "$(hp "$CONFIG")" ]] || {
		echo 3
		return
	}
	v=$(top_level_key "$(hp "$CONFIG")" version)
	echo "${v:-1}"
}

dropin_text() { # VERSION: the drop-in's bytes
	local v=$1 plugin
	case "$v" in
	3) plugin="'io.containerd.cri.v1.runtime'" ;;
	2) plugin="'io.containerd.grpc.v1.cri'" ;;
	esac
	cat <<TOML
$MARK the rsandbox runtime (containerd-shim-rsandbox-v1), written by the rsandbox node
$MARK installer, removed by its uninstall. Do not edit: the next install rewrites it.
version = $v
# the drop-in imports itself: containerd skips it the second time, and \`containerd config
# dump\` then lists this path under imports exactly when containerd reads this file
imports = ['$DROPIN']

[plugins.$plugin.containerd.runtimes.$HANDLER]
  runtime_type = '$RSANDBOX_RUNTIME_TYPE'
  sandboxer = 'shim'
TOML
}

# inert_dropin_text VERSION: what stays at the drop-in's path when a file containerd loads
# still imports it and the uninstall could not take that entry out: valid TOML that
# configures nothing (containerd starts, without the runtime), the marker on its first line
# (the next uninstall knows it as the installer's and deletes it once no file imports it)
inert_dropin_text() {
	cat <<TOML
$MARK inert: the rsandbox runtime was uninstalled, but a file containerd loads still
$MARK imports this file (see the uninstall's log): take that entry out, then run the
$MARK uninstall again, which deletes this file. It configures nothing.
version = $1
TOML
}

# dump_reads_dropin DUMP: the merged imports hold the drop-in's path
dump_reads_dropin() {
	grep -E '^imports = ' "$1" | grep -F "'$DROPIN'" >/dev/null
}

# dump_defines_handler DUMP: runtimes.$HANDLER is our runtime type with the shim sandboxer
dump_defines_handler() {
	awk -v hdr="[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.$HANDLER]" \
		-v type="runtime_type = '$RSANDBOX_RUNTIME_TYPE'" '
	{ line = $0; sub(/^[ \t]+/, "", line) }
	line == hdr { inside = 1; next }
	inside && line ~ /^\[/ { inside = 0 }
	inside && line == type { t = 1 }
	inside && line == "sandboxer = '\''shim'\''" { s = 1 }
	END { exit !(t && s) }' "$1"
}

dump_has_handler_table() { # DUMP: any runtimes.$HANDLER table at all
	grep -qF "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.$HANDLER]" "$1"
}

# --- the imports entry -----------------------------------------------------------------------
# State (host paths under STATE_DIR): import-mode (created | inserted-line | extended-array),
# config.orig (config.toml's bytes before), config.written.sha256 (what the installer wrote).

# import_edit SRC DST: DST = SRC with the drop-in added to its top-level imports; prints the
# mode. Fails (status 2) on an imports array this line editor does not handle.
import_edit() {
	local src=$1 dst=$2 cur
	cur=$(top_level_key "$src" imports)
	if [[ -z "$cur" ]]; then
		{
			echo "$MARK the next line was added by the rsandbox node installer (its uninstall removes it)"
			echo "imports = ['$DROPIN']"
			cat "$src"
		} >"$dst"
		echo inserted-line
	elif [[ "$cur" =~ ^\[[[:space:]]*\]$ ]]; then
		awk -v d="'$DROPIN'" 'done != 1 && /^[ \t]*imports[ \t]*=/ { sub(/\[[ \t]*\]/, "[" d "]"); done = 1 } { print }' "$src" >"$dst"
		echo extended-array
	elif [[ "$cur" =~ ^\[.*\]$ ]]; then
		awk -v d="'$DROPIN'" 'done != 1 && /^[ \t]*imports[ \t]*=/ { sub(/[ \t]*,?[ \t]*\][ \t]*(#.*)?$/, ", " d "]"); done = 1 } { print }' "$src" >"$dst"
		echo extended-array
	else
		return 2
	fi
}

# add_import: make config.toml read the drop-in (the drop-in exists by now: an imports entry
# naming a missing file stops containerd from starting)
add_import() {
	local cfg new mode st
	cfg=$(hp "$CONFIG")
	st=$(hp "$STATE_DIR")
	mkdir -p "$st"
	new=$(mktemp)
	if [[ ! -e "$cfg" ]]; then
		{
			echo "$MARK written by the rsandbox node installer: containerd had no config file and"
			echo "$MARK ran on its defaults; the uninstall removes this file again"
			echo "version = 3"
			echo "imports = ['$DROPIN']"
		} >"$new"
		mode=created
	else
		[[ -L "$cfg" ]] && refuse "$CONFIG is a symbolic link ($(readlink "$cfg")): add \"$DROPIN\" to its imports yourself, then re-run"
		mode=$(import_edit "$cfg" "$new") ||
			refuse "$CONFIG has a top-level imports array spread over several lines: add \"$DROPIN\" to it yourself, then re-run"
		cp -p "$cfg" "$st/config.orig.new" && sync "$st/config.orig.new" && mv -f "$st/config.orig.new" "$st/config.orig"
	fi
	echo "$mode" >"$st/import-mode"
	sha256_of "$new" >"$st/config.written.sha256"
	write_if_changed "$new" "$cfg" "$(stat -c %a "$cfg" 2>/dev/null || echo 644)" || true
	rm -f "$new"
	log "$CONFIG did not read $DROPIN: import added ($mode)"
}

# remove_import: undo add_import where config.toml is still what the installer wrote: its
# bytes from before the install put back (or the file removed, when the installer created it).
# Where someone changed it since, it is left to the uninstall's take_out_entries (which finds
# the entry however it is spelled now). The state stays until forget_import_state (the
# uninstall calls it once no file names the drop-in any more). Status 0 when config.toml was
# restored, 1 when there was nothing to restore.
remove_import() {
	local cfg st mode
	cfg=$(hp "$CONFIG")
	st=$(hp "$STATE_DIR")
	[[ -f "$st/import-mode" ]] || return 1
	mode=$(<"$st/import-mode")
	if [[ -L "$cfg" ]]; then
		log "$CONFIG is a symbolic link now (to $(readlink "$cfg")): not restored (a rename would replace the link)"
		return 1
	fi
	[[ -e "$cfg" && "$(sha256_of "$cfg")" == "$(cat "$st/config.written.sha256" 2>/dev/null)" ]] || {
		# restored already (a retry), or changed by someone since
		if [[ -e "$cfg" ]] && ! cmp -s "$cfg" "$st/config.orig"; then
			log "$CONFIG changed after the install: only the installer's imports entry is taken out"
		fi
		return 1
	}
	if [[ "$mode" == created ]]; then
		rm -f "$cfg"
		log "removed $CONFIG (the installer had created it)"
	else
		write_if_changed "$st/config.orig" "$cfg" "$(stat -c %a "$cfg")" || true
		log "restored $CONFIG as it was before the install"
	fi
	return 0
}

forget_import_state() { rm -f "$(hp "$STATE_DIR")"/{import-mode,config.orig,config.written.sha256}; }
