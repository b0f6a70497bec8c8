# Sourced by the staging scripts (stage-demo-conversion.sh, stage-warm-delta.sh, stage-data.sh, snapshot-delta.sh) and
# the GPU machine's side (device-base-gguf.sh, device-data.sh): what a large file takes to reach the
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

# Here, joining what the polls brought back: join_by_name OUT PREFIX DIR... joins the files PREFIX* found in the DIRs
# into OUT in name order, each name taken once (from the first DIR that holds it: a part that came back twice is
# not doubled); sets joined to the count (0: nothing found, OUT not written).
join_by_name() {
  local out=$1 prefix=$2 dir file name
  shift 2
  local -A path_of=()
  for dir in "$@"; do
    for file in "$dir/$prefix"*; do
      [ -f "$file" ] || continue
      name=${file##*/}
      [ -n "${path_of[$name]:-}" ] || path_of[$name]=$file
    done
  done
  joined=${#path_of[@]}
  [ "$joined" -gt 0 ] || return 0
  while IFS= read -r name; do cat "${path_of[$name]}"; done < <(printf '%s\n' "${!path_of[@]}" | sort) > "$out"
}

# On the GPU machine, joining what several calls carried: stash_carried STASH FILE... copies the files into STASH
# (cp -u: a warm machine keeps the earlier calls' stash); join_stashed STASH NAME OUT joins NAME.partII-of-NN
# (split_parts' names) into OUT once all NN are in STASH (status 0), else says how many are there (status 10; 3:
# none at all).
stash_carried() {
  local stash=$1 file
  shift
  mkdir -p "$stash"
  for file in "$@"; do cp -u "$file" "$stash/" && echo "stashed $file"; done
}
join_stashed() {
  local stash=$1 name=$2 out=$3 want
  local -a parts=()
  mapfile -t parts < <(compgen -G "$stash/$name.part*-of-*" | sort)
  [ "${#parts[@]}" -gt 0 ] || return 3
  want=$((10#${parts[0]##*-of-}))
  if [ "${#parts[@]}" -lt "$want" ]; then
    echo "$name: ${#parts[@]} of $want parts stashed; carry the next part in the next call (within 30 s)"
    return 10
  fi
  cat "${parts[@]}" > "$out"
}
