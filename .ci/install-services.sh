#!/usr/bin/env bash
# Install the real servers the integration tests run against, without touching the system:
# Debian 13 (trixie) packages are downloaded with a private apt configuration and unpacked
# with `dpkg -x` into .cache/services/<package>/ (ignored by git). Idempotent: a package
# whose binary is already there is skipped. Needs only Debian's archive (no root needed for
# the download when the cache folder is writable; as root apt may warn about sandboxing).
#
#   bash .ci/install-services.sh                 # victoria-metrics
#   bash .ci/install-services.sh PACKAGE...      # others, binary expected in usr/bin/PACKAGE
#
# Binary afterwards: .cache/services/victoria-metrics/usr/bin/victoria-metrics
# (Debian's prometheus 2.53 is built without the OTLP receiver, so it is of no use here.)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${OBSERVERS_SERVICES_CACHE:-$ROOT/.cache/services}"
SUITE="${OBSERVERS_SERVICES_SUITE:-trixie}"
MIRROR="${OBSERVERS_SERVICES_MIRROR:-http://deb.debian.org/debian}"
KEYRING="/usr/share/keyrings/debian-archive-keyring.gpg"
packages=("$@")
[[ ${#packages[@]} -gt 0 ]] || packages=(victoria-metrics)

binary_of() {
	case "$1" in
	victoria-metrics) echo usr/bin/victoria-metrics ;;
	*) echo "usr/bin/$1" ;;
	esac
}

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9 # one installer at a time (parallel test sessions)

missing=()
for pkg in "${packages[@]}"; do
	if [[ -x "$CACHE/$pkg/$(binary_of "$pkg")" ]]; then
		echo "install-services: $pkg already in $CACHE/$pkg"
	else
		missing+=("$pkg")
	fi
done
[[ ${#missing[@]} -gt 0 ]] || exit 0

APT="$CACHE/.apt"
mkdir -p "$APT/lists/partial" "$APT/cache/archives/partial" "$APT/etc" "$APT/debs"
signed=""
[[ -r "$KEYRING" ]] && signed="[signed-by=$KEYRING] "
echo "deb ${signed}${MIRROR} ${SUITE} main" >"$APT/etc/sources.list"
opts=(
	-o "Dir::Etc::sourcelist=$APT/etc/sources.list"
	-o "Dir::Etc::sourceparts=/dev/null"
	-o "Dir::Etc::preferencesparts=/dev/null"
	-o "Dir::State::Lists=$APT/lists"
	-o "Dir::Cache=$APT/cache"
	-o "APT::Sandbox::User=root"
	-o "Debug::NoLocking=1"
)
apt-get "${opts[@]}" -qq update
for pkg in "${missing[@]}"; do
	(cd "$APT/debs" && rm -f "${pkg}"_*.deb && apt-get "${opts[@]}" -qq download "$pkg")
	deb="$(ls "$APT/debs/${pkg}"_*.deb | head -n1)"
	rm -rf "$CACHE/$pkg.tmp" && mkdir -p "$CACHE/$pkg.tmp"
	dpkg -x "$deb" "$CACHE/$pkg.tmp"
	rm -rf "${CACHE:?}/$pkg" && mv "$CACHE/$pkg.tmp" "$CACHE/$pkg"
	rm -f "$deb"
	echo "install-services: $pkg $(basename "$deb" .deb) -> $CACHE/$pkg/$(binary_of "$pkg")"
done
