#!/usr/bin/env bash
# cargo deny with deny.toml: advisories, licences, banned and duplicate
# crates, sources. Offline: the advisories come from a snapshot of the
# RustSec advisory database, found at $WATCHPROXY_ADVISORY_DB, or
# ../shared/advisory-db beside the repository, or /work/shared/advisory-db.
set -euo pipefail
cd "$(dirname "$0")/.."

# An unoptimized build: it checks one lock file in seconds either way, and
# builds in a fraction of the time.
if ! command -v cargo-deny >/dev/null 2>&1; then
  echo "installing cargo-deny ..." >&2
  cargo install -q cargo-deny --debug --locked --version 0.20.2 ||
    { echo "install cargo-deny 0.20 (cargo install cargo-deny --locked)" >&2; exit 1; }
fi

db=""
for candidate in "${WATCHPROXY_ADVISORY_DB:-}" ../shared/advisory-db /work/shared/advisory-db; do
  if [ -n "$candidate" ] && [ -d "$candidate/crates" ]; then db=$candidate; break; fi
done
# Every platform's crates, which cargo metadata reads, are in the cache.
cargo fetch --locked >/dev/null
if [ -z "$db" ]; then
  echo "WARNING: advisories NOT checked: no RustSec advisory database here; set WATCHPROXY_ADVISORY_DB to a checkout of https://github.com/rustsec/advisory-db" >&2
  exec cargo deny --offline --log-level error check licenses bans sources
fi
if [ -f "$db/SNAPSHOT" ]; then
  echo "advisories from: $(head -1 "$db/SNAPSHOT")" >&2
fi

# cargo deny reads the database as a git repository, under the name it
# derives from the default URL.
dbs=target/advisory-dbs
rm -rf "$dbs"
mkdir -p "$dbs"
copy="$dbs/advisory-db-3157b0e258782691"
cp -r "$db" "$copy"
rm -rf "$copy/.git"
git -C "$copy" init -q
git -C "$copy" add -A
git -C "$copy" -c user.name=snapshot -c user.email=snapshot@localhost commit -q -m snapshot

cargo deny --offline --log-level error check advisories licenses bans sources
