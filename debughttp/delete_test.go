package debughttp_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/logbus/logbus/debughttp"
)

// Delete group is an action like the others: refused on a read-only page,
// from another site, another Host or as a GET; a POST deletes the group
// (Broker.DeleteGroup) and sends a browser back to the topic's page, which
// says so; a second one is 404.
func TestDeleteGroupAction(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDemo(t)
		h := debughttp.Handler(d.b, debughttp.WithActions())
		const path = "/topics/orders/groups/audit/delete"
		for name, r := range map[string]*http.Response{
			"read-only":  post(t, debughttp.Handler(d.b), path, nil),
			"a GET":      get(t, h, path),
			"cross-site": post(t, h, path, nil, "Sec-Fetch-Site", "cross-site", "Origin", "https://evil.example"),
			"rebound":    post(t, h, path, nil, "Host", "evil.example", "Origin", "http://evil.example", "Sec-Fetch-Site", "same-origin"),
		} {
			if r.StatusCode != http.StatusForbidden && r.StatusCode != http.StatusMethodNotAllowed {
				t.Errorf("%s delete: %d, want 403 or 405", name, r.StatusCode)
			}
		}
		if n := len(d.b.Snapshot().Topics[0].Groups); n != 2 {
			t.Fatalf("%d groups after refused deletes, want 2", n)
		}

		if page := body(t, get(t, h, "/topics/orders/groups/audit")); !strings.Contains(page, `action="../../../topics/orders/groups/audit/delete"><button type="submit" data-action="delete-group" data-confirm="Delete group audit, its offsets and its dead letters?">`) {
			t.Error("the group page has no Delete group button asking for confirmation")
		}
		r := post(t, h, path, nil, browser...)
		if loc := r.Header.Get("Location"); r.StatusCode != http.StatusSeeOther || loc != "../../../orders?done=delete-group" {
			t.Fatalf("delete group: %d Location %q, want 303 to the topic's page", r.StatusCode, loc)
		}
		synctest.Wait()
		if gs := d.b.Snapshot().Topics[0].Groups; len(gs) != 1 || gs[0].Name != "billing" {
			t.Errorf("groups after deleting audit: %+v, want billing alone", gs)
		}
		if page := body(t, get(t, h, "/topics/orders?done=delete-group")); !strings.Contains(page, `id="notice">Group deleted.</p>`) {
			t.Error("the topic's page does not say the group was deleted")
		}
		r = post(t, h, path, nil, "Accept", "application/json")
		if e := decode[map[string]string](t, r); r.StatusCode != http.StatusNotFound || !strings.Contains(e["error"], `"audit"`) {
			t.Errorf("deleting audit again: %d %v, want 404", r.StatusCode, e)
		}
		r = post(t, h, "/topics/orders/groups/billing/delete", nil, "Accept", "application/json")
		if res := decode[map[string]any](t, r); r.StatusCode != http.StatusOK || res["ok"] != true || res["action"] != "delete" || res["group"] != "billing" {
			t.Errorf("delete billing as JSON: %d %v", r.StatusCode, res)
		}
	})
}

// Delete topic deletes it with its groups (Broker.DeleteTopic) and sends a
// browser back to the overview, which says so; the topic's page has the
// button, a read-only one does not.
func TestDeleteTopicAction(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDemo(t)
		h := debughttp.Handler(d.b, debughttp.WithActions())
		if page := body(t, get(t, debughttp.Handler(d.b), "/topics/orders")); strings.Contains(page, "<form") {
			t.Error("a read-only topic page shows a form")
		}
		if r := post(t, debughttp.Handler(d.b), "/topics/orders/delete", nil); r.StatusCode != http.StatusForbidden {
			t.Errorf("delete topic on a read-only page: %d, want 403", r.StatusCode)
		}
		if page := body(t, get(t, h, "/topics/orders")); !strings.Contains(page, `action="../topics/orders/delete"><button type="submit" data-action="delete-topic" data-confirm="`) {
			t.Error("the topic page has no Delete topic button asking for confirmation")
		}
		r := post(t, h, "/topics/orders/delete", nil, browser...)
		if loc := r.Header.Get("Location"); r.StatusCode != http.StatusSeeOther || loc != "../../?done=delete-topic" {
			t.Fatalf("delete topic: %d Location %q, want 303 to the overview", r.StatusCode, loc)
		}
		synctest.Wait()
		if ts := d.b.Snapshot().Topics; len(ts) != 0 {
			t.Errorf("topics after deleting orders: %d, want none", len(ts))
		}
		if page := body(t, get(t, h, "/?done=delete-topic")); !strings.Contains(page, `id="notice">Topic deleted.</p>`) || !strings.Contains(page, "No topics.") {
			t.Error("the overview does not say the topic was deleted")
		}
		if r := post(t, h, "/topics/orders/delete", nil); r.StatusCode != http.StatusNotFound || !strings.HasPrefix(body(t, r), "logbus: delete topic") {
			t.Errorf("deleting orders again: %d, want 404 in a line of text", r.StatusCode)
		}
		if r := post(t, h, "/topics/orders/explode", nil); r.StatusCode != http.StatusNotFound {
			t.Errorf("an unknown topic action: %d, want 404", r.StatusCode)
		}
	})
}

// Discard removes dead letters without delivering them and answers how
// many; an ID the group does not hold is 404, without echoing it.
func TestDiscardAction(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDemo(t)
		h := debughttp.Handler(d.b, debughttp.WithActions())
		g := decode[group](t, get(t, h, "/topics/orders/groups/billing?format=json"))
		id := g.DeadLetters[0].ID
		page := body(t, get(t, h, "/topics/orders/groups/billing"))
		for _, want := range []string{`data-action="discard" data-confirm="Discard this dead letter?"`, `data-action="discard-all"`} {
			if !strings.Contains(page, want) {
				t.Errorf("the group page lacks %s", want)
			}
		}
		if r := post(t, h, "/topics/orders/groups/billing/discard", nil); r.StatusCode != http.StatusBadRequest {
			t.Errorf("discard of nothing named: %d, want 400", r.StatusCode)
		}
		r := post(t, h, "/topics/orders/groups/billing/discard", url.Values{"id": {"secret-id-1", "secret-id-2"}})
		if text := body(t, r); r.StatusCode != http.StatusNotFound || strings.Contains(text, "secret-id") {
			t.Errorf("discard of unknown IDs: %d %q, want 404 without the IDs", r.StatusCode, text)
		}
		r = post(t, h, "/topics/orders/groups/billing/discard", url.Values{"id": {id}}, "Accept", "application/json")
		if res := decode[map[string]any](t, r); r.StatusCode != http.StatusOK || res["count"] != 1.0 {
			t.Errorf("discard by ID: %d %v, want count 1", r.StatusCode, res)
		}
		synctest.Wait()
		g = decode[group](t, get(t, h, "/topics/orders/groups/billing?format=json"))
		if g.NumDead != 0 || g.DeadLettered != 1 || g.Redriven != 0 {
			t.Errorf("billing after the discard: holding %d, dead-lettered %d, redriven %d; want 0, 1, 0", g.NumDead, g.DeadLettered, g.Redriven)
		}
		r = post(t, h, "/topics/orders/groups/billing/discard", url.Values{"all": {"1"}})
		if text := body(t, r); r.StatusCode != http.StatusOK || text != "discard: 0 dead letter(s) discarded\n" {
			t.Errorf("discard all of none: %d %q", r.StatusCode, text)
		}
		r = post(t, h, "/topics/orders/groups/billing/discard", url.Values{"all": {"1"}}, browser...)
		if loc := r.Header.Get("Location"); r.StatusCode != http.StatusSeeOther || loc != "../billing?count=0&done=discard" {
			t.Errorf("discard from a browser: %d Location %q", r.StatusCode, loc)
		}
		if page := body(t, get(t, h, "/topics/orders/groups/billing?count=3&done=discard")); !strings.Contains(page, `id="notice">3 dead letter(s) discarded.</p>`) {
			t.Error("the group page does not count the letters discarded")
		}
	})
}

// Under a prefix, the deletions' redirects stay under it.
func TestDeleteUnderAPrefix(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDemo(t)
		mux := http.NewServeMux()
		mux.Handle("/debug/logbus/", http.StripPrefix("/debug/logbus", debughttp.Handler(d.b, debughttp.WithActions())))
		for _, c := range []struct{ path, want string }{ // the group first: deleting the topic deletes it too
			{"/debug/logbus/topics/orders/groups/audit/delete", "/debug/logbus/topics/orders"},
			{"/debug/logbus/topics/orders/delete", "/debug/logbus/"},
		} {
			path, want := c.path, c.want
			base, _ := url.Parse("http://localhost" + path)
			r := post(t, mux, path, nil, browser...)
			loc, err := base.Parse(r.Header.Get("Location"))
			if err != nil || loc.Path != want {
				t.Errorf("POST %s redirects to %v (%v), want %s", path, loc, err, want)
			}
			synctest.Wait()
		}
	})
}
