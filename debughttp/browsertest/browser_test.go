package browsertest

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/debughttp"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

// stepTimeout bounds everything the test asks of the browser once it has
// started; the start itself is bounded by startTimeout.
const (
	startTimeout = 60 * time.Second
	stepTimeout  = 60 * time.Second
)

// live is a broker in the states an operator looks for: billing
// dead-lettered the poison order; audit is paused, so it lags by every
// order; mailer's handler hangs on its first order, a stuck handler.
type live struct {
	b       *pubsub.Broker
	audit   *pubsub.Group[string]
	billing *pubsub.Group[string]
	release chan struct{} // lets mailer's handler return
}

const orders = 30

func newLive(t *testing.T) *live {
	t.Helper()
	stuck := &stuckHook{seen: make(chan struct{})}
	b := pubsub.NewBroker(pubsub.WithStuckAfter(100*time.Millisecond), pubsub.WithHooks(stuck))
	topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String(), pubsub.WithPartitions(3))
	if err != nil {
		t.Fatal(err)
	}
	billing := pubsubtest.NewRecorder[string]()
	billing.FailWith(func(m pubsub.Message[string]) error {
		if m.Value == "poison" {
			return fmt.Errorf("order %d: unknown currency %q: %w", m.Offset, "XX<b>", pubsub.ErrPermanent)
		}
		return nil
	})
	billingGroup, err := topic.Subscribe("billing", "billing-1", billing)
	if err != nil {
		t.Fatal(err)
	}
	audit, err := topic.Subscribe("audit", "audit-1", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	if err := audit.Pause(t.Context()); err != nil {
		t.Fatal(err)
	}
	l := &live{b: b, audit: audit, billing: billingGroup, release: make(chan struct{})}
	started := make(chan struct{}, 1)
	_, err = topic.Subscribe("mailer", "mailer-1", pubsub.HandlerFunc[string](func(ctx context.Context, m pubsub.Message[string]) error {
		if m.Offset == 0 && m.Partition == 0 {
			select {
			case started <- struct{}{}:
			default:
			}
			select {
			case <-l.release:
			case <-ctx.Done():
			}
		}
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		close(l.release)
		if err := audit.Resume(context.Background()); err != nil {
			t.Error(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := b.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	for i := range orders {
		v := fmt.Sprintf("order-%d", i)
		if i == 7 {
			v = "poison" // customer-2, whose later orders follow it in its partition
		}
		if _, err := topic.Publish(t.Context(), fmt.Sprintf("customer-%d", i%5), v); err != nil {
			t.Fatal(err)
		}
	}
	// Barriers, no sleeping: billing acked every other order, and so (in
	// partition order) dead-lettered the poison first; mailer's handler
	// is running, and the broker has reported it stuck.
	if err := billing.WaitFor(t.Context(), orders-1); err != nil {
		t.Fatal(err)
	}
	<-started
	select {
	case <-stuck.seen:
	case <-time.After(30 * time.Second): // a bound: the watchdog reports within 150ms
		t.Fatal("the broker did not report mailer's handler stuck")
	}
	return l
}

// stuckHook tells when the broker first reported a stuck handler.
type stuckHook struct {
	once sync.Once
	seen chan struct{}
}

func (h *stuckHook) OnStuck(e pubsub.StuckEvent) {
	if !e.Returned {
		h.once.Do(func() { close(h.seen) })
	}
}

// browser returns the Chromium to drive, or skips the test.
func browser(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CHROME_PATH"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("LOGBUS_REQUIRE_BROWSER") == "1" {
		t.Fatal("no Chromium found and LOGBUS_REQUIRE_BROWSER=1: apt-get install -y --no-install-recommends chromium fonts-liberation, or set CHROME_PATH")
	}
	t.Skip("no Chromium found: apt-get install -y --no-install-recommends chromium fonts-liberation (or set CHROME_PATH); LOGBUS_REQUIRE_BROWSER=1 makes this a failure")
	return ""
}

// startBrowser starts headless Chromium and returns a context for its tab,
// bounded by stepTimeout.
func startBrowser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browser(t)),
		chromedp.NoSandbox, // Chromium refuses to run as root with its sandbox
		chromedp.WindowSize(1280, 900),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithErrorf(t.Logf))
	t.Cleanup(cancel)
	// chromedp: no deadline on the context of the call that starts the
	// browser (it would end the browser with it); bound it from outside.
	start := time.Now()
	started := make(chan error, 1)
	go func() { started <- chromedp.Do(ctx) }()
	select {
	case err := <-started:
		if err != nil {
			t.Fatalf("starting Chromium: %v", err)
		}
	case <-time.After(startTimeout):
		cancel()
		t.Fatalf("Chromium did not start within %v", startTimeout)
	}
	t.Logf("Chromium started in %v", time.Since(start).Round(time.Millisecond))
	ctx, cancelSteps := context.WithTimeout(ctx, stepTimeout)
	t.Cleanup(cancelSteps)
	return ctx
}

// text is what a person reads in the element sel: its innerText.
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(`(() => { const e = document.querySelector(%q); return e ? e.innerText.trim() : "<missing>" })()`, sel)))
	if err != nil {
		t.Fatalf("reading %s: %v", sel, err)
	}
	return s
}

// waitFor polls the page's own state until the JavaScript expression is
// true: the page refreshes itself, so the test waits for the browser, not
// for time.
func waitFor(t *testing.T, ctx context.Context, expr string) {
	t.Helper()
	if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(20*time.Second))); err != nil {
		t.Fatalf("waiting for %s: %v", expr, err)
	}
}

func TestDebugPageInBrowser(t *testing.T) {
	ctx := startBrowser(t)
	l := newLive(t)
	mux := http.NewServeMux()
	mux.Handle("/debug/logbus/", http.StripPrefix("/debug/logbus",
		debughttp.Handler(l.b, debughttp.WithActions(), debughttp.WithPayloads(), debughttp.WithRefresh(250*time.Millisecond))))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	if err := chromedp.Do(ctx,
		chromedp.Navigate(srv.URL+"/debug/logbus/"),
		chromedp.WaitVisible(chromedp.ID("groups")),
	); err != nil {
		t.Fatal(err)
	}
	row := func(group, field string) string {
		return text(t, ctx, fmt.Sprintf(`#groups tr[data-group=%q] td[data-field=%q]`, group, field))
	}
	title, err := chromedp.Run(ctx, chromedp.Title())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ what, got, want string }{
		{"title", title, "logbus"},
		{"orders published", text(t, ctx, `#topics tr[data-topic="orders"] td[data-field="published"]`), "30"},
		{"audit status", row("audit", "status"), "PAUSED"}, // upper-cased by the style sheet
		{"audit lag", row("audit", "lag"), "30"},
		{"billing status", row("billing", "status"), "OK"},
		{"billing lag", row("billing", "lag"), "0"},
		{"billing dead-lettered", row("billing", "dead-lettered"), "1"},
		{"mailer in flight", row("mailer", "in-flight"), "1 (1 stuck)"},
		{"mailer status", row("mailer", "status"), "STUCK"},
		{"stuck handler's partition", text(t, ctx, `#stuck tr[data-group="mailer"] td:nth-child(3)`), "0"},
		{"dead letter's value", text(t, ctx, `#dead-letters tr[data-group="billing"] td[data-field="value"] .preview`), "poison"},
	} {
		if c.got != c.want {
			t.Errorf("%s reads %q, want %q", c.what, c.got, c.want)
		}
	}
	if e := text(t, ctx, `#dead-letters tr[data-group="billing"] td[data-field="error"]`); !strings.Contains(e, `unknown currency "XX<b>"`) {
		t.Errorf("the dead letter's error reads %q, want it to quote the currency as written", e)
	}
	if running := text(t, ctx, `#stuck tr[data-group="mailer"] td[data-field="running"]`); !strings.HasSuffix(running, "ms") && !strings.HasSuffix(running, "s") {
		t.Errorf("the stuck handler's running time reads %q", running)
	}
	if age := row("audit", "lag-age"); age == "0" || age == "<missing>" {
		t.Errorf("audit's lag age reads %q, want the age of its oldest order", age)
	}
	// The page refreshes itself: its script fetched it again and swapped
	// the figures in.
	waitFor(t, ctx, `Number(document.getElementById("refreshed").dataset.count) >= 2`)
	if got := row("audit", "lag"); got != "30" {
		t.Errorf("after refreshing, audit's lag reads %q, want 30", got)
	}
	shot(t, ctx, "debug-page.png", true)

	// To audit's page, and press Resume: audit catches up.
	press(t, ctx, `#groups tr[data-group="audit"] td a`)
	if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.ID("group-partitions"))); err != nil {
		t.Fatal(err)
	}
	if got := text(t, ctx, "#status"); got != "PAUSED" {
		t.Errorf("audit's page shows status %q, want PAUSED", got)
	}
	press(t, ctx, `#actions button[data-action="resume"]`)
	if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`#notice[data-done="resume"]`))); err != nil {
		t.Fatal(err)
	}
	if got := text(t, ctx, "#notice"); got != "Resumed." {
		t.Errorf("after Resume the page says %q, want Resumed.", got)
	}
	// The refresh shows the group caught up, as a person waiting would see.
	waitFor(t, ctx, `document.getElementById("lag").innerText === "0" && document.getElementById("status").innerText === "OK"`)
	if lag := l.audit.Lag(); lag != 0 {
		t.Errorf("the page shows audit caught up, but its lag is %d", lag)
	}
	loc, err := chromedp.Run(ctx, chromedp.Location())
	if err != nil {
		t.Fatal(err)
	}
	if want := srv.URL + "/debug/logbus/topics/orders/groups/audit"; loc != want {
		t.Errorf("after the action the browser is at %s, want %s (without ?done=)", loc, want)
	}
	shot(t, ctx, "debug-page-group.png", false)

	// To billing's page, and redrive its dead letter: the poison fails
	// again and is dead-lettered again, and the page counts the redrive.
	if err := chromedp.Do(ctx,
		chromedp.Navigate(srv.URL+"/debug/logbus/topics/orders/groups/billing"),
		chromedp.WaitVisible(chromedp.ID("dead-letters")),
	); err != nil {
		t.Fatal(err)
	}
	press(t, ctx, `#dead-letters button[data-action="redrive"]`)
	if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`#notice[data-done="redrive"]`))); err != nil {
		t.Fatal(err)
	}
	if got := text(t, ctx, "#notice"); got != "1 dead letter(s) sent back to the group." {
		t.Errorf("after Redrive the page says %q, want it to count the letter sent back", got)
	}
	if loc, err := chromedp.Run(ctx, chromedp.Location()); err != nil || strings.Contains(loc, "?") {
		t.Errorf("after Redrive the browser is at %s (%v), want the group's page without ?done= and ?count=", loc, err)
	}
	waitFor(t, ctx, `(s => s.includes("dead-lettered 2") && s.includes("1 redriven"))(document.getElementById("summary").innerText)`)
	if s := l.billing.Stats(); s.Redriven != 1 || s.DeadLettered != 2 {
		t.Errorf("billing after the redrive: %+v, want 1 redriven and 2 dead-lettered", s)
	}

	// Discard asks first. Cancelled, nothing is sent: after two more
	// refreshes the letter is still there (and the Redrive's notice, which
	// stays until the page is left). Confirmed, it is discarded.
	dialogs := make(chan string, 1)
	if err := chromedp.Listen(ctx, func(ev any) {
		if e, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			select {
			case dialogs <- e.Message:
			default:
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	answer := func(accept bool) {
		t.Helper()
		select {
		case msg := <-dialogs:
			if msg != "Discard this dead letter?" {
				t.Errorf("the dialog asks %q", msg)
			}
		case <-ctx.Done():
			t.Fatal("Discard did not ask for confirmation")
		}
		if _, err := chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: accept}); err != nil {
			t.Fatal(err)
		}
	}
	press(t, ctx, `#dead-letters button[data-action="discard"]`)
	answer(false)
	refreshed, err := chromedp.Run(ctx, chromedp.Evaluate[int](`Number(document.getElementById("refreshed").dataset.count)`))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, fmt.Sprintf(`Number(document.getElementById("refreshed").dataset.count) >= %d`, refreshed+2))
	if n := len(l.billing.DeadLetters()); n != 1 {
		t.Fatalf("after Discard was cancelled billing holds %d dead letters, want 1", n)
	}
	if got := text(t, ctx, "#notice"); got != "1 dead letter(s) sent back to the group." {
		t.Errorf("after two refreshes the page's notice reads %q, want the Redrive's still", got)
	}
	press(t, ctx, `#dead-letters button[data-action="discard"]`)
	answer(true)
	if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`#notice[data-done="discard"]`))); err != nil {
		t.Fatal(err)
	}
	if got := text(t, ctx, "#notice"); got != "1 dead letter(s) discarded." {
		t.Errorf("after Discard the page says %q, want it to count the letter discarded", got)
	}
	if n, s := len(l.billing.DeadLetters()), l.billing.Stats(); n != 0 || s.DeadLettered != 2 || s.Redriven != 1 {
		t.Errorf("billing after the discard: %d letters held, %+v; want none, and the counts unchanged", n, s)
	}
}

// press clicks the element sel from a script of the page's, after the
// current task: a click from outside could find the node just before the
// page's refresh replaces it, and a dialog the click opens must not block
// the call.
func press(t *testing.T, ctx context.Context, sel string) {
	t.Helper()
	ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(
		`(sel => { if (!document.querySelector(sel)) return false; setTimeout(() => document.querySelector(sel).click(), 0); return true })(%q)`, sel)))
	if err != nil || !ok {
		t.Fatalf("pressing %s: found %v, %v", sel, ok, err)
	}
}

// shot saves a full-page screenshot under out/ (or LOGBUS_ARTIFACTS), the
// folder CI keeps; forDocs also writes docs/ at the repository's root
// when LOGBUS_UPDATE_DOCS=1.
func shot(t *testing.T, ctx context.Context, name string, forDocs bool) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // quality 100: PNG
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) {
		t.Fatalf("the screenshot is not a PNG (%d bytes)", len(png))
	}
	dir := os.Getenv("LOGBUS_ARTIFACTS")
	if dir == "" {
		dir = "out"
	}
	dirs := []string{dir}
	if forDocs && os.Getenv("LOGBUS_UPDATE_DOCS") == "1" {
		dirs = append(dirs, filepath.Join("..", "..", "docs"))
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(d, name)
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s (%d bytes)", path, len(png))
	}
}
