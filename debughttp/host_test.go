package debughttp_test

import (
	"net/http"
	"net/url"
	"testing"
	"testing/synctest"

	"github.com/logbus/logbus/debughttp"
)

// DNS rebinding: a hostile page whose name was made to resolve to the
// debug page's address sends requests whose Host, Origin and
// Sec-Fetch-Site agree, so the cross-origin check lets them through. With
// actions (or payloads) on, its Host is refused: the group stays paused.
func TestRebindingIsRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDemo(t)
		h := debughttp.Handler(d.b, debughttp.WithActions())
		rebound := []string{"Host", "evil.example:6060", "Origin", "http://evil.example:6060", "Sec-Fetch-Site", "same-origin", "Accept", "application/json"}
		if r := post(t, h, "/topics/orders/groups/audit/resume", nil, rebound...); r.StatusCode != http.StatusForbidden {
			t.Errorf("a rebound POST: %d, want 403", r.StatusCode)
		}
		if r := get(t, h, "/topics/orders/groups/audit", rebound...); r.StatusCode != http.StatusForbidden {
			t.Errorf("a rebound GET: %d, want 403", r.StatusCode)
		}
		if r := post(t, h, "/topics/orders/groups/audit/replay", url.Values{"from": {"earliest"}}, "Host", "evil.example", "Accept", "application/json"); r.StatusCode != http.StatusForbidden {
			t.Errorf("a POST naming another host: %d, want 403", r.StatusCode)
		}
		synctest.Wait()
		if !d.b.Snapshot().Topics[0].Groups[0].Paused {
			t.Fatal("a rebound request resumed audit")
		}
		if r := get(t, debughttp.Handler(d.b, debughttp.WithPayloads()), "/", "Host", "evil.example"); r.StatusCode != http.StatusForbidden {
			t.Errorf("a rebound GET of a page with payloads: %d, want 403", r.StatusCode)
		}
		if r := get(t, debughttp.Handler(d.b), "/", "Host", "evil.example"); r.StatusCode != http.StatusOK {
			t.Errorf("a read-only page without payloads from any host: %d, want 200", r.StatusCode)
		}
	})
}

// Loopback names, IP addresses and the names WithAllowedHosts adds are
// allowed, whatever their case and port.
func TestAllowedHosts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDemo(t)
		h := debughttp.Handler(d.b, debughttp.WithActions(), debughttp.WithAllowedHosts("ops.example.com", "Debug.Example.com:8443"))
		for host, want := range map[string]int{
			"localhost": 200, "LOCALHOST:6060": 200, "localhost.": 200, "app.localhost:80": 200,
			"127.0.0.1:6060": 200, "[::1]:6060": 200, "[::1]": 200, "10.1.2.3": 200,
			"ops.example.com": 200, "OPS.example.com:9999": 200, "debug.example.com": 200,
			"evil.example": 403, "localhost.evil.example": 403, "example.com": 403, "ops.example.com.evil": 403,
		} {
			if r := get(t, h, "/", "Host", host); r.StatusCode != want {
				t.Errorf("Host %q: %d, want %d", host, r.StatusCode, want)
			}
		}
		if r := get(t, debughttp.Handler(d.b, debughttp.WithAllowedHosts("")), "/"); r.StatusCode != http.StatusInternalServerError {
			t.Errorf("WithAllowedHosts(\"\"): %d, want 500 (invalid)", r.StatusCode)
		}
	})
}
