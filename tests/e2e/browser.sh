# browser.sh - headless Chromium for the web pages' end-to-end scripts (source it after
# lib.sh). browse URL NAME [HEIGHT] loads a page the way a person's browser does: its DOM as
# Chromium built it goes to $T/NAME.dom, a screenshot 1280 wide to $SHOTS/NAME.png (build/
# screens beside $KILN), and the script fails when the page logged anything to the console:
# a page without JavaScript logs nothing but a content security policy violation or a
# failed load. Each call is bounded by timeout. Chromium as root needs --no-sandbox.
CHROMIUM=${CHROMIUM:-chromium}
command -v "$CHROMIUM" >/dev/null || fail "no $CHROMIUM (make deps installs Debian's chromium)"
SHOTS=${SHOTS:-$(dirname "$KILN")/screens}
mkdir -p "$SHOTS"
chrome() {
    timeout 90 "$CHROMIUM" --headless --no-sandbox --disable-gpu --hide-scrollbars \
        --no-first-run --user-data-dir="$T/chromium" --enable-logging=stderr --v=0 "$@"
}
# console_clean LOG: no console message, no refusal, no CSP violation in Chromium's log.
console_clean() {
    if grep -E ':CONSOLE|Refused to|Content Security Policy|Uncaught' "$1" >"$T/console" 2>/dev/null; then
        cat "$T/console" >&2
        return 1
    fi
}
browse() {
    chrome --dump-dom "$1" >"$T/$2.dom" 2>"$T/$2.log" || { cat "$T/$2.log" >&2; fail "chromium: $1"; }
    console_clean "$T/$2.log" || fail "$2: the browser logged the above loading $1"
    [ -s "$T/$2.dom" ] || fail "$2: empty DOM from $1"
    chrome --screenshot="$SHOTS/$2.png" --window-size=1280,"${3:-1600}" "$1" >/dev/null 2>"$T/$2.shot.log" ||
        { cat "$T/$2.shot.log" >&2; fail "chromium screenshot: $1"; }
    console_clean "$T/$2.shot.log" || fail "$2: the browser logged the above taking a screenshot"
    [ -s "$SHOTS/$2.png" ] || fail "$2: no screenshot"
}
# count PATTERN FILE: how many times the fixed string occurs.
count() { grep -oF -- "$1" "$2" | wc -l; }
# The check can fail: a page that breaks its policy is caught.
printf '%s' '<!DOCTYPE html><html><head><meta http-equiv="Content-Security-Policy" content="default-src '"'none'"'"></head><body><p style="color:red">x</p></body></html>' >"$T/csp-bad.html"
chrome --dump-dom "file://$T/csp-bad.html" >/dev/null 2>"$T/csp-bad.log" || true
! console_clean "$T/csp-bad.log" 2>/dev/null || fail "browser.sh does not see a CSP violation"
