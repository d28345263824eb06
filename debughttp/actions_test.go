package debughttp_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/logbus/logbus/debughttp"
)

// An error answers in the format the client asked for: JSON for
// Accept: application/json, a page for a browser, and a line of text for
// curl's */* (or no Accept at all); a 405 and an unknown path too.
func TestErrorsAnswerInTheClientsFormat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDemo(t)
		readOnly, withActions := debughttp.Handler(d.b), debughttp.Handler(d.b, debughttp.WithActions())
		type request struct {
			name   string
			h      http.Handler
			method string
			path   string
			want   int
		}
		for _, rq := range []request{
			{"a GET of an action", withActions, http.MethodGet, "/topics/orders/groups/audit/resume", http.StatusMethodNotAllowed},
			{"a POST of a view", withActions, http.MethodPost, "/topics/orders", http.StatusMethodNotAllowed},
			{"an action on a read-only page", readOnly, http.MethodPost, "/topics/orders/groups/audit/resume", http.StatusForbidden},
			{"an unknown action", withActions, http.MethodPost, "/topics/orders/groups/audit/explode", http.StatusNotFound},
			{"a GET of an unknown topic action", withActions, http.MethodGet, "/topics/orders/groups", http.StatusNotFound},
			{"an unknown group", withActions, http.MethodPost, "/topics/orders/groups/shipping/resume", http.StatusNotFound},
			{"an unknown topic's page", withActions, http.MethodGet, "/topics/payments", http.StatusNotFound},
			{"an unknown path", withActions, http.MethodGet, "/nowhere/at/all", http.StatusNotFound},
		} {
			for _, c := range []struct {
				client string
				accept []string
				ctype  string
			}{
				{"JSON", []string{"Accept", "application/json"}, "application/json"},
				{"curl", []string{"Accept", "*/*"}, "text/plain; charset=utf-8"},
				{"no Accept", nil, "text/plain; charset=utf-8"},
				{"a browser", browser, "text/html; charset=utf-8"},
			} {
				r := serve(t, rq.h, rq.method, rq.path, nil, c.accept...)
				text := body(t, r)
				if r.StatusCode != rq.want || r.Header.Get("Content-Type") != c.ctype {
					t.Errorf("%s from %s: %d %q, want %d %q\n%.200s", rq.name, c.client, r.StatusCode, r.Header.Get("Content-Type"), rq.want, c.ctype, text)
					continue
				}
				switch c.client {
				case "JSON":
					if !strings.HasPrefix(text, `{`) || !strings.Contains(text, `"error":`) {
						t.Errorf("%s from %s: %q, want {\"error\": ...}", rq.name, c.client, text)
					}
				case "curl", "no Accept":
					if strings.Contains(text, "<") || strings.Count(text, "\n") != 1 {
						t.Errorf("%s from %s: %q, want one line of text", rq.name, c.client, text)
					}
				}
				if rq.want == http.StatusMethodNotAllowed && r.Header.Get("Allow") == "" {
					t.Errorf("%s from %s: a 405 without Allow", rq.name, c.client)
				}
			}
		}
	})
}

// Replay has no default start: without from it is refused, and the group
// is not rewound.
func TestReplayRequiresFrom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDemo(t)
		h := debughttp.Handler(d.b, debughttp.WithActions())
		if err := d.audit.Resume(context.Background()); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		before := d.audit.Stats().Delivered
		for _, form := range []url.Values{nil, {"offset": {"3"}}, {"from": {""}}} {
			r := post(t, h, "/topics/orders/groups/audit/replay", form, "Accept", "application/json")
			if e := decode[map[string]string](t, r); r.StatusCode != http.StatusBadRequest || !strings.Contains(e["error"], "from=") {
				t.Errorf("replay with %v: %d %v, want 400 saying from is needed", form, r.StatusCode, e)
			}
		}
		synctest.Wait()
		if lag, delivered := d.audit.Lag(), d.audit.Stats().Delivered; lag != 0 || delivered != before {
			t.Errorf("after refused replays audit has lag %d and delivered %d, want 0 and %d: it was rewound", lag, delivered, before)
		}
	})
}

// Redrive answers how many dead letters it sent back: in JSON, in text,
// and in the notice of the page a browser is sent back to.
func TestRedriveAnswersHowMany(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDemo(t)
		h := debughttp.Handler(d.b, debughttp.WithActions())
		r := post(t, h, "/topics/orders/groups/billing/redrive", url.Values{"all": {"1"}}, "Accept", "application/json")
		if res := decode[map[string]any](t, r); r.StatusCode != http.StatusOK || res["count"] != 1.0 {
			t.Errorf("redrive as JSON: %d %v, want count 1", r.StatusCode, res)
		}
		synctest.Wait() // the poison fails again: one letter again
		r = post(t, h, "/topics/orders/groups/billing/redrive", url.Values{"all": {"1"}})
		if text := body(t, r); r.StatusCode != http.StatusOK || text != "redrive: 1 dead letter(s) sent back\n" {
			t.Errorf("redrive as text: %d %q", r.StatusCode, text)
		}
		synctest.Wait()
		r = post(t, h, "/topics/orders/groups/billing/redrive", url.Values{"all": {"1"}}, browser...)
		if loc := r.Header.Get("Location"); r.StatusCode != http.StatusSeeOther || loc != "../billing?count=1&done=redrive" {
			t.Fatalf("redrive from a browser: %d Location %q", r.StatusCode, loc)
		}
		page := body(t, get(t, h, "/topics/orders/groups/billing?count=1&done=redrive"))
		if !strings.Contains(page, `id="notice">1 dead letter(s) sent back to the group.</p>`) {
			t.Error("the group's page does not say how many letters were sent back")
		}
	})
}

// A redrive naming IDs the group does not hold is 404 without repeating
// the IDs (a POST may name thousands); a redrive whose request has reached its deadline
// sends nothing back.
func TestRedriveByIDs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDemo(t)
		h := debughttp.Handler(d.b, debughttp.WithActions())
		ids := url.Values{}
		for i := range 1000 {
			ids.Add("id", "no-such-letter-"+strings.Repeat("x", i%7))
		}
		r := post(t, h, "/topics/orders/groups/billing/redrive", ids, "Accept", "application/json")
		if text := body(t, r); r.StatusCode != http.StatusNotFound || strings.Contains(text, "no-such-letter") || len(text) > 200 {
			t.Errorf("redrive of unknown IDs: %d %q, want a short 404 without the IDs", r.StatusCode, text)
		}

		id := decode[group](t, get(t, h, "/topics/orders/groups/billing?format=json")).DeadLetters[0].ID
		ctx, cancel := context.WithTimeout(context.Background(), 0) // its deadline has passed
		defer cancel()
		req := request(http.MethodPost, "/topics/orders/groups/billing/redrive", url.Values{"id": {id}}, "Accept", "application/json").WithContext(ctx)
		r = do(h, req)
		if res := decode[map[string]any](t, r); r.StatusCode != http.StatusGatewayTimeout {
			t.Errorf("redrive after the request's deadline: %d %v, want 504", r.StatusCode, res)
		}
		if s := d.b.Snapshot().Topics[0].Groups[1]; s.Name != "billing" || s.Stats.Redriven != 0 || s.DeadLetters != 1 {
			t.Errorf("billing after a redrive whose request ended: %+v, want nothing redriven", s)
		}
	})
}
