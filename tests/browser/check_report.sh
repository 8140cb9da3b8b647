#!/usr/bin/env bash
# Renders a generated HTML report in headless Chromium (Debian's `chromium`, installed by scripts/setup.sh)
# and checks that it shows: the DOM has every section, one base64 PNG per layer and the SVG charts, and a
# screenshot is not blank (many colours, heatmap cells in the colour map's hot colour, chart lines).
# Usage: check_report.sh ATTN_REPORT_SAMPLE WORK_DIR
set -euo pipefail
sample="$1"
work="$2"
rm -rf "$work"
mkdir -p "$work"
report="$work/report.html"

browser="$(command -v chromium || command -v chromium-browser || true)"
if [ -z "$browser" ]; then
  echo "FAIL: chromium is not installed (scripts/setup.sh installs Debian's chromium package)" >&2
  exit 1
fi

"$sample" write "$report"

# Root (CI, containers) needs --no-sandbox; a private profile keeps runs independent.
flags=(--headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run --disable-extensions
  --user-data-dir="$work/profile" --window-size=1280,3600)
timeout 120 "$browser" "${flags[@]}" --dump-dom "file://$report" > "$work/dom.html" 2> "$work/chromium-dom.log" || {
  echo "FAIL: chromium --dump-dom failed:" >&2
  tail -5 "$work/chromium-dom.log" >&2
  exit 1
}
timeout 120 "$browser" "${flags[@]}" --screenshot="$work/screenshot.png" "file://$report" \
  > "$work/chromium-shot.log" 2>&1 || {
  echo "FAIL: chromium --screenshot failed:" >&2
  tail -5 "$work/chromium-shot.log" >&2
  exit 1
}

fail=0
expect_count() {  # expect_count WHAT MIN PATTERN: at least MIN matches of PATTERN in the rendered DOM
  local n
  n=$(grep -o -- "$3" "$work/dom.html" | wc -l)
  echo "dom: $1: $n"
  if [ "$n" -lt "$2" ]; then
    echo "FAIL: expected at least $2 $1 in the rendered DOM" >&2
    fail=1
  fi
}
expect_count "sections" 5 '<section id="'
expect_count "heatmap images" 2 '<img width="[0-9]*" src="data:image/png;base64,'
expect_count "charts" 3 '<svg class="chart"'
expect_count "curves" 5 '<polyline class="series"'
expect_count "entropy flags" 1 'class="flag '
if grep -q -i -E '(src|href)="https?:' "$work/dom.html"; then
  echo "FAIL: the report refers to the network" >&2
  fail=1
fi

[ -s "$work/screenshot.png" ] || { echo "FAIL: no screenshot" >&2; exit 1; }
"$sample" check-screenshot "$work/screenshot.png" || fail=1
exit $fail
