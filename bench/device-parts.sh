# Sourced by the staging scripts (stage-demo-conversion.sh, stage-warm-delta.sh): what a large file takes to reach the
# GPU machine, whose calls carry at most 64 MiB each (the tracked and untracked-not-ignored tree, plus `carry`).

# The bytes of the tree that travels with every call.
tree_bytes() {
  git ls-files -co --exclude-standard -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}'
}

# split_parts FILE ROOM DIR_PREFIX PART_NAME FIRST_DIR: FILE in the fewest equal parts of at most ROOM bytes, part i
# as DIR_PREFIX-NN/PART_NAME.partII-of-NN with NN = FIRST_DIR + i (DIR_PREFIX-* removed first); sets n and part.
split_parts() {
  local file=$1 room=$2 prefix=$3 name=$4 first=$5 size tmp f i=0 dir
  size=$(stat -c %s "$file")
  n=$(( (size + room - 1) / room ))
  part=$(( (size + n - 1) / n ))
  rm -rf "$prefix"-*
  tmp=$(mktemp -d)
  split -b "$part" -d -a 2 "$file" "$tmp/p"
  for f in "$tmp"/p*; do
    dir=$(printf '%s-%02d' "$prefix" "$((first + i))")
    mkdir -p "$dir"
    mv "$f" "$dir/$(printf '%s.part%02d-of-%02d' "$name" "$i" "$n")"
    i=$((i + 1))
  done
  rmdir "$tmp"
}
