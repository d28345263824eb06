package jetstream

import (
	"bytes"
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
	"github.com/nats-io/nats.go"
)

// TestBacklogPullsRideOnAcks consumes a backlog and watches what the
// engine sends the server: the pull for each next record rides on the
// ack of the one before (+NXT), with no reply asked, so a record costs one
// message each way; only the first record is pulled on its own, and only
// the last ack (the server had nothing after it) is confirmed. The
// records still come once each, in order.
func TestBacklogPullsRideOnAcks(t *testing.T) {
	const n = 200
	opts := testOptions()
	b := brokerOn(t, testServer.Engine(opts...))
	topic, err := pubsub.NewTopic(b, "backlog", codec.String(), codec.String(),
		pubsub.WithRetention(pubsub.Retention{MaxMessages: 2 * n}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	entries := make([]pubsub.Entry[string, string], n)
	for i := range entries {
		entries[i] = pubsub.Entry[string, string]{Key: "k", Value: strconv.Itoa(i)}
	}
	if _, err := topic.PublishBatch(ctx, entries); err != nil {
		t.Fatal(err)
	}

	// A second connection sees every pull request and ack the engine sends.
	nc, err := testServer.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var c config
	for _, o := range opts {
		o.apply(&c)
	}
	nm := names{prefix: encodeName(c.prefix)}
	stream, consumer := nm.stream("backlog", 0), nm.consumer("g", 0)
	var mu sync.Mutex
	var pulls, acksNext, acksConfirmed, acksOther int
	pullSub, err := nc.Subscribe("$JS.API.CONSUMER.MSG.NEXT."+stream+"."+consumer, func(*nats.Msg) {
		mu.Lock()
		pulls++
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer pullSub.Unsubscribe()
	ackSub, err := nc.Subscribe("$JS.ACK."+stream+"."+consumer+".>", func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case bytes.HasPrefix(m.Data, []byte("+NXT")) && m.Reply != "":
			acksNext++
		case string(m.Data) == "+ACK" && m.Reply != "":
			acksConfirmed++
		default:
			acksOther++
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ackSub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	rec := pubsubtest.NewRecorder[string]()
	if _, err := topic.Subscribe("g", "c1", rec); err != nil {
		t.Fatal(err)
	}
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil { // what the engine sent before Drain returned has arrived
		t.Fatal(err)
	}
	mu.Lock()
	gotPulls, gotNext, gotConfirmed, gotOther := pulls, acksNext, acksConfirmed, acksOther
	mu.Unlock()

	msgs := rec.Messages()
	var values []string
	for _, m := range msgs {
		values = append(values, m.Value)
		if m.Attempt != 1 {
			t.Errorf("%q came at attempt %d, want 1", m.Value, m.Attempt)
		}
	}
	want := make([]string, n)
	for i := range want {
		want[i] = strconv.Itoa(i)
	}
	if !slices.Equal(values, want) {
		t.Errorf("handled %d records %v, want 0..%d once each, in order", len(values), values, n-1)
	}
	if gotNext != n-1 || gotConfirmed != 1 || gotOther != 0 {
		t.Errorf("acks: %d carrying the next pull, %d confirmed, %d other; want %d, 1, 0", gotNext, gotConfirmed, gotOther, n-1)
	}
	// The first pull, the one the last ack could not carry, and the poll
	// of the idle partition until Drain returned (50ms apart).
	if gotPulls < 2 || gotPulls > 10 {
		t.Errorf("%d pull requests of their own for %d records, want 2 and a few polls", gotPulls, n)
	}
}
