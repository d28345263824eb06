package debughttp_test

import (
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/logbus/logbus/debughttp"
)

// An option given a value means that value: WithDeadLetters(0) shows no
// dead letter but still counts them, WithRefresh(0) turns refreshing off.
func TestZeroOptionsMeanNone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDemo(t)
		h := debughttp.Handler(d.b, debughttp.WithDeadLetters(0), debughttp.WithRefresh(0))
		g := decode[group](t, get(t, h, "/topics/orders/groups/billing?format=json"))
		if len(g.DeadLetters) != 0 || g.NumDead != 1 {
			t.Errorf("WithDeadLetters(0): %d letters shown of %d held, want 0 of 1", len(g.DeadLetters), g.NumDead)
		}
		if page := body(t, get(t, h, "/")); !strings.Contains(page, `data-refresh="0"`) || !strings.Contains(page, "refresh off") {
			t.Error("WithRefresh(0) does not turn refreshing off")
		}
	})
}

// A negative count or period, or a nil option, is invalid: the handler
// does not panic, and answers every request with 500 and an error naming
// the option.
func TestInvalidOptions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDemo(t)
		for name, c := range map[string]struct {
			opt  debughttp.Option
			want string
		}{
			"negative dead letters": {debughttp.WithDeadLetters(-1), "WithDeadLetters(-1)"},
			"negative refresh":      {debughttp.WithRefresh(-time.Second), "WithRefresh(-1s)"},
			"a nil option":          {nil, "nil Option"},
		} {
			h := debughttp.Handler(d.b, debughttp.WithActions(), c.opt)
			for _, path := range []string{"/", "/topics/orders/groups/billing"} {
				r := get(t, h, path, "Accept", "application/json")
				if e := decode[map[string]string](t, r); r.StatusCode != http.StatusInternalServerError ||
					!strings.Contains(e["error"], c.want) || !strings.Contains(e["error"], "invalid argument") {
					t.Errorf("%s: GET %s: %d %v, want 500 naming %s as invalid", name, path, r.StatusCode, e, c.want)
				}
			}
		}
	})
}
