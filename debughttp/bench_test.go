package debughttp_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/debughttp"
	"github.com/logbus/logbus/pubsub"
)

// BenchmarkOverview measures one read of the overview, HTML and JSON, of a
// broker with 4 topics of 8 partitions, 3 groups each, one of which holds
// 1024 dead letters of 200 bytes: what each refresh of an open page costs.
func BenchmarkOverview(b *testing.B) {
	br := pubsub.NewBroker()
	b.Cleanup(func() { _ = br.Close(context.Background()) })
	value := make([]byte, 200)
	for i := range 4 {
		topic, err := pubsub.NewTopic(br, fmt.Sprintf("topic-%d", i), codec.String(), codec.Bytes(), pubsub.WithPartitions(8))
		if err != nil {
			b.Fatal(err)
		}
		for _, g := range []string{"a", "b", "c"} {
			h := pubsub.HandlerFunc[[]byte](func(context.Context, pubsub.Message[[]byte]) error { return nil })
			if i == 0 && g == "a" {
				h = func(context.Context, pubsub.Message[[]byte]) error { return pubsub.ErrPermanent }
			}
			if _, err := topic.Subscribe(g, g+"-1", h); err != nil {
				b.Fatal(err)
			}
		}
		for n := range 1024 {
			if _, err := topic.Publish(context.Background(), fmt.Sprint(n), value); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := br.Drain(context.Background()); err != nil {
		b.Fatal(err)
	}
	h := debughttp.Handler(br)
	for _, format := range []string{"html", "json"} {
		b.Run("format="+format, func(b *testing.B) {
			target := "/?format=" + format
			b.ReportAllocs()
			for b.Loop() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, target, nil))
				if w.Code != http.StatusOK {
					b.Fatal(w.Code)
				}
			}
		})
	}
}

// BenchmarkOverviewManyPartitions measures one read of each view of a
// broker with one topic of 65,536 partitions (the most a topic may have)
// read by two groups: what one refresh of an open page costs, and how
// large the page is (resp-B/op).
func BenchmarkOverviewManyPartitions(b *testing.B) {
	br := pubsub.NewBroker()
	b.Cleanup(func() { _ = br.Close(context.Background()) })
	const partitions = 1 << 16
	topic, err := pubsub.NewTopic(br, "wide", codec.String(), codec.Bytes(), pubsub.WithPartitions(partitions),
		pubsub.WithRetention(pubsub.Retention{MaxMessages: 4}))
	if err != nil {
		b.Fatal(err)
	}
	for _, g := range []string{"a", "b"} {
		if _, err := topic.Subscribe(g, g+"-1", pubsub.HandlerFunc[[]byte](func(context.Context, pubsub.Message[[]byte]) error { return nil })); err != nil {
			b.Fatal(err)
		}
	}
	h := debughttp.Handler(br)
	for _, view := range []struct{ name, target string }{
		{"overview", "/"},
		{"topic", "/topics/wide"},
		{"group", "/topics/wide/groups/a"},
	} {
		for _, format := range []string{"html", "json"} {
			b.Run("view="+view.name+"/format="+format, func(b *testing.B) {
				target := view.target + "?format=" + format
				b.ReportAllocs()
				var size int
				for b.Loop() {
					w := httptest.NewRecorder()
					h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, target, nil))
					if w.Code != http.StatusOK {
						b.Fatal(w.Code)
					}
					size = w.Body.Len()
				}
				b.ReportMetric(float64(size), "resp-B/op")
			})
		}
	}
}
