package jetstream

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/logbus/logbus/codec"
	"github.com/logbus/logbus/pubsub"
	"github.com/logbus/logbus/pubsub/pubsubtest"
)

// TestBatchUnderBlockStoresAPrefix publishes a batch larger than a Block
// partition's room while its only group is paused: the batch stores what
// fits, in order, fails with ErrBackpressure, and the partition holds
// exactly that prefix (nothing after it, nothing twice).
func TestBatchUnderBlockStoresAPrefix(t *testing.T) {
	b := newBroker(t)
	topic, err := pubsub.NewTopic(b, "orders", codec.String(), codec.String(),
		pubsub.WithRetention(pubsub.Retention{MaxMessages: 4, BlockTimeout: 50 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	rec := pubsubtest.NewRecorder[string]()
	g, err := topic.Subscribe("g", "c1", rec)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	var batch []string
	for i := range 6 {
		batch = append(batch, fmt.Sprint("v", i))
	}
	pos, err := topic.PublishValues(ctx, batch)
	if !errors.Is(err, pubsub.ErrBackpressure) {
		t.Fatalf("PublishValues of 6 into room for 4: got %v, want ErrBackpressure", err)
	}
	if len(pos) != 4 {
		t.Errorf("positions %v, want the 4 stored", pos)
	}
	for i, p := range pos {
		if p.Offset != int64(i) {
			t.Errorf("record %d stored at offset %d, want %d", i, p.Offset, i)
		}
	}
	if st := topic.Stats(); st.Published != 4 || st.Retained != 4 || st.TimedOut != 1 {
		t.Errorf("stats %+v, want 4 published and retained, 1 timed out", st)
	}
	if err := g.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if got := rec.Values(); fmt.Sprint(got) != fmt.Sprint(batch[:4]) {
		t.Errorf("delivered %q, want %q", got, batch[:4])
	}
}
