#!/usr/bin/env bash
# tests/report/browser.sh BIN_DIR WORK_DIR — the report of real short runs, opened in headless Chromium
# (Debian's `chromium`, installed by tools/setup.sh; exit 77 = skipped only where it is not installed):
# an LM run (lm-tiny.ini: text samples), a diffusion run (tests/diffusion_objective/tiny.ini: image grids)
# and the two compared. For each page: check_page.py html (self-contained, the runs' data), then Chromium
# renders it twice with the same window (a screenshot; the DOM after its scripts ran, with the console on
# stderr): no console message at all, no script error, every plot on screen has curves (pixels of the
# screenshot inside the plot rectangles the page reports), the expected charts exist; the comparison lists
# the config differences. A copy of the page with a broken script must fail the same checks.
# The screenshots stay in WORK_DIR (lm.png, diffusion.png, compare.png) to be looked at.
set -euo pipefail
bin=$1 work=$2
browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
  echo "SKIP: no chromium (tools/setup.sh installs Debian's chromium)"
  exit 77
fi
here=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-/usr/bin/python3}
rm -rf "$work" && mkdir -p "$work"
cd "$work"
fail() { echo "FAIL: $*"; exit 1; }
run() { "$bin/dew-run" "$@" > last.log 2>&1 < /dev/null || { cat last.log; fail "dew-run $*"; }; }
flags=(--headless --disable-gpu --no-sandbox --force-device-scale-factor=1 --hide-scrollbars
       --window-size=1400,2000 --user-data-dir="$work/profile")
# render PAGE NAME: NAME.png (screenshot), NAME.dom (DOM after the scripts ran), NAME.console (console lines)
render() {
  timeout 120 "$browser" "${flags[@]}" --screenshot="$work/$2.png" "file://$work/$1" > "$2.shot.log" 2>&1 ||
    { cat "$2.shot.log"; fail "chromium --screenshot $1"; }
  [ -s "$2.png" ] || { cat "$2.shot.log"; fail "no screenshot of $1"; }
  timeout 120 "$browser" "${flags[@]}" --enable-logging=stderr --v=0 --virtual-time-budget=5000 --dump-dom \
    "file://$work/$1" > "$2.dom" 2> "$2.err" || { cat "$2.err"; fail "chromium --dump-dom $1"; }
  grep "CONSOLE" "$2.err" > "$2.console" || true
}
"$bin/dew-tokenize" --input /usr/share/games/fortunes/magic --out data/magic > tok.log 2>&1 || { cat tok.log; fail tokenize; }
run train --config "$here/lm-tiny.ini" --run-dir lm
run train --config "$here/../diffusion_objective/tiny.ini" --run-dir diffusion
run report --run-dir lm --out lm.html
run report --run-dir diffusion --out diffusion.html
run report --run-dir lm --run-dir diffusion --out compare.html
"$PY" "$here/check_page.py" html lm.html lm
"$PY" "$here/check_page.py" html diffusion.html diffusion
"$PY" "$here/check_page.py" html compare.html lm diffusion

common=(--title "loss (train and validation)" --title "learning rate" --title "memory (MiB)")
check() {  # NAME MIN_PLOTS TITLES...
  local name=$1; shift
  [ ! -s "$name.console" ] || { cat "$name.console"; fail "$name: console messages"; }
  "$PY" "$here/check_page.py" render "$name.dom" "$name.png" --min-plots "$@"
}
render lm.html lm
check lm 8 "${common[@]}" --title "throughput (tokens/s)"
grep -q 'class="sample-text"' lm.dom || fail "lm: no text sample on the page"
render diffusion.html diffusion
check diffusion 6 "${common[@]}" --title "throughput (samples/s)" --title "train mse"
grep -q 'class="grid-image"' diffusion.dom || fail "diffusion: no image grid on the page"
render compare.html compare
check compare 10 "${common[@]}"
grep -q 'id="config-diff"' compare.dom || fail "compare: no config differences table"
grep -q '<td>model.plugin</td><td>causal_transformer</td><td>dit</td>' compare.dom ||
  fail "compare: model.plugin is not listed as a difference"

# The controls redraw the charts (smoothing 0.9, linear scale) and the pointer shows values, with no error.
cat > interact.js <<'JS'
<script>
const s = document.getElementById('smoothing'); s.value = '0.9'; s.dispatchEvent(new Event('input'));
const l = document.getElementById('logscale'); l.checked = false; l.dispatchEvent(new Event('change'));
const svg = document.querySelector('.chart svg'), r = svg.getBoundingClientRect();
svg.dispatchEvent(new MouseEvent('mousemove', { clientX: r.left + r.width * 0.6, clientY: r.top + r.height / 2 }));
const tip = document.querySelector('.tip');
document.body.setAttribute('data-tip', tip.style.display + ': ' + tip.textContent);
</script>
JS
sed '/^<\/body>$/e cat interact.js' lm.html > interact.html
render interact.html interact
check interact 8
grep -q 'data-tip="block: loss: [0-9.]* (smoothed [0-9.]*) @ [0-9]*' interact.dom ||
  { grep -o 'data-tip="[^"]*"' interact.dom; fail "no values under the pointer"; }

# The checks catch a page whose script fails half-way (nothing is drawn) ...
sed 's/^  drawAll();$/  drawAll(); notDefinedAnywhere();/' lm.html > broken.html
cmp -s lm.html broken.html && fail "could not break the page"
render broken.html broken
[ -s broken.console ] || fail "the broken page logged nothing on the console"
if "$PY" "$here/check_page.py" render broken.dom broken.png --min-plots 8 > broken.check 2>&1; then
  fail "the checks passed a page with a script error"
fi
grep -q "script errors" broken.check || { cat broken.check; fail "the broken page failed for another reason"; }
# ... and one that draws no curves.
sed 's/stroke: s.color, .stroke-width.: 1.6/stroke: "none", "stroke-width": 1.6/; s/fill: s.color/fill: "none"/' \
  lm.html > blank.html
cmp -s lm.html blank.html && fail "could not blank the curves"
render blank.html blank
if "$PY" "$here/check_page.py" render blank.dom blank.png --min-plots 8 > blank.check 2>&1; then
  fail "the checks passed a page without curves"
fi
grep -q "curve pixels" blank.check || { cat blank.check; fail "the blank page failed for another reason"; }
echo "browser: the LM, diffusion and comparison reports render their plots in headless Chromium with no script error"
