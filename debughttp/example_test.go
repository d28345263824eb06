package debughttp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/debughttp"
	"github.com/logbus/logbus/pubsub"
)

// Mount the page under a prefix of your own mux, and ask for JSON.
func ExampleHandler() {
	b := pubsub.NewBroker()
	defer b.Close(context.Background())
	orders, _ := pubsub.NewTopic(b, "orders", codec.String(), codec.String())
	billing, _ := orders.Subscribe("billing", "billing-1", pubsub.HandlerFunc[string](func(context.Context, pubsub.Message[string]) error { return nil }))
	_ = billing.Pause(context.Background())
	_, _ = orders.Publish(context.Background(), "alice", "order-1")

	mux := http.NewServeMux()
	mux.Handle("/debug/logbus/", http.StripPrefix("/debug/logbus", debughttp.Handler(b)))

	r := httptest.NewRequest(http.MethodGet, "/debug/logbus/topics/orders/groups/billing?format=json", nil)
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, r)
	var g struct {
		Name   string `json:"name"`
		Status string `json:"status"`
		Lag    int64  `json:"lag"`
	}
	_ = json.NewDecoder(w.Body).Decode(&g)
	fmt.Printf("%s: %s, lag %d\n", g.Name, g.Status, g.Lag)
	_ = billing.Resume(context.Background())
	// Output: billing: paused, lag 1
}
