# shellcheck shell=bash
# deploy/node/lib/imports.sh - the `imports` entries of containerd's config files: read, walked
# as containerd walks them, and the installer's drop-in taken out of them.
#
# Why the uninstall needs this: containerd refuses to start when a file it loads imports a
# file that does not exist (`open .../conf.d/rsandbox.toml: no such file or directory`), and
# `containerd config dump` does not say so (it ignores a missing imported file). The entry
# the installer added may have been rewritten since by a TOML tool or a person: "..." for
# '...', another path appended, the array spread over lines with comments, a relative path;
# the installer's state (/var/lib/rsandbox-node) may be gone. So the uninstall finds every
# entry naming the drop-in by reading the TOML, takes each out of its array (the rest of the
# file byte for byte), and deletes the drop-in only once the walk below finds no file that
# would still need it.
#
# Dependency-free as the rest of the script (it runs on the host and in its own image, which
# has mawk): a POSIX awk lexer of the TOML that matters here. It reads a file's top level (up
# to the first table header; containerd reads `imports` there only), skips every other
# value whatever its form (the four string kinds, arrays and inline tables over lines), and
# parses the `imports` array: basic "..." strings (escapes decoded) and literal '...' ones,
# commas, comments and newlines between them, a trailing comma.

# imports_awk MODE DIR TARGET FILE: the lexer over FILE, in one of two modes. Exit status 2
# (and a message on stderr) on TOML it cannot read: the caller then treats the file as unknown.
# list: one line per entry of the top-level imports, "entry PATH" (PATH resolved against
#   dir, the file's directory, and cleaned as Go's filepath.Clean: what containerd opens)
#   or "unsure RAW" (an escape this lexer does not decode: the path cannot be compared).
# drop: the file without the entries whose path is target, each with its comma; a line left
#   blank by that goes too, and so does an `imports = []` the installer inserted (its
#   marker comment on the line before).
imports_awk() {
	awk -v mode="$1" -v dir="$2" -v target="${3:-}" -v mark="$MARK the next line was added by the rsandbox node installer (its uninstall removes it)" '
	BEGIN { RS = "\001" } # no such byte in a config file: the whole file is one record
	function ch(p) { return substr(T, p, 1) }
	function die(msg) { printf "%s at byte %d\n", msg, i > "/dev/stderr"; exit 2 }
	function blanks() { while (i <= n && (ch(i) == " " || ch(i) == "\t")) i++ }
	function comment() { while (i <= n && ch(i) != "\n") i++ }
	# blanks, newlines and comments (inside an array)
	function space() {
		while (i <= n) {
			c = ch(i)
			if (c == " " || c == "\t" || c == "\r" || c == "\n") i++
			else if (c == "#") comment()
			else break
		}
	}
	function hexval(h,   k, v, d) {
		v = 0
		for (k = 1; k <= length(h); k++) {
			d = index("0123456789abcdef", tolower(substr(h, k, 1)))
			if (d == 0) return -1
			v = v * 16 + d - 1
		}
		return v
	}
	# string: the string starting at i; S its value, unsure set when an escape was not
	# decoded; i after its closing quote
	function string(   q, e, v, k) {
		unsure = 0; S = ""
		if (substr(T, i, 3) == "\"\"\"" || substr(T, i, 3) == "'\'''\'''\''") {
			q = substr(T, i, 3); i += 3; unsure = 1
			while (i <= n && substr(T, i, 3) != q) { if (q == "\"\"\"" && ch(i) == "\\") i++; i++ }
			if (i > n) die("unterminated multi-line string")
			i += 3
			while (ch(i) == substr(q, 1, 1)) i++
			return
		}
		q = ch(i); i++
		while (i <= n && ch(i) != q) {
			c = ch(i)
			if (c == "\n") die("newline in a string")
			if (q == "\"" && c == "\\") {
				e = ch(i + 1); i += 2
				if (e == "\"" || e == "\\") S = S e
				else if (e == "t") S = S "\t"
				else if (e == "n") S = S "\n"
				else if (e == "r") S = S "\r"
				else if (e == "b") S = S "\b"
				else if (e == "f") S = S "\f"
				else if (e == "u" || e == "U") {
					k = (e == "u" ? 4 : 8); v = hexval(substr(T, i, k)); i += k
					if (v > 0 && v < 128) S = S sprintf("%c", v)
					else unsure = 1
				} else die("unknown escape \\" e)
				continue
			}
			S = S c; i++
		}
		if (i > n) die("unterminated string")
		i++
	}
	# value: skips any value (a scalar, a string, an array or inline table over lines)
	function value(   depth) {
		depth = 0
		while (i <= n) {
			c = ch(i)
			if (c == "\"" || c == "'\''") { string(); if (depth == 0) return; continue }
			if (c == "[" || c == "{") { depth++; i++; continue }
			if (c == "]" || c == "}") { depth--; i++; if (depth < 0) die("unbalanced " c); if (depth == 0) return; continue }
			if (depth > 0 && c == "#") { comment(); continue }
			if (depth == 0 && (c == "\n" || c == "#" || c == " " || c == "\t" || c == "\r")) return
			i++
		}
		if (depth) die("unterminated array or inline table")
	}
	# key: a bare, basic or literal key, dotted parts joined with "." (K)
	function key(   part) {
		K = ""
		while (i <= n) {
			c = ch(i)
			if (c == "\"" || c == "'\''") { string(); part = S }
			else {
				part = ""
				while (i <= n && ch(i) ~ /[A-Za-z0-9_-]/) { part = part ch(i); i++ }
				if (part == "") die("expected a key")
			}
			K = (K == "" ? part : K "." part)
			blanks()
			if (ch(i) != ".") return
			i++; blanks()
		}
	}
	# clean: Go filepath.Clean of an absolute path
	function clean(p,   parts, k, m, out, depth, stack) {
		m = split(p, parts, "/"); depth = 0
		for (k = 1; k <= m; k++) {
			if (parts[k] == "" || parts[k] == ".") continue
			if (parts[k] == "..") { if (depth > 0) depth--; continue }
			stack[++depth] = parts[k]
		}
		out = ""
		for (k = 1; k <= depth; k++) out = out "/" stack[k]
		return out == "" ? "/" : out
	}
	function imports(   start) {
		if (ch(i) != "[") { value(); return }
		i++
		while (1) {
			space()
			if (i > n) die("unterminated imports array")
			c = ch(i)
			if (c == "]") { i++; return }
			if (c != "\"" && c != "'\''") die("an imports entry that is not a string")
			start = i; string()
			N++; ES[N] = start; EE[N] = i; EC[N] = 0; EU[N] = unsure
			EP[N] = (substr(S, 1, 1) == "/" ? clean(S) : clean(dir "/" S)); ER[N] = substr(T, start, i - start)
			space()
			if (ch(i) == ",") { EC[N] = i; i++ }
			else if (ch(i) != "]") die("expected , or ] in imports")
		}
	}
	{ T = (NR > 1 ? T "\001" : "") $0 }
	END {
		n = length(T); i = 1; N = 0
		while (i <= n) {
			blanks(); c = ch(i)
			if (c == "\n" || c == "\r") { i++; continue }
			if (c == "#") { comment(); continue }
			if (c == "[") break
			key(); blanks()
			if (ch(i) != "=") die("expected =")
			i++; blanks()
			if (K == "imports") imports(); else value()
			blanks()
			if (ch(i) == "#") comment()
			if (i <= n && ch(i) != "\n" && ch(i) != "\r") die("trailing text after a value")
		}
		if (mode == "list") {
			for (k = 1; k <= N; k++) print (EU[k] ? "unsure " ER[k] : "entry " EP[k])
			exit 0
		}
		# drop: mark the bytes to delete; an entry goes with its own comma, the last one
		# kept before it loses its comma when the entry was the last
		last = 0
		for (k = 1; k <= N; k++) {
			if (EU[k] || EP[k] != target) { last = k; continue }
			if (EC[k]) {
				for (p = ES[k]; p <= EC[k]; p++) D[p] = 1
				for (p = EC[k] + 1; ch(p) == " " || ch(p) == "\t"; p++) D[p] = 1
			} else {
				for (p = ES[k]; p < EE[k]; p++) D[p] = 1
				if (last && EC[last]) {
					D[EC[last]] = 1
					for (p = EC[last] + 1; p < ES[k] && (ch(p) == " " || ch(p) == "\t"); p++) ;
					if (p == ES[k]) for (p = EC[last] + 1; p < ES[k]; p++) D[p] = 1
				}
			}
		}
		# out, line by line: a line that only lost bytes and kept blanks goes whole
		out = ""; line = ""; lost = 0
		for (p = 1; p <= n; p++) {
			c = ch(p)
			if (D[p]) { lost = 1; continue }
			if (c != "\n") { line = line c; continue }
			if (!(lost && line ~ /^[ \t\r]*$/)) out = out line "\n"
			line = ""; lost = 0
		}
		if (!(lost && line ~ /^[ \t\r]*$/)) out = out line
		# the line the installer inserted, now empty, goes with its marker
		m = split(out, L, "\n"); res = ""
		for (k = 1; k <= m; k++) {
			if (L[k] == mark && k < m && L[k + 1] ~ /^imports = \[ *\]$/) { k++; continue }
			res = res L[k] (k < m ? "\n" : "")
		}
		printf "%s", res
	}' "$4"
}

# imports_in FILE DIR: FILE's top-level imports, one "entry PATH" or "unsure RAW" a line
imports_in() { imports_awk list "$2" "" "$1"; }

# without_import FILE DIR PATH: FILE's text with every imports entry naming PATH taken out
without_import() { imports_awk drop "$2" "$3" "$1"; }

# canonical PATH: the host path PATH names once links are followed (asked on the host: an
# absolute link's target is a host path, which HOST_ROOT would not resolve here)
canonical() { host_run readlink -m -- "$1"; }

# config_walk GONE: containerd's LoadConfig walk over the host's files, from $CONFIG: each
# file's imports in order, relative to its directory, a path with `*` globbed (Go's Glob:
# a leading dot matches too), each file once; judged as if GONE (the drop-in, or nothing)
# did not exist. Prints, one a line:
#   names FILE     FILE has an imports entry spelling GONE's path (the uninstall takes it out)
#   problem TEXT   what would stop containerd from starting (an import of a missing file or of
#                  GONE under another name, a file whose imports cannot be read)
config_walk() {
	local gone=$1 gone_real="" pending=("$CONFIG") path kind val m matches=() list
	local -A seen=()
	[[ -n "$gone" ]] && gone_real=$(canonical "$gone")
	[[ -e "$(hp "$CONFIG")" ]] || return 0 # no config.toml: containerd's defaults import nothing
	while ((${#pending[@]})); do
		path=${pending[0]}
		pending=("${pending[@]:1}")
		[[ -z "${seen[$path]:-}" ]] || continue
		seen[$path]=1
		if ! list=$(imports_in "$(hp "$path")" "$(dirname "$path")" 2>&1); then
			echo "problem $path: its TOML could not be read ($list)"
			continue
		fi
		while read -r kind val; do
			if [[ -z "$kind" ]]; then
				continue # no imports: one empty line from <<<
			elif [[ "$kind" == unsure ]]; then
				echo "problem $path imports $val, a path this installer cannot decode (is it the drop-in?)"
			elif [[ "$val" == *'*'* ]]; then
				# a glob: a match that is GONE itself goes with it; one linked to it would dangle
				mapfile -t matches < <(
					shopt -s nullglob dotglob
					IFS= # the pattern is globbed, never split
					# shellcheck disable=SC2086 # the glob is meant
					for m in "$HOST_ROOT"$val; do printf '%s\n' "${m#"$HOST_ROOT"}"; done
				)
				for m in "${matches[@]}"; do
					[[ "$m" == "$gone" ]] && continue
					if [[ -n "$gone" && "$(canonical "$m")" == "$gone_real" ]]; then
						echo "problem $path imports $m (through $val), a link to $gone"
					else
						pending+=("$m")
					fi
				done
			elif [[ -n "$gone" && "$val" == "$gone" ]]; then
				echo "names $path"
				echo "problem $path imports $gone"
			elif [[ -n "$gone" && "$(canonical "$val")" == "$gone_real" ]]; then
				echo "problem $path imports $val, which is $gone by another name (a link)"
			elif [[ ! -e "$(hp "$val")" ]]; then
				echo "problem $path imports $val, which does not exist"
			else
				pending+=("$val")
			fi
		done <<<"$list"
	done
}

# take_out_entries: every imports entry naming the drop-in (config_walk's "names") taken out
# of its file, the rest of the file byte for byte. A file the installer will not rewrite (a
# link: the rename would replace it by a plain file; a read-only directory) is left as it is:
# the walk after this reports it. Status 0 when a file changed.
take_out_entries() {
	local kind f new rc=1
	while read -r kind f; do
		[[ "$kind" == names ]] || continue
		if [[ -L "$(hp "$f")" ]]; then
			log "$f is a symbolic link (to $(readlink "$(hp "$f")")): not edited"
			continue
		fi
		if [[ ! -w "$(hp "$(dirname "$f")")" ]]; then
			log "$(dirname "$f") is not writable: $f not edited"
			continue
		fi
		new=$(mktemp)
		if without_import "$(hp "$f")" "$(dirname "$f")" "$DROPIN" >"$new" &&
			write_if_changed "$new" "$(hp "$f")" "$(stat -c %a "$(hp "$f")")"; then
			log "took $DROPIN out of the imports of $f"
			rc=0
		fi
		rm -f "$new"
	done < <(config_walk "$DROPIN" | sort -u)
	return "$rc"
}
