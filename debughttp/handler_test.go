package debughttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/debughttp"
	"github.com/logbus/logbus/pubsub"
)

// demo is a broker to look at: topic orders (3 partitions) read by billing,
// which dead-letters the poison order, and by audit, which is paused and
// so lags by every order.
type demo struct {
	b      *pubsub.Broker
	orders *pubsub.Topic[string, string]
	audit  *pubsub.Group[string]
}

const demoOrders = 30

func newDemo(t *testing.T) *demo {
	t.Helper()
	b := pubsub.NewBroker()
	orders, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String(), pubsub.WithPartitions(3))
	if err != nil {
		t.Fatal(err)
	}
	handle := pubsub.HandlerFunc[string](func(_ context.Context, m pubsub.Message[string]) error {
		if m.Value == "poison" {
			return fmt.Errorf("order %d: unknown currency: %w", m.Offset, pubsub.ErrPermanent)
		}
		return nil
	})
	if _, err := orders.Subscribe("billing", "billing-1", handle); err != nil {
		t.Fatal(err)
	}
	audit, err := orders.Subscribe("audit", "audit-1", handle)
	if err != nil {
		t.Fatal(err)
	}
	if err := audit.Pause(t.Context()); err != nil {
		t.Fatal(err)
	}
	for i := range demoOrders {
		v := fmt.Sprintf("order-%d", i)
		if i == 7 {
			v = "poison"
		}
		if _, err := orders.Publish(t.Context(), fmt.Sprintf("customer-%d", i%5), v); err != nil {
			t.Fatal(err)
		}
	}
	synctest.Wait() // billing has handled everything; audit waits
	d := &demo{b: b, orders: orders, audit: audit}
	t.Cleanup(func() {
		// A test may have deleted audit, or its topic.
		if err := audit.Resume(context.Background()); err != nil && !errors.Is(err, pubsub.ErrSubscription) && !errors.Is(err, pubsub.ErrTopicNotFound) {
			t.Error(err)
		}
		if err := b.Close(context.Background()); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return d
}

// get serves one request on h and returns the response.
func get(t *testing.T, h http.Handler, target string, header ...string) *http.Response {
	t.Helper()
	return serve(t, h, http.MethodGet, target, nil, header...)
}

func post(t *testing.T, h http.Handler, target string, form url.Values, header ...string) *http.Response {
	t.Helper()
	return serve(t, h, http.MethodPost, target, form, header...)
}

// serve serves one request on h, with the header's pairs of names and
// values, and returns the response.
func serve(t *testing.T, h http.Handler, method, target string, form url.Values, header ...string) *http.Response {
	t.Helper()
	return do(h, request(method, target, form, header...))
}

// request is a request to target from localhost, with form as its body
// (unless nil) and the header's pairs; "Host" sets its Host.
func request(method, target string, form url.Values, header ...string) *http.Request {
	var r *http.Request
	if form == nil {
		r = httptest.NewRequest(method, target, nil)
	} else {
		r = httptest.NewRequest(method, target, strings.NewReader(form.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	r.Host = "localhost:6060"
	for i := 0; i+1 < len(header); i += 2 {
		if header[i] == "Host" {
			r.Host = header[i+1]
			continue
		}
		r.Header.Set(header[i], header[i+1])
	}
	return r
}

func do(h http.Handler, r *http.Request) *http.Response {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Result()
}

func body(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// overview is the part of the JSON overview these tests read.
type overview struct {
	State   string `json:"state"`
	Actions bool   `json:"actions"`
	Topics  []struct {
		Name          string                `json:"name"`
		Published     int64                 `json:"published"`
		NumPartitions int                   `json:"num_partitions"`
		Partitions    []struct{ End int64 } `json:"partitions"`
		Groups        []group               `json:"groups"`
	} `json:"topics"`
}

type group struct {
	Name             string     `json:"name"`
	Topic            string     `json:"topic"`
	Status           string     `json:"status"`
	Paused           bool       `json:"paused"`
	Lag              int64      `json:"lag"`
	LagSeconds       float64    `json:"lag_seconds"`
	Consumers        []consumer `json:"consumers"`
	DeadLettered     int64      `json:"dead_lettered"`
	Redriven         int64      `json:"redriven"`
	NumDead          int        `json:"num_dead_letters"`
	DeadLettersError string     `json:"dead_letters_error"`
	DeadLetters      []struct {
		ID     string `json:"id"`
		Offset int64  `json:"offset"`
		Error  string `json:"error"`
		Value  struct {
			Encoding  string `json:"encoding"`
			Text      string `json:"text"`
			Size      int    `json:"size"`
			Truncated bool   `json:"truncated"`
		} `json:"value"`
	} `json:"dead_letters"`
}

type consumer struct {
	Name          string `json:"name"`
	NumPartitions int    `json:"num_partitions"`
	Partitions    []int  `json:"partitions"`
}

func decode[T any](t *testing.T, resp *http.Response) T {
	t.Helper()
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q, want application/json", ct)
	}
	var v T
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

func (o overview) group(topic, name string) *group {
	for _, tv := range o.Topics {
		for i, g := range tv.Groups {
			if tv.Name == topic && g.Name == name {
				return &tv.Groups[i]
			}
		}
	}
	return nil
}

// The overview, as HTML and as JSON (asked for either way), shows the
// topic, both groups with their lag and status, and billing's dead letter
// with its error and the size of its bytes.
func TestOverviewShowsTopicsGroupsAndDeadLetters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDemo(t)
		h := debughttp.Handler(d.b)

		resp := get(t, h, "/")
		page := body(t, resp)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/html; charset=utf-8" {
			t.Fatalf("GET /: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		for _, want := range []string{
			`<title>logbus</title>`,
			`<tr data-topic="orders"><td class="l"><a href="./topics/orders">orders</a></td><td>3</td><td data-field="published">30</td>`,
			`data-field="status">paused</td>`,
			`data-field="lag">30</td>`,
			`unknown currency: permanent failure`,
			`data-field="size">6 B</span>`,
			`read-only`,
		} {
			if !strings.Contains(page, want) {
				t.Errorf("the page lacks %q", want)
			}
		}
		if strings.Contains(page, "<form") {
			t.Error("a read-only page shows a form")
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'nonce-") {
			t.Errorf("Content-Security-Policy %q has no script nonce", csp)
		}

		for _, r := range []*http.Response{get(t, h, "/?format=json"), get(t, h, "/", "Accept", "application/json")} {
			o := decode[overview](t, r)
			if o.State != "running" || o.Actions || len(o.Topics) != 1 || o.Topics[0].Published != demoOrders {
				t.Fatalf("overview: %+v", o)
			}
			audit, billing := o.group("orders", "audit"), o.group("orders", "billing")
			if audit == nil || billing == nil {
				t.Fatalf("groups missing: %+v", o.Topics[0].Groups)
			}
			if audit.Status != "paused" || !audit.Paused || audit.Lag != demoOrders {
				t.Errorf("audit: status %q paused %v lag %d, want paused, true, %d", audit.Status, audit.Paused, audit.Lag, demoOrders)
			}
			if billing.Status != "ok" || billing.Lag != 0 || billing.DeadLettered != 1 || billing.NumDead != 1 ||
				len(billing.Consumers) != 1 || billing.Consumers[0].Name != "billing-1" || len(billing.Consumers[0].Partitions) != 3 {
				t.Errorf("billing: %+v", billing)
			}
			if len(billing.DeadLetters) != 1 {
				t.Fatalf("billing shows %d dead letters, want 1", len(billing.DeadLetters))
			}
			l := billing.DeadLetters[0]
			if l.Value.Encoding != "" || l.Value.Text != "" || l.Value.Size != 6 || l.Value.Truncated ||
				!strings.Contains(l.Error, "unknown currency") || l.ID == "" {
				t.Errorf("dead letter: %+v", l)
			}
		}
		// A browser names text/html first: it gets the page.
		if r := get(t, h, "/", "Accept", "text/html,application/xhtml+xml,application/json;q=0.9"); r.Header.Get("Content-Type") != "text/html; charset=utf-8" {
			t.Errorf("a browser's Accept got %q", r.Header.Get("Content-Type"))
		}
	})
}

// The topic and group views show their part, in both forms; an unknown
// topic or group is 404 in both.
func TestTopicAndGroupViews(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDemo(t)
		h := debughttp.Handler(d.b)

		resp := get(t, h, "/topics/orders")
		if page := body(t, resp); resp.StatusCode != http.StatusOK || !strings.Contains(page, `<table id="partitions">`) ||
			!strings.Contains(page, `href="../topics/orders/groups/audit"`) {
			t.Errorf("topic page: %d\n%s", resp.StatusCode, page)
		}
		type topicJSON struct {
			Name       string `json:"name"`
			Partitions []struct {
				Partition int   `json:"partition"`
				End       int64 `json:"end"`
			} `json:"partitions"`
			Groups []group `json:"groups"`
		}
		topic := decode[topicJSON](t, get(t, h, "/topics/orders?format=json"))
		var ends int64
		for _, p := range topic.Partitions {
			ends += p.End
		}
		if topic.Name != "orders" || len(topic.Partitions) != 3 || ends != demoOrders || len(topic.Groups) != 2 {
			t.Errorf("topic JSON: %+v", topic)
		}

		resp = get(t, h, "/topics/orders/groups/billing")
		if page := body(t, resp); resp.StatusCode != http.StatusOK || !strings.Contains(page, `<table id="group-partitions">`) ||
			!strings.Contains(page, `<table id="dead-letters">`) {
			t.Errorf("group page: %d\n%s", resp.StatusCode, page)
		}
		g := decode[group](t, get(t, h, "/topics/orders/groups/billing", "Accept", "application/json"))
		if g.Name != "billing" || g.Topic != "orders" || len(g.DeadLetters) != 1 || g.DeadLetters[0].Value.Size != len("poison") {
			t.Errorf("group JSON: %+v", g)
		}

		for _, path := range []string{"/topics/payments", "/topics/orders/groups/shipping", "/nowhere"} {
			if r := get(t, h, path); r.StatusCode != http.StatusNotFound {
				t.Errorf("GET %s: %d, want 404", path, r.StatusCode)
			}
		}
		r := get(t, h, "/topics/payments?format=json")
		if e := decode[map[string]string](t, r); r.StatusCode != http.StatusNotFound || !strings.Contains(e["error"], `"payments"`) {
			t.Errorf("GET unknown topic as JSON: %d %v", r.StatusCode, e)
		}
	})
}

// browser is the Accept header of a browser's navigation.
var browser = []string{"Accept", "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}

// Without WithActions every action is refused and nothing changes.
func TestActionsAreOffByDefault(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDemo(t)
		h := debughttp.Handler(d.b)
		for _, a := range []string{"resume", "pause", "replay", "redrive"} {
			resp := post(t, h, "/topics/orders/groups/audit/"+a, url.Values{"all": {"1"}}, browser...)
			if resp.StatusCode != http.StatusForbidden || !strings.Contains(body(t, resp), "read-only") ||
				resp.Header.Get("Content-Type") != "text/html; charset=utf-8" {
				t.Errorf("POST %s: %d %q, want 403 and a page saying the page is read-only", a, resp.StatusCode, resp.Header.Get("Content-Type"))
			}
		}
		if g := d.b.Snapshot().Topics[0].Groups[0]; g.Name != "audit" || !g.Paused {
			t.Errorf("audit: %+v, want still paused", g)
		}
	})
}

// With WithActions, a same-origin form post resumes the paused group and
// redirects back to its page; a GET, a cross-site post, an unknown action
// or group and a bad argument change nothing.
func TestActionsWhenEnabled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDemo(t)
		h := debughttp.Handler(d.b, debughttp.WithActions())

		if r := get(t, h, "/topics/orders/groups/audit/resume"); r.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("GET of an action: %d, want 405", r.StatusCode)
		}
		r := post(t, h, "/topics/orders/groups/audit/resume", nil, "Sec-Fetch-Site", "cross-site", "Origin", "https://evil.example")
		if r.StatusCode != http.StatusForbidden {
			t.Errorf("cross-site POST: %d, want 403", r.StatusCode)
		}
		for path, want := range map[string]int{
			"/topics/orders/groups/audit/explode":   http.StatusNotFound,
			"/topics/orders/groups/shipping/resume": http.StatusNotFound,
			"/topics/payments/groups/audit/resume":  http.StatusNotFound,
		} {
			if r := post(t, h, path, nil); r.StatusCode != want {
				t.Errorf("POST %s: %d, want %d", path, r.StatusCode, want)
			}
		}
		if r := post(t, h, "/topics/orders/groups/audit/replay", url.Values{"from": {"offset"}, "offset": {"-1"}}); r.StatusCode != http.StatusBadRequest {
			t.Errorf("replay from offset -1: %d, want 400", r.StatusCode)
		}
		if r := post(t, h, "/topics/orders/groups/audit/redrive", nil); r.StatusCode != http.StatusBadRequest {
			t.Errorf("redrive of nothing named: %d, want 400", r.StatusCode)
		}
		if g := d.b.Snapshot().Topics[0].Groups[0]; !g.Paused || g.Lag != demoOrders {
			t.Fatalf("audit after refused actions: paused %v lag %d, want true, %d", g.Paused, g.Lag, demoOrders)
		}

		page := body(t, get(t, h, "/topics/orders/groups/audit"))
		if !strings.Contains(page, `action="../../../topics/orders/groups/audit/resume"`) || !strings.Contains(page, `data-action="replay"`) {
			t.Errorf("the group page lacks its Resume and Replay forms:\n%s", page)
		}

		r = post(t, h, "/topics/orders/groups/audit/resume", nil, append(browser, "Sec-Fetch-Site", "same-origin")...)
		if r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != "../audit?done=resume" {
			t.Fatalf("resume: %d Location %q, want 303 to ../audit?done=resume", r.StatusCode, r.Header.Get("Location"))
		}
		synctest.Wait()
		g := decode[group](t, get(t, h, "/topics/orders/groups/audit?format=json"))
		if g.Paused || g.Lag != 0 || g.Status != "ok" {
			t.Errorf("audit after Resume: paused %v lag %d status %q, want false, 0, ok", g.Paused, g.Lag, g.Status)
		}
		if page := body(t, get(t, h, "/topics/orders/groups/audit?done=resume")); !strings.Contains(page, `id="notice">Resumed.</p>`) {
			t.Error("the group page does not say it resumed")
		}

		// Replay from the earliest record, asked for as JSON: audit reads
		// everything again.
		r = post(t, h, "/topics/orders/groups/audit/replay", url.Values{"from": {"earliest"}}, "Accept", "application/json")
		if res := decode[map[string]any](t, r); r.StatusCode != http.StatusOK || res["ok"] != true {
			t.Errorf("replay: %d %v", r.StatusCode, res)
		}
		synctest.Wait()
		if s := d.audit.Stats(); s.Delivered != 2*(demoOrders-1) || s.DeadLettered != 2 {
			t.Errorf("audit after the replay: %+v, want %d delivered and 2 dead-lettered", s, 2*(demoOrders-1))
		}
	})
}

// Redrive sends billing's dead letter back to billing (named by its ID, or
// all of them): the poison fails again and is dead-lettered again. An ID
// the group does not hold is 404.
func TestRedriveAction(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDemo(t)
		h := debughttp.Handler(d.b, debughttp.WithActions())
		g := decode[group](t, get(t, h, "/topics/orders/groups/billing?format=json"))
		if len(g.DeadLetters) != 1 {
			t.Fatalf("billing holds %d dead letters, want 1", len(g.DeadLetters))
		}
		page := body(t, get(t, h, "/topics/orders/groups/billing"))
		if !strings.Contains(page, `<input type="hidden" name="id" value="`+g.DeadLetters[0].ID+`">`) {
			t.Error("the dead letter has no Redrive button naming it")
		}
		if r := post(t, h, "/topics/orders/groups/billing/redrive", url.Values{"id": {"no-such-letter"}}); r.StatusCode != http.StatusNotFound {
			t.Errorf("redrive of an unknown ID: %d, want 404", r.StatusCode)
		}
		r := post(t, h, "/topics/orders/groups/billing/redrive", url.Values{"id": {g.DeadLetters[0].ID}}, browser...)
		if r.StatusCode != http.StatusSeeOther {
			t.Fatalf("redrive by ID: %d, want 303", r.StatusCode)
		}
		synctest.Wait()
		r = post(t, h, "/topics/orders/groups/billing/redrive", url.Values{"all": {"1"}}, browser...)
		if r.StatusCode != http.StatusSeeOther {
			t.Fatalf("redrive all: %d, want 303", r.StatusCode)
		}
		synctest.Wait()
		g = decode[group](t, get(t, h, "/topics/orders/groups/billing?format=json"))
		if g.Redriven != 2 || g.DeadLettered != 3 || g.NumDead != 1 || len(g.DeadLetters) != 1 {
			t.Errorf("billing after two redrives: redriven %d, dead-lettered %d, holding %d: want 2, 3, 1", g.Redriven, g.DeadLettered, g.NumDead)
		}
	})
}

// After Close the page still shows the broker, stopped, with its dead
// letters (Group.LatestDeadLetters is a read, which works after Close); an
// action is refused with 409 Conflict.
func TestPageAfterClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDemo(t)
		h := debughttp.Handler(d.b, debughttp.WithActions())
		if err := d.audit.Resume(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := d.b.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		o := decode[overview](t, get(t, h, "/?format=json"))
		if billing := o.group("orders", "billing"); o.State != "stopped" || billing == nil || billing.NumDead != 1 ||
			len(billing.DeadLetters) != 1 || billing.DeadLettersError != "" {
			t.Errorf("after Close: state %q, billing %+v; want stopped, showing its dead letter", o.State, billing)
		}
		if r := post(t, h, "/topics/orders/groups/billing/redrive", url.Values{"all": {"1"}}); r.StatusCode != http.StatusConflict {
			t.Errorf("redrive after Close: %d, want 409", r.StatusCode)
		}
	})
}

// Hostile topic and group names and message bytes are shown escaped, never
// as markup; binary bytes as hex; long values truncated; and a name with a
// slash still has a page of its own.
func TestHostileNamesAndBytesAreEscaped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := pubsub.NewBroker()
		t.Cleanup(func() { _ = b.Close(context.Background()) })
		topicName := `<script>alert("t")</script>/x`
		groupName := `"><img src=x onerror=alert(1)>`
		topic, err := pubsub.NewTopic(b, topicName, codec.Bytes(), codec.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := topic.Subscribe(groupName, "c<b>1</b>", pubsub.HandlerFunc[[]byte](func(context.Context, pubsub.Message[[]byte]) error {
			return fmt.Errorf("<b>bad</b> \u202e %w", pubsub.ErrPermanent)
		})); err != nil {
			t.Fatal(err)
		}
		values := [][]byte{
			[]byte("\x00\xff<script>alert(2)</script>"), // binary: hex
			[]byte("abc\u202edef</td>"),                 // a bidi override: hex
			[]byte(strings.Repeat("é", 300)),            // long text: cut at a character
			[]byte(`<img src=y onerror=alert(3)>`),      // text with markup: escaped
		}
		for _, v := range values {
			if _, err := topic.Publish(t.Context(), []byte("<k>"), v); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		h := debughttp.Handler(b, debughttp.WithActions(), debughttp.WithPayloads())

		var pages []string
		for _, path := range []string{"/", "/topics/" + url.PathEscape(topicName), "/topics/" + url.PathEscape(topicName) + "/groups/" + url.PathEscape(groupName)} {
			resp := get(t, h, path)
			page := body(t, resp)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("GET %s: %d\n%s", path, resp.StatusCode, page)
			}
			pages = append(pages, page)
		}
		for i, page := range pages {
			for _, bad := range []string{"<script>alert", "<img src", "<b>bad", "<b>1", "\u202e", "</td>\"", "<k>"} {
				if strings.Contains(page, bad) {
					t.Errorf("page %d contains %q unescaped", i, bad)
				}
			}
			if !strings.Contains(page, "&lt;script&gt;alert(&#34;t&#34;)&lt;/script&gt;/x") {
				t.Errorf("page %d does not show the topic's name escaped", i)
			}
		}
		g := decode[group](t, get(t, h, "/topics/"+url.PathEscape(topicName)+"/groups/"+url.PathEscape(groupName)+"?format=json"))
		if g.Name != groupName || g.Topic != topicName || len(g.DeadLetters) != len(values) {
			t.Fatalf("group JSON: %q %q, %d letters", g.Name, g.Topic, len(g.DeadLetters))
		}
		// The newest first.
		byOffset := map[int64]int{}
		for i, l := range g.DeadLetters {
			byOffset[l.Offset] = i
		}
		for off, want := range []struct {
			encoding string
			prefix   string
			trunc    bool
		}{
			{"hex", "00ff3c736372697074", false},
			{"hex", "616263e280ae646566", false},
			{"utf-8", "éé", true},
			{"utf-8", "<img src=y", false},
		} {
			v := g.DeadLetters[byOffset[int64(off)]].Value
			if v.Encoding != want.encoding || !strings.HasPrefix(v.Text, want.prefix) || v.Truncated != want.trunc || v.Size != len(values[off]) {
				t.Errorf("offset %d previewed as %+v, want %s starting %q truncated %v", off, v, want.encoding, want.prefix, want.trunc)
			}
		}
	})
}

// Mounted under a prefix with StripPrefix, the page's links and its
// actions' redirects stay under the prefix, and the bare prefix redirects
// to itself with a slash.
func TestMountedUnderAPrefix(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDemo(t)
		mux := http.NewServeMux()
		mux.Handle("/debug/logbus/", http.StripPrefix("/debug/logbus", debughttp.Handler(d.b, debughttp.WithActions())))
		mux.Handle("/debug/logbus", http.StripPrefix("/debug/logbus", debughttp.Handler(d.b)))

		if r := get(t, mux, "/debug/logbus"); r.StatusCode != http.StatusFound || r.Header.Get("Location") != "/debug/logbus/" {
			t.Errorf("GET /debug/logbus: %d Location %q, want a redirect to /debug/logbus/", r.StatusCode, r.Header.Get("Location"))
		}
		page := body(t, get(t, mux, "/debug/logbus/"))
		if !strings.Contains(page, `href="./topics/orders/groups/audit"`) {
			t.Error("the overview does not link to the group relatively")
		}
		base, _ := url.Parse("http://host/debug/logbus/topics/orders/groups/audit/resume")
		r := post(t, mux, base.Path, nil, browser...)
		loc, err := base.Parse(r.Header.Get("Location"))
		if err != nil || loc.Path != "/debug/logbus/topics/orders/groups/audit" {
			t.Errorf("resume redirects to %v (%v), want the group's page under the prefix", loc, err)
		}
	})
}
