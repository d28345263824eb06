package debughttp_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/debughttp"
	"github.com/logbus/logbus/pubsub"
)

// secrets is a broker whose group "payments" on topic "cards" holds one
// dead letter carrying secrets in its key, its value and its headers.
func secrets(t *testing.T) *pubsub.Broker {
	t.Helper()
	b := pubsub.NewBroker()
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	cards, err := pubsub.NewTopic(b, "cards", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cards.Subscribe("payments", "payments-1", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error {
		return errors.Join(errors.New("declined"), pubsub.ErrPermanent)
	})); err != nil {
		t.Fatal(err)
	}
	headers := map[string]string{
		"Authorization":       "Bearer token-AUTH",
		"proxy-authorization": "Basic token-PROXY",
		"COOKIE":              "sid=token-COOKIE",
		"Set-Cookie":          "sid=token-SETCOOKIE",
		"X-Api-Key":           "token-APIKEY",
		"traceparent":         "00-trace-VISIBLE-01",
	}
	if _, err := cards.Publish(t.Context(), "customer-KEY", "card 4111-VALUE", pubsub.WithHeaders(headers)); err != nil {
		t.Fatal(err)
	}
	synctest.Wait()
	return b
}

// By default the pages and the JSON show a dead letter's sizes only: no
// byte of its key, value or headers.
func TestPayloadsAreHiddenByDefault(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := debughttp.Handler(secrets(t))
		for _, path := range []string{"/", "/?format=json", "/topics/cards", "/topics/cards?format=json",
			"/topics/cards/groups/payments", "/topics/cards/groups/payments?format=json"} {
			page := body(t, get(t, h, path))
			for _, secret := range []string{"KEY", "VALUE", "token-", "VISIBLE"} {
				if strings.Contains(page, secret) {
					t.Errorf("GET %s shows %q", path, secret)
				}
			}
		}
		g := decode[letters](t, get(t, h, "/topics/cards/groups/payments?format=json"))
		if len(g.DeadLetters) != 1 {
			t.Fatalf("%d dead letters shown, want 1", len(g.DeadLetters))
		}
		l := g.DeadLetters[0]
		if l.Key.Size != len("customer-KEY") || l.Value.Size != len("card 4111-VALUE") || l.Key.Encoding != "" || l.Value.Text != "" ||
			l.NumHeaders != 6 || l.HeaderBytes == 0 || l.Headers != nil || !strings.Contains(l.Error, "declined") {
			t.Errorf("dead letter by default: %+v, want sizes and the error only", l)
		}
		if page := body(t, get(t, h, "/topics/cards/groups/payments")); !strings.Contains(page, `data-field="size">15 B</span>`) {
			t.Error("the group page does not show the value's size")
		}
	})
}

// With WithPayloads the key, the value and the headers are previewed,
// except the values of the secret headers, whatever their case, and of
// those WithRedactedHeaders names.
func TestPayloadsRedactSecretHeaders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := debughttp.Handler(secrets(t), debughttp.WithPayloads(), debughttp.WithRedactedHeaders("x-API-key"))
		for _, path := range []string{"/", "/?format=json", "/topics/cards/groups/payments", "/topics/cards/groups/payments?format=json"} {
			page := body(t, get(t, h, path))
			if strings.Contains(page, "token-") {
				t.Errorf("GET %s shows a secret header's value", path)
			}
			if !strings.Contains(page, "card 4111-VALUE") {
				t.Errorf("GET %s does not show the value", path)
			}
		}
		g := decode[letters](t, get(t, h, "/topics/cards/groups/payments?format=json"))
		l := g.DeadLetters[0]
		if l.Key.Text != "customer-KEY" || l.Value.Text != "card 4111-VALUE" || l.Value.Encoding != "utf-8" {
			t.Errorf("previews: key %+v value %+v", l.Key, l.Value)
		}
		for k, want := range map[string]string{
			"Authorization": "[redacted]", "proxy-authorization": "[redacted]", "COOKIE": "[redacted]",
			"Set-Cookie": "[redacted]", "X-Api-Key": "[redacted]", "traceparent": "00-trace-VISIBLE-01",
		} {
			if got, ok := l.Headers[k]; !ok || got != want {
				t.Errorf("header %s reads %q (%v), want %q", k, got, ok, want)
			}
		}
	})
}

// letters is the part of a group's JSON these tests read.
type letters struct {
	DeadLetters []struct {
		Error       string            `json:"error"`
		Key         previewJSON       `json:"key"`
		Value       previewJSON       `json:"value"`
		NumHeaders  int               `json:"num_headers"`
		HeaderBytes int               `json:"header_bytes"`
		Headers     map[string]string `json:"headers"`
	} `json:"dead_letters"`
}

type previewJSON struct {
	Encoding  string `json:"encoding"`
	Text      string `json:"text"`
	Size      int    `json:"size"`
	Truncated bool   `json:"truncated"`
}
