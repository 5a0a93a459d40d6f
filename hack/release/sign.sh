#!/usr/bin/env bash
# hack/release/sign.sh DIR - detached signatures of DIR/SHA256SUMS and DIR/*.intoto.json (the
# provenance) with the release key (hack/release.sh calls it on dist/; run it by hand to sign
# a dist/ built elsewhere, where the key is):
#
#   RSANDBOX_RELEASE_SSH_KEY=KEY  `ssh-keygen -Y sign -n file -f KEY FILE` -> FILE.sig. KEY is a
#                                 private key file, or the public key of a key held by
#                                 ssh-agent. Each signature is then verified with KEY's public
#                                 key (KEY itself, KEY.pub, or `ssh-keygen -y -f KEY`).
#   RSANDBOX_RELEASE_GPG_KEY=ID   `gpg --armor --detach-sign --local-user ID FILE` -> FILE.asc,
#                                 then `gpg --verify` of each.
#
# Why both files: SHA256SUMS vouches for the artefacts, the provenance for how they were made;
# a node that checks only the sums still knows the files are the release's. The SBOM is in
# SHA256SUMS. Old signatures in DIR are removed first, so a signature never outlives its file.
# Without either key nothing is signed, the script says so loudly and exits 0 (a test or a
# developer's release); with a key that fails to sign it exits 1.
set -euo pipefail
# shellcheck source=hack/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

{ (($# == 1)) && [[ -d "$1" ]]; } || die "usage: $0 DIR (the release's files, e.g. dist)"
dir=$1
[[ -f "$dir/SHA256SUMS" ]] || die "no $dir/SHA256SUMS"
provs=("$dir"/*.intoto.json)
[[ -f "${provs[0]}" ]] || die "no provenance ($dir/*.intoto.json)"
files=("$dir/SHA256SUMS" "${provs[@]}")
rm -f "$dir"/*.sig "$dir"/*.asc

ssh_key=${RSANDBOX_RELEASE_SSH_KEY:-}
gpg_key=${RSANDBOX_RELEASE_GPG_KEY:-}
if [[ -z "$ssh_key" && -z "$gpg_key" ]]; then
	log "WARNING: UNSIGNED: no RSANDBOX_RELEASE_SSH_KEY (--ssh-key) nor RSANDBOX_RELEASE_GPG_KEY (--gpg-key):"
	log "WARNING: $dir has no signatures; a node cannot verify these files (do not publish them)"
	exit 0
fi

if [[ -n "$ssh_key" ]]; then
	command -v ssh-keygen >/dev/null || die "ssh-keygen is missing (openssh-client)"
	[[ -f "$ssh_key" ]] || die "RSANDBOX_RELEASE_SSH_KEY: no file $ssh_key"
	# the public half: KEY itself when it is one (the private key is in ssh-agent)
	if [[ "$(head -n 1 "$ssh_key")" =~ ^(ssh-|ecdsa-|sk-) ]]; then
		pub=$(head -n 1 "$ssh_key")
	elif [[ -f "$ssh_key.pub" ]]; then
		pub=$(head -n 1 "$ssh_key.pub")
	else
		pub=$(ssh-keygen -y -f "$ssh_key") || die "cannot read the public key of $ssh_key"
	fi
	allowed=$(mktemp)
	trap 'rm -f "$allowed"' EXIT
	echo "release $pub" >"$allowed"
	for f in "${files[@]}"; do
		ssh-keygen -q -Y sign -n file -f "$ssh_key" "$f" || die "ssh-keygen could not sign $f"
		ssh-keygen -Y verify -f "$allowed" -I release -n file -s "$f.sig" <"$f" >/dev/null ||
			die "the SSH signature of $f does not verify with $ssh_key's public key"
		log "signed (ssh, $(ssh-keygen -l -f <(echo "$pub") | cut -d' ' -f2)): $f.sig"
	done
fi

if [[ -n "$gpg_key" ]]; then
	command -v gpg >/dev/null || die "gpg is missing"
	for f in "${files[@]}"; do
		gpg --batch --yes --armor --local-user "$gpg_key" --output "$f.asc" --detach-sign "$f" ||
			die "gpg could not sign $f with $gpg_key"
		gpg --batch --verify "$f.asc" "$f" 2>/dev/null || die "the OpenPGP signature of $f does not verify"
		log "signed (gpg, $gpg_key): $f.asc"
	done
fi
