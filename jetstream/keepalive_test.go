package jetstream

import (
	"context"
	"testing"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// TestLongHandlerIsKeptAlive holds a handler for several AckWaits while
// another client pulls on the partition's consumer, as a member that
// believes it owns the partition would once the pin expired: the engine's
// in-progress acks keep the record from being redelivered to it, so the
// record is handled once.
func TestLongHandlerIsKeptAlive(t *testing.T) {
	const ackWait = 200 * time.Millisecond
	opts := testOptions(WithAckWait(ackWait), WithMemberTTL(150*time.Millisecond))
	b := brokerOn(t, testServer.Engine(opts...))
	topic, err := pubsub.NewTopic(b, "slow", codec.String(), codec.String())
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	rec := pubsubtest.NewRecorder[string]()
	rec.FailWith(func(m pubsub.Message[string]) error {
		if m.Value == "long" {
			close(entered)
			<-release
		}
		return nil
	})
	if _, err := topic.Subscribe("g", "c1", rec); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := topic.PublishValue(ctx, "long"); err != nil {
		t.Fatal(err)
	}
	<-entered

	// The intruder pulls for 4 AckWaits, well past the pin's TTL.
	nc, err := testServer.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := natsjs.New(nc)
	var prefix string
	for _, o := range opts {
		var c config
		o.apply(&c)
		if c.prefix != "" {
			prefix = c.prefix
		}
	}
	n := names{prefix: encodeName(prefix)}
	cons, err := js.Consumer(ctx, n.stream("slow", 0), n.consumer("g", 0))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(4 * ackWait)
	for time.Now().Before(deadline) {
		batch, err := cons.Fetch(1, natsjs.FetchMaxWait(ackWait), natsjs.FetchPriorityGroup(priorityGroup))
		if err != nil {
			continue // pinned to the engine still: a mismatch
		}
		for m := range batch.Messages() {
			t.Errorf("another client got %q while the handler ran: the record was not kept alive", m.Data())
		}
	}
	close(release)
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if msgs := rec.Messages(); len(msgs) != 1 || msgs[0].Attempt != 1 {
		t.Errorf("handled %+v, want long once, at attempt 1", msgs)
	}
}
