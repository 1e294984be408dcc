#!/bin/sh
# fetch-source NAME REPOSITORY COMMIT TREE DEST [--submodules] [--pull-requests "N:HEAD ..."]
#
# Fetches exactly COMMIT (never a branch or tag), refuses it unless its tree is TREE, checks that
# the head of every pull request the lock records is an ancestor of COMMIT (the merged tree the
# lock pins contains them), and records what git itself reports in
# /opt/dcpqual/image/sources/NAME.json, which the in-image identity check
# (python -m harness.image.verify_runtime) compares with the lock.
set -eu
name=$1 repository=$2 commit=$3 tree=$4 dest=$5
shift 5
submodules=no pull_requests=""
while [ $# -gt 0 ]; do
    case "$1" in
        --submodules) submodules=yes; shift ;;
        --pull-requests) pull_requests=$2; shift 2 ;;
        *) echo "fetch-source: $name: unknown option $1" >&2; exit 2 ;;
    esac
done
mkdir -p "$dest"
cd "$dest"
git init -q
git remote add origin "$repository"
if [ -n "$pull_requests" ]; then
    # Ancestry needs the history (without blobs) between each head and COMMIT.
    git fetch -q --filter=blob:none origin "$commit"
else
    git fetch -q --depth 1 origin "$commit"
fi
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
for pr in $pull_requests; do
    number=${pr%%:*} head=${pr#*:}
    if ! git merge-base --is-ancestor "$head" "$commit" 2>/dev/null; then
        echo "fetch-source: $name: pull request $number head $head is not in $commit" >&2
        exit 1
    fi
done
if [ "$submodules" = yes ]; then
    # Submodule commits are gitlinks inside TREE, so the tree check above pins them too.
    git submodule update -q --init --recursive --depth 1 --jobs 8
fi
if [ -n "$(git status --porcelain)" ]; then
    echo "fetch-source: $name: checkout is not clean after fetching" >&2
    exit 1
fi
sources="${DCPQUAL_IMAGE_ROOT:-/opt/dcpqual/image}/sources"
mkdir -p "$sources"
printf '{"name": "%s", "repository": "%s", "commit": "%s", "tree": "%s"}\n' \
    "$name" "$repository" "$got_commit" "$got_tree" > "$sources/$name.json"
echo "fetch-source: $name at $got_commit (tree $got_tree)"
