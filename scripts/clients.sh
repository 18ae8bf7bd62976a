#!/usr/bin/env bash
# `make clients`: the coding agents tests/test_clients.py runs against lead, at pinned
# versions, in a cache outside the repo (reused; a version changed here installs afresh):
# the npm ones under $DIR/npm, aider in a venv of its own under $DIR/aider (it pins many
# packages of its own: never in the project's venv). Where Node, npm or a registry is
# missing, one line says so and the clients' tests skip.
set -u
DIR=${DUO_CLIENTS:-${DUO_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/duo}/clients}
PYTHON=${PYTHON:-python3}
# Node 20 runs them all: qwen-code needs >= 20, Claude Code >= 18, Codex >= 16; opencode
# is a Bun binary (no Node at all past its installer).
NPM_PKGS=(@anthropic-ai/claude-code@2.1.197 @openai/codex@0.171.0 opencode-ai@1.18.33
          @qwen-code/qwen-code@0.15.10)
NODE_MAJOR=20
AIDER=aider-chat==0.86.2

installed_npm() {  # name@version -> whether that version is there
  local name=${1%@*} version=${1##*@}
  [ -f "$DIR/npm/node_modules/$name/package.json" ] &&
    grep -q "\"version\": *\"$version\"" "$DIR/npm/node_modules/$name/package.json"
}

npm_clients() {
  local missing=() pkg major
  for pkg in "${NPM_PKGS[@]}"; do installed_npm "$pkg" || missing+=("$pkg"); done
  [ ${#missing[@]} -eq 0 ] && return
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "no node/npm (Node.js $NODE_MAJOR+): ${missing[*]} not installed, their tests will skip"
    return
  fi
  major=$(node -p 'process.versions.node.split(".")[0]')
  if [ "$major" -lt $NODE_MAJOR ]; then
    echo "Node $(node -v) is older than $NODE_MAJOR: ${missing[*]} not installed, their tests will skip"
    return
  fi
  echo "installing ${missing[*]} into $DIR/npm (npm; about 1 GB)"
  mkdir -p "$DIR/npm"
  npm install --prefix "$DIR/npm" --save-exact --no-audit --no-fund --loglevel=error \
      --fetch-retries=1 --fetch-timeout=60000 "${missing[@]}" >"$DIR/npm-install.log" 2>&1 ||
    echo "could not install ${missing[*]} (npm registry unreachable? $DIR/npm-install.log): their tests will skip"
}

aider_client() {
  local stamp="$DIR/aider/.installed-$AIDER"
  [ -f "$stamp" ] && return
  echo "installing $AIDER into a venv of its own, $DIR/aider (pip)"
  rm -rf "$DIR/aider"
  if "$PYTHON" -m venv "$DIR/aider" &&
     "$DIR/aider/bin/python" -m pip install -q --disable-pip-version-check --retries 1 \
         --timeout 30 "$AIDER" >"$DIR/aider-install.log" 2>&1; then
    touch "$stamp"
  else
    echo "could not install $AIDER (PyPI unreachable? $DIR/aider-install.log): its test will skip"
  fi
}

mkdir -p "$DIR"
npm_clients
aider_client
