#!/bin/sh
# fetch-source NAME REPOSITORY COMMIT TREE DEST [--submodules]
#
# Fetches exactly COMMIT (never a branch or tag), refuses it unless its tree is TREE, and records
# what git itself reports in /opt/dcpqual/image/sources/NAME.json, which the in-image identity
# check (python -m harness.image.verify_runtime) compares with the lock.
set -eu
name=$1 repository=$2 commit=$3 tree=$4 dest=$5
shift 5
mkdir -p "$dest"
cd "$dest"
git init -q
git remote add origin "$repository"
git fetch -q --depth 1 origin "$commit"
git checkout -q --detach FETCH_HEAD
got_commit=$(git rev-parse HEAD)
got_tree=$(git rev-parse 'HEAD^{tree}')
if [ "$got_commit" != "$commit" ]; then
    echo "fetch-source: $name: fetched commit $got_commit, the lock says $commit" >&2
    exit 1
fi
if [ "$got_tree" != "$tree" ]; then
    echo "fetch-source: $name: commit $commit has tree $got_tree, the lock says $tree" >&2
    exit 1
fi
if [ "${1:-}" = "--submodules" ]; then
    # Submodule commits are gitlinks inside TREE, so the tree check above pins them too.
    git submodule update -q --init --recursive --depth 1 --jobs 8
fi
if [ -n "$(git status --porcelain)" ]; then
    echo "fetch-source: $name: checkout is not clean after fetching" >&2
    exit 1
fi
mkdir -p /opt/dcpqual/image/sources
printf '{"name": "%s", "repository": "%s", "commit": "%s", "tree": "%s"}\n' \
    "$name" "$repository" "$got_commit" "$got_tree" > "/opt/dcpqual/image/sources/$name.json"
echo "fetch-source: $name at $got_commit (tree $got_tree)"
