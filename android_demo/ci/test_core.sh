#!/usr/bin/env bash
# Compile android_demo/specdecode-core and its JUnit 4 tests with `javac --release 8` (the Java level
# Android accepts) and run them; the last line is "N passed, N failed", the exit status non-zero on
# any failure. Needs Debian's default-jdk-headless and junit4 (apt-get install -y default-jdk-headless junit4).
#
# usage: android_demo/ci/test_core.sh [LLAMA_SPM_TOKENIZER_JSON]
#   The Llama-2 tokenizer is not committed (licence); it is converted into the cache by
#   `python -m omnidraft.models.gguf_tokenizers llama-spm`. Its path is, in order: the argument,
#   $OMNIDRAFT_LLAMA_SPM_TOKENIZER, ${OMNIDRAFT_CACHE:-~/.cache/omnidraft}/tokenizers/llama-spm/tokenizer.json.
set -euo pipefail

core_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/../specdecode-core" && pwd)"
repo_dir="$(cd "$core_dir/../.." && pwd)"
cache_dir="${OMNIDRAFT_CACHE:-$HOME/.cache/omnidraft}"
llama="${1:-${OMNIDRAFT_LLAMA_SPM_TOKENIZER:-$cache_dir/tokenizers/llama-spm/tokenizer.json}}"
gpt2="${OMNIDRAFT_GPT2_TOKENIZER:-$repo_dir/models/tokenizers/gpt2/tokenizer.json}"
junit="${JUNIT_JAR:-/usr/share/java/junit4.jar}"
hamcrest="${HAMCREST_JAR:-/usr/share/java/hamcrest-core.jar}"

die() { echo "test_core.sh: error: $*" >&2; exit 2; }
command -v javac >/dev/null || die "javac not found; apt-get install -y default-jdk-headless"
[[ -f "$junit" ]] || die "JUnit 4 not found at $junit; apt-get install -y junit4 (or set JUNIT_JAR)"
[[ -f "$hamcrest" ]] || die "hamcrest not found at $hamcrest; apt-get install -y junit4 (or set HAMCREST_JAR)"
[[ -f "$llama" ]] || die "Llama-2 tokenizer not found at $llama; run \`python -m omnidraft.models.gguf_tokenizers llama-spm\` or pass its tokenizer.json as the first argument"
[[ -f "$gpt2" ]] || die "GPT-2 tokenizer not found at $gpt2; restore models/tokenizers/gpt2 from git (or set OMNIDRAFT_GPT2_TOKENIZER)"

build="$(mktemp -d "${TMPDIR:-/tmp}/specdecode-core.XXXXXX")"
trap 'rm -rf "$build"' EXIT
mkdir -p "$build/main" "$build/test"

mapfile -t main_src < <(find "$core_dir/src/main/java" -name '*.java' | sort)
mapfile -t test_src < <(find "$core_dir/src/test/java" -name '*.java' | sort)
# The core must stay plain Java: no Android (or other) imports may creep in.
if grep -nE '^import (android|androidx|org\.pytorch|com\.)' "${main_src[@]}"; then
  die "specdecode-core imports a non-JDK package (above); the core must be pure Java 8"
fi
javac --release 8 -encoding UTF-8 -Xlint:all,-options -d "$build/main" "${main_src[@]}"
javac --release 8 -encoding UTF-8 -Xlint:-options -d "$build/test" -cp "$build/main:$junit" "${test_src[@]}"

mapfile -t classes < <(cd "$build/test" && find . -name '*Test.class' | sed -e 's|^\./||' -e 's|\.class$||' -e 's|/|.|g' | sort)
java -Xss8m -cp "$build/main:$build/test:$core_dir/src/test/resources:$junit:$hamcrest" \
  "-Domnidraft.tokenizer.llama-spm=$llama" "-Domnidraft.tokenizer.gpt-2=$gpt2" \
  org.omnidraft.specdecode.CoreTestMain "${classes[@]}"
