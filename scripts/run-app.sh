#!/usr/bin/env bash
# Sets up .venv (first run only), checks the system libraries Qt's X11 (xcb) platform needs (Linux),
# prepares the embedded default models (first run only), opens the app.
#   bash scripts/run-app.sh [app options]   open the app
#   bash scripts/run-app.sh --check-qt      only check the Qt platform libraries (exit 1 when some are missing)
# Without the libraries Qt stops with a generic "could not load the Qt platform plugin xcb"; this says
# which Debian/Ubuntu packages hold them and the exact install command (run as root, it installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"

# soname -> Debian/Ubuntu package, for everything libqxcb.so and libQt6XcbQpa.so.6 (Qt 6.11) link to
# outside the wheel.
package_of() {
  case "$1" in
    libxcb-cursor.so.*) echo libxcb-cursor0 ;;
    libxcb-icccm.so.*) echo libxcb-icccm4 ;;
    libxcb-image.so.*) echo libxcb-image0 ;;
    libxcb-keysyms.so.*) echo libxcb-keysyms1 ;;
    libxcb-randr.so.*) echo libxcb-randr0 ;;
    libxcb-render-util.so.*) echo libxcb-render-util0 ;;
    libxcb-render.so.*) echo libxcb-render0 ;;
    libxcb-shape.so.*) echo libxcb-shape0 ;;
    libxcb-shm.so.*) echo libxcb-shm0 ;;
    libxcb-sync.so.*) echo libxcb-sync1 ;;
    libxcb-util.so.*) echo libxcb-util1 ;;
    libxcb-xfixes.so.*) echo libxcb-xfixes0 ;;
    libxcb-xkb.so.*) echo libxcb-xkb1 ;;
    libxcb-xinerama.so.*) echo libxcb-xinerama0 ;;
    libxcb.so.*) echo libxcb1 ;;
    libxkbcommon-x11.so.*) echo libxkbcommon-x11-0 ;;
    libxkbcommon.so.*) echo libxkbcommon0 ;;
    libX11-xcb.so.*) echo libx11-xcb1 ;;
    libX11.so.*) echo libx11-6 ;;
    libEGL.so.*) echo libegl1 ;;
    libGL.so.* | libGLX.so.*) echo libgl1 ;;
    libOpenGL.so.*) echo libopengl0 ;;
    libfontconfig.so.*) echo libfontconfig1 ;;
    libfreetype.so.*) echo libfreetype6 ;;
    libdbus-1.so.*) echo libdbus-1-3 ;;
    libglib-2.0.so.* | libgthread-2.0.so.*) echo libglib2.0-0 ;;
    *) echo "$1" ;;  # not in the table: name the library itself
  esac
}

check_qt_libs() {
  [ "$(uname -s)" = Linux ] || return 0
  local qt
  qt="$("$PYTHON" -c 'import os, PySide6; print(os.path.join(os.path.dirname(PySide6.__file__), "Qt"))')" || {
    echo "run-app.sh: cannot import PySide6 with $PYTHON" >&2; return 1; }
  local plugin="$qt/plugins/platforms/libqxcb.so"
  [ -f "$plugin" ] || return 0
  local missing
  missing="$(LD_LIBRARY_PATH="$qt/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$plugin" "$qt/lib/libQt6XcbQpa.so.6" 2>/dev/null \
             | awk '/=> not found/ {print $1}' | sort -u)"
  [ -n "$missing" ] || return 0
  local pkgs
  pkgs="$(for lib in $missing; do package_of "$lib"; done | sort -u | tr '\n' ' ')"
  pkgs="${pkgs% }"
  echo "Qt's X11 platform (xcb) needs system libraries that are not installed: $(echo $missing | tr '\n' ' ')" >&2
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "Installing them: apt-get install -y $pkgs" >&2
    apt-get update -qq && apt-get install -y $pkgs
    return
  fi
  echo "Install them with:" >&2
  echo "    sudo apt-get install -y $pkgs" >&2
  echo "(other distributions: the packages that provide these libraries), then run this script again." >&2
  return 1
}

needs_xcb() {
  case "${QT_QPA_PLATFORM:-}" in
    "" ) [ -n "${DISPLAY:-}" ] || [ -z "${WAYLAND_DISPLAY:-}" ] ;;  # X11, or nothing yet (the app explains)
    xcb*) true ;;
    *) false ;;
  esac
}

if [ "${1:-}" = "--check-qt" ]; then
  check_qt_libs
  exit $?
fi
bash scripts/bootstrap.sh
if needs_xcb; then
  check_qt_libs
fi
.venv/bin/dflash-studio prepare
exec .venv/bin/dflash-studio gui "$@"
