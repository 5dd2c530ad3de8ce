#!/usr/bin/env bash
# Installs the system packages Rentune needs on Debian/Ubuntu when they are missing and we are root.
#   system-deps.sh run   libraries Qt's X11/Wayland plugins load (only for a desktop session)
#   system-deps.sh test  OpenSSH server (the tests' stand-in GPU machine), cmake and a C++ compiler (that machine
#                        builds llama.cpp's quantise tool, as a rented one does), fonts for offscreen rendering
#                        and curl (the serve tests run the curl example the app shows)
# On other systems, or without root, it only says what is missing.
set -euo pipefail

mode=${1:-test}
case "$mode" in
  run)  packages=(libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 libxcb-shape0 libxkbcommon-x11-0 libegl1 libfontconfig1) ;;
  test) packages=(openssh-server openssh-client cmake g++ make fonts-dejavu-core libfontconfig1 libegl1 curl) ;;
  *) echo "usage: $0 run|test" >&2; exit 2 ;;
esac

[ "$(uname -s)" = "Linux" ] || exit 0
command -v dpkg-query >/dev/null 2>&1 || exit 0

missing=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "Installing system packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "Missing system packages: ${missing[*]}" >&2
  echo "Install them with: sudo apt-get install ${missing[*]}" >&2
  if [ "$mode" = test ]; then exit 1; fi
fi
