// Package browsertest drives headless Chromium against logbus's debug page
// (package debughttp), as a person would use it: it reads what the page
// shows of a live broker, presses a button and sees the effect. It is a
// module of its own so that the library's module never builds chromedp.
//
// The test needs Debian's chromium (apt-get install chromium
// fonts-liberation) or CHROME_PATH; without it the test skips, unless
// LOGBUS_REQUIRE_BROWSER=1, which CI sets, makes it fail. Screenshots go to
// out/ (or LOGBUS_ARTIFACTS); LOGBUS_UPDATE_DOCS=1 also writes the
// README's docs/debug-page.png.
package browsertest
