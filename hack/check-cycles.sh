#!/usr/bin/env bash
# hack/check-cycles.sh - import cycles between the modules of src/, modules
# that must stay self-contained, and the layer rule (a lower layer never
# imports a higher one).
#
# Usage: hack/check-cycles.sh [--leaves-only] [SRC_DIR]   (SRC_DIR: src)
#
# Every .rs file is a module (src/a/b.rs and src/a/b/mod.rs are a::b;
# src/lib.rs is the crate root, src/main.rs, a crate of its own, is left out).
# An edge a -> b is any path in a's file that names b: `crate::b::..`,
# `super::..`, `self::..` and paths through a's own child modules (`mod c;`
# then `c::..`, e.g. a re-export), in `use` statements (groups `{..}`
# expanded) and in code. A path names the longest module it starts with
# (`crate::cni::config::parse_version` -> cni::config, `crate::cni::CniError`
# -> cni). Test modules count too: a test's import is an import.
#
# Checks:
#   cycles  strongly connected components of more than one module; each is
#           printed with its edges and where each edge comes from
#   leaves  the modules under each of LEAVES (default: cni) import nothing of
#           the crate outside their own subtree (cni/ could be a crate of its
#           own); --leaves-only checks only this
#   layers  the top-level modules are layers, in the order of LAYERS, lowest
#           first; a module imports only its own layer and those below it. An
#           import of a higher layer is printed with its file and line, and so
#           is a top-level module that is in no layer
# Exit 1 if any check fails, 0 otherwise.
#
# Limits (it reads text, it does not compile): `//` comments after code are
# dropped only when preceded by a blank; `/* */` comments only when they start
# a line; string literals only when they end on their line; inline modules (`mod tests {`) are found by rustfmt's indentation,
# and `super::` inside one names the file's own module.
set -euo pipefail

leaves_only=0
if [[ "${1:-}" == --leaves-only ]]; then
	leaves_only=1
	shift
fi
cd "$(dirname "${BASH_SOURCE[0]}")/.."
src=${1:-src}
src=${src%/}
[[ -d "$src" ]] || {
	echo "check-cycles: no directory $src" >&2
	exit 2
}
LEAVES=${LEAVES:-cni}
# The layers, lowest first (docs/internals.md, src/lib.rs). testutil: the unit
# tests' helpers, importing nothing; fuzzing: the fuzz entry points, above all.
LAYERS="testutil cni records shim host task pod server cli fuzzing"

mapfile -t files < <(find "$src" -name '*.rs' ! -path "$src/main.rs" | LC_ALL=C sort)

LC_ALL=C awk -v root="$src" -v leaves="$LEAVES" -v layers="$LAYERS" -v leaves_only="$leaves_only" '
function modname(f,   m) {
	m = substr(f, length(root) + 2)
	sub(/\.rs$/, "", m)
	sub(/\/mod$/, "", m)
	if (m == "lib") return ""
	gsub(/\//, "::", m)
	return m
}
function parent(m) {
	if (m !~ /::/) return ""
	sub(/::[^:]*$/, "", m)
	return m
}
function abs(m) { return m == "" ? "crate" : "crate::" m }

# Rewrites super::, self:: and paths through child modules into crate:: paths.
function absolutize(s,   out, pre, tok, up, m, rest, c) {
	out = ""
	while (match(s, /(^|[^A-Za-z0-9_:])(super|self|[a-z_][a-z0-9_]*)::/)) {
		pre = substr(s, 1, RSTART - 1)
		tok = substr(s, RSTART, RLENGTH)
		rest = substr(s, RSTART + RLENGTH)
		c = ""
		if (tok !~ /^(super|self|[a-z_])/) {
			c = substr(tok, 1, 1)
			tok = substr(tok, 2)
		}
		sub(/::$/, "", tok)
		if (tok == "super") {
			# inside an inline module, the first super:: is the file module
			m = depth > 0 ? cur : parent(cur)
			while (rest ~ /^super::/) {
				m = parent(m)
				rest = substr(rest, 8)
			}
			out = out pre c abs(m) "::"
		} else if (tok == "self") {
			out = out pre c abs(cur) "::"
		} else if (depth == 0 && ((FILENAME SUBSEP tok) in child)) {
			out = out pre c abs(cur == "" ? tok : cur "::" tok) "::"
		} else {
			out = out pre c tok "::"
		}
		s = rest
	}
	return out s
}

function skipws() { while (P <= L && substr(S, P, 1) ~ /[ \t]/) P++ }
function ident(   start) {
	start = P
	while (P <= L && substr(S, P, 1) ~ /[A-Za-z0-9_*]/) P++
	return substr(S, start, P - start)
}
# One use tree at P (`a::b::{c, d::e as f, self}`), every leaf path emitted.
function tree(pre,   id, p, c) {
	skipws()
	if (substr(S, P, 1) == "{") {
		P++
		while (P <= L) {
			skipws()
			c = substr(S, P, 1)
			if (c == "}") { P++; return }
			if (c == ",") { P++; continue }
			p = P
			tree(pre)
			skipws()
			if (substr(S, P, 3) == "as ") { P += 3; skipws(); ident() }
			if (P == p) P++ # not a path: do not loop on it
		}
		return
	}
	id = ident()
	if (id == "" || id == "self") { emit(pre); return }
	p = pre == "" ? id : pre "::" id
	if (substr(S, P, 2) == "::") { P += 2; tree(p); return }
	emit(p)
}
function emit(path) {
	n++
	efrom[n] = cur
	epath[n] = path
	eloc[n] = FILENAME ":" stmt_line
}
function extract(s) {
	s = absolutize(s)
	while (match(s, /(^|[^A-Za-z0-9_:])crate::/)) {
		S = substr(s, RSTART + RLENGTH)
		L = length(S)
		P = 1
		tree("")
		s = substr(S, P)
	}
}

FNR == 1 {
	cur = modname(FILENAME)
	mods[cur] = 1
	depth = 0
	inblock = 0
	instmt = 0
}
{
	line = $0
	if (inblock) {
		if (i = index(line, "*/")) { line = substr(line, i + 2); inblock = 0 } else next
	}
	if (line ~ /^[ \t]*\/\*/) {
		if (i = index(line, "*/")) line = substr(line, i + 2)
		else { inblock = 1; next }
	}
	sub(/(^|[ \t])\/\/.*/, "", line)
	gsub(/\047\\?"\047/, "\047q\047", line) # char literals of a double quote
	gsub(/"([^"\\]|\\.)*"/, "\"\"", line) # one-line string literals
	if (depth > 0 && line == indent[depth] "}") { depth--; next }
	if (match(line, /^[ \t]*(pub(\([^)]*\))?[ \t]+)?mod[ \t]+[A-Za-z_][A-Za-z0-9_]*[ \t]*[;{]/)) {
		name = line
		sub(/^[ \t]*(pub(\([^)]*\))?[ \t]+)?mod[ \t]+/, "", name)
		sub(/[ \t]*[;{].*/, "", name)
		if (depth == 0) child[FILENAME, name] = 1
		if (line ~ /\{[ \t]*$/) {
			depth++
			indent[depth] = line
			sub(/[^ \t].*/, "", indent[depth])
		}
		next
	}
	if (instmt) {
		stmt = stmt " " line
	} else if (line ~ /^[ \t]*(pub(\([^)]*\))?[ \t]+)?use[ \t]/) {
		stmt = line
		stmt_line = FNR
		instmt = 1
	} else {
		stmt_line = FNR
		extract(line)
		next
	}
	if (index(stmt, ";")) {
		instmt = 0
		extract(stmt)
	}
}

# The longest module a path starts with ("" = the crate root: no edge).
function resolve(path,   best, m, k, i, seg) {
	k = split(path, seg, "::")
	best = ""
	m = ""
	for (i = 1; i <= k; i++) {
		m = m == "" ? seg[i] : m "::" seg[i]
		if (m in mods) best = m
	}
	return best
}
function under(m, top) { return m == top || index(m, top "::") == 1 }

function strongconnect(g, v,   i, w) {
	idx[g, v] = nidx
	low[g, v] = nidx
	nidx++
	stack[++sp] = v
	onstack[g, v] = 1
	for (i = 1; i <= deg[g, v]; i++) {
		w = adj[g, v, i]
		if (!((g, w) in idx)) {
			strongconnect(g, w)
			if (low[g, w] < low[g, v]) low[g, v] = low[g, w]
		} else if (onstack[g, w] && idx[g, w] < low[g, v]) {
			low[g, v] = idx[g, w]
		}
	}
	if (low[g, v] == idx[g, v]) {
		nscc++
		size[nscc] = 0
		do {
			w = stack[sp--]
			onstack[g, w] = 0
			scc[g, w] = nscc
			size[nscc]++
		} while (w != v)
	}
}
function add_edge(g, from, to, loc) {
	if ((g, from, to) in where) return
	where[g, from, to] = loc
	deg[g, from]++
	adj[g, from, deg[g, from]] = to
	node[g, from] = 1
	node[g, to] = 1
}
function top(m) { sub(/::.*/, "", m); return m }
# " a b": the top-level modules of component c, sorted, each once.
function topkey(c, g, nm, sorted,   i, j, t, n, u, seen, key) {
	n = 0
	for (i = 1; i <= nm; i++) {
		if (scc[g, sorted[i]] != c) continue
		t = top(sorted[i])
		if (t in seen) continue
		seen[t] = 1
		for (j = n; j >= 1 && u[j] > t; j--) u[j + 1] = u[j]
		u[j + 1] = t
		n++
	}
	key = ""
	for (i = 1; i <= n; i++) key = key " " u[i]
	return key
}
# Prints the cycles of graph g (strongly connected components of 2+ nodes).
function cycles(g, title,   nm, i, j, k, v, w, c, key, sorted, found) {
	nm = 0
	for (k in node) {
		split(k, gk, SUBSEP)
		if (gk[1] == g) sorted[++nm] = gk[2]
	}
	for (i = 2; i <= nm; i++) { # insertion sort: deterministic output
		v = sorted[i]
		for (j = i - 1; j >= 1 && sorted[j] > v; j--) sorted[j + 1] = sorted[j]
		sorted[j + 1] = v
	}
	nidx = 0; sp = 0; nscc = 0
	for (i = 1; i <= nm; i++) if (!((g, sorted[i]) in idx)) strongconnect(g, sorted[i])
	found = 0
	for (c = 1; c <= nscc; c++) {
		if (size[c] < 2) continue
		key = ""
		for (i = 1; i <= nm; i++) if (scc[g, sorted[i]] == c) key = key " " sorted[i]
		if (key in reported) continue # the same modules as a cycle already printed
		reported[key] = 1
		if (g == "file") reported[topkey(c, g, nm, sorted)] = 1
		found++
		printf "%s cycle (%d modules):%s\n", title, size[c], key
		for (i = 1; i <= nm; i++) {
			v = sorted[i]
			if (scc[g, v] != c) continue
			for (j = 1; j <= deg[g, v]; j++) {
				w = adj[g, v, j]
				if (scc[g, w] == c) printf "  %s -> %s  (%s)\n", v, w, where[g, v, w]
			}
		}
	}
	return found
}

END {
	for (i = 1; i <= n; i++) {
		to = resolve(epath[i])
		from = efrom[i]
		if (to == "" || to == from || from == "") continue
		add_edge("file", from, to, eloc[i])
		if (top(from) != top(to)) add_edge("top", top(from), top(to), eloc[i] " " from " -> " to)
	}
	bad = 0

	# leaves: nothing outside their own subtree
	nl = split(leaves, leaf, /[ ,]+/)
	for (k in where) {
		split(k, ft, SUBSEP)
		if (ft[1] != "file") continue
		for (j = 1; j <= nl; j++) {
			if (leaf[j] != "" && under(ft[2], leaf[j]) && !under(ft[3], leaf[j])) {
				printf "%s must stay self-contained: %s -> %s (%s)\n", leaf[j], ft[2], ft[3], where[k]
				bad = 1
			}
		}
	}
	if (leaves_only) {
		if (!bad) printf "nothing in %s imports the rest of the crate\n", leaves
		exit bad
	}

	# layers: no import of a higher layer
	nlayer = split(layers, layer, / +/)
	for (j = 1; j <= nlayer; j++) rank[layer[j]] = j
	nbad = 0
	for (m in mods) {
		if (m == "" || m ~ /::/ || m in rank) continue
		printf "top-level module %s is in no layer (LAYERS in %s)\n", m, "hack/check-cycles.sh"
		nbad++
	}
	for (k in where) {
		split(k, ft, SUBSEP)
		if (ft[1] != "file") continue
		a = top(ft[2]); b = top(ft[3])
		if ((a in rank) && (b in rank) && rank[a] < rank[b]) {
			printf "layer rule: %s imports %s, a higher layer (%s is above %s): %s -> %s\n", where[k], b, b, a, ft[2], ft[3]
			nbad++
		}
	}
	if (nbad) {
		printf "%d layer rule violation(s); the layers, lowest first: %s\n", nbad, layers
		bad = 1
	} else {
		printf "every import of %s is of its own layer or one below (%s)\n", root, layers
	}

	nfile = cycles("file", "module")
	ntop = cycles("top", "top-level module")
	if (nfile + ntop) {
		printf "%d import cycle(s) between the modules of %s, %d more between its top-level modules\n", nfile, root, ntop
		bad = 1
	} else {
		printf "no import cycles between the modules of %s\n", root
	}
	exit bad
}
' "${files[@]}"
